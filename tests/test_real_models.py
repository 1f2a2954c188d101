"""The real embedded weights: fast path vs plain-HF reference, and the scan API on them."""

import numpy as np
import pytest
import torch
from scipy import stats

import rmfast

from rmfast.scoring import batching
from rmfast.fast.engine import Engine
from rmfast.scoring.hf_path import hf_scores
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"
# a spread of ids: special tokens, byte-level pieces, ordinary words, the end of the vocabulary
SUBSET = sorted({*range(0, 20), *range(150, 170), *range(1000, 49152, 997), 49151})


@pytest.fixture(scope="module")
def tmpl(smollm2):
    return build_template(smollm2.tokenizer, PROMPT)


def test_smollm2_logprob_fp32_exact(smollm2, tmpl):
    ids = torch.tensor(SUBSET)[:, None]
    fast = Engine(smollm2.model, tmpl, head="logprob").score(ids)
    ref = hf_scores(smollm2.model, tmpl, ids.tolist(), head="logprob", batch_size=16)
    torch.testing.assert_close(fast, ref, atol=2e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def smol_rm():
    return rmfast.load("smollm2-135m-instruct", dtype="float32", random_head_seed=0)


def test_smollm2_classifier_fp32_exact(smol_rm, tmpl):
    ids = torch.tensor(SUBSET)[:, None]
    fast = Engine(smol_rm.model, tmpl, head="score").score(ids)
    ref = hf_scores(smol_rm.model, tmpl, ids.tolist(), head="score", batch_size=32)
    assert ref.std() > 1e-3
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-5)


def test_smollm2_bf16_rank_agreement(tmpl):
    """The real weights in bf16 rank as the plain-HF fp32 forward of the same (bf16-rounded) weights does: what
    bf16 compute changes. (The bf16 HF forward's own agreement is the tiny models' test, test_engine's
    test_bf16_rank_agreement: here it would cost ~60 s on a CPU that emulates bf16, the fp32 truth ~7 s.)"""
    lm = rmfast.load("smollm2-135m-instruct", dtype="bfloat16")
    ids = torch.arange(2000, 49152, 393)[:, None]  # 120 ids
    fast = Engine(lm.model, tmpl, head="logprob").score(ids).float().numpy()
    truth = hf_scores(lm.model.float(), tmpl, ids.tolist(), head="logprob", batch_size=64).numpy()
    assert stats.spearmanr(fast, truth).statistic > 0.99
    assert len(set(np.argsort(-fast)[:12]) & set(np.argsort(-truth)[:12])) >= 9


def test_scan_api_and_resume(smollm2, tmp_path, monkeypatch):
    res = rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="0:600", progress=False)
    df = res.to_pandas()
    assert len(df) == 600 and res.manifest["head"] == "logprob" and res.manifest["engine"] == "fast"
    # a model rmfast.load gave records where it came from, as the CLI's scan does (not a converted folder's path)
    assert res.manifest["model"] == smollm2.source and res.manifest["model"]["sha256"]
    assert res.manifest["model"]["name"] == "SmolLM2-135M-Instruct"
    assert res.top(3)["score"].is_monotonic_decreasing and res.top(1)["rank"].item() == 1
    assert res.bottom(1)["score"].item() == df["score"].min()
    p = res.to_parquet(tmp_path / "a.parquet")
    back = rmfast.ScanResult.from_parquet(p)
    np.testing.assert_array_equal(back.scores, res.scores)
    assert back.manifest["prompt"] == PROMPT

    # Interrupt after two batches: the checkpoint keeps them, and the rerun scores only the rest.
    ck = tmp_path / "ck.npz"
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_S", 0.0)
    calls = {"n": 0}
    real = Engine.score

    def flaky(self, responses):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, responses)

    monkeypatch.setattr(Engine, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="0:600", batch_size=100, progress=False, checkpoint=ck)
    assert ck.exists()
    monkeypatch.setattr(Engine, "score", real)
    again = rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="0:600", batch_size=100, progress=False, checkpoint=ck)
    assert again.manifest["resumed_candidates"] == 200
    assert not ck.exists()
    # Bit-identical to the same scan uninterrupted: the same batches of 100 (the checkpoint ended on a
    # batch boundary), threads and process. Against ``res`` (auto batches) it would agree only to
    # fp32 rounding: tests/test_rounding.py.
    plain = rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="0:600", batch_size=100, progress=False)
    np.testing.assert_array_equal(again.scores, plain.scores)


def test_fallback_path_warns_and_matches(smollm2, tmpl, monkeypatch):
    """An architecture the engine does not know runs on the plain-HF path, with a one-line warning."""
    import rmfast.fast.arch as arch

    monkeypatch.setattr(arch, "SUPPORTED", {})
    with pytest.warns(UserWarning, match="not on the fast path"):
        res = rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="3000:3040", progress=False)
    assert res.manifest["engine"] == "hf"
    monkeypatch.undo()
    fast = rmfast.scan(smollm2.model, smollm2.tokenizer, PROMPT, token_ids="3000:3040", progress=False)
    np.testing.assert_allclose(res.scores, fast.scores, atol=2e-4)


@pytest.mark.slow
def test_gemma3_270m_logprob_exact():
    try:
        lm = rmfast.load("gemma3-270m", dtype="float32")
    except rmfast.UserError as e:
        pytest.skip(str(e))
    assert lm.model.get_input_embeddings().weight.shape[0] == 262144
    t = build_template(lm.tokenizer, PROMPT, template=lm.default_template + "\n")  # "\n" ends the answer
    assert t.n_continuation == 1
    ids = torch.tensor([2, 100, 5000, 100000, 262143, 236761, 17128])[:, None]
    fast = Engine(lm.model, t, head="logprob").score(ids)
    ref = hf_scores(lm.model, t, ids.tolist(), head="logprob", batch_size=4)
    torch.testing.assert_close(fast, ref, atol=2e-4, rtol=1e-5)
