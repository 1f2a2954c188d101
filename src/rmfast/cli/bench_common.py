"""What the bench workloads' command lines share: their configs per model and the rows written and checked."""

from __future__ import annotations

import sys

from ..errors import UserError


def random_init_configs(base, args, tiny: bool):
    """A workload's configs for ``--random-init`` names (or ``--tiny`` alone: a small random Llama), or None
    (then ``--models``); CUDA asked where there is none is one line."""
    from dataclasses import replace

    import torch

    if base.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda but CUDA is not available")
    if not (args.random_init or tiny):
        return None
    names = args.random_init.split(",") if args.random_init else ["llama-3.2-1b"]
    return [replace(base, random_init=n.strip(), tiny=True if tiny else args.tiny) for n in names if n.strip()]


def ran(record, base, cfgs: list) -> dict:
    """A workload's config as its JSON records it: the base's fields, and each config that ran (the base names the
    default model, where --random-init or --tiny ran another)."""
    return {**record(base), "model": ",".join(c.random_init or c.model for c in cfgs), "configs": [record(c) for c in cfgs]}


def model_configs(base, models) -> list:
    """A workload's config per resolved bench model (:func:`rmfast.bench.resolve_models`)."""
    from dataclasses import replace

    return [replace(base, model=m.spec, name=m.name, random_head_seed=m.random_head_seed, template=m.template)
            for m in models]


def say_busy(args) -> None:
    """The busy-machine line the run found at its start (:func:`rmfast.bench.machine.busy_note`), said after the
    figures (an error before them stays the run's one line)."""
    if getattr(args, "busy_note", None):
        print(f"rmfast bench: {args.busy_note}", file=sys.stderr)


def write_and_check(rows: list[dict], write, args, record: dict, device: str, what: str) -> int:
    """A workload's rows written with its config and command line; exit 1 where fp32 scores differ past rounding."""
    write(rows, args.out, {**record, "cli": {k: v for k, v in vars(args).items() if k != "func"}}, device=device)
    say_busy(args)
    bad = [r for r in rows if r["dtype"] == "float32" and not r["max_abs_diff"] <= 1e-3 * max(1.0, r["score_std"])]
    if bad:
        print(f"rmfast bench: {what} differ by up to {max(r['max_abs_diff'] for r in bad):.2e} in float32 "
              "(max_abs_diff in the rows)", file=sys.stderr)
        return 1
    return 0
