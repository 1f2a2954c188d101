#!/usr/bin/env python
"""The determinism table: how far a scan's numbers move with each path decision, per dtype, measured.

    python benchmarks/determinism.py [--models tiny-llama tiny-gemma2 smollm2-rm] [--n 1024] [--device cpu]
                                     [--out benchmarks/results/determinism.csv]

For each model and dtype (float32, bfloat16) a baseline scan (this process, batch 128, compile
off, this process's threads) is compared with the same scan run another way: a rerun, another
process, a resumed scan (interrupted after one batch), batch size 37, one thread, the compiled
layer, two torchrun ranks, a sweep part, and (bf16 only) fp32. Each row: max |diff|, mean |diff|,
rank swaps (pairs of rows whose order flips; a tie becoming an order is not a swap), rows whose
rank changed (ties share the best rank, so in bf16 a broken tie moves many), bit-identical or not. One CSV with the machine,
versions and config on every row; docs/determinism.md holds the latest table.

Models: tiny-llama / tiny-gemma2 (the tests' random-init reward models, real SmolLM2 tokenizer),
smollm2-rm (SmolLM2-135M-Instruct with a seeded random score head: a reward model's shape).
Runtime on a shared 2-core CPU: ~5 min with the defaults (SmolLM2 dominates; --n scales it).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    import rmfast
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO / "src"))
    import rmfast

PROMPT = "What, in one word, is the greatest thing ever?"
BATCH = 128
FIELDS = ["machine", "cpu", "threads", "device", "torch", "transformers", "rmfast", "commit", "model", "dtype", "n",
          "decision", "baseline", "other", "max_abs_diff", "mean_abs_diff", "rank_swaps", "rank_changes", "bit_identical", "other_s"]


def make_model(name: str, root: Path) -> Path:
    """An HF folder for ``name`` (every path below loads the same files)."""
    from rmfast.loading.loader import load

    d = root / name
    if d.exists():
        return d
    smol = load("smollm2-135m-instruct", dtype="float32", device="cpu",
                random_head_seed=0 if name == "smollm2-rm" else None)
    if name == "smollm2-rm":
        model = smol.model
    else:
        sys.path.insert(0, str(REPO / "tests"))
        import tiny_models as T

        model = T.tiny(name.removeprefix("tiny-"), "classifier", num_labels=1, pad_token_id=smol.tokenizer.pad_token_id)
    model.save_pretrained(d)
    smol.tokenizer.save_pretrained(d)
    return d


def scan_here(folder: Path, dtype: str, n: int, device: str, **kw) -> np.ndarray:
    """The scan in this process; (n,) scores in token-id order."""
    from rmfast.loading.loader import load
    from rmfast.scoring.pipeline import Selection, run_scan

    lm = load(str(folder), dtype=dtype, device=device)
    opts = dict(batch_size=BATCH, compile="off", progress=False, audit=0)
    opts.update(kw)
    res, _ = run_scan(lm.model, lm.tokenizer, PROMPT, Selection(token_ids=f"0:{n}"), **opts)
    return res.scores


def cli(args: list[str], out: Path, *, torchrun: int = 0) -> np.ndarray:
    """``rmfast scan`` in another process (or ``torchrun`` ranks); the scores it wrote."""
    import pandas as pd

    env = dict(os.environ, PYTHONPATH=str(Path(rmfast.__file__).parents[1]), TOKENIZERS_PARALLELISM="false")
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(torchrun), "-m", "rmfast"]
            if torchrun else [sys.executable, "-m", "rmfast"])
    r = subprocess.run(head + ["scan", *args, "--out", str(out), "--no-progress", "--top", "0", "--audit", "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return pd.read_parquet(out).sort_values("token_id")["score"].to_numpy()


def resumed(folder: Path, dtype: str, n: int, device: str, tmp: Path) -> np.ndarray:
    """Interrupted after one batch (the checkpoint holds it), then resumed in this process."""
    from rmfast.scoring import batching
    from rmfast.fast.engine import Engine

    ck = tmp / f"resume-{folder.name}-{dtype}.partial.npz"
    real, calls = Engine.score, {"n": 0}
    saved = batching.CHECKPOINT_EVERY_N, batching.CHECKPOINT_MIN_S

    def interrupted(self, r):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, r)

    Engine.score, batching.CHECKPOINT_EVERY_N, batching.CHECKPOINT_MIN_S = interrupted, 1, 0.0
    try:
        scan_here(folder, dtype, n, device, checkpoint=ck)
    except KeyboardInterrupt:
        pass
    finally:
        Engine.score = real
        batching.CHECKPOINT_EVERY_N, batching.CHECKPOINT_MIN_S = saved
    assert ck.exists(), "the interrupted scan left no checkpoint"
    return scan_here(folder, dtype, n, device, checkpoint=ck)


def sweep_part(folder: Path, dtype: str, n: int, device: str, tmp: Path) -> np.ndarray:
    from rmfast.sweep.store import load_results
    from rmfast.sweep import load_config, run_sweep

    import yaml

    cfg = tmp / f"sweep-{folder.name}-{dtype}.yaml"
    cfg.write_text(yaml.safe_dump({"models": [{"model": str(folder), "dtype": dtype, "device": device, "batch_size": BATCH,
                                               "compile": "off", "audit": 0}],
                                   "prompts": {"p": PROMPT}, "candidates": {"v": {"vocabulary": {"token_ids": f"0:{n}"}}}}))
    run_sweep(load_config(cfg), tmp / f"store-{folder.name}-{dtype}", progress=False)
    df = load_results(tmp / f"store-{folder.name}-{dtype}")
    return df.sort_values("token_id")["score"].to_numpy()


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    import pandas as pd

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b)
    ra = pd.Series(a).rank(ascending=False, method="min").to_numpy()
    rb = pd.Series(b).rank(ascending=False, method="min").to_numpy()
    sa, sb = np.sign(a[:, None] - a[None, :]), np.sign(b[:, None] - b[None, :])  # (n, n)
    swaps = int((sa * sb < 0).sum()) // 2
    return {"max_abs_diff": f"{d.max():.3g}", "mean_abs_diff": f"{d.mean():.3g}", "rank_swaps": swaps,
            "rank_changes": int((ra != rb).sum()),
            "bit_identical": bool(np.array_equal(a, b))}


def machine() -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"machine": platform.node(), "cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "rmfast": rmfast.__version__, "commit": commit}


def rows_for(name: str, folder: Path, dtype: str, n: int, device: str, tmp: Path, base32: dict):
    """Yield (decision, other config, scores thunk) for one model × dtype."""
    import torch

    spec = [str(folder), "--dtype", dtype, "--device", device, "--token-ids", f"0:{n}", "--compile", "off"]
    yield "rerun (same process)", "again", lambda: scan_here(folder, dtype, n, device)
    yield "other process", "rmfast scan, same threads", lambda: cli(spec + ["--batch-size", str(BATCH)],
                                                                      tmp / f"proc-{name}-{dtype}.parquet")
    yield "resumed scan", "interrupted after 1 batch, resumed", lambda: resumed(folder, dtype, n, device, tmp)
    yield "batch size", "batch 37", lambda: scan_here(folder, dtype, n, device, batch_size=37)
    if device == "cpu" and torch.get_num_threads() > 1:
        def one_thread():
            k = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return scan_here(folder, dtype, n, device)
            finally:
                torch.set_num_threads(k)

        yield "threads", "1 thread", one_thread
    if device == "cpu":
        yield "compile on/off", "compiled layer", lambda: scan_here(folder, dtype, n, device, compile="on")
    yield "torchrun ranks", "2 ranks", lambda: cli(spec + ["--batch-size", str(BATCH)],
                                                  tmp / f"ranks-{name}-{dtype}.parquet", torchrun=2)
    yield "sweep vs scan", "sweep part", lambda: sweep_part(folder, dtype, n, device, tmp)
    if dtype == "bfloat16":
        yield "dtype", "float32 (the bf16 audit's measure)", lambda: base32[name]


def markdown(csv_path: str | Path) -> str:
    """The CSV as the docs' table: one row per decision, one column per model × dtype, cells
    ``max |diff| / rank swaps`` ("identical" when bit-identical)."""
    import pandas as pd

    df = pd.read_csv(csv_path)
    df["cell"] = [("identical" if str(b) == "True" else f"{m} / {s}") if str(b) in ("True", "False") else str(m)
                  for m, s, b in zip(df["max_abs_diff"], df["rank_swaps"].astype("Int64"), df["bit_identical"])]
    cols = list(dict.fromkeys(zip(df["model"], df["dtype"])))
    out = ["| decision | " + " | ".join(f"{m} {'fp32' if d == 'float32' else 'bf16'}" for m, d in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for dec in dict.fromkeys(df["decision"]):
        cells = []
        for m, d in cols:
            hit = df[(df["decision"] == dec) & (df["model"] == m) & (df["dtype"] == d)]
            cells.append(hit["cell"].iloc[0] if len(hit) else "–")
        out.append(f"| {dec} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llama", "tiny-gemma2", "smollm2-rm"],
                    help="tiny-llama, tiny-gemma2, smollm2-rm (default: all three)")
    ap.add_argument("--n", type=int, default=1024, help="token ids 0..n-1 scored (default 1024)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="default: float32 bfloat16")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "determinism.csv"),
                    help="CSV written (default benchmarks/results/determinism.csv)")
    ap.add_argument("--table", default=None, metavar="CSV", help="print CSV as the docs' markdown table and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown(args.table))
        return 0
    import warnings

    warnings.filterwarnings("ignore")
    info = machine()
    rows = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        base32: dict = {}
        for name in args.models:
            folder = make_model(name, tmp / "models")
            for dtype in args.dtypes:
                base = scan_here(folder, dtype, args.n, args.device)
                if dtype == "float32":
                    base32[name] = base
                for decision, other, thunk in rows_for(name, folder, dtype, args.n, args.device, tmp, base32):
                    if decision == "dtype" and name not in base32:
                        continue
                    t0 = time.perf_counter()
                    try:
                        cmp = compare(base, thunk())
                    except Exception as e:  # a path this machine cannot run (no compiler, no gloo): say so
                        cmp = {"max_abs_diff": f"failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:120]}"}
                    row = {**info, "device": args.device, "model": name, "dtype": dtype, "n": args.n,
                           "decision": decision, "baseline": f"this process, batch {BATCH}, compile off", "other": other,
                           **cmp, "other_s": round(time.perf_counter() - t0, 1)}
                    rows.append(row)
                    print(f"{name:12s} {dtype:9s} {decision:22s} max {row.get('max_abs_diff')!s:>9} "
                          f"swaps {row.get('rank_swaps', '-')!s:>5} rank changes {row.get('rank_changes', '-')!s:>5} identical {row.get('bit_identical', '-')} "
                          f"({row['other_s']} s)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out} ({len(rows)} rows, {time.perf_counter() - t_all:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
