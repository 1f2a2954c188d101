"""The shared-prompt engine against the plain-HF reference (full templated sequence per row).

fp32: elementwise with a tight tolerance over the FULL 49,152-token vocabulary of the real
SmolLM2 tokenizer, one tiny random model per architecture. bf16: by rank agreement.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from rmfast.fast.engine import Engine
from rmfast.scoring.hf_path import hf_scores
from rmfast.template import build_template

import tiny_models as T
from tiny_models import small

ARCHS = list(T.ARCHS)
FP32_ATOL = 2e-5  # scores are O(0.01–1); float32 reassociation noise is ~1e-6


@pytest.fixture(scope="module")
def short_tmpl(smol_tokenizer):
    # A short prompt keeps the full-vocabulary reference affordable (~20 prefix tokens), still
    # longer than the tiny models' sliding windows (8), so windows shorter than the prompt are exercised.
    return build_template(smol_tokenizer, "Greatest thing?", system="Be brief.")


@pytest.mark.parametrize("arch", ARCHS)
def test_full_vocab_fp32_matches_reference(arch, short_tmpl):
    model = small(arch)
    assert len(short_tmpl.prefix_ids) > 8  # the window (8) is shorter than the prompt
    ids = torch.arange(T.VOCAB)
    fast = Engine(model, short_tmpl, head="score", head_index=1).score(ids[:, None])
    ref = hf_scores(model, short_tmpl, ids[:, None].tolist(), head="score", head_index=1, batch_size=8192)
    assert ref.std() > 1e-3, "degenerate model: scores barely vary"
    torch.testing.assert_close(fast, ref, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "gemma2", "gemma3", "mistral"])
@pytest.mark.parametrize("head", ["score", "logprob"])
def test_long_prompt_flash_form_matches_reference(arch, head, smol_tokenizer):
    """A prompt of >= FLASH_MIN_PROMPT tokens: the prompt pass and the rows' pass take the fused flash form
    on CPU (Gemma 2's softcap and windows shorter than the prompt keep the reference form), and still
    equal the plain-HF forward of each whole sequence in fp32."""
    from rmfast.fast import ops

    model = T.tiny(arch, "classifier" if head == "score" else "causal_lm")
    tmpl = build_template(smol_tokenizer, " ".join(["the river runs by the old mill"] * 45))
    assert len(tmpl.prefix_ids) >= ops.FLASH_MIN_PROMPT
    calls = []
    real = ops.cpu_flash.shared_prefix_attention_flash
    ops.cpu_flash.shared_prefix_attention_flash = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        resp = torch.randint(0, T.VOCAB, (24, 3), generator=torch.Generator().manual_seed(3))
        fast = Engine(model, tmpl, head=head).score(resp)
    finally:
        ops.cpu_flash.shared_prefix_attention_flash = real
    ref = hf_scores(model, tmpl, resp.tolist(), head=head)
    assert ref.std() > 1e-4
    torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-5)
    assert bool(calls) == (arch not in ("gemma2", "mistral"))  # no softcap; Mistral's window (16) < the prompt


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_long_rows_of_a_short_prompt_take_the_flash_form(arch, short_tmpl):
    """Rows of >= FLASH_MIN_PROMPT tokens take the flash form whatever the prompt's length (their own causal part
    was the written-out block: 2.3x slower for a 1,024-token response, benchmarks/long_responses.py), and still equal
    the plain-HF forward of each whole sequence in fp32; rows shorter keep the bmm form; a softcap (Gemma 2) keeps the
    reference form at any length."""
    from rmfast.fast import ops

    model = T.tiny(arch)
    P = len(short_tmpl.prefix_ids)
    assert P < ops.FLASH_MIN_PROMPT
    calls = []
    real = ops.cpu_flash.shared_prefix_attention_flash
    ops.cpu_flash.shared_prefix_attention_flash = lambda *a, **k: calls.append(a[3].shape[2]) or real(*a, **k)
    try:
        g = torch.Generator().manual_seed(5)
        for n in (ops.FLASH_MIN_PROMPT - 40, ops.FLASH_MIN_PROMPT + 20):
            resp = torch.randint(3, T.VOCAB, (2, n), generator=g)
            got = Engine(model, short_tmpl, head="score").score(resp)
            ref = hf_scores(model, short_tmpl, resp.tolist(), head="score")
            torch.testing.assert_close(got, ref, atol=5e-5, rtol=1e-5)
    finally:
        ops.cpu_flash.shared_prefix_attention_flash = real
    long_rows = [S for S in calls if S >= ops.FLASH_MIN_PROMPT]
    assert len(long_rows) == len(calls)  # the short rows: bmm
    assert bool(calls) == (arch != "gemma2")  # the softcap: the reference form


@pytest.mark.parametrize("arch", ARCHS)
def test_logprob_head_matches_reference(arch, tmpl):
    model = T.tiny(arch, "causal_lm")
    ids = torch.randint(0, T.VOCAB, (300,), generator=torch.Generator().manual_seed(1))
    eng = Engine(model, tmpl, head="logprob")
    fast = eng.score(ids[:, None])
    ref = hf_scores(model, tmpl, ids[:, None].tolist(), head="logprob")
    torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3", "qwen3", "phi3"])
@pytest.mark.parametrize("head", ["score", "logprob"])
def test_multi_token_responses(arch, head, tmpl):
    model = T.tiny(arch, "classifier" if head == "score" else "causal_lm")
    resp = torch.randint(0, T.VOCAB, (40, 5), generator=torch.Generator().manual_seed(2))
    fast = Engine(model, tmpl, head=head).score(resp)
    ref = hf_scores(model, tmpl, resp.tolist(), head=head)
    torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-5)


#: 1,024 ids across the vocabulary: each arch's bf16 HF baseline is most of these tests' time where bf16 is
#: emulated (3,072 ids took 8-10 s an arch on an AVX2-only EPYC); the Spearman and top-50 margins were alike
BF16_IDS = torch.arange(0, T.VOCAB, 48)
_BF16_BASELINES: dict = {}


def bf16_baseline(arch, tmpl):
    """(fp32 truth, bf16 HF scores) over BF16_IDS for the tiny ``arch``: computed once per module, since the eager
    and the compiled bf16 tests judge against the same two (the bf16 HF forward is most of their cost on CPUs
    that emulate bf16)."""
    key = (arch, tuple(tmpl.prefix_ids), tuple(tmpl.suffix_ids))
    if key not in _BF16_BASELINES:
        model = T.tiny(arch)
        rows = BF16_IDS[:, None].tolist()
        truth = hf_scores(model, tmpl, rows, head="score", batch_size=4096).numpy()
        ref = hf_scores(model.to(torch.bfloat16), tmpl, rows, head="score", batch_size=4096).numpy()
        _BF16_BASELINES[key] = (truth, ref)
    return _BF16_BASELINES[key]


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_rank_agreement(arch, tmpl):
    """bf16 fast path ranks candidates as well as bf16 HF does, judged against fp32 truth."""
    truth, ref = bf16_baseline(arch, tmpl)
    model = T.tiny(arch).to(torch.bfloat16)
    fast = Engine(model, tmpl, head="score").score(BF16_IDS[:, None]).numpy()
    rho_fast = stats.spearmanr(fast, truth).statistic
    rho_ref = stats.spearmanr(ref, truth).statistic
    assert rho_fast > rho_ref - 0.01, (rho_fast, rho_ref)
    top_t = set(np.argsort(-truth)[:50])
    assert len(set(np.argsort(-fast)[:50]) & top_t) >= len(set(np.argsort(-ref)[:50]) & top_t) - 5


def test_prefix_kv_is_one_shared_copy(tmpl):
    model = T.tiny("llama")
    eng = Engine(model, tmpl, head="score")
    P = len(tmpl.prefix_ids)
    for k, v in eng.kv:
        assert k.shape == (model.config.num_key_value_heads, P, model.config.head_dim)
        assert v.shape == k.shape


@pytest.mark.parametrize("arch,head", [("llama", "score"), ("gemma2", "logprob"), ("gemma3", "score"), ("qwen3", "logprob"),
                                       ("phi3", "score")])
def test_engine_on_triton_kernels_interpreted(arch, head, short_tmpl, monkeypatch):
    """The CUDA path's kernels (run by the Triton interpreter on CPU) inside the whole engine."""
    pytest.importorskip("triton")
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton imported before TRITON_INTERPRET=1 was set")
    model = small(arch, "classifier" if head == "score" else "causal_lm")
    ids = torch.arange(1000, 49152, 1531)[:, None]  # 32 ids
    ref = hf_scores(model, short_tmpl, ids.tolist(), head=head)
    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    fast = Engine(model, short_tmpl, head=head).score(ids)
    torch.testing.assert_close(fast, ref, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rows_of_several_prompts_on_triton_kernels_interpreted(arch, smol_tokenizer, monkeypatch):
    """The CUDA path of a batch holding several prompts' ragged rows (the scorer's waves): each prompt's
    Triton attention call on its slice of rows, per-row RoPE, equal to each row scored alone."""
    pytest.importorskip("triton")
    import os

    from rmfast.fast.engine import score_prompts

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton imported before TRITON_INTERPRET=1 was set")
    model = small(arch)
    tmpls = [build_template(smol_tokenizer, p) for p in ("Hi", "Greatest thing ever, in one word?")]
    g = torch.Generator().manual_seed(4)
    resp = [torch.randint(5, T.VOCAB, (b, 4), generator=g) for b in (2, 3)]
    lens = [torch.tensor([4, 2]), torch.tensor([1, 4, 3])]
    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    e0 = Engine(model, tmpls[0], head="score")
    engs = [e0, Engine(model, tmpls[1], head="score", layers=e0.layers)]
    got = score_prompts(engs, resp, lens)
    alone = torch.stack([e.score(r[i : i + 1, : int(n[i])])[0] for e, r, n in zip(engs, resp, lens) for i in range(len(n))])
    torch.testing.assert_close(got, alone, atol=5e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------
# The compiled CPU layer (Engine(compile=True): torch.compile over rmfast.fast.layer.decoder_layer)
# ----------------------------------------------------------------------------------------

def _compiled(model, tmpl, head):
    eng = Engine(model, tmpl, head=head, compile=True)
    assert eng.compile, "the compiled path should serve every fast-path architecture"
    return eng


@pytest.mark.compiles
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_fp32_matches_reference(arch, short_tmpl):
    """Both heads, every architecture (windows shorter than the prompt, softcaps, q/k norms, GQA)."""
    ids = torch.arange(7, T.VOCAB, 61)[:, None]  # 806 ids across the vocabulary
    for head, kind in (("score", "classifier"), ("logprob", "causal_lm")):
        model = small(arch, kind)
        eng = _compiled(model, short_tmpl, head)
        fast = eng.score(ids)
        assert eng._compile_checked and eng.compile  # it really ran compiled, no silent fallback
        ref = hf_scores(model, short_tmpl, ids.tolist(), head=head, head_index=0 if head == "logprob" else 0)
        torch.testing.assert_close(fast, ref, atol=FP32_ATOL if head == "score" else 5e-5, rtol=0 if head == "score" else 1e-5)


@pytest.mark.compiles
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_compiled_multi_token_and_tail_batches(arch, tmpl):
    """Several suffix lengths in one engine (one graph each) and short batches padded to the compiled one."""
    model = T.tiny(arch)
    eng = _compiled(model, tmpl, "score")
    for n in (1, 4):
        resp = torch.randint(0, T.VOCAB, (64, n), generator=torch.Generator().manual_seed(n))
        full = eng.score(resp)
        ref = hf_scores(model, tmpl, resp.tolist(), head="score")
        torch.testing.assert_close(full, ref, atol=5e-5, rtol=1e-5)
        tail = eng.score(resp[:10])  # padded to the 64-row compiled batch (no new graph)
        torch.testing.assert_close(tail, full[:10], atol=1e-6, rtol=0)  # only the head's GEMM differs (M)


@pytest.mark.compiles
@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen3"])
def test_compiled_bf16_rank_agreement(arch, tmpl):
    """bf16 compiled path (fp32 inside each fused loop, one rounding) ranks as well as bf16 HF does."""
    truth, ref = bf16_baseline(arch, tmpl)
    model = T.tiny(arch).to(torch.bfloat16)
    fast = _compiled(model, tmpl, "score").score(BF16_IDS[:, None]).numpy()
    rho_fast = stats.spearmanr(fast, truth).statistic
    rho_ref = stats.spearmanr(ref, truth).statistic
    assert rho_fast > rho_ref - 0.01, (rho_fast, rho_ref)


def test_compile_failure_falls_back_to_eager(tmpl, monkeypatch):
    """Where torch.compile cannot work (no C++ compiler...), one warning and the eager numbers."""
    model = T.tiny("llama")
    ids = torch.arange(100, 140)[:, None]
    want = Engine(model, tmpl, head="score").score(ids)

    def broken(fn, **kw):
        def f(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return f

    monkeypatch.setattr(torch, "compile", broken)
    eng = Engine(model, tmpl, head="score", compile=True)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        got = eng.score(ids)
    assert not eng.compile
    assert torch.equal(got, want)


def test_flat_lm_head_nests(tmpl):
    """The benchmark wraps hf_scores (which flattens the LM head itself) in flat_lm_head:
    nested, the head must still come back as (B, k, V) with the same numbers."""
    from rmfast.scoring.hf_path import flat_lm_head

    model = T.tiny("gemma3", "causal_lm")
    ids = torch.randint(0, T.VOCAB, (3, 9), generator=torch.Generator().manual_seed(0))
    want = model(input_ids=ids, logits_to_keep=2).logits
    with flat_lm_head(model), flat_lm_head(model):
        got = model(input_ids=ids, logits_to_keep=2).logits
    assert got.shape == want.shape == (3, 2, T.VOCAB)
    torch.testing.assert_close(got, want)
    resp = ids[:, :1].tolist()
    with flat_lm_head(model):
        nested = hf_scores(model, tmpl, resp, head="logprob")
    torch.testing.assert_close(nested, hf_scores(model, tmpl, resp, head="logprob"))


def test_blockdiag_overhead_grows_with_the_prompt(smol_tokenizer):
    """scan's auto mode skips the compiled layer when the block-diagonal prompt attention would cost
    more than MAX_BLOCKDIAG_EXTRA of a layer (H x the prompt-attention FLOPs)."""
    from rmfast.fast.engine import MAX_BLOCKDIAG_EXTRA

    model = T.tiny("llama")
    short = Engine(model, build_template(smol_tokenizer, "Hi?"), head="score")
    long = Engine(model, build_template(smol_tokenizer, "word " * 300), head="score")
    P_s, P_l = len(short.template.prefix_ids), len(long.template.prefix_ids)
    assert long.blockdiag_overhead() == pytest.approx(short.blockdiag_overhead() * P_l / P_s)
    assert long.blockdiag_overhead() > MAX_BLOCKDIAG_EXTRA


# ----------------------------------------------------------------------------------------
# The one decoder layer (rmfast.fast.layer.decoder_layer): every attention form and weight layout
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "qwen3", "phi3"])
@pytest.mark.parametrize("packed,fuse", [(True, False), (False, True), (False, False)])
def test_attention_forms_and_weight_layouts_match_reference(arch, packed, fuse, short_tmpl, monkeypatch):
    """Packed (block-diagonal) or stored prompt K/V (the CUDA form's twin), fused or separate q|k|v
    and gate|up (CUDA's default): all the same layer, all exact in fp32."""
    # the eager CPU engine runs the block-diagonal form only when asked (the compiled layer's form)
    model = small(arch)
    ids = torch.arange(11, T.VOCAB, 389)[:, None]
    eng = Engine(model, short_tmpl, head="score", fuse=fuse, attention="block-diagonal" if packed else None)
    fast = eng.score(ids)
    assert eng._use_packed(fast) == packed and (len(eng.layers[0][0].w_qkv) == 1) == fuse
    ref = hf_scores(model, short_tmpl, ids.tolist(), head="score")
    torch.testing.assert_close(fast, ref, atol=FP32_ATOL, rtol=0)


def test_length_dependent_rope_is_refused_beyond_its_limit(smol_tokenizer):
    """LongRoPE (Phi-3) switches every position to its long factors once a sequence passes
    original_max_position_embeddings (256 here): the shared prompt cannot follow, so one clear error."""
    from rmfast.errors import UserError

    model = small("phi3")
    assert Engine(model, build_template(smol_tokenizer, "word " * 200), head="score").score(torch.tensor([[5]])).shape == (1,)
    with pytest.raises(UserError, match="longer than 256 tokens"):
        Engine(model, build_template(smol_tokenizer, "word " * 260), head="score")


def test_qwen3_tied_lm_head_and_head_dim(tmpl):
    """The Qwen3 replica's features are really there: head_dim != hidden/heads, q/k norms, per-layer
    windows (full, then sliding), o_proj bias, the LM head tied to the embeddings."""
    from rmfast.fast.arch import arch_spec

    model = T.tiny("qwen3", "causal_lm")
    sp = arch_spec(model)
    assert sp.head_dim * sp.n_heads != model.config.hidden_size
    assert all(L.q_norm is not None for L in sp.layers) and not sp.gemma_norm
    assert [L.window for L in sp.layers] == [None, 16, 16] and sp.layers[0].o_proj.bias is not None
    assert sp.lm_head_weight.data_ptr() == sp.embed.weight.data_ptr()


def test_mlp_bias_and_unknown_activation(short_tmpl):
    """MLP biases are part of the layer; an activation the layer has no form for leaves the fast path."""
    import transformers as tf

    from rmfast.fast.arch import arch_spec

    cfg = tf.LlamaConfig(**{**T.COMMON, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2},
                         mlp_bias=True, num_labels=1, pad_token_id=2)
    cfg._attn_implementation = "eager"
    model = tf.LlamaForSequenceClassification(cfg)
    T._reinit(model, 0)
    model.eval().requires_grad_(False)
    ids = torch.arange(5, T.VOCAB, 1021)[:, None]
    fast = Engine(model, short_tmpl, head="score").score(ids)
    torch.testing.assert_close(fast, hf_scores(model, short_tmpl, ids.tolist(), head="score"), atol=FP32_ATOL, rtol=0)
    cfg.hidden_act = "gelu_new"  # HF's explicit tanh formula: not bit-identical to the layer's forms
    assert arch_spec(model) is None


def test_compiled_layer_rounds_where_eager_does(tmpl):
    """bf16: the compiled layer (emulate_precision_casts) agrees with the same function run eagerly in
    all but a few elements (fp32 reduction order inside attention); without keeping eager's rounding
    points, about half of a layer's outputs differed."""
    from rmfast.fast.engine import _own_copy
    from rmfast.fast.layer import compile_layer, decoder_layer

    model = T.tiny("llama", dtype=torch.bfloat16)
    eng = Engine(model, tmpl, head="score", compile=True)
    ids = torch.arange(0, T.VOCAB, 97)[:256, None]
    h = eng.spec.embed(torch.cat([ids, eng.suffix.expand(len(ids), -1)], 1))  # (B, S, Dm)
    S = h.shape[1]
    rope = eng.spec.rope(torch.arange(eng.P, eng.P + S), h)
    w, c = eng.layers[0]
    args = (h, w, *rope[c.rope_key], eng._prompts(S, h)[0], c, S)
    want = decoder_layer(*args)
    got = compile_layer(_own_copy(decoder_layer))(*args)
    assert got.dtype == torch.bfloat16
    assert (got != want).float().mean().item() < 0.01


def test_every_projection_reads_rows_of_their_own(tmpl, monkeypatch):
    """The q|k|v and gate|up GEMMs read contiguous inputs, the last layer's queries included (only its read
    positions get queries: a strided view of the rows before the fix, for which cuBLAS chose a 512x8-tile
    kernel on the H100, 69 ms of a 780 ms scan batch: gpu_h100_2026-11-27_e). Rows of 1 + suffix tokens, so the
    last layer's n_out < S; the scores are those of the unpatched engine."""
    import rmfast.fast.layer as layer

    model = T.tiny("llama", num_labels=1)
    ids = torch.arange(20, 36)[:, None]  # (16, 1) one-token responses
    for fuse in (False, True):  # separate projections (CUDA's plan: q's own GEMM) and fused (CPU's)
        want = Engine(model, tmpl, head="score", fuse=fuse).score(ids)
        seen, real = [], layer._linear
        monkeypatch.setattr(layer, "_linear", lambda x, *a: seen.append(x.is_contiguous()) or real(x, *a))
        got = Engine(model, tmpl, head="score", fuse=fuse).score(ids)
        monkeypatch.setattr(layer, "_linear", real)
        per_layer = 2 if fuse else 5
        assert len(tmpl.suffix_ids) >= 1 and len(seen) >= per_layer * model.config.num_hidden_layers and all(seen)
        assert torch.equal(got, want)
