"""Step 4, the workloads on the 8B's shapes: best-of-N, the profile, the states overhead (in RAM, then on disk), the
serve workload."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from .config import (BEST_OF_N_RUNS, SCRIPT, SERVE_ARGS, STATES_ARGS, STATES_RAM, WORKLOAD_EST_S, WORKLOAD_MODEL)
from .steps import run_step, say


def workload_cmds(out: Path, dry: bool) -> list[tuple[str, list[str]]]:
    """(step name, command) of every workload step: best-of-N runs, the profile, the states overhead."""
    rm = [sys.executable, "-m", "rmfast", "bench"]
    if dry:
        model = ["--tiny", "--device", "cpu", "--dtype", "float32", "--threads", "1"]
        # one best-of-N process (several prompts, two N): the GPU's second run is the same command with other sizes
        bon = {"single": ["--prompt-tokens-list", "16", "--n-list", "2,3", "--prompts", "2"]}
        states = ["--n-candidates", "32", "--repeats", "1", "--batch-size", "16", "--states-modes", "last_prenorm,all"]
    else:
        model = ["--random-init", WORKLOAD_MODEL, "--device", "cuda", "--dtype", "bfloat16"]
        bon, states = BEST_OF_N_RUNS, STATES_ARGS
    cmds = [(f"best-of-n-{k}", rm + ["--workload", "best-of-n", *model, *v, "--out", str(out / "best_of_n" / k)])
            for k, v in bon.items()]
    if all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn", "httpx")):
        serve = (["--prompt-tokens-list", "16", "--n-list", "4", "--prompts", "2", "--clients", "4"] if dry
                 else SERVE_ARGS)
        cmds.append(("serve", rm + ["--workload", "serve", *model, *serve, "--out", str(out / "serve")]))
    else:
        say("serve: skipped: FastAPI, uvicorn or httpx is not installed here (pip install 'rmfast[serve]')")
    cmds.append(("profile", [sys.executable, str(SCRIPT), "--profile-best-of-n",
                             str(out / "profile.txt")] + (["--dry-run"] if dry else [])))
    # in RAM first: the target's own condition (a "disk" that keeps up); the disk's run is known to be disk-bound
    # (run e's budget reached it last and skipped the RAM one)
    if ram_has_room(STATES_RAM["dry_bytes" if dry else "gpu_bytes"]):
        i = states.index("--states-modes") + 1
        ram = states[:i] + ["all"] + states[i + 1:]  # `all` and the plain scan it is measured against
        cmds.append(("states-ram", ["env", f"TMPDIR={STATES_RAM['dir']}"] + rm + ["--workload", "states", *model, *ram,
                                                                                   "--out", str(out / "states_ram")]))
    cmds.append(("states", rm + ["--workload", "states", *model, *states, "--out", str(out / "states")]))
    return cmds


WORKLOAD_KINDS = ("best-of-n", "serve", "profile", "states")  # what --workloads names


def ram_has_room(need: int) -> bool:
    """Whether the tmpfs of :data:`STATES_RAM` exists and has ``need`` bytes free."""
    try:
        return shutil.disk_usage(STATES_RAM["dir"]).free >= need
    except OSError:
        return False


def run_workloads(ctx: dict, only: list[str] | None = None) -> list[dict]:
    """Step 4: each workload as a subprocess, skipped (and said so) when the budget left is below its estimate or
    when ``only`` (kinds: best-of-n, serve, profile, states) leaves it out."""
    done = []
    for name, cmd in workload_cmds(ctx["out"], ctx["dry"]):
        kind = "best-of-n" if name.startswith("best-of-n") else "states" if name.startswith("states") else name
        if only is not None and kind not in only:
            done.append({"step": name, "rc": None, "status": "skipped: not in --workloads"})
            say(f"{name}: {done[-1]['status']}", ctx["log"])
            continue
        est = 5 if ctx["dry"] else WORKLOAD_EST_S["best-of-n" if name.startswith("best-of-n") else name]
        if ctx["clock"].left() < est:
            done.append({"step": name, "rc": None, "status": f"skipped: {max(0, ctx['clock'].left()):.0f} s of budget "
                                                              f"left, needs ~{est} s"})
            say(f"{name}: {done[-1]['status']}", ctx["log"])
            continue
        st = run_step(name, cmd, ctx["out"] / "steps", ctx["clock"].left(), ctx["log"])
        ctx["steps"].append(st)
        done.append(st)
    return done
