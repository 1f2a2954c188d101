"""Kernels: torch references vs an independent naive computation, Triton kernels vs references.

Without CUDA the Triton kernels run in the Triton interpreter (numpy on CPU tensors): it is
slow and has no bf16, so interpreter cases use tiny shapes, fp32, and a few fp16 cases
(fp16 exercises the same reduced-precision rounding points as bf16).  bf16 cases run only
on CUDA.
"""

from __future__ import annotations

import os

import torch

# triton.jit chooses compiled vs interpreted kernels when a kernel is defined, and
# triton.language's own helpers are defined when triton is first imported: the interpreter
# flag must be set before anything imports triton.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

try:
    import rmfast  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import rmfast.kernels  # noqa: E402
from rmfast.kernels import torch_twins as ref  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HAVE_TRITON = importlib.util.find_spec("triton") is not None

# (kernel, dtype) -> (atol, rtol).  "naive" rows bound the reference against the naive
# float64 oracle; the others bound Triton against the reference in the same dtype.
TOLERANCES: dict[tuple[str, torch.dtype], tuple[float, float]] = {
    # The reference soft-maxes in fp32 even for fp64 inputs (as HF does), hence not ~1e-12.
    ("naive_attention", torch.float64): (2e-6, 2e-6),
    ("naive_attention", torch.float32): (2e-5, 2e-5),
    ("naive_norm_head", torch.float64): (1e-5, 1e-6),  # fp32 output by contract
    ("naive_logprob", torch.float64): (1e-5, 1e-6),  # fp32 accumulators by contract
    ("naive_logprob", torch.float32): (2e-5, 2e-5),
    ("attention", torch.float32): (2e-5, 2e-5),
    ("attention", torch.float16): (4e-3, 4e-3),  # ~2 fp16 ulps at 1
    ("attention", torch.bfloat16): (3e-2, 3e-2),  # probs rounded at different points
    ("norm_head", torch.float32): (2e-5, 2e-5),
    ("norm_head", torch.float16): (4e-3, 4e-3),
    ("norm_head", torch.bfloat16): (2e-2, 1e-2),  # 1 bf16 ulp of the rounded head output
    ("logprob", torch.float32): (3e-5, 2e-5),
    ("logprob", torch.float16): (3e-3, 1e-3),
    ("logprob", torch.bfloat16): (3e-2, 1e-2),  # logits rounded to bf16 can flip by 1 ulp
    # CPU twins (block-diagonal attention, chunked compiled-form log-probs) vs the reference in bf16:
    ("cpu_attention", torch.bfloat16): (3e-2, 3e-2),  # prompt and suffix parts rounded apart
    ("cpu_flash", torch.bfloat16): (3e-2, 3e-2),  # fp32 soft-max tiles vs scores rounded to bf16 (reference)
    ("cpu_logprob", torch.bfloat16): (3e-2, 1e-2),
}


def assert_close(actual, expected, kernel: str, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCES[(kernel, dtype)]
    # Compare in float64 so neither side is rounded by the comparison itself.
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=atol, rtol=rtol)


SKIP_TRITON = "" if HAVE_TRITON else "triton is not installed"
if HAVE_TRITON:
    from rmfast.kernels import triton_attention, triton_logprob, triton_norm_head

    # If triton was imported before the flag was set (by another test module, or with
    # TRITON_INTERPRET=0 in the environment), even triton.language's own helpers were built
    # for the GPU and nothing here can rebuild them: skip rather than fail obscurely.
    if not CUDA and type(triton_attention._shared_prefix_attn_kernel).__name__ != "InterpretedFunction":
        SKIP_TRITON = "triton was imported before TRITON_INTERPRET=1 was set (see tests/conftest.py)"

requires_triton = pytest.mark.skipif(bool(SKIP_TRITON), reason=SKIP_TRITON or "-")
requires_cuda = pytest.mark.skipif(not CUDA or bool(SKIP_TRITON),
                                   reason="bf16 needs CUDA (no bf16 in the interpreter)")


# ----------------------------------------------------------------------------------------
# Inputs and naive oracles
# ----------------------------------------------------------------------------------------

def attn_inputs(B, H, Hkv, D, P, S, Sq, dtype, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(device=device, dtype=dtype)

    # q scaled up so scores reach softcap territory and the softmax is not flat.
    return (r(B, H, Sq, D, s=2.0), r(Hkv, P, D), r(Hkv, P, D), r(B, Hkv, S, D), r(B, Hkv, S, D))


def naive_attention(q, kp, vp, ks, vs, *, scale, softcap=None, window=None):
    """Explicit full key set per row: expand the prefix, concatenate, full mask, plain softmax.

    float64 throughout, head-by-head loops, no shared code with the reference.
    """
    B, H, Sq, D = q.shape
    Hkv, P, _ = kp.shape
    S = ks.shape[2]
    G = H // Hkv
    out = torch.empty(B, Sq, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kvh = h // G
            keys = torch.cat([kp[kvh], ks[b, kvh]], 0).double().cpu()  # (P+S, D)
            vals = torch.cat([vp[kvh], vs[b, kvh]], 0).double().cpu()  # (P+S, D)
            for i in range(Sq):
                qpos = P + S - Sq + i
                s = (keys @ q[b, h, i].double().cpu()) * scale  # (P+S,)
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                for j in range(P + S):
                    if j > qpos or (window is not None and j <= qpos - window):
                        s[j] = float("-inf")
                p = torch.exp(s - s.max())
                out[b, i, h] = (p / p.sum()) @ vals
    return out


def naive_rmsnorm(x, w, eps, gemma_style):
    x = x.double().cpu()
    w = w.double().cpu()
    xn = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return xn * (1.0 + w) if gemma_style else xn * w


def naive_logprob(x, w, eps, lm, targets, gemma_style, final_softcap):
    logits = naive_rmsnorm(x, w, eps, gemma_style) @ lm.double().cpu().T  # (N, V), fine at test sizes
    if final_softcap is not None:
        logits = final_softcap * torch.tanh(logits / final_softcap)
    lse = torch.logsumexp(logits, -1)
    return logits[torch.arange(len(targets)), targets.cpu()] - lse


def head_inputs(N, D, K, V, dtype, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(device=device, dtype=dtype)

    x = r(N, D, s=3.0)
    w = r(D, s=0.5) + 1.0
    hw = r(K, D, s=0.3)
    hb = r(K)
    lm = r(V, D, s=0.3)
    targets = torch.randint(0, V, (N,), generator=g).to(device)
    return x, w, hw, hb, lm, targets


# Attention configs: (B, H, Hkv, D, P, S, Sq, softcap, window).  Chosen to cover every value
# of every axis and the interesting pairs (GQA x window, softcap x P=0, Sq<S x window...)
# without a full cartesian product, which the interpreter could not run in time.
ATTN_CASES = [
    (1, 4, 4, 16, 0, 1, 1, None, None),   # no prefix, single token
    (3, 4, 4, 16, 5, 3, 3, None, None),   # MHA
    (3, 4, 2, 24, 13, 3, 3, None, None),  # GQA G=2, odd D
    (3, 6, 1, 24, 13, 3, 1, 50.0, None),  # MQA G=6, Sq<S, mild softcap
    (1, 6, 1, 16, 0, 3, 3, 5.0, None),    # P=0 + strong softcap
    (3, 4, 2, 64, 13, 3, 3, 5.0, 4),      # window shorter than the prompt
    (3, 4, 2, 16, 5, 3, 1, None, 2),      # window shorter than the suffix, Sq<S
    (3, 6, 1, 24, 13, 1, 1, None, 100),   # window longer than P+S
    (1, 4, 4, 64, 5, 3, 3, 50.0, 6),      # window == P+S-ish with softcap
    (3, 4, 2, 24, 0, 3, 3, None, 2),      # P=0 with window
    (1, 4, 2, 16, 40, 1, 1, 5.0, 7),      # prefix spans several tiles, window skips tiles
    (3, 6, 1, 16, 13, 3, 1, None, 1),     # window 1: each query sees only itself
]


def _ids(cases):
    return ["B{}-H{}x{}-D{}-P{}-S{}-Sq{}-cap{}-win{}".format(*c) for c in cases]


# ----------------------------------------------------------------------------------------
# The references against the naive oracles (no triton needed)
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids(ATTN_CASES))
def test_reference_attention_matches_naive(case, dtype):
    B, H, Hkv, D, P, S, Sq, softcap, window = case
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, dtype, device="cpu")
    got = ref.shared_prefix_attention(q, kp, vp, ks, vs, scale=D**-0.5, softcap=softcap, window=window)
    assert got.shape == (B, Sq, H, D) and got.dtype == dtype
    want = naive_attention(q, kp, vp, ks, vs, scale=D**-0.5, softcap=softcap, window=window)
    assert_close(got, want, "naive_attention", dtype)


@pytest.mark.parametrize("gemma_style", [False, True])
@pytest.mark.parametrize("K,bias", [(1, True), (3, False)])
def test_reference_norm_head_matches_naive(gemma_style, K, bias):
    x, w, hw, hb, _, _ = head_inputs(5, 24, K, 8, torch.float64, device="cpu")
    got = ref.rmsnorm_head(x, w, 1e-6, hw, hb if bias else None, gemma_style=gemma_style)
    want = naive_rmsnorm(x, w, 1e-6, gemma_style) @ hw.T + (hb if bias else 0.0)
    assert got.shape == (5, K) and got.dtype == torch.float32
    assert_close(got, want, "naive_norm_head", torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gemma_style,final_softcap,V,chunk", [
    (False, None, 1000, 256), (True, 30.0, 1000, 256), (False, 5.0, 999, 1000), (True, None, 7, 3),
])
def test_reference_logprob_matches_naive(gemma_style, final_softcap, V, chunk, dtype):
    x, w, _, _, lm, targets = head_inputs(6, 24, 1, V, dtype, device="cpu")
    targets[0] = V - 1  # last column, in the ragged final chunk
    got = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, gemma_style=gemma_style,
                                     final_softcap=final_softcap, chunk=chunk)
    want = naive_logprob(x, w, 1e-6, lm, targets, gemma_style, final_softcap)
    assert got.shape == (6,) and got.dtype == torch.float32
    assert_close(got, want, "naive_logprob", dtype)


# ----------------------------------------------------------------------------------------
# CPU twins (block-diagonal attention, chunked compiled-form log-probs) vs the naive oracles / references
# ----------------------------------------------------------------------------------------

def _blockdiag(case, dtype):
    from rmfast.kernels.blockdiag_attention import pack_prefix, shared_prefix_attention_blockdiag, visibility_bias

    B, H, Hkv, D, P, S, Sq, softcap, window = case
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, dtype, device="cpu")
    k_bd, v_bd = pack_prefix(kp, vp, H)
    pre, suf = visibility_bias(P, S, Sq, window, torch.float32, "cpu")
    # The CPU layer's layouts: q (B, Sq, H, D) and suffix K/V (B, S, Hkv, D), both non-contiguous views here.
    got = shared_prefix_attention_blockdiag(q.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), k_bd, v_bd,
                                            scale=D**-0.5, softcap=softcap, pre_bias=pre, suf_bias=suf)
    assert got.shape == (B, Sq, H * D) and got.dtype == dtype
    return got.view(B, Sq, H, D), (q, kp, vp, ks, vs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids(ATTN_CASES))
def test_blockdiag_attention_matches_naive(case, dtype):
    got, (q, kp, vp, ks, vs) = _blockdiag(case, dtype)
    softcap, window = case[7], case[8]
    want = naive_attention(q, kp, vp, ks, vs, scale=case[3] ** -0.5, softcap=softcap, window=window)
    assert_close(got, want, "naive_attention", dtype)


@pytest.mark.parametrize("case", ATTN_CASES[1:6] + [(64, 9, 3, 64, 42, 3, 3, None, None)],
                         ids=_ids(ATTN_CASES[1:6] + [(64, 9, 3, 64, 42, 3, 3, None, None)]))
def test_blockdiag_attention_bf16_matches_reference(case):
    got, (q, kp, vp, ks, vs) = _blockdiag(case, torch.bfloat16)
    want = ref.shared_prefix_attention(q, kp, vp, ks, vs, scale=case[3] ** -0.5, softcap=case[7], window=case[8])
    assert_close(got, want, "cpu_attention", torch.bfloat16)


FLASH_CASES = [c for c in ATTN_CASES if c[7] is None and (c[8] is None or c[8] >= c[4] + c[5])] + [
    (4, 9, 3, 64, 300, 20, 7, None, None),  # a long prompt, Sq < S
    (2, 9, 3, 64, 0, 300, 300, None, None),  # a long prompt pass
    (2, 9, 3, 64, 0, 300, 40, None, None),  # the prompt pass's last layer (Sq < S)
    (3, 6, 2, 80, 33, 5, 5, None, 38),  # a window exactly P + S
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", FLASH_CASES, ids=_ids(FLASH_CASES))
def test_cpu_flash_attention_matches_naive(case, dtype):
    from rmfast.kernels.cpu_flash import shared_prefix_attention_flash, usable

    B, H, Hkv, D, P, S, Sq, softcap, window = case
    assert usable(softcap, window, P, S)
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, dtype, device="cpu")
    got = shared_prefix_attention_flash(q, kp, vp, ks, vs, scale=D**-0.5)
    assert got.shape == (B, Sq, H, D) and got.dtype == dtype
    assert_close(got, naive_attention(q, kp, vp, ks, vs, scale=D**-0.5, window=window), "naive_attention", dtype)


@pytest.mark.parametrize("case", FLASH_CASES[1:], ids=_ids(FLASH_CASES[1:]))
def test_cpu_flash_attention_bf16_matches_reference(case):
    from rmfast.kernels.cpu_flash import shared_prefix_attention_flash

    B, H, Hkv, D, P, S, Sq, softcap, window = case
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, torch.bfloat16, device="cpu")
    got = shared_prefix_attention_flash(q, kp, vp, ks, vs, scale=D**-0.5)
    assert_close(got, ref.shared_prefix_attention(q, kp, vp, ks, vs, scale=D**-0.5, window=window), "cpu_flash",
                 torch.bfloat16)


def test_cpu_flash_is_not_used_where_it_would_differ():
    from rmfast.kernels.cpu_flash import usable

    assert not usable(50.0, None, 300, 4) and not usable(None, 100, 300, 4) and usable(None, 304, 300, 4)


def test_blockdiag_prefix_is_packed_once_per_layer():
    from rmfast.kernels.blockdiag_attention import pack_prefix

    kp, vp = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    k_bd, v_bd = pack_prefix(kp, vp, n_heads=6)
    assert k_bd.shape == (6 * 5, 6 * 8) and v_bd.shape == (6 * 8, 6 * 5)
    # head 4 uses kv head 1 (G = 3); every off-diagonal block is zero
    torch.testing.assert_close(k_bd[4 * 5 : 5 * 5, 4 * 8 : 5 * 8], kp[1])
    torch.testing.assert_close(v_bd[4 * 8 : 5 * 8, 4 * 5 : 5 * 5], vp[1].T)
    assert k_bd.count_nonzero() == kp.count_nonzero() * 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gemma_style,final_softcap,V,N,chunk", [
    (False, None, 1000, 6, 256), (True, 30.0, 999, 37, 256), (False, 5.0, 7, 3, 3), (True, None, 9000, 9, 4096),
])
@pytest.mark.parametrize("pad_rows", [None, 40])
def test_cpu_logprob_matches_naive(gemma_style, final_softcap, V, N, chunk, dtype, pad_rows):
    from rmfast.kernels.torch_twins import rmsnorm_lmhead_logprob_cpu

    x, w, _, _, lm, targets = head_inputs(N, 24, 1, V, dtype, device="cpu")
    targets[0] = V - 1  # last column, in the ragged final chunk
    got = rmsnorm_lmhead_logprob_cpu(x, w, 1e-6, lm, targets, gemma_style=gemma_style, final_softcap=final_softcap,
                                     chunk=chunk, pad_rows=pad_rows)
    want = naive_logprob(x, w, 1e-6, lm, targets, gemma_style, final_softcap)
    assert got.shape == (N,) and got.dtype == torch.float32
    assert_close(got, want, "naive_logprob", dtype)


def test_cpu_logprob_bf16_matches_reference():
    from rmfast.kernels.torch_twins import rmsnorm_lmhead_logprob_cpu

    x, w, _, _, lm, targets = head_inputs(300, 64, 1, 5000, torch.bfloat16, device="cpu")
    got = rmsnorm_lmhead_logprob_cpu(x, w, 1e-6, lm, targets, gemma_style=True, final_softcap=30.0, chunk=1024)
    want = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, gemma_style=True, final_softcap=30.0)
    assert_close(got, want, "cpu_logprob", torch.bfloat16)


# ----------------------------------------------------------------------------------------
# Triton vs the references
# ----------------------------------------------------------------------------------------

def _run_attention(case, dtype, config=None):
    B, H, Hkv, D, P, S, Sq, softcap, window = case
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, dtype)
    kw = dict(scale=D**-0.5, softcap=softcap, window=window)
    got = triton_attention.shared_prefix_attention_triton(q, kp, vp, ks, vs, **kw, config=config)
    want = ref.shared_prefix_attention(q, kp, vp, ks, vs, **kw)
    assert got.shape == want.shape == (B, Sq, H, D) and got.dtype == dtype
    assert torch.isfinite(got).all()
    assert_close(got, want, "attention", dtype)


@requires_triton
@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids(ATTN_CASES))
def test_triton_attention_fp32(case):
    _run_attention(case, torch.float32)


@requires_triton
@pytest.mark.parametrize("D", [80, 96, 256])
def test_triton_attention_padded_head_dims(D):
    # Non-power-of-two (and large) head dims are padded to a power of two and masked.
    _run_attention((3, 4, 2, D, 13, 3, 3, 5.0, 9), torch.float32)


#: shared memory per block: an H100 (232,448, opt-in) and an A10 / L4-class GPU (101,376)
SMEM_LIMITS = {"h100": 232_448, "a10": 101_376}


@pytest.mark.parametrize("smem", SMEM_LIMITS.values(), ids=SMEM_LIMITS.keys())
def test_attention_config_fits_shared_memory(smem):
    """Every head dim x dtype gets tiles within the device's shared memory by the estimate; tiles stay >= 16."""
    from rmfast.kernels.attention_config import attention_config, smem_estimate

    for D in (64, 80, 96, 128, 256):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            c = attention_config(D, dtype, smem)
            assert c is not None, (D, dtype)
            elem = torch.tensor([], dtype=dtype).element_size()
            assert c.smem_bytes == smem_estimate(c.block_m, c.block_n, c.block_d, elem, c.num_stages) <= smem
            assert min(c.block_m, c.block_n) >= 16 and c.block_d >= D and c.num_stages >= 1


def test_attention_smem_estimate_covers_the_h100_failure():
    """The first version's tiles for D=256 fp32 (32 x 64, 3 stages) needed 303,232 bytes on the H100 (Triton's
    OutOfResources, gpu-check 2026-11-26): the estimate is at least that, and the chooser now avoids them."""
    from rmfast.kernels.attention_config import attention_config, smem_estimate

    assert 303_232 <= smem_estimate(32, 64, 256, 4, 3) <= 303_232 + 2048
    c = attention_config(256, torch.float32, SMEM_LIMITS["h100"])
    assert (c.block_m, c.block_n, c.num_stages) != (32, 64, 3)
    # bf16 at D=256 and fp32 at D=128 (which ran on the H100) keep the first version's tiles and stages
    assert attention_config(256, torch.bfloat16, SMEM_LIMITS["h100"]).num_stages == 3
    assert attention_config(128, torch.float32, SMEM_LIMITS["h100"]).num_stages == 3
    assert attention_config(256, torch.float32, 40_000) is None  # nothing fits: ops takes the torch form


@requires_triton
@pytest.mark.parametrize("smem", SMEM_LIMITS.values(), ids=SMEM_LIMITS.keys())
def test_triton_attention_head_dim_256_with_the_chosen_config(smem):
    """D=256 fp32, the tiles the chooser picks within each device's shared memory: exact (fp32 tolerance)."""
    from rmfast.kernels.attention_config import attention_config

    cfg = attention_config(256, torch.float32, smem)
    _run_attention((3, 4, 2, 256, 37, 3, 3, 5.0, 30), torch.float32, config=cfg)  # prefix over several key tiles
    _run_attention((2, 2, 1, 256, 20, 4, 2, None, None), torch.float32, config=cfg)


@requires_triton
def test_attention_falls_back_to_torch_where_no_config_fits(monkeypatch):
    """No configuration fits the device's shared memory: ops runs the torch attention, says so once, records why."""
    from rmfast.fast import ops
    from rmfast.kernels import attention_config as ac

    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    monkeypatch.setattr(ac, "device_smem_bytes", lambda device: 40_000)
    monkeypatch.setattr(ac, "launch_config", lambda q: ac.attention_config(q.shape[-1], q.dtype, 40_000))
    monkeypatch.setattr(ops, "ATTENTION_FALLBACKS", {})
    q, kp, vp, ks, vs = attn_inputs(2, 2, 1, 256, 9, 2, 2, torch.float32)
    with pytest.warns(UserWarning, match="head_dim 256 in float32 needs at least .* shared memory"):
        got = ops.shared_prefix_attention(q, kp, vp, ks, vs, scale=0.0625)
    torch.testing.assert_close(got, ref.shared_prefix_attention(q, kp, vp, ks, vs, scale=0.0625), rtol=0, atol=0)
    assert list(ops.ATTENTION_FALLBACKS) == [(256, torch.float32, 40_000)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per (head_dim, dtype, device limit)
        ops.shared_prefix_attention(q, kp, vp, ks, vs, scale=0.0625)


@requires_triton
def test_every_timed_configuration_is_checked_against_the_plans_own(monkeypatch):
    """rmfast.bench.attention_tune (the GPU check's configuration sweep): every try of the shared-prefix kernel and
    of the cascade's prompt part launches with its own tiles and gives the plan's configuration's output (fp32, to
    the attention tolerance); a try that needs more shared memory than the device has is reported, not run."""
    from rmfast.bench import attention_tune as at
    from rmfast.kernels import attention_config as ac

    spy = _LaunchSpy(triton_attention._shared_prefix_attn_kernel)
    monkeypatch.setattr(triton_attention, "_shared_prefix_attn_kernel", spy)
    monkeypatch.setattr(triton_attention, "check_device", lambda *a: None)
    shape = dict(rows=5, heads=4, kv_heads=2, suffix=3, queries=2, prompt=9, head_dim=16, dtype=torch.float32,
                 device=DEVICE)
    plan, got = at.tune_shared_prefix(**shape, tries=((16, 16, 4, 1), (32, 16, 2, 2)), reps=1)
    tiles = [(kw["BLOCK_M"], kw["BLOCK_N"]) for kw in spy.launches]
    assert {(16, 16), (32, 16), (plan.block_m, plan.block_n)} <= set(tiles)
    assert [r.config for r in got] == [(plan.block_m, plan.block_n, plan.num_warps, plan.num_stages),
                                       (16, 16, 4, 1), (32, 16, 2, 2)]
    atol, _ = TOLERANCES[("attention", torch.float32)]
    assert got[0].max_diff is None and all(r.ms > 0 and r.max_diff <= atol for r in got[1:]), got
    monkeypatch.setattr(ac, "device_smem_bytes", lambda device: 3_000)  # a device with almost no shared memory
    monkeypatch.setattr(at, "device_smem_bytes", lambda device: 3_000)
    _, small = at.tune_shared_prefix(**shape, tries=((64, 64, 4, 3),), reps=1)
    assert small[-1].ms is None and "shared memory" in small[-1].note
    own, part = at.tune_prompt_part(rows=3, row_tokens=5, heads=4, kv_heads=2, prompt=11, head_dim=16,
                                    dtype=torch.float32, device=DEVICE, tries=((16, 16, 4, 1),), reps=1)
    assert [r.config for r in part] == [own, (16, 16, 4, 1)] and part[1].max_diff <= atol, part
    lines = at.table(got, bytes_=at.shared_prefix_bytes(**{k: v for k, v in shape.items() if k not in ("dtype", "device")},
                                                        elem=4), bandwidth_tb_s=1.0)
    assert len(lines) == 4 and "(plan)" in lines[1] and sum("fastest" in x for x in lines) == 1


class _LaunchSpy:
    """Stands in for a Triton kernel: records each launch's keyword arguments, then launches the real one."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append(kw)
            return self.kernel[grid](*args, **kw)
        return launch


@requires_triton
def test_fp32_computations_launch_ieee_dots(monkeypatch):
    """Every kernel meant to compute in fp32 (fp32 inputs, or fp32 heads on half inputs) is launched with IEEE
    dots: TF32 made the fp32 log-prob head on fp16 rows 3.3e-3 off on an H100 (the interpreter ignores the
    precision, so the launch parameter is what is checked here)."""
    from rmfast.kernels.triton_common import dot_precision

    assert dot_precision(torch.float32) == dot_precision(torch.float16, True) == dot_precision(torch.bfloat16, True) == "ieee"
    spies = {}
    for mod, name in ((triton_attention, "_shared_prefix_attn_kernel"), (triton_norm_head, "_rmsnorm_head_kernel"),
                      (triton_logprob, "_lmhead_logprob_kernel")):
        spies[name] = _LaunchSpy(getattr(mod, name))
        monkeypatch.setattr(mod, name, spies[name])
        monkeypatch.setattr(mod, "check_device", lambda *a: None)
    half = torch.float16
    for dtype, fp32 in ((torch.float32, False), (half, True), (half, False)):
        x, w, hw, hb, lm, targets = head_inputs(5, 32, 2, 300, dtype)
        triton_norm_head.rmsnorm_head_triton(x, w, 1e-6, hw, hb, gemma_style=False, fp32=fp32)
        triton_logprob.rmsnorm_lmhead_logprob_triton(x, w, 1e-6, lm, targets, gemma_style=False, chunk=64, fp32=fp32)
    for dtype in (torch.float32, half):
        q, kp, vp, ks, vs = attn_inputs(2, 2, 1, 16, 5, 2, 2, dtype)
        triton_attention.shared_prefix_attention_triton(q, kp, vp, ks, vs, scale=0.25)
    got = {name: [kw["DOT_PRECISION"] for kw in spy.launches] for name, spy in spies.items()}
    assert got == {"_rmsnorm_head_kernel": ["ieee", "ieee", "tf32"], "_lmhead_logprob_kernel": ["ieee", "ieee", "tf32"],
                   "_shared_prefix_attn_kernel": ["ieee", "tf32"]}


@requires_triton
@pytest.mark.parametrize("case", [ATTN_CASES[i] for i in (2, 4, 5)], ids=_ids([ATTN_CASES[i] for i in (2, 4, 5)]))
def test_triton_attention_fp16(case):
    # Reduced precision in the interpreter: the scores' rounding points must match the reference.
    _run_attention(case, torch.float16)


@requires_triton
def test_triton_attention_strided_inputs_and_many_rows():
    # The engine hands over views: q as (B, S, H, D).transpose(1, 2), K/V sliced out of caches.
    # B*G*Sq = 8*3*2 = 48 query rows: two row tiles, the boundary inside a batch row's group.
    B, H, Hkv, D, P, S, Sq = 8, 6, 2, 16, 13, 3, 2
    q, kp, vp, ks, vs = attn_inputs(B, H, Hkv, D, P, S, Sq, torch.float32)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, Sq, D) view, strides of (B, Sq, H, D)

    def in_cache(t):  # (Hkv, P, D) -> the same values as a slice of a bigger buffer
        big = torch.zeros(Hkv, P + 4, D + 8, device=DEVICE)
        big[:, 2 : 2 + P, :D] = t
        return big[:, 2 : 2 + P, :D]

    kp, vp = in_cache(kp), in_cache(vp)  # equal, non-contiguous strides: read in place
    ks = ks.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Hkv, S, D) view of (B, S, Hkv, D)
    vs = vs.transpose(1, 2).contiguous().transpose(1, 2)
    assert not (q.is_contiguous() or kp.is_contiguous() or ks.is_contiguous())
    kw = dict(scale=0.3, softcap=None, window=10)
    got = triton_attention.shared_prefix_attention_triton(q, kp, vp, ks, vs, **kw)
    want = ref.shared_prefix_attention(q.contiguous(), kp.contiguous(), vp.contiguous(),
                                       ks.contiguous(), vs.contiguous(), **kw)
    assert_close(got, want, "attention", torch.float32)


@requires_triton
@pytest.mark.parametrize("gemma_style", [False, True])
@pytest.mark.parametrize("N,D,K,bias", [(5, 24, 1, True), (37, 64, 3, False), (3, 200, 1, False), (2, 16, 70, True)])
def test_triton_norm_head_fp32(gemma_style, N, D, K, bias):
    # D=200 spans two D chunks; K=70 spans two head-output tiles; N=37 two row tiles.
    x, w, hw, hb, _, _ = head_inputs(N, D, K, 8, torch.float32)
    hb = hb if bias else None
    got = triton_norm_head.rmsnorm_head_triton(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    want = ref.rmsnorm_head(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    assert got.shape == (N, K) and got.dtype == torch.float32
    assert_close(got, want, "norm_head", torch.float32)


@requires_triton
@pytest.mark.parametrize("gemma_style", [False, True])
def test_triton_norm_head_fp16(gemma_style):
    x, w, hw, hb, _, _ = head_inputs(7, 40, 3, 8, torch.float16)
    got = triton_norm_head.rmsnorm_head_triton(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    want = ref.rmsnorm_head(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    assert_close(got, want, "norm_head", torch.float16)


LOGPROB_CASES = [
    # (N, D, V, gemma_style, final_softcap, num_splits)
    (5, 24, 1000, False, None, None),  # default split count (2 on the interpreter)
    (19, 64, 1000, True, 30.0, 1),     # one split, two row tiles
    (3, 40, 999, False, 5.0, 3),       # odd V, strong softcap, three splits
    (1, 16, 7, True, None, None),      # V smaller than one tile
    (2, 200, 1000, True, None, 8),     # several D chunks; eight splits
]


@requires_triton
@pytest.mark.parametrize("N,D,V,gemma_style,final_softcap,num_splits", LOGPROB_CASES)
def test_triton_logprob_fp32(N, D, V, gemma_style, final_softcap, num_splits):
    x, w, _, _, lm, targets = head_inputs(N, D, 1, V, torch.float32)
    targets[0] = V - 1  # last column, in the ragged final tile
    want = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, gemma_style=gemma_style,
                                      final_softcap=final_softcap, chunk=256)
    got = triton_logprob._launch(x, w, 1e-6, lm, targets, gemma_style=gemma_style,
                                 final_softcap=final_softcap, chunk=256, num_splits=num_splits)
    assert got.shape == (N,) and got.dtype == torch.float32
    assert_close(got, want, "logprob", torch.float32)


@requires_triton
def test_triton_logprob_public_launcher_fp16():
    x, w, _, _, lm, targets = head_inputs(7, 40, 1, 1000, torch.float16)
    for gemma_style, cap in [(False, None), (True, 30.0)]:
        kw = dict(gemma_style=gemma_style, final_softcap=cap, chunk=256)
        got = triton_logprob.rmsnorm_lmhead_logprob_triton(x, w, 1e-6, lm, targets, **kw)
        want = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, **kw)
        assert_close(got, want, "logprob", torch.float16)


@requires_triton
@pytest.mark.parametrize("gemma_style", [False, True])
def test_triton_fp32_heads_on_fp16_inputs(gemma_style):
    """fp32=True (the engine's default): norm and head in fp32 from half-precision inputs, against the
    torch twin at fp32 tolerance (the old rounding points would miss it by fp16 steps)."""
    x, w, hw, hb, lm, targets = head_inputs(7, 40, 3, 1000, torch.float16)
    got = triton_norm_head.rmsnorm_head_triton(x, w, 1e-6, hw, hb, gemma_style=gemma_style, fp32=True)
    want = ref.rmsnorm_head(x, w, 1e-6, hw, hb, gemma_style=gemma_style, fp32=True)
    assert_close(got, want, "norm_head", torch.float32)
    kw = dict(gemma_style=gemma_style, final_softcap=30.0 if gemma_style else None, chunk=256, fp32=True)
    got = triton_logprob.rmsnorm_lmhead_logprob_triton(x, w, 1e-6, lm, targets, **kw)
    want = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, **kw)
    assert_close(got, want, "logprob", torch.float32)


def test_reference_fp32_heads_are_the_fp32_model_maths():
    """fp32=True on half inputs equals the fp32 computation on the upcast inputs."""
    x, w, hw, hb, lm, targets = head_inputs(6, 24, 2, 300, torch.float16, device="cpu")
    for gemma_style in (False, True):
        got = ref.rmsnorm_head(x, w, 1e-6, hw, hb, gemma_style=gemma_style, fp32=True)
        want = ref.rmsnorm_head(x.float(), w.float(), 1e-6, hw.float(), hb.float(), gemma_style=gemma_style)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        got = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, gemma_style=gemma_style, fp32=True, chunk=64)
        want = ref.rmsnorm_lmhead_logprob(x.float(), w.float(), 1e-6, lm.float(), targets, gemma_style=gemma_style,
                                          chunk=64)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------
# bf16: CUDA only
# ----------------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("case", ATTN_CASES[1:6] + [(64, 8, 2, 128, 300, 4, 1, 50.0, 256)],
                         ids=_ids(ATTN_CASES[1:6] + [(64, 8, 2, 128, 300, 4, 1, 50.0, 256)]))
def test_triton_attention_bf16(case):
    _run_attention(case, torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("gemma_style", [False, True])
def test_triton_norm_head_bf16(gemma_style):
    x, w, hw, hb, _, _ = head_inputs(300, 576, 1, 8, torch.bfloat16)
    got = triton_norm_head.rmsnorm_head_triton(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    want = ref.rmsnorm_head(x, w, 1e-6, hw, hb, gemma_style=gemma_style)
    assert_close(got, want, "norm_head", torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("gemma_style,cap", [(False, None), (True, 30.0)])
def test_triton_logprob_bf16(gemma_style, cap):
    x, w, _, _, lm, targets = head_inputs(100, 576, 1, 49152, torch.bfloat16)
    kw = dict(gemma_style=gemma_style, final_softcap=cap)
    got = triton_logprob.rmsnorm_lmhead_logprob_triton(x, w, 1e-6, lm, targets, **kw)
    want = ref.rmsnorm_lmhead_logprob(x, w, 1e-6, lm, targets, **kw)
    assert_close(got, want, "logprob", torch.bfloat16)


# ----------------------------------------------------------------------------------------
# Without triton
# ----------------------------------------------------------------------------------------

def test_kernel_modules_import_without_triton():
    # Blocking the import (sys.modules entry None) simulates an install without triton.
    src = Path(rmfast.kernels.__file__).resolve().parents[2]  # .../src
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import rmfast.kernels, rmfast.kernels.triton_attention as a, "
        "rmfast.kernels.triton_norm_head as n, rmfast.kernels.triton_logprob as l\n"
        "assert not (a.HAVE_TRITON or n.HAVE_TRITON or l.HAVE_TRITON)\n"
        "try:\n    a.shared_prefix_attention_triton(None, None, None, None, None, scale=1.0)\n"
        "except RuntimeError as e:\n    assert 'triton' in str(e)\nelse:\n    raise AssertionError\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
