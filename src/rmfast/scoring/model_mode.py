"""A model as rmfast scores it, whoever called: eval mode and no autocast for the length of a call, and one lock per
model for the calls that change its config (:func:`rmfast.scoring.hf_path.pad_token_as`).

Library callers hand rmfast models that a trainer also holds: in training mode (dropout on), inside the caller's
``torch.autocast`` region, or shared by two scorers in two threads. Before this module, only
:class:`rmfast.scoring.scorer.RewardScorer` set eval mode, per scorer: ``rmfast.scan`` on the plain-HF engine scored
with dropout (two identical scans disagreed, by up to 0.2 on a tiny GPT-2, and moved the global RNG), an autocast
region made every layer and the "fp32" head bf16 while the manifest said float32, and two scorers of one model in two
threads could restore training mode under each other's running call.

Example:
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    >>> with scoring_mode(m), torch.autocast("cpu", dtype=torch.bfloat16):
    ...     with scoring_mode(m):     # a nested call (rmfast's own entry points nest)
    ...         (m.training, m(torch.ones(1, 2)).dtype)
    (False, torch.float32)
    >>> m.training                    # the caller's mode back once the last call on the model ends
    True
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch

_LOCK = threading.Lock()
#: model -> [calls running on it, the modules' own training flags to restore (None: all were in eval mode)]
_IN_USE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: model -> the lock of the calls that change its config while they run
_MODEL_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def scoring_mode(model):
    """``model`` in eval mode (no dropout) and autocast off (rmfast decides every dtype: the layers', and the head's in
    fp32) while the block runs; each module's own training flag back when the last call on the model ends, so calls
    that overlap in threads never restore training mode under one another."""
    with _LOCK:
        got = _IN_USE.get(model)
        if got is None:
            modes = [(m, m.training) for m in model.modules()]
            got = _IN_USE[model] = [0, modes if any(was for _, was in modes) else None]
            if got[1] is not None:
                model.eval()
        got[0] += 1
    try:
        with no_autocast():
            yield
    finally:
        with _LOCK:
            got[0] -= 1
            if got[0] == 0:
                _IN_USE.pop(model, None)
                for m, was in got[1] or ():
                    m.training = was


@contextlib.contextmanager
def no_autocast():
    """The caller's ``torch.autocast`` regions (CPU, CUDA) off in this thread for the block; nothing where none is on."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def model_lock(model) -> threading.RLock:
    """The lock of ``model``'s config changes (one per model object, whichever scorer or scan holds it)."""
    with _LOCK:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


__all__ = ["model_lock", "no_autocast", "scoring_mode"]
