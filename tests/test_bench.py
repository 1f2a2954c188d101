"""`rmfast bench` end to end on a tiny model: every method runs, agrees, and is written out.

Not a timing test: the figures are whatever this machine gives; what is checked is that the
comparison is complete and honest (same ids, agreement checks passed, rows for every method).
"""

import json

import pandas as pd

from rmfast.cli.bench import main


def test_bench_runs_every_method_and_writes_rows(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["--models", str(tiny_dir), "--device", "cpu", "--dtype", "float32", "--n-candidates", "96",
               "--n-naive", "16", "--naive-batch", "16", "--hf-batch", "32", "--repeats", "1", "--check-n", "8",
               "--no-plot", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    df = pd.read_csv(out / "bench_latest.csv")
    assert set(df["method"]) == {"naive", "hf-cache", "rmfast-eager", "rmfast"}
    base = df[df["method"] != "rmfast"]
    assert base["agree_ok"].all()  # bf16/fp32 agreement with rmfast (fp32 here: elementwise too)
    assert (base["fp32_max_abs_diff"] < 2e-4).all()
    rm = df[df["method"] == "rmfast"].iloc[0]
    assert rm["cand_per_s"] > 0 and rm["gemm_peak_gflops"] > 0 and rm["n_timed"] == 96
    meta = json.loads((out / "bench_latest.json").read_text())
    m = meta["models"][0]
    assert m["agreement"]["rmfast-eager_vs_rmfast"]["ok"]
    assert "rmfast-eager" in printed and "| rmfast |" in printed
