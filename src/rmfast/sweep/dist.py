"""Scale-out: ranks from the environment, a barrier, work sharding, and big models over many devices.

Under ``torchrun`` every process sees ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``. rmfast then
splits the work: a sweep's parts are dealt out by estimated size (:func:`rmfast.sweep.assign`,
deterministic from the config), a single scan's candidates by ``index % world == rank``;
each rank writes its own files, and rank 0 finishes (merges shards, writes the store index) after
a barrier. The barrier is a ``torch.distributed`` **gloo** process group (CPU tensors only, so it
works the same on CPU and GPU nodes; torchrun's rendezvous gives the address), with a long
timeout because ranks may finish hours apart. Outside torchrun (no ``WORLD_SIZE``, or 1) nothing
changes: no process group, no sharding.

``--shard I/N`` gives the rank and world explicitly (a SLURM array: ``I=$SLURM_ARRAY_TASK_ID``);
there is no barrier then, and whichever process sees every part finished writes the store index.

``--device-map auto`` loads a model across all visible GPUs (and CPU RAM) with accelerate; it is
scored on the plain Hugging Face path, because the shared-prompt engine assumes one device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from datetime import timedelta

import numpy as np
import torch

from ..errors import UserError

BARRIER_TIMEOUT = timedelta(days=30)  # ranks may finish their parts hours apart


@dataclass(frozen=True)
class Dist:
    """Where this process stands: rank, world size, local rank, and whether a process group is used."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: bool = False  # a torch.distributed process group (torchrun); False for --shard or one process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mine(self, n: int) -> np.ndarray:
        """Indices 0..n-1 this rank takes: every world-th, starting at its rank."""
        return np.arange(self.rank, n, self.world, dtype=np.int64)

    def tag(self) -> str:
        return f"rank{self.rank}-of-{self.world}"


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise UserError(f"environment variable {name}={v!r} is not an integer") from None


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N.

    >>> parse_shard("3/8")
    (3, 8)
    """
    a, sep, b = str(spec).partition("/")
    try:
        i, n = int(a), int(b)
    except ValueError:
        raise UserError(f"--shard {spec!r} is not I/N (e.g. --shard 0/4, or --shard $SLURM_ARRAY_TASK_ID/4)") from None
    if not sep or n < 1 or not (0 <= i < n):
        raise UserError(f"--shard {spec!r}: need 0 <= I < N")
    return i, n


def from_env(shard: str | None = None) -> Dist:
    """The rank and world size from torchrun's environment (or ``--shard I/N``); (0, 1) otherwise."""
    world = _env_int("WORLD_SIZE") or 1
    if shard is not None:
        if world > 1:
            raise UserError("--shard is for separate jobs (SLURM arrays); under torchrun the ranks come from the environment")
        i, n = parse_shard(shard)
        return Dist(rank=i, world=n, local_rank=0, group=False)
    if world <= 1:
        return Dist()
    rank = _env_int("RANK")
    if rank is None or not (0 <= rank < world):
        raise UserError(f"WORLD_SIZE={world} but RANK is unset or out of range; launch with torchrun")
    if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        raise UserError(f"WORLD_SIZE={world} but MASTER_ADDR/MASTER_PORT are unset; launch with torchrun "
                        "(or use --shard I/N for independent jobs)")
    return Dist(rank=rank, world=world, local_rank=_env_int("LOCAL_RANK") or 0, group=True)


def init(d: Dist) -> None:
    """Join the gloo process group (torchrun only). Idempotent."""
    if not d.group:
        return
    import torch.distributed as td

    if not td.is_available():
        raise UserError("this torch build has no torch.distributed; run one process per job with --shard I/N")
    if not td.is_initialized():
        td.init_process_group(backend="gloo", rank=d.rank, world_size=d.world, timeout=BARRIER_TIMEOUT)


def barrier(d: Dist) -> None:
    if d.group:
        import torch.distributed as td

        td.barrier()


def finish(d: Dist) -> None:
    if d.group:
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()


def device_for(d: Dist, device: str) -> str:
    """This rank's device (:func:`rmfast.loading.loader.resolve_device`, the one rule: under torchrun "auto"/"cuda"
    is cuda:LOCAL_RANK)."""
    from ..loading.loader import resolve_device

    return str(resolve_device(device, d.local_rank if d.group else None))


def shard_path(out: Path, rank: int, world: int) -> Path:
    """Where rank ``rank`` of ``world`` keeps its share of a scan ``out`` until rank 0 merges them (its
    states folder beside it: :func:`rmfast.io.states_dir`)."""
    return Path(out).parent / f".{Path(out).name}.rank{rank}-of-{world}.parquet"


def drop_shards(d: Dist, out: Path, checkpoint) -> None:
    """Rank 0, once ``out``, its manifest and states are in place: every rank's shard and checkpoint
    (``checkpoint(tag)``: a rank's checkpoint path from its :meth:`Dist.tag`). Kept until then, so a rank 0 that
    fails (a full disk) or is killed while writing loses no rank's scores: the rerun resumes every rank."""
    from ..io import manifest_path

    for r in range(d.world):
        for f in (shard_path(out, r, d.world), manifest_path(shard_path(out, r, d.world)),
                  checkpoint(Dist(r, d.world).tag())):
            Path(f).unlink(missing_ok=True)


def gather_shards(d: Dist, out: Path, res, order):
    """Each rank writes its shard; rank 0 merges them after a barrier (returns None on other ranks). The
    shards stay until rank 0 has written the output (:func:`drop_shards`).

    With states, each rank first finishes its own states folder (beside its shard); the merged result
    then joins them into ``<out stem>.states`` when :func:`rmfast.scoring.pipeline.finish_states` is
    called on it, after the scan is written (:class:`rmfast.states.StatesMerge`: its shards are linked, the ranks removed once it is in place)."""
    import json

    from ..io import manifest_path, provenance, states_dir, write_json, write_parquet
    from ..parquet_read import read_parquet
    from ..scoring.pipeline import finish_states
    from ..scoring.results import merge_shards
    from ..states import StatesMerge

    def shard(r):
        return shard_path(out, r, d.world)

    finish_states(res)  # this rank's states folder, complete before the barrier
    df = res.to_pandas()
    df["_order"] = order
    write_parquet(shard(d.rank), df, provenance(res.manifest))  # a shard says what its scores are, as the scan will
    write_json(manifest_path(shard(d.rank)), res.manifest)
    barrier(d)
    if not d.is_main:
        return None
    frames = [read_parquet(shard(r)) for r in range(d.world)]
    merged = merge_shards(frames, [json.loads(manifest_path(shard(r)).read_text()) for r in range(d.world)])
    if (res.manifest.get("states") or {}).get("folder"):
        merged.states_writer = StatesMerge([states_dir(shard(r)) for r in range(d.world)], states_dir(out))
        merged.states_scan = res.states_scan
        merged.manifest["states"] = {**res.manifest["states"], "folder": states_dir(out).name}
    return merged
