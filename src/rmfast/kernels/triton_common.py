"""Pieces every Triton kernel module shares: the optional import, launch-size helpers, device check.

Kept apart so the modules stay importable without triton (CPU installs use the torch twins).
"""

from __future__ import annotations

import torch

try:  # the package must import without triton
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    triton = None
    tl = None
    HAVE_TRITON = False


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def dot_precision(dtype: torch.dtype, fp32: bool = False) -> str:
    """The ``input_precision`` of every ``tl.dot`` of a kernel whose inputs are ``dtype``.

    "ieee" wherever the computation is meant to be fp32: fp32 inputs, or ``fp32=True`` (the engine's
    fp32 heads) on half inputs. Triton's default for fp32 operands is "tf32", which Ampere and Hopper
    run on tensor cores with a 10-bit mantissa: on an H100 the fp32 log-prob head on fp16 rows was
    off by 3.3e-3 (gpu-check of 2026-11-26, issue 32), a thousand times fp32's error. Half inputs
    with half operands: "tf32" names the default, which applies to no operand there (half x half,
    fp32 accumulation).

    >>> dot_precision(torch.float32), dot_precision(torch.float16, fp32=True), dot_precision(torch.bfloat16)
    ('ieee', 'ieee', 'tf32')
    """
    return "ieee" if fp32 or dtype == torch.float32 else "tf32"


def check_device(t: torch.Tensor, kernel) -> None:
    """CPU tensors only work when the kernel was built by the interpreter.

    triton.jit picks compiled vs interpreted when a kernel is defined (triton.language's own
    helpers: when triton is first imported), so TRITON_INTERPRET=1 must be set before that;
    say so instead of failing obscurely.
    """
    if not t.is_cuda and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton kernels need CUDA tensors; CPU tensors work only when "
                           "TRITON_INTERPRET=1 was set before triton was first imported")
