"""One definition each (issue 34, item 4): the next-token log-softmax, the model dimensions a config
gives, the results' shared table methods and the "rows of several lengths or prompts may share a batch"
rule are each written once, and every caller uses that one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import tiny_models as T
from rmfast.fast import ops

SRC = Path(__file__).resolve().parents[1] / "src" / "rmfast"
PROMPT = "What, in one word, is the greatest thing ever?"


# ----------------------------------------------------------------------------- the next-token log-softmax

@pytest.fixture(scope="module")
def chatml():
    return T.chatml_tokenizer()


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: final_logit_softcapping 3.0
def test_engine_and_logprobs_take_the_one_log_softmax_and_agree(arch, chatml, monkeypatch):
    """The engine's prompt pass and ``rmfast logprobs`` both end in :func:`rmfast.fast.ops.vocab_logprobs`
    (a spy sees each call), and give the same log-probabilities of the prompt's next token."""
    from rmfast.fast.engine import Engine
    from rmfast.logprobs import logprobs
    from rmfast.template import build_template

    seen = []
    real = ops.vocab_logprobs

    def spy(logits, **kw):
        seen.append((tuple(logits.shape), kw.get("final_softcap")))
        return real(logits, **kw)

    monkeypatch.setattr(ops, "vocab_logprobs", spy)
    m = T.tiny(arch, "causal_lm", seed=3)
    tmpl = build_template(chatml, PROMPT)
    eng = Engine(m, tmpl, head="logprob")
    assert seen == [((T.VOCAB,), m.config.final_logit_softcapping if arch == "gemma2" else None)]
    res = logprobs(m, chatml, PROMPT)
    assert res.manifest["template"]["prefix_ids"] == list(tmpl.prefix_ids)
    assert seen[1] == ((T.VOCAB,), None)  # HF's forward applied the model's own softcap
    torch.testing.assert_close(torch.from_numpy(res.scores), eng.prefix_logprobs, atol=2e-5, rtol=0)


def test_vocab_logprobs_is_fp32_and_softcaps_before_the_softmax():
    x = torch.tensor([[0.5, -2.0, 9.0]], dtype=torch.bfloat16)
    out = ops.vocab_logprobs(x, final_softcap=3.0)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.log_softmax(torch.tanh(x.float() / 3.0) * 3.0, dim=-1))
    assert torch.equal(ops.vocab_logprobs(x), torch.log_softmax(x.float(), dim=-1))


def test_no_other_next_token_log_softmax():
    """The engine and logprobs compute no log-softmax of their own (their docstrings may name it)."""
    for rel in ("fast/engine.py", "logprobs.py"):
        calls = [n for n in ast.walk(ast.parse((SRC / rel).read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in
                 ("log_softmax", "logsumexp")]
        assert not calls, rel


def test_logprobs_refuses_what_the_scan_refuses_in_its_own_words(chatml):
    """logprobs' head check is the scan's (:func:`rmfast.scoring.plan.choose_head`), its message its own."""
    from rmfast.errors import UserError
    from rmfast.logprobs import logprobs
    from rmfast.scoring.plan import choose_head

    clf = T.tiny("llama", "classifier")
    with pytest.raises(UserError, match="head='logprob' needs a causal language model"):
        choose_head(clf, "logprob", 0)
    with pytest.raises(UserError, match=r"^logprobs needs a causal language model; this model has no LM head$"):
        logprobs(clf, chatml, PROMPT)


# ----------------------------------------------------------------------------- the model dimensions

def _module_dims(model) -> dict:
    """The dimensions as the instantiated modules have them (not the config)."""
    from rmfast.fast.arch import backbone_of

    bb = backbone_of(model)
    L0 = bb.layers[0]
    a, mlp = L0.self_attn, L0.mlp
    emb = bb.embed_tokens.weight
    if hasattr(a, "qkv_proj"):  # Phi-3: rows q | k | v, the q rows are o_proj's input
        q_out = a.o_proj.in_features
        kv_out = (a.qkv_proj.out_features - q_out) // 2
    else:
        q_out, kv_out = a.q_proj.out_features, a.k_proj.out_features
    return {"hidden": emb.shape[1], "vocab": emb.shape[0], "layers": len(bb.layers), "head_dim": a.head_dim,
            "heads": q_out // a.head_dim, "kv_heads": kv_out // a.head_dim, "intermediate": mlp.down_proj.in_features}


@pytest.mark.parametrize("arch", sorted(T.ARCHS))
def test_model_dims_are_the_built_models(arch):
    """model_dims(config) == the shapes transformers builds from that config, every fast-path architecture
    (Gemma's and Qwen3's head_dim != hidden / heads, GQA, Phi-3's fused q|k|v)."""
    from rmfast.dims import model_dims

    for kind in ("classifier", "causal_lm"):
        m = T.tiny(arch, kind)
        got = model_dims(m.config)
        assert {k: getattr(got, k) for k in _module_dims(m)} == _module_dims(m), (arch, kind)
        assert (got.q_width, got.kv_width) == (got.heads * got.head_dim, got.kv_heads * got.head_dim)


@pytest.mark.parametrize("base", ["llama-3.2-1b", "gemma-2-2b", "gemma-2-27b", "qwen3-0.6b"])
def test_model_dims_of_the_registry_configs_are_the_built_models(base):
    """The registry's config.json dicts: model_dims(dict) == the published model's shapes (built on the
    meta device, 2 layers). Gemma-2-2B: head_dim 256, not 2,304 / 8; Gemma-2-27B: 128, not 4,608 / 32."""
    from transformers import AutoModelForCausalLM

    from rmfast.bench import random_init as RI
    from rmfast.dims import model_dims

    d = RI.config_dict(base, layers=2)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(RI._hf_config(d))
    got = model_dims(d)
    assert {k: getattr(got, k) for k in _module_dims(m)} == _module_dims(m)
    assert got == model_dims(m.config)  # the dict and transformers' config object read alike


def test_model_dims_read_a_multimodal_config_s_text_config():
    from transformers import Gemma3Config

    from rmfast.dims import model_dims

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, vocab_size=1000)
    cfg = Gemma3Config(text_config=text)
    want = model_dims(cfg.text_config)
    assert model_dims(cfg) == want == model_dims({"model_type": "gemma3", "text_config": text})
    assert (want.hidden, want.head_dim, want.kv_heads, want.vocab) == (64, 16, 2, 1000)
    with pytest.raises(ValueError, match="num_attention_heads"):
        model_dims({"hidden_size": 64, "num_hidden_layers": 2})


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "phi3"])
def test_every_reader_of_the_dimensions_agrees(arch):
    """The fast path's spec, the memory estimate, the prompt-cache size, the layer count, the CPU probe
    shape and the benchmark's dims all give model_dims' numbers."""
    from rmfast.bench.flops import model_dims as bench_dims
    from rmfast.cpu import mlp_dims
    from rmfast.dims import model_dims
    from rmfast.fast.arch import arch_spec
    from rmfast.scoring import batching, hf_path
    from rmfast.scoring.scorer import RewardScorer

    m = T.tiny(arch, "classifier", num_labels=1)
    dm = model_dims(m.config)
    sp = arch_spec(m)
    assert (sp.n_heads, sp.n_kv_heads, sp.head_dim) == (dm.heads, dm.kv_heads, dm.head_dim)
    b = bench_dims(m, "score")
    assert (b["n_layers"], b["hidden"], b["n_heads"], b["n_kv_heads"], b["head_dim"], b["intermediate"]) == (
        dm.layers, dm.hidden, dm.heads, dm.kv_heads, dm.head_dim, dm.intermediate)
    assert mlp_dims(m.config) == (dm.hidden, dm.intermediate) and hf_path.n_layers(m) == dm.layers
    T_, P = 3, 10
    assert batching.row_bytes(m, T_, prefix_len=P) == (T_ * (4 * dm.hidden + (dm.heads + 2 * dm.kv_heads) * dm.head_dim
                                                        + 3 * dm.intermediate) * 4 + 2 * dm.heads * T_ * (T_ + P) * 4)
    scorer = RewardScorer.__new__(RewardScorer)  # prompt_bytes reads the model only
    scorer.model = m
    assert scorer.prompt_bytes(P) == 2 * dm.layers * dm.kv_width * P * 4  # fp32: 4 bytes


def test_no_other_reader_of_the_config_dimensions():
    """Outside rmfast.dims nothing reads the dimension fields off a config (an attribute, a getattr with
    the field's name, or a subscript): a new reader with its own defaults would be a second definition.
    The exceptions read something else of the same name, or a table they write."""
    fields = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size"}
    allowed = {
        "states/reader.py": {"hidden_size"},  # the states folder's manifest and its property
        "analysis/representations/similarity.py": {"hidden_size"},  # States.hidden_size
        "analysis/representations/representation_rsa.py": {"hidden_size"},  # StatesSet.hidden_size
        "bench/states_overhead.py": {"hidden_size", "num_hidden_layers"},  # a states manifest; getattr(..., None)
        "bench/random_init.py": {"num_attention_heads", "head_dim"},  # TINY, the table config_dict writes from
        "integrations/trl.py": {"num_hidden_layers"},  # getattr(config, ..., None) of any wrapped trainer model
        "bench/flops.py": {"head_dim"},  # its own dims dicts (model_dims' numbers, COST_MODELS), not a config
        "bench/cascade_cost.py": {"head_dim"},  # its own dims dict
    }
    found = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel == "dims.py" or rel.startswith("kernels/"):  # the kernels take head_dim as an argument
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr != "head_dim":
                name = n.attr  # (x.head_dim: ModelDims', ArchSpec's, an attention module's; not a config's here)
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and isinstance(n.slice, ast.Constant):
                name = n.slice.value
            elif isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr" and len(n.args) > 1 \
                    and isinstance(n.args[1], ast.Constant):
                name = n.args[1].value
            if name in fields and name not in allowed.get(rel, ()):
                found.setdefault(rel, set()).add(name)
    assert not found, found


# ----------------------------------------------------------------------------- the results' shared methods

def test_scan_and_text_results_share_one_definition_of_their_table_methods():
    from rmfast.scoring.results import ScanResult, TextScanResult, _Result

    for name in ("top", "bottom", "to_parquet", "wall_s", "candidates_per_s", "_ranked"):
        assert name in vars(_Result), name
        assert name not in vars(ScanResult) and name not in vars(TextScanResult), name


def test_shared_top_bottom_order_rows_as_before(tmp_path):
    """As the two classes' own methods did: token results' ties by token id (whatever the row order), text
    results' in row order, a NaN score last; the table's columns in their order."""
    import numpy as np
    import pandas as pd

    from rmfast.scoring.results import ScanResult, TextScanResult

    scores = np.array([1.0, 3.0, np.nan, 3.0, 1.0, 2.0], dtype=np.float32)
    ids = np.array([9, 4, 7, 2, 1, 5])  # not ascending, as a merged shard may hold them
    tok = ScanResult(ids, scores, [f"t{i}" for i in ids], [f"x{i}" for i in ids], {"wall_s": 2.5},
                     {"lens_1": scores * 2})
    df = tok.to_pandas()
    assert list(df.columns) == ["token_id", "token", "text", "score", "rank", "lens_1"]
    assert tok.top(6)["token_id"].tolist() == df.sort_values(["rank", "token_id"]).head(6)["token_id"].tolist() \
        == [2, 4, 5, 1, 9, 7]
    assert tok.bottom(6)["token_id"].tolist() == df.sort_values(["rank", "token_id"], ascending=[False, True]).head(6)[
        "token_id"].tolist() == [1, 9, 5, 2, 4, 7]  # a NaN score has no rank: last either way
    txt = TextScanResult([f"r{i}" for i in range(6)], scores, np.ones(6, dtype=np.int64), [[i] for i in range(6)],
                         {"candidates_per_s": 7.0})
    assert list(txt.to_pandas().columns) == ["text", "n_tokens", "score", "rank", "token_ids"]
    assert "token_ids" not in txt.top(2).columns
    plain = txt.to_pandas(token_ids=False)
    assert txt.top(6)["text"].tolist() == plain.sort_values("rank", kind="stable")["text"].tolist() \
        == ["r1", "r3", "r5", "r0", "r4", "r2"]
    assert txt.bottom(6)["text"].tolist() == plain.sort_values("rank", ascending=False, kind="stable")["text"].tolist()
    assert (tok.wall_s, txt.candidates_per_s) == (2.5, 7.0)
    back = TextScanResult.from_parquet(txt.to_parquet(tmp_path / "t.parquet"))
    pd.testing.assert_frame_equal(back.to_pandas(), txt.to_pandas())


# ----------------------------------------------------------------------------- rows of several lengths in one batch

def _gated_rm(tmpl):
    """A tiny Llama with an ArmoRM-style gated head (2 objectives) gating on a token of the prompt."""
    from rmfast.fast.heads import GatedHead, GatingLayer
    from rmfast.loading.custom_heads import CustomRewardModel

    g = torch.Generator().manual_seed(0)
    head = GatedHead(regression=torch.randn(2, 64, generator=g), transform=torch.randn(2, 2, generator=g),
                     gating=[GatingLayer("linear", torch.randn(2, 64, generator=g))], temperature=1.0,
                     logit_scale=torch.ones(1), num_quantiles=1, pattern=(tmpl.prefix_ids[-3],))
    return CustomRewardModel(T.tiny("llama", "causal_lm").model, head, "armorm").eval()


@pytest.mark.parametrize("kind", ["linear", "gated", "logprob"])
def test_one_rule_decides_whether_rows_of_several_lengths_share_a_batch(kind, chatml):
    """The scorer's grouping (before any engine exists) and the engine (score_prompts, score_together)
    answer by the one rule, :func:`rmfast.fast.engine.ragged_ok`; a batch the rule refuses is refused."""
    import numpy as np

    from rmfast.fast import engine as E
    from rmfast.scoring.plan import plan_scoring, score_together
    from rmfast.scoring.scorer import RewardScorer
    from rmfast.template import build_template

    tmpl = build_template(chatml, PROMPT)
    model = {"linear": lambda: T.tiny("llama", num_labels=1), "gated": lambda: _gated_rm(tmpl),
             "logprob": lambda: T.tiny("llama", "causal_lm")}[kind]()
    head = "logprob" if kind == "logprob" else "score"
    want = kind == "linear"
    scorer = RewardScorer(model, chatml, head=head, engine="fast", device="cpu", dtype="float32")
    plan = plan_scoring(model, tmpl, head=head, engine="fast", compile=False)
    assert scorer._ragged_ok() is plan.eng.can_score_ragged() is E.ragged_ok(head, plan.eng.score_head) is want
    rows = [[5, 6], [7]]
    if want:
        out = score_together([plan], [rows], 8)
        np.testing.assert_allclose(out, [plan.score([r], 1)[0] for r in rows], atol=1e-5, rtol=0)
    else:
        with pytest.raises(ValueError, match="several lengths"):
            score_together([plan], [rows], 8)
