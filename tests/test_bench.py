"""`rmfast bench` end to end on a tiny model: every method runs, agrees, and is written out.

Not a timing test: the figures are whatever this machine gives; what is checked is that the
comparison is complete and honest (same ids, agreement checks passed, rows for every method).
"""

import json

import pandas as pd
import pytest
import torch

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


def _random_init_cli(alias, out, *extra):
    return main([*extra, "--random-init", alias, "--layers", "2", "--device", "cpu", "--n-candidates", "8", "--n-naive", "4",
                 "--naive-batch", "4", "--hf-batch", "8", "--batch-size", "8", "--repeats", "1", "--check-n", "0",
                 "--compile", "off", "--no-peak", "--no-plot", "--threads", "2", "--out", str(out)])


@pytest.mark.slow  # ~20 s idle, 40 s on a loaded 2-core machine: drawing the 128,256 x 2,048 embedding dominates
def test_random_init_real_config_cut_through_the_cli(tmp_path, capsys):
    """`rmfast bench --random-init ALIAS --layers 2`: the registry's full-size configuration of a known reward
    model (Skywork-Reward-V2-Llama-3.2-1B: hidden 2048, 128,256-token vocabulary), its first 2 layers, with
    random weights; the rows name the alias and the cut, and the model is that config (vocab, GEMM shapes)."""
    from rmfast import registry

    out = tmp_path / "bench"
    assert _random_init_cli("S-Lla-1B-V2", out) == 0, capsys.readouterr().err
    df = pd.read_csv(out / "bench_latest.csv")
    assert set(df["model"]) == {"S-Lla-1B-V2@random-L2"} and set(df["method"]) == {"naive", "hf-cache", "rmfast"}
    rm = df[df["method"] == "rmfast"].iloc[0]
    c = registry.MODELS["S-Lla-1B-V2"].config()
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = 2 * c["hidden_size"] * (q + kv) + 3 * c["hidden_size"] * c["intermediate_size"]
    assert rm["vocab"] == 128256 and rm["gemm_params"] == 2 * per_layer and rm["cand_per_s"] > 0
    note = json.loads((out / "bench_latest.json").read_text())["models"][0]
    assert "Skywork/Skywork-Reward-V2-Llama-3.2-1B" in json.dumps(note) and "2 layers" in json.dumps(note)


def test_random_init_qwen3_cut(tmp_path, capsys):
    """A Qwen3 reward model's real configuration cut to 2 layers (Skywork-Reward-V2-Qwen3-0.6B: q/k norms,
    151,936-token vocabulary). Through the CLI once Qwen3 is on the fast path; until then `bench` says so in
    one line (exit 2) and the model is built and scored on the plain-HF path (the Python API)."""
    from rmfast.bench.random_init import random_init_model
    from rmfast.models.arch import SUPPORTED

    out = tmp_path / "bench"
    # fp32: on 8 candidates of a 2-layer random model, bf16 rounding alone can push the methods' rank
    # correlation below the bench's 0.99 (measured 0.69-0.94 while rmfast was the closer to fp32 truth);
    # in fp32 the methods must agree elementwise.
    rc = _random_init_cli("S-Qwe-0.6B-V2", out, "--dtype", "float32")
    err = capsys.readouterr().err
    if "qwen3" in SUPPORTED:
        assert rc == 0, err
        assert set(pd.read_csv(out / "bench_latest.csv")["model"]) == {"S-Qwe-0.6B-V2@random-L2"}
        return
    assert rc == 2 and "not on rmfast's fast path" in err and "Traceback" not in err
    from rmfast.reference import reference_scores
    from rmfast.template import build_template

    lm = random_init_model("S-Qwe-0.6B-V2", layers=2, dtype="float32")
    m = lm.model
    assert m.config.model_type == "qwen3" and len(m.model.layers) == 2 and len(lm.tokenizer) == 151936
    assert m.model.layers[0].self_attn.q_norm.weight.shape == (128,)  # Qwen3's q/k norms over head_dim
    tmpl = build_template(lm.tokenizer, "What, in one word, is the greatest thing ever?", template=lm.default_template)
    s = reference_scores(m, tmpl, [[i] for i in (300, 5000, 151935)], head="score")
    assert torch.isfinite(s).all() and s.std() > 0
