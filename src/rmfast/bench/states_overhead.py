"""The extra time of ``--states last_prenorm`` and ``--states all`` over a plain scan (issue 24;
``rmfast bench --workload states``, ``benchmarks/states_overhead.py``).

One process, one model (default the embedded SmolLM2-135M-Instruct with a seeded random score head,
so the score head and its fast path run), the same ids (the first ``n`` of the vocabulary). The
plain scan and each states mode are interleaved over ``repeats`` rounds (plain, last_prenorm, all, plain,
last_prenorm, all, ...) after one untimed warm-up scan of each (first-call costs, such as a compiled layer's
form with states, stay out of the first round); each is a full :func:`rmfast.scoring.pipeline.score_ids`
job through the batching loop with a checkpoint, a mode's states written to a fresh folder (shards
+ manifest) in the system's temporary folder, as ``rmfast scan --states MODE`` does, and removed
after it is measured.

One row per mode (``plain`` first): the median, fastest and slowest scan time and the median's
ratio to plain's (plain's is 1.0), the layers kept, the bytes the states folder took on disk (all
its files: shards with their keys, manifest) per candidate beside the states alone (layers ×
hidden × dtype size), the rate they were written at over the scan (``write_mb_s``: bytes on disk / median
scan time) beside the disk's measured limit (``disk_limit_mb_s``: :func:`disk_write_mb_s`, fsync'ed
sequential writes of the same size class into the same folder, capped at 256 MiB, in as many files side by side
as the states' writer pool writes, ``disk_probe_streams``), how long the scan waited
on the writer thread (``writer_wait_s``, median; ``disk_kept_up``: at most :data:`KEPT_UP_FRAC` of the
scan; :class:`rmfast.scoring.states_stream.BackgroundWriter`), the peak memory of the scan
(:class:`rmfast.bench.machine.PeakMemory`: the process's RSS high-water mark on CPU, reset before each scan, so it includes the model; CUDA's
``max_memory_allocated`` on a GPU) and its excess over plain's, whether every scan's scores were
plain's bit for bit, the machine and the versions. A mode ``MODE/sync`` writes its states in the scan's
thread (the synchronous reference, ``StatesRequest(background=False)``), timed in the same rounds.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..states import parse_layers
from ..cpu import versions
from ..scoring.states_stream import WRITERS
from .best_of_n import MACHINE_FIELDS, VERSION_FIELDS
from .machine import PeakMemory, log, machine_info, sync
from .models import DEFAULT_PROMPT, ModelChoice
from .random_init import load_workload_model


@dataclass
class StatesOverheadConfig(ModelChoice):
    """One states-overhead run (one model). Every field has the default of ``benchmarks/states_overhead.py``.

    Attributes:
        n: candidate ids scanned per job, the first ``n`` of the vocabulary (default 4096).
        repeats: rounds of plain + every mode; the median counts (default 5).
        modes: the ``--states`` of each timed mode beside plain: ``last_prenorm``, ``all``, ``last_normed`` or a
            layer index, each optionally ``/sync`` (written in the scan's thread) (default ("last_prenorm", "all")).
        dtype: model dtype (default "bfloat16"; the states are kept in it).
        device: "cpu", "cuda" or "auto" (default "cpu").
        threads: torch CPU threads (default None: torch's).
        batch_size: rows per batch (default "auto": scan's).
        prompt: the user turn (default :data:`rmfast.bench.models.DEFAULT_PROMPT`).
        model, name, random_head_seed, template, random_init, layers, tiny, init_seed, allow_pickle:
            which model (:class:`rmfast.bench.models.ModelChoice`, same defaults).
        head: "score", "logprob" or "auto" (default "score").
    """

    n: int = 4096
    repeats: int = 5
    modes: tuple[str, ...] = ("last_prenorm", "all")
    dtype: str = "bfloat16"
    device: str = "cpu"
    threads: int | None = None
    batch_size: int | str = "auto"
    prompt: str = DEFAULT_PROMPT
    head: str = "score"

    def check(self) -> None:
        """One-line UserErrors for values that cannot run."""
        if int(self.n) < 1 or int(self.repeats) < 1:
            raise UserError("states: n-candidates and repeats must be >= 1")
        if not self.modes:
            raise UserError("states: give at least one mode (e.g. --states-modes last_prenorm,all)")
        for m in self.modes:
            if m == "plain" or "," in m:
                raise UserError(f"states: mode {m!r}: give last_prenorm, all, last_normed or a layer index "
                                "(plain is always timed)")
            parse_layers(m.removesuffix(SYNC), None)


#: the suffix of a mode whose states are written in the scan's thread (the synchronous reference)
SYNC = "/sync"
#: the disk kept up when the scan waited on the writer thread for at most this share of its time
KEPT_UP_FRAC = 0.05
#: the disk probe writes as much as the largest states folder, within these bounds (bytes)
PROBE_MIN, PROBE_MAX = 8 << 20, 256 << 20


def disk_write_mb_s(folder: Path, size: int, chunk: int = 4 << 20, streams: int = 1) -> float:
    """The disk's sequential write rate into ``folder`` (MB/s, 1e6 bytes): ``size`` bytes of random data in
    ``streams`` files written side by side (a thread each, as the states' shard writers write), each in ``chunk``-byte
    pieces and fsync'ed, timed from the first open to the last fsync; the files are removed.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     disk_write_mb_s(Path(d), 1 << 20, chunk=1 << 18, streams=2) > 0
    True
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    data = os.urandom(chunk)
    files = [Path(folder) / f"rmfast-disk-probe-{i}.bin" for i in range(streams)]
    share = -(-size // streams)  # bytes per stream (the last may write fewer)

    def write(i: int) -> None:
        n = max(0, min(share, size - i * share))
        with open(files[i], "wb") as fh:
            for lo in range(0, n, chunk):
                fh.write(data[: min(chunk, n - lo)])
            fh.flush()
            os.fsync(fh.fileno())

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(streams) as pool:
            list(pool.map(write, range(streams)))  # re-raises a stream's error
        return size / (time.perf_counter() - t0) / 1e6
    finally:
        for f in files:
            f.unlink(missing_ok=True)


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


class _Jobs:
    """The scans of one run: one model, one id set, a fresh states folder and checkpoint per scan."""

    def __init__(self, lm, template, cfg: StatesOverheadConfig, tmp: Path):
        self.lm, self.template, self.cfg, self.tmp = lm, template, cfg, tmp
        self.dev = next(lm.model.parameters()).device
        self.ids = np.arange(cfg.n, dtype=np.int64)
        self.mem = PeakMemory(self.dev)
        self.ref: np.ndarray | None = None
        self.identical: dict[str, bool] = {}
        self.info: dict[str, dict] = {}  # mode -> layers, dtype, bytes of its first folder
        self.batch_size = None
        self.writer: dict[str, list[tuple[float, float]]] = {}  # mode -> (wait s, busy s) per timed scan

    def run(self, mode: str, r: int) -> tuple[float, float]:
        """One scan in ``mode`` (round ``r``): (seconds, peak MiB)."""
        from ..scoring.pipeline import StatesRequest, score_ids

        folder = self.tmp / f"{mode.replace('/', '-')}.{r}.states"
        req = None if mode == "plain" else StatesRequest(mode.removesuffix(SYNC), folder=folder,
                                                         background=not mode.endswith(SYNC))
        sync(self.dev)
        self.mem.reset()
        t0 = time.perf_counter()
        res = score_ids(self.lm.model, self.lm.tokenizer, self.cfg.prompt, self.ids, head=self.cfg.head,
                        template=self.template, batch_size=self.cfg.batch_size, progress=False,
                        checkpoint=self.tmp / f"{mode}.{r}.npz", states=req)
        sync(self.dev)
        dt = time.perf_counter() - t0
        peak = self.mem.read_mib()
        if self.ref is None:
            self.ref = res.scores
        same = bool(np.array_equal(res.scores, self.ref, equal_nan=True))
        self.identical[mode] = self.identical.get(mode, True) and same
        self.batch_size = res.manifest.get("batch_size")
        w = (res.manifest.get("states") or {}).get("writer")
        if w is not None and r >= 0:
            self.writer.setdefault(mode, []).append((w["wait_s"], w["busy_s"], w.get("write_s"), w.get("writers")))
        if req is not None:
            if mode not in self.info:
                man = json.loads((folder / "manifest.json").read_text())
                if int(man["n"]) != self.ids.size:
                    raise RuntimeError(f"states {mode}: the folder holds {man['n']} rows, not {self.ids.size}")
                self.info[mode] = {"layers": man["layers"], "dtype": man["dtype"], "hidden": int(man["hidden_size"]),
                                   "bytes": folder_bytes(folder)}
            shutil.rmtree(folder)
        return dt, peak


def _write_fields(jobs: _Jobs, mode: str, nbytes: int, median_s: float, disk: tuple[float, int]) -> dict:
    """How a mode's states were written: its rate over the scan, the disk's limit, the wait on the writer."""
    if mode == "plain":
        return {"writer": "", "write_mb_s": None, "disk_limit_mb_s": None, "disk_probe_bytes": None, "disk_probe_streams": None,
                "of_disk_limit": None, "writer_wait_s": None, "writer_busy_s": None, "shard_write_s": None,
                "shard_writers": None, "disk_kept_up": None}
    rate, limit = nbytes / median_s / 1e6, disk[0]
    w = jobs.writer.get(mode)  # None: written in the scan's thread (/sync), where every write is a wait
    wait = statistics.median(x[0] for x in w) if w else None
    return {"writer": "background" if w else "sync", "write_mb_s": round(rate, 2), "disk_limit_mb_s": round(limit, 1),
            "disk_probe_bytes": disk[1], "disk_probe_streams": WRITERS,
            "of_disk_limit": round(rate / limit, 4) if limit else None,
            "writer_wait_s": None if wait is None else round(wait, 4),
            "writer_busy_s": round(statistics.median(x[1] for x in w), 4) if w else None,
            # the shard writers' time (count + write), summed over the threads that wrote side by side
            "shard_write_s": round(statistics.median(x[2] for x in w), 4) if w and w[0][2] is not None else None,
            "shard_writers": w[0][3] if w else None,
            "disk_kept_up": None if wait is None else bool(wait <= KEPT_UP_FRAC * median_s)}


def _rows(jobs: _Jobs, name: str, times: dict, peaks: dict, disk: tuple[float, int]) -> list[dict]:
    """One row per mode from the rounds' times and peaks, and the disk probe's (MB/s, bytes)."""
    cfg, lm = jobs.cfg, jobs.lm
    info, ver = machine_info(jobs.dev), versions()
    med = {m: statistics.median(v) for m, v in times.items()}
    rows = []
    for mode, ts in times.items():
        st = jobs.info.get(mode, {"layers": [], "dtype": None, "hidden": None, "bytes": 0})
        size = torch.tensor([], dtype=getattr(torch, st["dtype"])).element_size() if st["dtype"] else 0
        rows.append({
            "model": name, "mode": mode, "states_layers": "" if mode == "plain" else mode.removesuffix(SYNC),
            "layers_kept": len(st["layers"]), "hidden_size": st["hidden"], "states_dtype": st["dtype"],
            "n_candidates": cfg.n, "rounds": len(ts), "batch_size": jobs.batch_size,
            "median_s": round(med[mode], 4), "min_s": round(min(ts), 4), "max_s": round(max(ts), 4),
            "ratio_to_plain": round(med[mode] / med["plain"], 4), "cand_per_s": round(cfg.n / med[mode], 2),
            "bytes_written": st["bytes"], "bytes_per_candidate": round(st["bytes"] / cfg.n, 1),
            "state_bytes_per_candidate": len(st["layers"]) * (st["hidden"] or 0) * size,
            **_write_fields(jobs, mode, st["bytes"], med[mode], disk),
            "peak_mib": round(max(peaks[mode]), 1), "peak_mib_over_plain": round(max(peaks[mode]) - max(peaks["plain"]), 1),
            "peak_how": jobs.mem.how, "scores_identical": jobs.identical[mode],
            "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."), "device": str(jobs.dev),
            "times_s": [round(t, 4) for t in ts],
            **{k: info.get(k) for k in MACHINE_FIELDS}, **{k: ver.get(k) for k in VERSION_FIELDS}})
    return rows


def run_states_overhead(cfg: StatesOverheadConfig) -> list[dict]:
    """Plain and every mode of ``cfg`` interleaved over its rounds on its model; one row per mode, plain first
    (times, ratio to plain, layers, bytes, peak memory, exactness, model, dtype, device, machine, versions)."""
    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    lm, name, template = load_workload_model(cfg)
    vocab = lm.model.get_input_embeddings().num_embeddings
    if cfg.n > vocab:
        raise UserError(f"states: {cfg.n} candidates but {name} has {vocab:,} ids; give --n-candidates <= {vocab}")
    for m in cfg.modes:  # a layer index out of range: one line before any scan
        parse_layers(m.removesuffix(SYNC), getattr(lm.model.config, "num_hidden_layers", None))
    modes = ("plain", *dict.fromkeys(cfg.modes))
    times: dict[str, list[float]] = {m: [] for m in modes}
    peaks: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="rmfast-states-bench-") as tmp:
        jobs = _Jobs(lm, template, cfg, Path(tmp))
        t0 = time.perf_counter()
        for m in modes:  # warm-up: first-touch allocations, thread pools, a compiled layer (and its states form)
            jobs.run(m, -1)
        log(f"{name}: {cfg.n} ids, warm-up scans {time.perf_counter() - t0:.1f} s; {cfg.repeats} rounds of "
            f"{', '.join(modes)}")
        for r in range(cfg.repeats):
            for m in modes:
                dt, peak = jobs.run(m, r)
                times[m].append(dt)
                peaks[m].append(peak)
            log(f"round {r + 1}/{cfg.repeats}: " + "  ".join(f"{m} {times[m][-1]:.3f} s" for m in modes))
        probe = min(PROBE_MAX, max(PROBE_MIN, *(i["bytes"] for i in jobs.info.values())))
        # where the states were written, after the scans, as many streams as the writer's pool writes at once
        disk = (disk_write_mb_s(Path(tmp), probe, streams=WRITERS), probe)
    rows = _rows(jobs, name, times, peaks, disk)
    for row in rows:
        log(f"{row['mode']:>8}: median {row['median_s']:.3f} s ({row['ratio_to_plain']:.3f}x plain), "
            f"{row['layers_kept']} layers, {row['bytes_per_candidate']:,.0f} B/candidate on disk, peak "
            f"{row['peak_mib']:,.0f} MiB ({row['peak_mib_over_plain']:+,.0f})"
            + ("" if row["write_mb_s"] is None else f", {row['write_mb_s']:,.1f} MB/s written (disk: "
               f"{row['disk_limit_mb_s']:,.0f} MB/s fsync'ed), waited on the writer {row['writer_wait_s']} s")
            + ("" if row["scores_identical"] else "  SCORES DIFFER FROM PLAIN"))
    return rows


def format_states_table(rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    out = ["| model | mode | layers | median s | × plain | B/candidate on disk | MB/s written (disk limit) "
           "| waited on writer s | peak MiB (vs plain) | same scores |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb = "" if r.get("write_mb_s") is None else f"{r['write_mb_s']:,.1f} ({r['disk_limit_mb_s']:,.0f})"
        wait = "" if r.get("writer_wait_s") is None else (f"{r['writer_wait_s']:.3f} ("
                                                          f"{'kept up' if r['disk_kept_up'] else 'did not keep up'})")
        out.append(f"| {r['model']} | {r['mode']} | {r['layers_kept']} | {r['median_s']:.3f} | {r['ratio_to_plain']:.3f} "
                   f"| {r['bytes_per_candidate']:,.0f} | {mb} | {wait} | {r['peak_mib']:,.0f} "
                   f"({r['peak_mib_over_plain']:+,.0f}) | {'yes' if r['scores_identical'] else 'NO'} |")
    return "\n".join(out)


def write_states_overhead(rows: list[dict], out: str | Path, config: dict, device: str = "cpu") -> tuple[Path, Path]:
    """Rows to ``<out>/states_overhead_<timestamp>.csv`` and ``.json`` (with the machine, versions and config)
    and the same as ``states_overhead_latest``; the timestamped paths."""
    from .output import write_workload_rows

    return write_workload_rows(rows, out, config, workload="states", stem="states_overhead", device=device)


def config_record(cfg: StatesOverheadConfig) -> dict:
    """The configuration as the JSON records it."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
