"""The layer's elementwise kernels (rmfast.kernels.triton_elementwise): RMSNorm, RoPE and SiLU·up each as one
Triton kernel, against their torch twins (interpreted on CPU: small odd shapes, fp32 and fp16; bf16 on CUDA),
the layouts they refuse (the caller then runs the twin), and the engine with them on against off on tiny models
of every architecture. `make gpu-check` runs this file on a CUDA machine.
"""

from __future__ import annotations

import os

import torch

# triton.jit decides interpreted vs compiled kernels when triton is first imported (tests/conftest.py too)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import tiny_models as T  # noqa: E402

from rmfast.fast import ops  # noqa: E402
from rmfast.fast.engine import Engine, fused_elementwise  # noqa: E402
from rmfast.kernels import torch_twins as ref  # noqa: E402
from rmfast.template import build_template  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
SKIP = "" if importlib.util.find_spec("triton") else "triton is not installed"
if not SKIP:
    from rmfast.kernels import triton_elementwise as te

    if not CUDA and type(te._rmsnorm_kernel).__name__ != "InterpretedFunction":
        SKIP = "triton was imported before TRITON_INTERPRET=1 was set (see tests/conftest.py)"
requires_triton = pytest.mark.skipif(bool(SKIP), reason=SKIP or "-")
# the interpreter has no bf16: bf16 cases on CUDA only
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])

#: dtype -> (atol, rtol) of kernel vs twin. RMSNorm: fp32 sums in another order, then the same roundings (a
#: rounding boundary may fall the other way: 1 ulp). RoPE and SiLU·up: the same ops and roundings (fp32 maths may
#: contract a product into an FMA, and exp may differ in its last bit): 1 ulp.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _close(got, want, dtype):
    atol, rtol = TOL[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), atol=atol, rtol=rtol)


def _randn(*shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=DEVICE, dtype=dtype)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(1, 7), (3, 5, 40), (2, 1, 3, 96)])
def test_rmsnorm_kernel_matches_twin(shape, gemma, dtype):
    x = _randn(*shape, dtype=dtype, scale=3.0)
    w = _randn(shape[-1], dtype=dtype, seed=1, scale=0.5)
    got = te.rmsnorm_triton(x, w, 1e-6, gemma_style=gemma)
    _close(got, ref.rmsnorm(x, w, 1e-6, gemma_style=gemma), dtype)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape,n_out", [((1, 1, 7), 1), ((3, 5, 40), 5), ((3, 5, 40), 2), ((2, 4, 96), 1)])
def test_add_rmsnorm_kernel_matches_twin(shape, n_out, gemma, dtype):
    """h = r + a (exactly torch's add: the same rounding) and h's RMSNorm (the norm's tolerance), where r is the last
    n_out positions of a longer residual stream, as the layer passes it (a strided view, read as it is)."""
    B, S, N = shape
    h_full = _randn(B, S, N, dtype=dtype, scale=3.0)
    r = h_full[:, S - n_out:]
    a = _randn(B, n_out, N, dtype=dtype, seed=1, scale=2.0)
    w = _randn(N, dtype=dtype, seed=2, scale=0.5)
    h, y = te.add_rmsnorm_triton(r, a, w, 1e-6, gemma_style=gemma)
    want_h, want_y = ops.add_rmsnorm(r, a, w, 1e-6, gemma_style=gemma)
    assert h.is_contiguous() and y.is_contiguous()
    torch.testing.assert_close(h, want_h, atol=0, rtol=0)  # the add: bit-identical
    _close(y, want_y, dtype)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Dr", [16, 8])  # full, and partial rotary (Phi-4-mini: the rest passes through)
@pytest.mark.parametrize("per_row", [False, True])  # one table (S, Dr), or one per row (B, S, Dr)
def test_rope_kernel_matches_twin(Dr, per_row, dtype):
    B, S, n, D = 3, 5, 3, 16
    x = _randn(B, S, n, D, dtype=dtype, scale=2.0)
    ang = _randn(*((B, S, Dr) if per_row else (S, Dr)), dtype=torch.float32, seed=2, scale=3.0)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    _close(te.rope_triton(x, cos, sin), ref.rope(x, cos, sin), dtype)
    # the queries' table: the last rows of it (a strided view of the table)
    q = _randn(B, 2, n, D, dtype=dtype, seed=3)
    _close(te.rope_triton(q, cos[..., S - 2:, :], sin[..., S - 2:, :]), ref.rope(q, cos[..., S - 2:, :], sin[..., S - 2:, :]),
           dtype)


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Dr", [16, 8])
@pytest.mark.parametrize("per_row", [False, True])
def test_rope_of_queries_and_keys_in_one_launch_is_each_ones_rope(Dr, per_row, dtype):
    """rope_qk_triton (a layer's q and k at the same positions, one launch): each output bit-equal to its own
    rope_triton, with more query heads than key heads (GQA) and a strided key view (a slice of a wider output);
    None where the two differ in tokens, head dim or dtype (the caller ropes them one by one)."""
    B, S, D = 2, 5, 16
    q = _randn(B, S, 6, D, dtype=dtype, scale=2.0)
    kv = _randn(B, S, 4, D, dtype=dtype, seed=1, scale=2.0)
    k = kv[:, :, :2]  # (B, S, 2, D) read with the wider tensor's strides
    ang = _randn(*((B, S, Dr) if per_row else (S, Dr)), dtype=torch.float32, seed=2, scale=3.0)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    gq, gk = te.rope_qk_triton(q, k, cos, sin)
    assert torch.equal(gq, te.rope_triton(q, cos, sin)) and torch.equal(gk, te.rope_triton(k, cos, sin))
    _close(gk, ref.rope(k, cos, sin), dtype)
    assert te.rope_qk_triton(q[:, 3:], k, cos, sin) is None  # other token counts (the last layer's queries)
    other = k.float() if dtype != torch.float32 else k.half()
    assert te.rope_qk_triton(q, other, cos, sin) is None  # another dtype
    oq, ok = ops.rope_qk(q, other, cos, sin, triton=True)  # refused: each roped by itself
    assert torch.equal(oq, gq) and torch.equal(ok, ops.rope(other, cos, sin, triton=True))


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (1000,), (2, 2050), (3, 1, 5)])  # one block, several, a ragged last one; rows
def test_silu_mul_kernel_matches_twin(shape, dtype):
    g, u = _randn(*shape, dtype=dtype, scale=4.0), _randn(*shape, dtype=dtype, seed=1)
    _close(te.silu_mul_triton(g, u), torch.nn.functional.silu(g) * u, dtype)


@requires_triton
def test_layouts_the_kernels_do_not_read_fall_back_to_the_twin():
    """A layout a kernel cannot read gives None, and ops runs the twin there: the same values either way."""
    x = _randn(2, 4, 10, dtype=torch.float32)
    w = _randn(6, dtype=torch.float32, seed=1)
    cut = x[..., 2:8]  # a slice along the last dim: rows of 6 at a stride of 10, read as they are
    _close(te.rmsnorm_triton(cut, w, 1e-6, gemma_style=False), ref.rmsnorm(cut, w, 1e-6, gemma_style=False),
           torch.float32)
    tr = _randn(2, 6, 4, dtype=torch.float32).transpose(1, 2)  # (2, 4, 6), the last dim strided: no (rows, N) view
    assert te.rmsnorm_triton(tr, w, 1e-6, gemma_style=False) is None
    _close(ops.rmsnorm(tr, w, 1e-6, gemma_style=False, triton=True), ref.rmsnorm(tr, w, 1e-6, gemma_style=False),
           torch.float32)
    qkv = _randn(2, 3, 5, 8, dtype=torch.float32)
    view = qkv[:, :, :3]  # q|k heads of a fused projection: rows of 5 heads, 3 read
    ang = _randn(3, 8, dtype=torch.float32, seed=2)
    assert te.rope_triton(view, ang.cos(), ang.sin()) is not None  # head stride differs from D: read as it is
    assert te.rope_triton(qkv[:, 1:], ang[:2].cos(), ang[:2].sin()) is None  # batch stride != S x token stride
    _close(ops.rope(qkv[:, 1:], ang[:2].cos(), ang[:2].sin(), triton=True), ref.rope(qkv[:, 1:], ang[:2].cos(), ang[:2].sin()),
           torch.float32)
    r, a = _randn(3, 2, 6, dtype=torch.float32), _randn(2, 3, 6, dtype=torch.float32, seed=1).transpose(0, 1)
    assert te.add_rmsnorm_triton(r, a, w, 1e-6, gemma_style=False) is None  # a: (3, 2, 6) with no (rows, N) view
    assert te.add_rmsnorm_triton(r, a.contiguous().double(), w, 1e-6, gemma_style=False) is None  # dtypes differ
    h, y = ops.add_rmsnorm(r, a, w, 1e-6, gemma_style=False, triton=True)
    torch.testing.assert_close(h, r + a, atol=0, rtol=0)
    _close(y, ref.rmsnorm(r + a, w, 1e-6, gemma_style=False), torch.float32)
    g = _randn(4, 6, dtype=torch.float32)
    assert te.silu_mul_triton(g[:, ::2], g[:, 1::2]) is None  # every other column: no unit stride along N
    _close(ops.silu_mul(g[:, ::2], g[:, 1::2], triton=True), torch.nn.functional.silu(g[:, ::2]) * g[:, 1::2],
           torch.float32)
    heads = _randn(2, 3, 5, 8, dtype=torch.float32).transpose(1, 2)  # (2, 5, 3, 8): tokens and heads swapped
    assert te.rmsnorm_triton(heads, _randn(8, dtype=torch.float32), 1e-6, gemma_style=False) is None  # no (T, n, N) view


@requires_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernels_read_a_fused_projection_as_it_is(dtype):
    """The fused layout (q|k|v and gate|up as one GEMM each, :func:`rmfast.fast.layer.build_layers` with fuse):
    SiLU·up reads the two halves of the gate|up output, and the q/k norm the q|k heads of the q|k|v slab, as the
    strided views they are, with no copy, to the twin's values."""
    gu = _randn(2, 3, 2 * 37, dtype=dtype, scale=4.0)  # (B, S, 2I): gate then up, I odd
    g, u = gu[..., :37], gu[..., 37:]
    assert not g.is_contiguous()
    _close(te.silu_mul_triton(g, u), torch.nn.functional.silu(g) * u, dtype)
    H, Hkv, D = 4, 2, 16
    qkv = _randn(2, 3, H + 2 * Hkv, D, dtype=dtype, seed=1, scale=3.0)  # (B, S, H + 2Hkv, D)
    qk = qkv[:, :, : H + Hkv]  # (B, S, H + Hkv, D): rows of H + Hkv heads at the slab's token stride
    qn, kn = _randn(D, dtype=dtype, seed=2, scale=0.5), _randn(D, dtype=dtype, seed=3, scale=0.5)
    per_head = torch.cat([qn.expand(H, -1), kn.expand(Hkv, -1)])  # (H + Hkv, D): the layer's qk_norm
    for w in (qn, per_head):
        for gemma in (False, True):
            got = te.rmsnorm_triton(qk, w, 1e-6, gemma_style=gemma)
            assert got is not None and got.is_contiguous()
            _close(got, ref.rmsnorm(qk, w, 1e-6, gemma_style=gemma), dtype)
    assert te.rmsnorm_triton(qk, per_head[:3], 1e-6, gemma_style=False) is None  # weight rows != heads: the twin


def test_the_rule_and_the_plan_record_it():
    """Fused on CUDA with Triton where the layer runs eagerly; never on CPU or in a compiled layer; the plan says so."""
    from rmfast.scoring.decisions import decide
    from rmfast.scoring.options import ScoringOptions

    assert fused_elementwise(torch.device("cuda"), True, False)
    assert not fused_elementwise(torch.device("cuda"), True, True)
    assert not fused_elementwise(torch.device("cuda"), False, False)
    assert not fused_elementwise(torch.device("cpu"), True, False)
    model = T.tiny("llama").to(DEVICE)  # the plan decides for the model's device (on the H100 this was a CPU model)
    tmpl = build_template(T.chatml_tokenizer(), "Hi")
    d = decide(model, ScoringOptions(), "scorer", template=tmpl)
    assert d.reasons["elementwise"]["value"] == ("triton" if CUDA and not SKIP else "torch")
    assert d.elementwise == (d.reasons["elementwise"]["value"] == "triton")


#: the fused layout on the architectures whose kernels read it differently: Qwen3's q/k norms over the q|k slab
#: (per-head weights), Phi-3's stored-fused projections and partial rotary. (Gemma's norm style on the slab:
#: test_the_kernels_read_a_fused_projection_as_it_is; the suite's time is kept to what adds a case.)
FUSED_ARCHS = ("qwen3", "phi3")


@requires_triton
@pytest.mark.parametrize("arch,fuse", [(a, False) for a in T.ARCHS] + [(a, True) for a in FUSED_ARCHS],
                         ids=[a for a in T.ARCHS] + [f"{a}-fused" for a in FUSED_ARCHS])
def test_engine_with_fused_elementwise_equals_torch_ops(arch, fuse, monkeypatch):
    """Every architecture (Gemma's norms, Qwen3's q/k norms, Phi-3's partial rotary, biases, windows), in both weight
    layouts (CUDA's separate q/k/v and gate/up GEMMs; the fused ones, where the kernels read strided halves and
    heads of one GEMM's output): the engine with the kernels scores as with torch's ops, fp32, the prompt pass and a
    wave of ragged rows; and the kernels did run (not the twins they fall back to): every norm and RoPE of every
    layer, SiLU·up where the MLP is SiLU."""
    ran = {"rmsnorm": 0, "add_rmsnorm": 0, "rope": 0, "rope_qk": 0, "silu_mul": 0}
    for name in ran:
        fn = getattr(te, f"{name}_triton")

        def counted(*a, _fn=fn, _name=name, **k):
            y = _fn(*a, **k)
            ran[_name] += y is not None
            return y
        monkeypatch.setattr(te, f"{name}_triton", counted)
    tok = T.chatml_tokenizer()
    model = T.small(arch).to(DEVICE)  # 2 layers (a sliding and a full one where the model has both): the interpreter's time
    tmpl = build_template(tok, "The greatest thing ever, in one word?")
    assert len(tmpl.prefix_ids) > 8  # windows (8) shorter than the prompt
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, T.VOCAB, (3, 4), generator=g).to(DEVICE)
    lens = torch.tensor([4, 1, 3], device=DEVICE)
    for form in (None, "cascade"):  # the device's own form, and the cascade (its rows packed)
        off = Engine(model, tmpl, head="score", elementwise=False, attention=form, fuse=fuse)
        on = Engine(model, tmpl, head="score", elementwise=True, attention=form, fuse=fuse)
        assert {len(w.w_qkv) for w, _ in on.layers} == {1 if fuse else 3}
        assert {c.fused for _, c in on.layers} == {True} and {c.fused for _, c in off.layers} == {False}
        torch.testing.assert_close(on.kv[0][0], off.kv[0][0], atol=1e-5, rtol=1e-5)  # the prompt pass's keys
        torch.testing.assert_close(on.score_ragged(ids, lens), off.score_ragged(ids, lens), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(on.score(ids), off.score(ids), atol=2e-5, rtol=1e-5)
    n = len(on.layers)
    # 3 passes a form: prompt, ragged, plain; each layer's input norm alone, its MLP's with the residual add
    assert ran["rmsnorm"] >= 2 * 3 * n and ran["add_rmsnorm"] >= 2 * 3 * n
    assert ran["rope"] + 2 * ran["rope_qk"] >= 2 * 3 * n and (ran["rope_qk"] > 0) == (not fuse)  # q and k at once
    assert (ran["silu_mul"] >= 3 * n) == (on.layers[0][1].act == "silu")


@requires_triton
def test_the_kernels_compile_once_per_model(monkeypatch):
    """Another prompt (another length), other candidate counts and suffix lengths launch only the variants the
    first scan compiled: token counts, tokens per row and per-row table strides are not specialised on."""
    from test_prompt_wave import _launch_log

    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    log = _launch_log(monkeypatch)
    tok = T.chatml_tokenizer()
    model = T.tiny("llama").to(DEVICE)
    first = Engine(model, build_template(tok, "Hi"), head="score", elementwise=True, fuse=False)
    first.score(torch.randint(5, T.VOCAB, (32, 1)).to(DEVICE))
    names = {name for name, _ in log}
    assert {"_rmsnorm_kernel", "_add_rmsnorm_kernel", "_rope_kernel", "_rope_qk_kernel", "_silu_mul_kernel"} <= names, names
    seen = {key for _, key in log}
    log.clear()
    prompt = "What, in one word, is the greatest thing ever?"
    while len(build_template(tok, prompt).prefix_ids) % 16:  # a prompt pass of 16k tokens: Triton's favourite
        prompt += " Think."  # integer specialisation, which the first prompt's pass did not have
    second = Engine(model, build_template(tok, prompt), head="score", layers=first.layers)
    assert first.P % 16 and second.P % 16 == 0
    for n, k in ((5, 1), (17, 2), (1, 3)):
        second.score(torch.randint(5, T.VOCAB, (n, k)).to(DEVICE))
    new = {key for name, key in log if name in ("_rmsnorm_kernel", "_add_rmsnorm_kernel", "_rope_kernel",
                                                "_rope_qk_kernel", "_silu_mul_kernel")} - seen
    assert not new, f"{len(new)} new compiled variant(s): {sorted(new)[:2]}"
