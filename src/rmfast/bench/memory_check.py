"""Refuse bench options whose batches cannot fit in memory, before any timing (:func:`check_batches`).

A batch size the user gives to ``rmfast bench`` (``--batch-size``, ``--hf-batch``, ``--naive-batch``,
each capped at the number of candidates the run times) is checked against the memory free on the
device, with the same per-row estimate the scan uses (:func:`rmfast.scoring.memory.row_bytes`): on a CPU an
oversized batch raises no out-of-memory error to back off from, it swaps the machine or gets the
process killed after minutes. The message gives the estimate and the largest batch that fits.
"""

from __future__ import annotations

from ..errors import UserError
from .machine import batch_options


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_batches(cfg, lm, args, device, dflt, available: int | None = None) -> None:
    """UserError when one batch of an explicit bench batch size needs more than the memory a scan may use
    (:data:`rmfast.scoring.memory.MEM_FRACTION` of what is free; ``available`` overrides the measurement)."""
    from ..scoring.memory import MEM_FRACTION, available_memory, row_bytes
    from ..scoring.plan import default_head
    from ..template import build_template
    from ..scoring.vocab import vocab_size

    asked = [("--batch-size", (args.batch_size,), False)] if args.batch_size else []
    if args.hf_batch:
        asked.append(("--hf-batch", batch_options(args.hf_batch, ()), True))
    if args.naive_batch:
        asked.append(("--naive-batch", batch_options(args.naive_batch, ()), True))
    if not asked:
        return
    avail = available_memory(device) if available is None else available
    if avail is None:
        return
    model, tok = lm.model, lm.tokenizer
    head = default_head(model) if cfg.head == "auto" else cfg.head
    tmpl = build_template(tok, args.prompt, template=cfg.template if cfg.template is not None else lm.default_template)
    tpr = 1 + len(tmpl.suffix_ids) if head == "score" else len(tmpl.continuation_ids)
    n = min(args.n_candidates or dflt["n_candidates"], vocab_size(model, tok))
    n_naive = min(args.n_naive or dflt["n_naive"], n)
    budget = int(MEM_FRACTION * avail)
    for opt, sizes, full in asked:
        rows = min(max(sizes), n_naive if opt == "--naive-batch" else n)
        per_row = row_bytes(model, max(1, tpr), prefix_len=len(tmpl.prefix_ids), head=head, full_sequence=full)
        need = rows * per_row
        if need > budget:
            fits = max(1, budget // per_row)
            raise UserError(f"bench {opt} {max(sizes)}: one batch of {rows} rows of {cfg.name} needs about {_gib(need)} "
                            f"({_gib(per_row)} a row), more than the {_gib(budget)} a batch may use "
                            f"({MEM_FRACTION:.0%} of {_gib(avail)} free on {device.type}); give {opt} {fits} or less")
