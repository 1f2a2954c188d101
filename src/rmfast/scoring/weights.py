"""Has a model's weights changed? A cheap fingerprint, so that cached copies of them (the fused
projections a :class:`rmfast.scoring.plan.ScoringPlan` holds, a scorer's cached prompt encodings)
are dropped when they are stale.

Example:
    >>> m = torch.nn.Linear(4, 4)
    >>> before = weights_fingerprint(m)
    >>> with torch.no_grad():
    ...     _ = m.weight.data.mul_(2)          # bypasses the version counter
    >>> weights_fingerprint(m) == before
    False
"""

from __future__ import annotations

import torch

#: values sampled from each parameter for :func:`weights_fingerprint`
FINGERPRINT_SAMPLES = 16


def tensor_version(t: torch.Tensor) -> int:
    """A tensor's in-place-update counter; -1 for inference tensors (made under ``torch.inference_mode``,
    which cannot change in place outside it and keep no counter)."""
    try:
        return t._version
    except RuntimeError:
        return -1


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """What identifies the weights a plan copied, cheaply: every parameter's data pointer and version
    counter (an optimizer step, ``load_state_dict``, ``copy_``), and :data:`FINGERPRINT_SAMPLES` values of
    each at a fixed stride, as bits (an in-place change through ``.data``, which bypasses the version
    counter: ``p.data.mul_(2)``). One device-to-host copy per device; a change that touches none of the
    sampled values is not seen (:meth:`rmfast.scoring.scorer.RewardScorer.clear_cache`)."""
    params = list(model.parameters())
    key = tuple((p.data_ptr(), tensor_version(p)) for p in params)
    by_device: dict = {}
    with torch.no_grad():
        for p in params:
            if p.device.type == "meta":  # an offloaded weight (accelerate): nothing to read here
                continue
            flat = p.detach().reshape(-1)  # (numel,) a view of a contiguous parameter (a copy otherwise)
            step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
            by_device.setdefault(p.device, []).append(flat[::step][:FINGERPRINT_SAMPLES].float())
        # the samples' bits (not their values: a NaN weight compares equal to itself as bits)
        samples = tuple(torch.cat(v).view(torch.int32).cpu().numpy().tobytes() for v in by_device.values())
    return key, samples


__all__ = ["FINGERPRINT_SAMPLES", "tensor_version", "weights_fingerprint"]
