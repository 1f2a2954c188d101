"""Machine, memory and timing helpers of ``rmfast bench``: what ran where, how much memory, how fast."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time

import numpy as np
import torch

from ..errors import UserError


def log(msg: str) -> None:
    """One progress line on stderr (flushed, so it interleaves with the run)."""
    print(msg, file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: torch.device) -> dict:
    """Platform, CPU model, kind and bf16-relevant flags (:func:`rmfast.cpu.cpu_info`), cores, torch
    threads, GPU name, load average."""
    from ..cpu import cpu_id, cpu_info, isa_env

    c = cpu_info()
    info = {
        "platform": platform.platform(),
        "cpu_model": c.model,
        "cpu_id": cpu_id(),  # vendor, family, model, stepping: "AMD EPYC" alone is every generation of it
        "cpu_kind": c.kind,
        "cpu_flags": " ".join(c.flags),
        "isa_env": isa_env(),  # kernels limited by the environment (e.g. AVX2 kernels on an AVX-512 CPU)
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "loadavg_start": loadavg(),
    }
    return info


def loadavg() -> list[float] | None:
    """The 1/5/15-minute load averages (rounded), or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def busy_note(load: list[float] | None = None, cpus: int | None = None) -> str | None:
    """One line where the machine is busy when a benchmark starts (the 1-minute load at or over the CPUs): its
    figures then say more of the other work than of rmfast (a walkthrough saw 2-50x between two runs of one
    command, and 2 threads at half the speed of 1). None on an idle machine.

    >>> busy_note([3.1, 2.0, 1.0], 2)
    'note: load average 3.1 on 2 CPUs: other work is running, so these timings are unreliable (run-to-run differences of 2-50x were seen); rerun on an idle machine, or with --threads 1'
    >>> busy_note([0.2, 0.1, 0.1], 2) is None
    True
    """
    load = loadavg() if load is None else load
    cpus = cpus or os.cpu_count() or 1
    if not load or load[0] < cpus:
        return None
    return (f"note: load average {load[0]:g} on {cpus} CPUs: other work is running, so these timings are unreliable "
            "(run-to-run differences of 2-50x were seen); rerun on an idle machine, or with --threads 1")


class PeakMemory:
    """Peak memory of a code region: CUDA max_memory_allocated, or the process's peak RSS.

    On Linux the RSS high-water mark is reset through /proc/self/clear_refs, so each region gets
    its own peak; elsewhere it is the process-wide getrusage maximum (monotone; stated in `how`).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.how = "cuda.max_memory_allocated" if device.type == "cuda" else "rss"

    def reset(self) -> None:
        """Start a new region: reset the CUDA peak or the RSS high-water mark."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.how = "rss (VmHWM, reset per method)"
        except OSError:
            self.how = "rss (getrusage ru_maxrss, process-wide max)"

    def read_mib(self) -> float:
        """The peak since the last reset, in MiB."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 2**20 if sys.platform == "darwin" else r / 1024



def chunks(ids: np.ndarray, bs: int) -> list[np.ndarray]:
    """``ids`` in consecutive slices of ``bs`` (the last one shorter)."""
    return [ids[i : i + bs] for i in range(0, ids.size, bs)]


def best_wall(fn, device: torch.device, repeats: int = 3) -> float:
    """The best wall of ``repeats`` calls of ``fn()`` in seconds, the device's queued work waited for around each."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def time_calls(fn, device: torch.device, repeats: int) -> tuple[np.ndarray, list[float]]:
    """Call ``fn() -> list of score tensors`` ``repeats`` times; (scores of the last call, seconds per call)."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        sync(device)
        t0 = time.perf_counter()
        parts = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        out = torch.cat([p.float().cpu() for p in parts]).numpy()
    return out, times


def time_batches(fn, ids: np.ndarray, bs: int, device: torch.device, repeats: int) -> tuple[np.ndarray, list[float]]:
    """Score ``ids`` (one-token responses) in batches of ``bs``, ``repeats`` times; (scores, seconds per pass)."""
    return time_calls(lambda: [fn(torch.from_numpy(c)[:, None]) for c in chunks(ids, bs)], device, repeats)


def batch_options(value, default) -> tuple[int, ...]:
    """``--hf-batch`` / ``--naive-batch``: None -> ``default``; an int or a comma-separated list of ints."""
    if value is None or value == "":
        return tuple(default)
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        out = tuple(int(v) for v in value)
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise UserError(f"batch sizes {value!r}: give a positive integer or a comma list of them, e.g. 128,512")
    return out


def say_clamped(option: str, asked, n: int, cap: int | None = None, why: str = "") -> None:
    """One line where a batch size the user gave (``option``: ``--hf-batch``, ``--naive-batch``) is not what runs:
    larger than the ``n`` candidates timed, or over ``cap`` (``why`` says whose cap)."""
    if asked is None or asked == "":
        return
    sizes = batch_options(asked, ())
    big = [b for b in sizes if b > n]
    if big:
        log(f"  note: {option} {','.join(map(str, big))} is more than the {n} candidates timed: batches of {n} run")
    if cap is not None and any(min(b, n) > cap for b in sizes):
        log(f"  note: {option}: batches of at most {cap} run ({why})")


def pick_batch(fn_for, ids: np.ndarray, options, device: torch.device) -> tuple[int, dict | None]:
    """Warm each batch size up on one batch, time one more; the fastest per candidate wins.

    ``fn_for(bs)`` is the scorer for batches of ``bs``. With a single option it only runs the warm-up
    batch (no probe). A batch size that runs out of memory is recorded as ``"oom"`` in the probe and
    left out (a large model's baseline on a GPU); if every one does, the error propagates.
    """
    options = sorted({int(min(b, ids.size)) for b in options})
    if len(options) == 1:
        fn_for(options[0])(torch.from_numpy(ids[: options[0]])[:, None])  # warm-up
        sync(device)
        return options[0], None
    probe: dict = {}
    for bs in options:
        try:
            probe[bs] = probe_batch(fn_for(bs), ids, bs, device)
        except torch.OutOfMemoryError:
            probe[bs] = "oom"
        if probe[bs] == "oom" and device.type == "cuda":  # after the except block: its traceback held the tensors
            torch.cuda.empty_cache()
    ok = {bs: v for bs, v in probe.items() if v != "oom"}
    if not ok:
        raise torch.OutOfMemoryError(f"every batch size of {options} ran out of memory")
    return max(ok, key=ok.get), probe


def probe_batch(fn, ids: np.ndarray, bs: int, device: torch.device) -> float:
    """Candidates/s of one batch of ``bs`` after one warm-up batch of the same shape."""
    batch = torch.from_numpy(ids[:bs])[:, None]
    fn(batch)  # warm-up (allocator, oneDNN primitives / CUDA kernels for this shape)
    sync(device)
    t0 = time.perf_counter()
    fn(batch)
    sync(device)
    return round(bs / (time.perf_counter() - t0), 2)
