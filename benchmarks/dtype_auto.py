"""Does ``--dtype auto`` pick the faster dtype on this CPU? ``rmfast scan`` timed end to end per dtype.

For each dtype (auto, float32, bfloat16) ``rmfast scan`` runs in a fresh process on two id counts; the
marginal rate ``(n2 - n1) / (t2 - t1)`` cancels the start-up (Python, model load, prompt pass, a
compile) and is the figure compared. One row per (dtype, n) with the CPU's model, kind and flags, the
ISA-limiting environment (``--emulate-avx2``: ``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2``: the kernels an AVX2-only CPU runs, on a CPU that has more), the
dtype auto took and why (its manifest's ``dtype_choice``), wall and scoring seconds.

    python benchmarks/dtype_auto.py --sizes 4096,16384 --out benchmarks/results/dtype_auto/zen4.csv
    python benchmarks/dtype_auto.py --emulate-avx2 --sizes 1024,3072 --dtypes auto,float32 --out ...
    python benchmarks/dtype_auto.py --emulate-avx2 --sizes 256,768 --dtypes bfloat16 --out ... --append

Rows are appended with ``--append`` (so slow dtypes can run on smaller sizes); the summary line per
dtype is printed at the end: the marginal rate (from the fastest of ``--repeats`` runs of each size) and its ratio to the fastest
explicit dtype.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rmfast.cpu import cpu_id, cpu_info, versions  # noqa: E402

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
FIELDS = ["cpu_model", "cpu_id", "cpu_kind", "cpu_flags", "emulated", "threads", "model", "dtype", "compile", "n", "wall_s",
          "scan_s", "cand_per_s", "ran_dtype", "dtype_source", "dtype_reason", "rmfast_commit", "torch", "timestamp"]


def one_scan(model: str, dtype: str, n: int, compile_: str, env: dict, threads: int) -> dict:
    """``rmfast scan MODEL --token-ids 0:n`` in a fresh process: wall seconds and its manifest."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "s.parquet"
        cmd = [sys.executable, "-c", f"import torch; torch.set_num_threads({threads}); from rmfast.cli import main; "
               f"raise SystemExit(main())", "scan", model, "--dtype", dtype, "--token-ids", f"0:{n}",
               "--compile", compile_, "--out", str(out), "--no-progress", "--top", "0"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"scan failed ({dtype}, {n}): {p.stderr[-1500:]}")
        m = json.loads(Path(str(out) + ".json").read_text())
    return {"wall_s": round(wall, 2), "scan_s": m.get("scan_s"), "cand_per_s": m.get("candidates_per_s"),
            "ran_dtype": m["dtype"], "dtype_source": (m.get("dtype_choice") or {}).get("source", "explicit"),
            "dtype_reason": (m.get("dtype_choice") or {}).get("reason", "")}


def summarize(rows: list[dict]) -> list[str]:
    """Marginal rate per dtype (largest two sizes) and its ratio to the fastest explicit dtype."""
    by: dict[str, list[dict]] = {}
    for r in rows:  # the fastest run of each (dtype, n)
        rs = by.setdefault(r["dtype"], [])
        same = [x for x in rs if int(x["n"]) == int(r["n"])]
        if not same:
            rs.append(r)
        elif float(r["wall_s"]) < float(same[0]["wall_s"]):
            rs[rs.index(same[0])] = r
    rate = {}
    for dt, rs in by.items():
        rs = sorted(rs, key=lambda r: int(r["n"]))
        if len(rs) >= 2 and float(rs[-1]["wall_s"]) > float(rs[0]["wall_s"]):
            rate[dt] = (int(rs[-1]["n"]) - int(rs[0]["n"])) / (float(rs[-1]["wall_s"]) - float(rs[0]["wall_s"]))
    best = max((v for k, v in rate.items() if k != "auto"), default=None)
    out = []
    for dt, v in rate.items():
        ran = by[dt][-1]["ran_dtype"]
        out.append(f"{dt:9s} ({ran}): {v:8.1f} cand/s marginal" + (f", {v / best:.2f}x the fastest explicit dtype" if best else ""))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", default="auto,float32,bfloat16")
    ap.add_argument("--sizes", default="4096,16384", help="two (or more) id counts, comma-separated")
    ap.add_argument("--compile", default="off", help="scan's --compile for every run (default off: one path for all sizes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per (dtype, n), interleaved; the fastest counts (default 2)")
    ap.add_argument("--emulate-avx2", action="store_true", help="run the scans with AVX2-only kernels (see above)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
    if a.emulate_avx2:
        env.update(AVX2_ENV)
    info = cpu_info()
    ver = versions()
    rows = []
    runs = [(int(n), dt) for _ in range(a.repeats) for n in a.sizes.split(",") for dt in a.dtypes.split(",")]
    for n, dt in runs:
        r = one_scan(a.model, dt, n, a.compile, env, a.threads)
        emu = "AVX2 kernels (" + ", ".join(f"{k}={v}" for k, v in AVX2_ENV.items()) + ")" if a.emulate_avx2 else ""
        rows.append({"cpu_model": info.model, "cpu_id": cpu_id(), "cpu_kind": info.kind, "cpu_flags": " ".join(info.flags), "emulated": emu,
                     "threads": a.threads, "model": a.model, "dtype": dt, "compile": a.compile, "n": n, **r,
                     "rmfast_commit": ver["rmfast_commit"], "torch": ver["torch"], "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")})
        print(f"{dt:9s} n={n:6d}: {r['wall_s']:7.1f} s wall ({r['ran_dtype']}, {r['dtype_source']})", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = list(csv.DictReader(open(out))) if a.append and out.is_file() else []
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(old + rows)
    for line in summarize([r for r in old + rows if r["emulated"] == rows[0]["emulated"]]):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
