"""Kernels: torch twins (:mod:`.reference`) and their Triton versions (:mod:`.triton_*`).

Nothing here imports triton: ``triton.jit`` decides between compiled and interpreted
kernels when a ``triton_*`` module is imported, so importing them eagerly would freeze
that choice before tests can set ``TRITON_INTERPRET=1``.  Pick kernels via
:mod:`rmfast.ops`.
"""

import importlib.util as _ilu

#: Whether triton is installed (checked without importing it).
HAVE_TRITON = _ilu.find_spec("triton") is not None

__all__ = ["HAVE_TRITON"]
