"""logprobs: next-token log-probabilities equal a plain-HF fp32 log_softmax, on tiny and real models."""

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.logprobs import logprobs, prompt_ids
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"
SUBSET = sorted({*range(0, 20), *range(150, 170), *range(1000, 49152, 997), 49151})


def hf_ref(model, ids):
    """Plain HF: full logits (no logits_to_keep), last position, fp32 log_softmax."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    return torch.log_softmax(logits[0, -1].float(), -1)


@pytest.fixture(scope="module")
def tiny_lm():
    return T.tiny("llama", "causal_lm", seed=1)


def test_tiny_equals_hf_log_softmax(tiny_lm, smol_tokenizer):
    res = logprobs(tiny_lm, smol_tokenizer, PROMPT)
    ids = smol_tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    assert res.manifest["template"]["prefix_ids"] == list(ids)
    assert res.manifest["head"] == "next_token_logprob"
    ref = hf_ref(tiny_lm, ids)
    assert res.token_ids.tolist() == list(range(T.VOCAB))
    np.testing.assert_allclose(res.scores, ref.numpy(), atol=1e-5, rtol=0)
    assert abs(torch.logsumexp(torch.from_numpy(res.scores).double(), 0).item()) < 1e-4  # a distribution


def test_tiny_candidate_matches_full_forward(tiny_lm, smol_tokenizer):
    """Independent check: log p(c) read at the right position of a forward over prompt + c."""
    ids, _ = prompt_ids(smol_tokenizer, PROMPT)
    cands = [0, 17, 504, 5195, 30000, T.VOCAB - 1]
    res = logprobs(tiny_lm, smol_tokenizer, PROMPT, token_ids=cands)
    with torch.no_grad():
        full = tiny_lm(torch.tensor([ids + [c] for c in cands])).logits
    want = torch.log_softmax(full[:, len(ids) - 1].float(), -1)[torch.arange(len(cands)), torch.tensor(cands)]
    np.testing.assert_allclose(res.scores, want.numpy(), atol=1e-5, rtol=0)
    assert res.texts == [smol_tokenizer.decode([c]) for c in cands]


def test_gemma2_final_logit_softcapping_included(smol_tokenizer):
    m = T.tiny("gemma2", "causal_lm", seed=2)  # final_logit_softcapping = 3.0
    res = logprobs(m, smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant:")
    ids = res.manifest["template"]["prefix_ids"]
    with torch.no_grad():
        h = m.model(torch.tensor([ids])).last_hidden_state[0, -1]
        raw = m.lm_head(h).float()
    capped = torch.log_softmax(3.0 * torch.tanh(raw / 3.0), -1)
    np.testing.assert_allclose(res.scores, capped.numpy(), atol=1e-5, rtol=0)
    assert not np.allclose(res.scores, torch.log_softmax(raw, -1).numpy(), atol=1e-3)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_a_bf16_model_s_head_multiplies_in_fp32(smol_tokenizer, arch):
    """A bf16 model's logits had been bf16 (its fp32 log-softmax kept 8 bits: SmolLM2's 49,152 log-probs took 298
    values, 'The' and 'That' tied at rank 1): the LM head multiplies in fp32 on the model's own bf16 state, the
    model's final softcap applied to those fp32 logits (Gemma 2); the head is the model's again afterwards."""
    m = T.tiny(arch, "causal_lm", seed=4).to(torch.bfloat16)
    res = logprobs(m, smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant:")
    ids = res.manifest["template"]["prefix_ids"]
    with torch.no_grad():
        h = m.model(torch.tensor([ids])).last_hidden_state[0, -1]  # (D,) bf16: the model's normed state
        raw = h.float() @ m.lm_head.weight.float().T  # (V,) fp32
    cap = getattr(m.config, "final_logit_softcapping", None)
    want = torch.log_softmax(cap * torch.tanh(raw / cap) if cap else raw, -1)
    np.testing.assert_allclose(res.scores, want.numpy(), atol=2e-5, rtol=0)
    assert len(np.unique(res.scores)) > 0.9 * T.VOCAB and res.manifest["lm_head_dtype"] == "float32"
    d = res.manifest["decisions"]["lm_head_dtype"]  # the plan's decision, with its reason
    assert d["value"] == "float32" and "bfloat16 last state" in d["reason"]
    assert "forward" not in vars(m.lm_head)  # the module's own forward again
    assert m.lm_head(h[None]).dtype == torch.bfloat16
    # a head with a forward of its own (accelerate's hooks under device_map) keeps it: it had been replaced, then deleted
    own = m.lm_head.forward
    m.lm_head.forward = lambda x: own(x)
    res = logprobs(m, smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant:")
    assert "forward" in vars(m.lm_head) and res.manifest["lm_head_dtype"] == "bfloat16"


def test_plain_templates(smol_tokenizer):
    # a {response} slot: exactly scan's prefix (the space before the slot belongs to the answer)
    fmt = "User: {prompt}\nAssistant: {response}"
    ids, info = prompt_ids(smol_tokenizer, PROMPT, template=fmt)
    assert info["kind"] == "plain_prefix"
    assert tuple(ids) == build_template(smol_tokenizer, PROMPT, template=fmt).prefix_ids
    # no slot: the text verbatim, which here is the same prefix
    ids2, info2 = prompt_ids(smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant:")
    assert info2["kind"] == "plain_text" and ids2 == ids
    assert info2["prefix_text"].endswith("Assistant:")
    with pytest.warns(UserWarning, match="whitespace"):
        ids3, _ = prompt_ids(smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant: ")
    assert len(ids3) == len(ids) + 1  # a lone space token
    with pytest.raises(UserError, match="prompt"):
        prompt_ids(smol_tokenizer, PROMPT, template="Assistant:")
    # a mistyped placeholder was kept as literal text in a format without {response} (scan's refused it)
    with pytest.raises(UserError, match=r"placeholder \{sytem\}"):
        prompt_ids(smol_tokenizer, PROMPT, template="{sytem}\nUser: {prompt}\nAssistant:")
    with pytest.raises(UserError, match="empty"):
        prompt_ids(smol_tokenizer, "  ")


def test_raw_prompt_for_base_tokenizer(tiny_lm, smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = None
    ids, info = prompt_ids(tok, PROMPT)
    assert info["kind"] == "raw_prompt" and ids == tok(PROMPT)["input_ids"]
    res = logprobs(tiny_lm, tok, PROMPT, token_ids="100:200")
    np.testing.assert_allclose(res.scores, hf_ref(tiny_lm, ids)[100:200].numpy(), atol=1e-5, rtol=0)


def test_output_format_like_scan(tiny_lm, smol_tokenizer, tmp_path):
    res = logprobs(tiny_lm, smol_tokenizer, PROMPT, exclude_special=True)
    assert not set(smol_tokenizer.all_special_ids) & set(res.token_ids.tolist())
    p = res.to_parquet(tmp_path / "lp.parquet")
    df = pd.read_parquet(p)
    assert list(df.columns) == ["token_id", "token", "text", "score", "rank"]
    assert df["rank"].min() == 1 and df.loc[df["score"].idxmax(), "rank"] == 1
    man = json.loads((tmp_path / "lp.parquet.json").read_text())
    assert man["head"] == "next_token_logprob" and man["prompt"] == PROMPT


def test_cli_logprobs(tmp_path, smol_tokenizer, capsys):
    d = tmp_path / "tiny-lm"
    m = T.tiny("llama", "causal_lm", seed=1)
    m.save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    out = tmp_path / "o.parquet"
    rc = main(["logprobs", str(d), "--prompt", PROMPT, "--out", str(out), "--top", "3"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_parquet(out)
    assert len(df) == T.VOCAB
    ref = hf_ref(m, prompt_ids(smol_tokenizer, PROMPT)[0])
    np.testing.assert_allclose(df.sort_values("token_id")["score"].to_numpy(), ref.numpy(), atol=1e-5, rtol=0)
    assert "top 3" in capsys.readouterr().out
    # a shell passes "\n" as two characters: the CLI unescapes it in a plain --template
    rc = main(["logprobs", str(d), "--template", r"User: {prompt}\nAssistant:", "--token-ids", "0:10",
               "--out", str(tmp_path / "t.parquet"), "--top", "0"])
    assert rc == 0
    man = json.loads((tmp_path / "t.parquet.json").read_text())
    assert man["template"]["format"] == "User: {prompt}\nAssistant:"
    assert man["template"]["prefix_ids"] == prompt_ids(smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant:")[0]
    rc = main(["logprobs", str(d), "--out", str(out)])  # exists, no --overwrite
    assert rc == 2 and "already exists" in capsys.readouterr().err
    rc = main(["logprobs", str(d), "--template", "Assistant:", "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "{prompt}" in err


def test_real_smollm2_matches_hf(smollm2):
    res = logprobs(smollm2.model, smollm2.tokenizer, PROMPT, token_ids=SUBSET)
    ids = res.manifest["template"]["prefix_ids"]
    assert tuple(ids) == build_template(smollm2.tokenizer, PROMPT).prefix_ids  # same prefix as scan
    ref = hf_ref(smollm2.model, ids)[SUBSET]
    np.testing.assert_allclose(res.scores, ref.numpy(), atol=2e-5, rtol=1e-5)
    # and read from a forward over prompt + candidate
    cands = sorted([SUBSET[5], SUBSET[-1], 5195])
    with torch.no_grad():
        full = smollm2.model(torch.tensor([ids + [c] for c in cands])).logits
    want = torch.log_softmax(full[:, len(ids) - 1].float(), -1)[torch.arange(3), torch.tensor(cands)]
    got = logprobs(smollm2.model, smollm2.tokenizer, PROMPT, token_ids=cands).scores
    np.testing.assert_allclose(got, want.numpy(), atol=2e-5, rtol=1e-5)


def test_logprobs_say_what_score_is(tmp_path, smol_tokenizer, capsys):
    """Issue 51 item 5: `rmfast logprobs` wrote no score_meaning (scan does): its manifest, its Parquet's schema
    metadata and the printed table now say what `score` is."""
    from rmfast.io import read_provenance
    from rmfast.scoring.plan import score_meaning

    d = tmp_path / "tiny-lm"
    T.tiny("llama", "causal_lm", seed=1).save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    out = tmp_path / "o.parquet"
    rc = main(["logprobs", str(d), "--prompt", PROMPT, "--token-ids", "0:20", "--out", str(out), "--top", "3"])
    assert rc == 0, capsys.readouterr().err
    want = score_meaning("next_token_logprob")
    assert want.startswith("log p(first response token | prompt side)") and "nats" in want
    assert json.loads((tmp_path / "o.parquet.json").read_text())["score_meaning"] == want
    assert read_provenance(out)["score_meaning"] == want
    assert f"score: {want}" in capsys.readouterr().out


def test_nan_log_probabilities_are_counted_and_said(smol_tokenizer):
    """An LM head with a NaN row makes every log-probability NaN (the softmax's sum): `rmfast logprobs` printed a
    top table of NaN, exit 0, with nothing said and no n_nonfinite; it is now one warning, as a scan's."""
    m = T.tiny("llama", "causal_lm", seed=1)
    with torch.no_grad():
        m.lm_head.weight[7] = float("nan")
    with pytest.warns(UserWarning, match=r"12 of 12 scores came out NaN or infinite \(token ids 0, 1, 2"):
        res = logprobs(m, smol_tokenizer, PROMPT, token_ids="0:12")
    assert res.manifest["n_nonfinite"] == 12 and np.isnan(res.scores).all()


def test_a_tokenizer_bigger_than_the_model_is_one_line(smol_tokenizer, capsys, tmp_path):
    """A model of 1,000 ids with SmolLM2's tokenizer: logprobs, and a scan, ended in an IndexError from inside the
    embedding (the size check came after the forward)."""
    m = T.tiny("llama", "causal_lm", seed=1, vocab=1000)
    with pytest.raises(UserError, match=r"go up to id \d+, but the model embeds only ids 0..999: the tokenizer is not"):
        logprobs(m, smol_tokenizer, PROMPT, token_ids="0:100")
    from rmfast.scoring.pipeline import scan

    with pytest.raises(UserError, match="the model embeds only ids 0..999"):
        scan(m, smol_tokenizer, PROMPT, token_ids="0:100", head="logprob", progress=False)
