"""Kernels: torch twins (:mod:`.torch_twins`) and their Triton versions (:mod:`.triton_*`).

Nothing here imports triton: ``triton.jit`` decides between compiled and interpreted
kernels when a ``triton_*`` module is imported, so importing them eagerly would freeze
that choice before tests can set ``TRITON_INTERPRET=1``.  Pick kernels via
:mod:`rmfast.fast.ops`.
"""


def triton_available() -> bool:
    """Whether triton imports here: the one check, made at first use (on a CUDA tensor), when the
    kernels' shared module (:mod:`.triton_common`) imports it."""
    from .triton_common import HAVE_TRITON

    return HAVE_TRITON


__all__ = ["triton_available"]
