"""How far rmfast covers each known reward model, computed (``rmfast models``' status column).

Three facts, each read from its one place: the architecture is on the fast path (:data:`rmfast.fast.arch.SUPPORTED`),
the head kind is one the engine scores (:data:`FAST_HEADS`), and a test verifies the model on a replica
(the registry entry's ``replica_test``).

    >>> from rmfast.loading.registry import find
    >>> coverage(find("R-Gem-2B")).arch, coverage(find("F-Lla-8B-v0.1")).head
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import RewardModel
from ..fast.arch import SUPPORTED

#: Head kinds (:data:`rmfast.loading.registry.HEADS`) the engine scores on the fast path: the plain classifier head
#: and rmfast's own implementations of the custom heads (:mod:`rmfast.fast.heads`, recognized by
#: :mod:`rmfast.loading.custom_heads`; no remote code).
FAST_HEADS: frozenset[str] = frozenset({"score", "armorm", "qrm", "urm"})


@dataclass(frozen=True)
class Coverage:
    arch: bool  # model_type on the fast path
    head: bool  # head kind in FAST_HEADS
    verified: bool  # a replica test is named

    @property
    def fast(self) -> bool:
        return self.arch and self.head

    def text(self, m: RewardModel) -> str:
        if self.fast:
            return "fast path, verified on a replica" if self.verified else "fast path (no replica test)"
        if not self.head:
            return f"not supported: {m.head} head not implemented"
        return f"plain-HF path: {m.model_type} is not on the fast path"


def coverage(m: RewardModel) -> Coverage:
    return Coverage(arch=m.model_type in SUPPORTED, head=m.head in FAST_HEADS, verified=m.replica_test is not None)
