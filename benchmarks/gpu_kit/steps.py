"""Running a step: the budget's clock, the log, a step as a subprocess with a time limit, the tests' JUnit file,
CSV files in and out."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from .config import REPO, RESERVE_S, SRC


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.monotonic(), budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed() - RESERVE_S


def say(msg: str, log=None) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    if log is not None:
        log.write(f"[gpu-check] {msg}\n")
        log.flush()


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def run_step(name: str, cmd: list[str], folder: Path, timeout: float, log) -> dict:
    """Run one step as a subprocess; its output goes to folder/NAME.log and the main log."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.log"
    say(f"{name}: {' '.join(cmd)}  (limit {timeout:.0f} s)", log)
    t0 = time.monotonic()
    with open(path, "w") as fh:
        try:
            p = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=fh, stderr=subprocess.STDOUT, timeout=max(1, timeout))
            rc, status = p.returncode, ("ok" if p.returncode == 0 else f"exit {p.returncode}")
        except subprocess.TimeoutExpired:
            rc, status = None, f"timed out after {timeout:.0f} s"
    wall = time.monotonic() - t0
    text = path.read_text(errors="replace")
    log.write(f"\n===== {name} ({status}, {wall:.1f} s) =====\n{text}\n")
    log.flush()
    say(f"{name}: {status} in {wall:.1f} s", log)
    return {"step": name, "cmd": cmd, "rc": rc, "status": status, "wall_s": round(wall, 1), "log": str(path.relative_to(folder.parent))}


def parse_junit(path: Path) -> tuple[list[dict], dict]:
    """pytest's JUnit XML -> one row per test, and the counts."""
    rows = []
    if path.exists():
        for tc in ET.parse(path).getroot().iter("testcase"):
            outcome, msg = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    msg = (el.get("message") or "").splitlines()[0][:200] if el.get("message") else ""
                    break
            rows.append({"test": f"{tc.get('classname')}::{tc.get('name')}", "outcome": outcome,
                         "seconds": float(tc.get("time") or 0), "message": msg})
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    return rows, counts


def csv_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_csv(path: Path, rows: list[dict], fields: list[str] | None = None) -> None:
    fields = fields or list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
