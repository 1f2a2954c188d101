"""Refuse bench options whose batches cannot fit in memory, before any timing (:func:`check_batches`).

A batch size the user gives to ``rmfast bench`` (``--batch-size``, ``--hf-batch``, ``--naive-batch``,
each capped at the number of candidates the run times) is checked against the memory free on the
device, with the same per-row estimate the scan uses (:func:`rmfast.scoring.batching.row_bytes`): on a CPU an
oversized batch raises no out-of-memory error to back off from, it swaps the machine or gets the
process killed after minutes. The message gives the estimate and the largest batch that fits.
"""

from __future__ import annotations

from ..errors import UserError
from .machine import batch_options


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def row_estimates(lm, prompt: str, head: str = "auto", template: str | None = None) -> dict[str, int]:
    """Estimated bytes one row of each bench batch needs (:func:`rmfast.scoring.batching.row_bytes`):
    ``--batch-size`` (the engine: the candidate's tokens over the shared prompt), ``--hf-batch`` and
    ``--naive-batch`` (plain HF: every row holds the whole sequence and its cache). ``lm`` may live on
    the meta device (:func:`rmfast.bench.random_init.random_init_shapes`): only shapes and dtype are read."""
    from ..scoring.batching import row_bytes
    from ..scoring.plan import default_head
    from ..template import build_template

    model, tok = lm.model, lm.tokenizer
    head = default_head(model) if head == "auto" else head
    tmpl = build_template(tok, prompt, template=template if template is not None else lm.default_template)
    tpr = max(1, 1 + len(tmpl.suffix_ids) if head == "score" else len(tmpl.continuation_ids))
    kw = dict(prefix_len=len(tmpl.prefix_ids), head=head)
    return {"--batch-size": row_bytes(model, tpr, **kw, full_sequence=False),
            "--hf-batch": row_bytes(model, tpr, **kw, full_sequence=True),
            "--naive-batch": row_bytes(model, tpr, **kw, full_sequence=True)}


def largest_batches(per_row: dict[str, int], available: int) -> dict[str, int]:
    """The most rows one batch of each option may hold with ``available`` bytes free: what :func:`check_batches`
    allows (:data:`rmfast.scoring.batching.MEM_FRACTION` of it), at least one.

    >>> largest_batches({"--hf-batch": 1000}, 10_000)
    {'--hf-batch': 5}
    """
    from ..scoring.batching import MEM_FRACTION

    budget = int(MEM_FRACTION * available)
    return {opt: max(1, budget // b) for opt, b in per_row.items()}


def check_batches(cfg, lm, args, device, dflt, available: int | None = None) -> None:
    """UserError when one batch of an explicit bench batch size needs more than the memory a scan may use
    (:data:`rmfast.scoring.batching.MEM_FRACTION` of what is free; ``available`` overrides the measurement).
    The rule is :func:`largest_batches` of :func:`row_estimates` (``benchmarks/gpu_check.py`` plans with it)."""
    from ..scoring.batching import MEM_FRACTION, available_memory
    from ..scoring.candidates import vocab_size

    asked = [("--batch-size", (args.batch_size,))] if args.batch_size else []
    if args.hf_batch:
        asked.append(("--hf-batch", batch_options(args.hf_batch, ())))
    if args.naive_batch:
        asked.append(("--naive-batch", batch_options(args.naive_batch, ())))
    if not asked:
        return
    avail = available_memory(device) if available is None else available
    if avail is None:
        return
    per_row = row_estimates(lm, args.prompt, cfg.head, cfg.template)
    fits = largest_batches(per_row, avail)
    n = min(args.n_candidates or dflt["n_candidates"], vocab_size(lm.model, lm.tokenizer))
    n_naive = min(args.n_naive or dflt["n_naive"], n)
    budget = int(MEM_FRACTION * avail)
    for opt, sizes in asked:
        rows = min(max(sizes), n_naive if opt == "--naive-batch" else n)
        if rows > fits[opt]:
            need = rows * per_row[opt]
            raise UserError(f"bench {opt} {max(sizes)}: one batch of {rows} rows of {cfg.name} needs about {_gib(need)} "
                            f"({_gib(per_row[opt])} a row), more than the {_gib(budget)} a batch may use "
                            f"({MEM_FRACTION:.0%} of {_gib(avail)} free on {device.type}); give {opt} {fits[opt]} or less")
