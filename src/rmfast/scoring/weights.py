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


def _samples(p: torch.Tensor) -> torch.Tensor:
    """(<= FINGERPRINT_SAMPLES,) values of ``p`` at a fixed stride: a view of a contiguous parameter (it follows
    in-place changes), a copy otherwise."""
    flat = p.detach().reshape(-1)  # (numel,)
    step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
    return flat[::step][:FINGERPRINT_SAMPLES]


class WeightsWatch:
    """:func:`weights_fingerprint` for calls that repeat on one model (a scorer checks it at every call): each
    parameter's sample view is made once and kept while the parameters keep their storage, shapes and dtypes,
    so a call costs one read of each parameter's pointer and version, and one gather and one device-to-host copy
    per device and dtype. On a GPU a view made per parameter and per call is a few launches each: an 8B's 291
    parameters took ~10 ms of host time per call that way (``make gpu-check``'s profile, run f). The kept views
    keep a replaced parameter's old storage alive until the next call sees the change and drops them."""

    def __init__(self):
        self._layout: tuple | None = None  # (data pointer, shape, dtype, device) of every parameter
        self._groups: list = []  # per (device, dtype): [(parameter, its kept sample view or None: sample afresh)]

    def __call__(self, model: torch.nn.Module) -> tuple:
        params = list(model.parameters())
        layout = tuple((p.data_ptr(), p.shape, p.dtype, p.device) for p in params)
        key = tuple((lay[0], tensor_version(p)) for lay, p in zip(layout, params))  # one pointer read a parameter
        if layout != self._layout:
            groups: dict = {}
            with torch.no_grad():
                for p in params:
                    if p.device.type == "meta":  # an offloaded weight (accelerate): nothing to read here
                        continue
                    # a contiguous parameter's samples are a view (kept); another's are copied at every call
                    groups.setdefault((p.device, p.dtype), []).append((p, _samples(p) if p.is_contiguous() else None))
            self._layout, self._groups = layout, list(groups.values())
        with torch.no_grad():
            # the samples' bits (not their values: a NaN weight compares equal to itself as bits)
            samples = tuple(torch.cat([_samples(p) if v is None else v for p, v in items]).view(torch.uint8)
                            .cpu().numpy().tobytes() for items in self._groups)
        return key, samples


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """What identifies the weights a plan copied, cheaply: every parameter's data pointer and version
    counter (an optimizer step, ``load_state_dict``, ``copy_``), and :data:`FINGERPRINT_SAMPLES` values of
    each at a fixed stride, as bits (an in-place change through ``.data``, which bypasses the version
    counter: ``p.data.mul_(2)``). One gather and one device-to-host copy per device and dtype; a change that
    touches none of the sampled values is not seen (:meth:`rmfast.scoring.scorer.RewardScorer.clear_cache`).
    Repeated calls on one model: :class:`WeightsWatch`."""
    return WeightsWatch()(model)


__all__ = ["FINGERPRINT_SAMPLES", "WeightsWatch", "tensor_version", "weights_fingerprint"]
