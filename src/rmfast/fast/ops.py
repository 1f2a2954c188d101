"""Kernel dispatch: Triton on CUDA, the torch twins elsewhere. The only door into :mod:`rmfast.kernels`:
the layer and the engine call these functions, never a kernel module.

Set ``RMFAST_KERNELS=torch`` to force the torch path on CUDA (for A/B timing), or
``RMFAST_KERNELS=triton`` to force Triton (on CPU this needs ``TRITON_INTERPRET=1``; tests only).

The attention of the rows' pass runs in one of :data:`ATTENTION_FORMS`, decided once per job by the plan
(:func:`rmfast.scoring.plan.choose_attention`) and handed to the engine; the functions here execute the form
they are given and read nothing from the environment for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings

import torch

from ..kernels import blockdiag_attention as bd
from ..kernels import cascade_torch as cascade_ref
from ..kernels import cpu_flash
from ..kernels import torch_twins as ref
from ..kernels import triton_available
from ..kernels.torch_twins import lse_update

__all__ = ["ATTENTION_FORMS", "device_attention", "uses_triton", "triton_attention_config", "ATTENTION_FALLBACKS",
           "shared_prefix_attention", "cascade_attention", "cascade_attention_varlen", "varlen_causal_attention", "shared_prefix_attention_blockdiag",
           "pack_prefix", "visibility_bias", "rmsnorm", "rmsnorm_head", "linear", "gemm_rows", "rope_tables", "alike_rule", "rmsnorm_lmhead_logprob", "lse_update", "vocab_logprobs"]

#: the most rows of one GEMM under the "pad" rows rule (:func:`rmfast.kernels.torch_twins.linear_rows`)
PAD_MAX_ROWS = ref.PAD_MAX_ROWS
#: how the fast engine's linears cut their rows (:func:`gemm_rows`); None: one GEMM over all rows, as torch decides
_GEMM_ROWS: contextvars.ContextVar = contextvars.ContextVar("rmfast_gemm_rows", default=None)


@contextlib.contextmanager
def gemm_rows(rule):
    """Within: every linear of the fast engine and its score head cut their rows by ``rule``, so that a row's
    result never depends on the other rows in its GEMM (``rmfast serve``: a sample's bits whatever it is batched
    with). ``("pad", m)``: one GEMM, at least m rows (fewer are padded with zero rows; the GEMM libraries pick
    other kernels for a handful of rows); ``("chunk", c)``: GEMMs of exactly c rows each, the last padded;
    None: torch's own. :func:`rmfast.kernels.torch_twins.linear_rows` does the cutting."""
    token = _GEMM_ROWS.set(rule)
    try:
        yield
    finally:
        _GEMM_ROWS.reset(token)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``, its rows cut as :func:`gemm_rows` says: x (..., K) -> (..., N)."""
    if torch.compiler.is_compiling():  # a compiled layer is one graph per shape already; never traced here
        return torch.nn.functional.linear(x, w, b)
    rule = _GEMM_ROWS.get()
    if rule is None:
        return torch.nn.functional.linear(x, w, b)
    return ref.linear_rows(x, w, b, rule)


#: the block-diagonal CPU form of the prompt attention (:mod:`rmfast.kernels.blockdiag_attention`):
#: the prompt K/V packed once per layer, a visibility bias per window, the attention itself
pack_prefix = bd.pack_prefix
visibility_bias = bd.visibility_bias
shared_prefix_attention_blockdiag = bd.shared_prefix_attention_blockdiag


def uses_triton(t: torch.Tensor | torch.device) -> bool:
    """Whether the kernels run as Triton for a tensor like ``t``, or on device ``t`` (CUDA with Triton, or
    ``RMFAST_KERNELS``)."""
    mode = os.environ.get("RMFAST_KERNELS", "auto")
    if mode == "torch":
        return False
    if mode == "triton":
        return True
    dev = t if isinstance(t, torch.device) else t.device
    return dev.type == "cuda" and triton_available()


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton kernels can run on ``device``: CUDA with Triton installed, or the CPU under Triton's
    interpreter (``TRITON_INTERPRET=1``, set before triton is first imported: tests)."""
    if device.type == "cuda":
        return triton_available()
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and triton_available()


#: the attention forms of the rows' pass (docs/backend.md, "Attention forms"):
#:   triton:         the Triton shared-prefix kernel (one kernel; its own-key phase walks the row's keys one
#:                   position at a time: built for the scan's 1-3 suffix tokens)
#:   cascade:        prompt part ⊕ response part merged by log-sum-exp (:mod:`rmfast.kernels.cascade_torch`,
#:                   Triton on CUDA: :mod:`rmfast.kernels.triton_cascade`), every prompt of a wave in one call
#:   cpu-flash:      torch's CPU flash kernel where the prompt or the rows are long enough (:func:`cpu_flash_from`),
#:                   the ``bmm`` reference below (:mod:`rmfast.kernels.cpu_flash`)
#:   block-diagonal: the compiled CPU layer's form (:mod:`rmfast.kernels.blockdiag_attention`)
#:   reference:      the ``bmm`` torch twin everywhere
ATTENTION_FORMS = ("triton", "cascade", "cpu-flash", "block-diagonal", "reference")


def device_attention(device: torch.device, compiled: bool = False) -> str:
    """The form a device's kernels give when nothing else is asked: Triton where :func:`uses_triton`, the
    compiled CPU layer's block-diagonal form, the CPU's flash/``bmm`` rule, or the reference on CUDA
    without Triton (``RMFAST_KERNELS=torch``). Read once per engine, never per call."""
    if uses_triton(device):
        return "triton"
    if device.type == "cpu":
        return "block-diagonal" if compiled else "cpu-flash"
    return "reference"


#: prompts at least this long take the fused flash form on CPU (:mod:`rmfast.kernels.cpu_flash`), in
#: the prompt pass and in the rows' pass alike; shorter ones the ``bmm`` reference form, which is
#: faster there (measured on a Zen 4, 9 heads of 64: the flash form 0.5-0.8x at 40 prompt tokens,
#: 1.0-2x at 256, 5-10x at 2,048; docs/backend.md). A token scan's rows are 1-3 tokens, so there the prompt's
#: length decides, and every row of a prompt takes the same form whatever its batch. Rows this long take it
#: too, whatever the prompt: their own causal part is then the written-out block (SmolLM2-135M, fp32, a
#: 43-token prompt, one row of 1,024 tokens: 5.19 -> 2.27 s a call, plain HF 4.25 s; 1.34x at 512 tokens, 1.10x
#: at 256; 2-core AVX2-only EPYC, benchmarks/results/long_responses_2026-11-29).
FLASH_MIN_PROMPT = 256


def cpu_flash_from(part: str, rows_rule=None) -> int | None:
    """The CPU's flash rule, its one definition: the least length from which attention takes torch's flash
    kernel, or None (never). ``part`` "prompt": the shared-prefix form (a prompt pass, or rows over their prompt
    in one call: a prompt or rows that long); "rows": packed rows' own keys (the cascade's response part). Under a rows
    rule (``rmfast serve``, :func:`gemm_rows`) a prompt never does: torch's kernel splits its work by the
    batch's size, so a prompt's bits would follow its wave; a long row still does, one call a row (a row's
    bits its own). Where a layer has a softcap, or a window that hides a key, the bmm form runs
    (:func:`rmfast.kernels.cpu_flash.usable`).

    >>> cpu_flash_from("prompt"), cpu_flash_from("prompt", ("pad", 64)), cpu_flash_from("rows", ("pad", 64))
    (256, None, 256)
    """
    if part not in ("prompt", "rows"):
        raise ValueError(f"part {part!r}: prompt or rows")
    return None if part == "prompt" and rows_rule is not None else FLASH_MIN_PROMPT


def alike_rule(device_type: str) -> str | None:
    """What a rows rule does to the elementwise work with an exp, tanh or cos on ``device_type``, in words for the
    plan's record (None: nothing; a GPU's elementwise kernels run every element alike already)."""
    if device_type != "cpu":
        return None
    return (f"SiLU/GELU, soft-max over a prompt's keys, the merge and softcaps in calls of exactly "
            f"at most {ref.ALIKE_CHUNK:,} elements, a multiple of {ref.ALIKE_ALIGN} (one thread, no scalar tail), the rotary tables in blocks of {ROPE_BLOCK} "
            "positions from 0: a token's bits whatever shares its wave")


def cpu_flash_rule(rows_rule=None) -> str:
    """:func:`cpu_flash_from` in words, for the plan's record of the "cpu-flash" form.

    >>> cpu_flash_rule()
    "torch's flash kernel for prompts or rows of 256+ tokens, bmm below (and on layers with a softcap or a window shorter than the text)"
    """
    p, r = cpu_flash_from("prompt", rows_rule), cpu_flash_from("rows", rows_rule)
    tail = "(and on layers with a softcap or a window shorter than the text)"
    if p == r:
        return f"torch's flash kernel for prompts or rows of {p}+ tokens, bmm below {tail}"
    return (f"torch's flash kernel for rows of {r}+ tokens, one call a row (a row's bits its own); bmm for every "
            f"prompt (in fixed row chunks: torch's flash kernel splits its work by the batch's size) and shorter rows "
            f"{tail}")


#: where Triton was chosen but its attention did not fit the device: (head_dim, dtype, shared memory per
#: block) -> the reason, in words (said once as a warning; the torch form ran instead)
ATTENTION_FALLBACKS: dict[tuple, str] = {}


def triton_attention_config(q):
    """The Triton shared-prefix attention's launch configuration for queries like ``q`` (B, H, Sq, D), or None
    where no tile configuration fits the device's shared memory
    (:func:`rmfast.kernels.attention_config.attention_config`; e.g. head_dim 256 in fp32 on a GPU with less
    than ~68 KB a block): then the torch form runs, said once and recorded in :data:`ATTENTION_FALLBACKS`."""
    from ..kernels.attention_config import device_smem_bytes, launch_config, min_smem_bytes

    cfg = launch_config(q)
    if cfg is None:
        D, smem = q.shape[-1], device_smem_bytes(q.device)
        key = (D, q.dtype, smem)
        if key not in ATTENTION_FALLBACKS:
            least = min_smem_bytes(D, q.dtype)
            ATTENTION_FALLBACKS[key] = (f"Triton attention for head_dim {D} in {str(q.dtype).removeprefix('torch.')} "
                                        f"needs at least ~{least:,} bytes of shared memory a block, this device has "
                                        f"{smem:,}: the torch attention runs instead (exact, slower)")
            warnings.warn("rmfast: " + ATTENTION_FALLBACKS[key], stacklevel=3)
    return cfg


def shared_prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, *, scale, softcap=None, window=None,
                            form: str | None = None):
    """(B, H, Sq, D) queries over one shared prefix K/V (Hkv, P, D) ⊕ own suffix (B, Hkv, S, D) -> (B, Sq, H, D).

    The prompt pass itself is P = 0 with S = the prompt's length. ``form``: "triton" (where a tile configuration
    fits the device, :func:`triton_attention_config`; else the torch form), "reference", or a CPU form
    ("cpu-flash", "block-diagonal": the flash/``bmm`` rule below); None: :func:`device_attention` of q."""
    form = form or device_attention(q.device)
    if form == "triton" and torch.compiler.is_compiling():
        # inside a compiled layer (the CUDA scan's, issue 33 item 3): the kernel as ONE opaque op, so inductor
        # fuses the elementwise work around it and never traces the launcher
        return torch.ops.rmfast.shared_prefix_attention_triton(q, k_prefix, v_prefix, k_suffix, v_suffix, scale,
                                                               softcap, window)
    cfg = triton_attention_config(q) if form == "triton" else None
    if cfg is not None:
        from ..kernels.triton_attention import shared_prefix_attention_triton

        return shared_prefix_attention_triton(
            q, k_prefix, v_prefix, k_suffix, v_suffix, scale=scale, softcap=softcap, window=window, config=cfg
        )
    P, S = k_prefix.shape[1], k_suffix.shape[2]
    rows = None if torch.compiler.is_compiling() else _GEMM_ROWS.get()
    least = cpu_flash_from("prompt", rows)  # the shared-prefix form: a prompt and its rows in one call
    if (form != "reference" and q.device.type == "cpu" and least is not None and max(P, S) >= least
            and cpu_flash.usable(softcap, window, P, S)):
        return cpu_flash.shared_prefix_attention_flash(q, k_prefix, v_prefix, k_suffix, v_suffix, scale=scale)
    # under a rows rule (rmfast serve) the torch form, its prompt GEMMs in fixed row chunks: torch's flash kernel
    # splits its work by the batch's size
    return ref.shared_prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, scale=scale, softcap=softcap,
                                       window=window, rows=rows)


@torch.library.custom_op("rmfast::shared_prefix_attention_triton", mutates_args=())
def _shared_prefix_attention_op(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor, k_suffix: torch.Tensor,
                                v_suffix: torch.Tensor, scale: float, softcap: float | None,
                                window: int | None) -> torch.Tensor:
    """:func:`shared_prefix_attention` in the "triton" form as one op of a compiled graph (run eagerly when the
    graph runs: the Triton kernel, or the torch form where no tile configuration fits the device)."""
    return shared_prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, scale=scale, softcap=softcap,
                                   window=window, form="triton")


@_shared_prefix_attention_op.register_fake
def _(q, k_prefix, v_prefix, k_suffix, v_suffix, scale, softcap, window):
    B, H, Sq, D = q.shape
    return q.new_empty(B, Sq, H, D)  # (B, Sq, H, D), contiguous like the kernel's output


def cascade_attention(q, k_suffix, v_suffix, k_prompt, v_prompt, cu_rows, cu_kv, lengths, *, max_rows: int, scale,
                      softcap=None, window=None, triton: bool):
    """The cascade form: q (B, Sq, H, D) of rows grouped by prompt (cu_rows (n+1,)) over their prompt's K/V
    (k/v_prompt (Hkv, sum P_i, D), cu_kv (n+1,)) ⊕ their own keys k/v_suffix (B, S, Hkv, D), ``lengths`` (B,)
    real positions per row or None -> (B, Sq, H, D) in q.dtype, one call for all prompts
    (:mod:`rmfast.kernels.cascade_torch`). ``triton``: the Triton kernels, else the torch twin."""
    if triton:
        from ..kernels.triton_cascade import cascade_attention_triton

        return cascade_attention_triton(q, k_suffix, v_suffix, k_prompt, v_prompt, cu_rows, cu_kv, lengths,
                                        max_rows=max_rows, scale=scale, softcap=softcap, window=window)
    return cascade_ref.cascade_attention(q, k_suffix, v_suffix, k_prompt, v_prompt, cu_rows, cu_kv, lengths, scale=scale,
                                         softcap=softcap, window=window)


def cascade_attention_varlen(q, k, v, k_prompt, v_prompt, cu_q, cu_kv, max_q: int, cu_seqlens, max_len: int, *, scale,
                             softcap=None, window=None, q_pos=None, triton: bool):
    """The cascade form on rows packed back to back with no padding: q (T, H, D), k/v (T, Hkv, D), row r's
    tokens at cu_seqlens[r]:cu_seqlens[r+1], prompt i's rows' tokens at cu_q[i]:cu_q[i+1] over its keys
    k/v_prompt (Hkv, sum P_i, D) at cu_kv[i]:cu_kv[i+1] -> (T, H, D) in q.dtype
    (:mod:`rmfast.kernels.cascade_torch`). ``max_q``/``max_len``: the most tokens of one prompt / one row
    (host ints). ``window``: a sliding window, ``q_pos`` (T,) int32 each token's place in its row (its position is
    its prompt's length plus that). ``triton``: the Triton kernels (three launches), else the torch twin."""
    if triton:
        from ..kernels.triton_cascade import cascade_attention_varlen_triton

        return cascade_attention_varlen_triton(q, k, v, k_prompt, v_prompt, cu_q, cu_kv, max_q, cu_seqlens, max_len,
                                               scale=scale, softcap=softcap, window=window, q_pos=q_pos)
    compiling = torch.compiler.is_compiling()
    rule = None if compiling else _GEMM_ROWS.get()  # rmfast serve: a row's bits its own
    part = None
    least = cpu_flash_from("rows", rule)
    if (not compiling and q.device.type == "cpu" and least is not None and max_len >= least
            and cpu_flash.usable(softcap, window, 0, max_len)):
        # rows this long take torch's flash kernel for their own keys, one call a row (a row's bits its own), as the
        # in-process rows do (cpu_flash_from); the shorter ones of the wave the reference form
        def part(q_, k_, v_, cu_):
            return cpu_flash.response_part_varlen(q_, k_, v_, cu_, scale=scale, min_len=least, short=lambda *a: (
                cascade_ref.response_part_varlen(*a, scale=scale, rule=rule)))
    return cascade_ref.cascade_attention_varlen(q, k, v, k_prompt, v_prompt, cu_q, cu_kv, cu_seqlens, scale=scale,
                                                softcap=softcap, window=window, rule=rule, q_pos=q_pos,
                                                response_part=part)


def varlen_causal_attention(q, k, v, cu_seqlens, max_len: int, *, scale, softcap=None, window=None, triton: bool):
    """Rows packed back to back with no padding, each causal over its own tokens: q (T, H, D), k/v (T, Hkv, D),
    row i's tokens at cu_seqlens[i]:cu_seqlens[i+1] ((n+1,) int32; ``max_len`` the longest row, a host int)
    -> (T, H, D) in q.dtype: the cascade's response part in the varlen layout
    (:func:`rmfast.kernels.cascade_torch.response_part_varlen`), the packed prompt pass's attention.
    ``triton``: the Triton kernel (one launch, written in q.dtype), else the torch twin."""
    if triton:
        from ..kernels.triton_cascade import response_part_varlen_triton

        return response_part_varlen_triton(q, k, v, cu_seqlens, max_len, scale=scale, softcap=softcap, window=window,
                                           out_dtype=q.dtype)[0]
    rule = None if torch.compiler.is_compiling() else _GEMM_ROWS.get()  # rmfast serve: a prompt's bits its own
    return cascade_ref.response_part_varlen(q, k, v, cu_seqlens, scale=scale, softcap=softcap, window=window,
                                            out_dtype=q.dtype, rule=rule)[0]


def rmsnorm(x, weight, eps, *, gemma_style, fp32=False, triton=False):
    """RMSNorm with HF's upcast/cast points (Llama ``w·x̂`` or Gemma ``(1+w)·x̂``); ``fp32``: result kept fp32.
    ``triton``: one fused kernel (:func:`rmfast.kernels.triton_elementwise.rmsnorm_triton`) where x's layout allows."""
    if triton and not fp32:
        from ..kernels.triton_elementwise import rmsnorm_triton

        y = rmsnorm_triton(x, weight, eps, gemma_style=gemma_style)
        if y is not None:
            return y
    return ref.rmsnorm(x, weight, eps, gemma_style=gemma_style, fp32=fp32)


def add_rmsnorm(r, a, weight, eps, *, gemma_style, triton=False):
    """The residual add and the RMSNorm after it: ``(h, rmsnorm(h))`` with ``h = r + a``, HF's ops and roundings.
    ``triton``: one kernel (:func:`rmfast.kernels.triton_elementwise.add_rmsnorm_triton`) where the layouts allow."""
    if triton:
        from ..kernels.triton_elementwise import add_rmsnorm_triton

        out = add_rmsnorm_triton(r, a, weight, eps, gemma_style=gemma_style)
        if out is not None:
            return out
    h = r + a
    return h, ref.rmsnorm(h, weight, eps, gemma_style=gemma_style)


#: positions per call of a rotary table under a rows rule (:func:`rope_tables`)
ROPE_BLOCK = 512


def rope_tables(make, positions, like, limit: int | None = None):
    """``make(positions, like)`` (:meth:`rmfast.fast.arch.ArchSpec.rope`: key -> (L, D) cos, sin), under a rows rule
    (``rmfast serve``) from tables made in blocks of :data:`ROPE_BLOCK` positions from 0 (the last ending at the
    model's ``limit``, ``rope_max_len``, where it has one) and gathered: a position's cos and sin the same bits
    whatever other positions share the wave (the cos of a large table's elements at its threads' split and its end
    takes a scalar path, another last bit on some CPUs)."""
    if torch.compiler.is_compiling() or _GEMM_ROWS.get() is None or positions.numel() == 0:
        return make(positions, like)
    end = -(-(int(positions.max()) + 1) // ROPE_BLOCK) * ROPE_BLOCK
    if limit is not None and int(positions.max()) < limit:
        end = min(end, limit)  # (a position past it: make refuses it, as without the blocks)
    blocks = [make(torch.arange(b, min(b + ROPE_BLOCK, end), device=positions.device), like)
              for b in range(0, end, ROPE_BLOCK)]
    idx = positions.long()
    return {k: (torch.cat([t[k][0] for t in blocks])[idx], torch.cat([t[k][1] for t in blocks])[idx]) for k in blocks[0]}


def rope(x, cos, sin, *, triton=False):
    """RoPE ``x·cos + rotate_half(x)·sin`` over the first cos.shape[-1] dims of each head, HF's ops and roundings:
    x (B, S, n, D), cos/sin (S, Dr) or (B, S, Dr). ``triton``: one kernel where the layout allows."""
    if triton:
        from ..kernels.triton_elementwise import rope_triton

        y = rope_triton(x, cos, sin)
        if y is not None:
            return y
    return ref.rope(x, cos, sin)


def rope_qk(q, k, cos, sin, *, triton=False):
    """:func:`rope` of a layer's queries q (B, S, H, D) and keys k (B, S, Hkv, D) at the same positions: (q', k');
    ``triton``: both in one kernel launch where the layouts allow (each bit-equal to its own :func:`rope`)."""
    if triton:
        from ..kernels.triton_elementwise import rope_qk_triton

        both = rope_qk_triton(q, k, cos, sin)
        if both is not None:
            return both
    return rope(q, cos, sin, triton=triton), rope(k, cos, sin, triton=triton)


def gated_act(g, u, act: str, *, triton=False):
    """The gated MLP's middle, ``act(g) * u`` (``act``: "silu" | "gelu_tanh" | "gelu" | "relu", the layer's
    :attr:`rmfast.fast.layer.LayerConsts.act`); ``triton``: SiLU·up as one kernel (:func:`silu_mul`)."""
    if act == "silu":
        return silu_mul(g, u, triton=triton)
    F = torch.nn.functional
    f = (lambda x: F.gelu(x, approximate="tanh")) if act == "gelu_tanh" else F.relu if act == "relu" else F.gelu
    rule = None if torch.compiler.is_compiling() else _GEMM_ROWS.get()
    return (f(g) if rule is None else ref.each_alike(f, g)) * u  # under a rows rule: each element alike


def silu_mul(g, u, *, triton=False):
    """``F.silu(g) * u`` (the gated MLP's middle); ``triton``: one kernel where each has a (rows, N) view
    (contiguous, or the halves of a fused gate|up output)."""
    if triton:
        from ..kernels.triton_elementwise import silu_mul_triton

        y = silu_mul_triton(g, u)
        if y is not None:
            return y
    if not torch.compiler.is_compiling() and _GEMM_ROWS.get() is not None:  # rmfast serve: each element alike
        return ref.each_alike(torch.nn.functional.silu, g) * u
    return torch.nn.functional.silu(g) * u


def rmsnorm_head(x, norm_weight, eps, head_weight, head_bias=None, *, gemma_style, fp32=True, triton=None):
    """Final RMSNorm + K-output head on (N, D) rows -> (N, K) fp32.

    fp32 (default): norm and head in fp32, output never rounded to the model dtype (a bf16 output
    has 8 significant bits: scores in steps of 0.125 near 20, rankings full of ties); False: HF's
    rounding points. ``triton``: the engine's kernels decision (None: :func:`uses_triton` of x, for direct calls).
    """
    if uses_triton(x) if triton is None else triton:
        from ..kernels.triton_norm_head import rmsnorm_head_triton

        return rmsnorm_head_triton(x, norm_weight, eps, head_weight, head_bias, gemma_style=gemma_style, fp32=fp32)
    rows = None if torch.compiler.is_compiling() else _GEMM_ROWS.get()
    return ref.rmsnorm_head(x, norm_weight, eps, head_weight, head_bias, gemma_style=gemma_style, fp32=fp32, rows=rows)


def rmsnorm_lmhead_logprob(x, norm_weight, eps, lm_weight, targets, *, gemma_style, final_softcap=None, chunk=8192,
                           update_fn=None, pad_rows=None, fp32=True, triton=None):
    """Final RMSNorm + LM head + log-softmax gather on (N, D) rows -> (N,) fp32, no (N, V) block.

    CUDA: the Triton kernel. CPU: :func:`.kernels.torch_twins.rmsnorm_lmhead_logprob_cpu` (``update_fn``: the engine's compiled
    chunk update when it compiles; ``pad_rows``: its compiled row count). fp32 (default): logits
    from fp32 normed rows and upcast weights, not rounded to the model dtype. ``triton``: as for :func:`rmsnorm_head`.
    """
    if uses_triton(x) if triton is None else triton:
        from ..kernels.triton_logprob import rmsnorm_lmhead_logprob_triton

        return rmsnorm_lmhead_logprob_triton(
            x, norm_weight, eps, lm_weight, targets, gemma_style=gemma_style, final_softcap=final_softcap, chunk=chunk,
            fp32=fp32,
        )
    if x.device.type == "cpu":
        return ref.rmsnorm_lmhead_logprob_cpu(
            x, norm_weight, eps, lm_weight, targets, gemma_style=gemma_style, final_softcap=final_softcap,
            update_fn=update_fn, pad_rows=pad_rows, fp32=fp32,
        )
    return ref.rmsnorm_lmhead_logprob(
        x, norm_weight, eps, lm_weight, targets, gemma_style=gemma_style, final_softcap=final_softcap, chunk=chunk,
        fp32=fp32,
    )


def vocab_logprobs(logits: torch.Tensor, *, final_softcap: float | None = None) -> torch.Tensor:
    """(..., V) next-token logits, any dtype -> (..., V) fp32 log-probabilities of every vocabulary id.

    The ONE definition of "the next-token log-probs of a prompt": the engine's prompt pass (its logits,
    already fp32, with the model's ``final_logit_softcapping`` applied here) and ``rmfast logprobs``
    (a Hugging Face forward's logits, softcapped by the model itself: ``final_softcap=None``) both end
    here, so the two agree bit for bit on the same logits. The softmax is always taken in fp32: a bf16
    log-softmax would round every log-probability to 8 significant bits.
    """
    x = logits.float()
    if final_softcap is not None:
        x = torch.tanh(x / final_softcap) * final_softcap
    return torch.log_softmax(x, dim=-1)
