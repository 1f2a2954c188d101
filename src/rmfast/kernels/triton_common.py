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


def check_device(t: torch.Tensor, kernel) -> None:
    """CPU tensors only work when the kernel was built by the interpreter.

    triton.jit picks compiled vs interpreted when a kernel is defined (triton.language's own
    helpers: when triton is first imported), so TRITON_INTERPRET=1 must be set before that;
    say so instead of failing obscurely.
    """
    if not t.is_cuda and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton kernels need CUDA tensors; CPU tensors work only when "
                           "TRITON_INTERPRET=1 was set before triton was first imported")
