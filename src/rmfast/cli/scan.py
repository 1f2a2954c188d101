"""``rmfast scan``: every vocabulary token (or a view, or a file of texts) as the response to a prompt.

One path for every input: the options build a :class:`rmfast.scoring.pipeline.Selection`, and
:func:`rmfast.scoring.pipeline.run_scan` scores it; under torchrun each rank scores its share and rank 0
merges the shards.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import UserError
from ..io import check_output, slug, states_dir
from ..locks import output_lock
from . import common


def register(sub) -> None:
    p = sub.add_parser("scan", help="score every vocabulary token (or a file of texts) as the response to a prompt")
    common.add_model_args(p)
    common.add_template_args(p)
    common.add_output_args(p, "results/<model>__<prompt>[__<candidates>].parquet; manifest at <out>.json")
    common.add_plan_args(p)
    p.add_argument("--token-ids", default=None, help="subset: a range A:B or a file with one id per line (default: all)")
    p.add_argument("--exclude-special", action="store_true", help="drop special/added tokens (default: score them)")
    p.add_argument("--wordlike", action="store_true", help="vocabulary view: tokens that are letters only (after the leading space)")
    p.add_argument("--dedup", action="store_true", help="vocabulary view: drop ids whose decoded text occurs more than once")
    p.add_argument("--candidates", default=None, metavar="FILE",
                   help="score response texts instead of token ids: one per line, or a CSV/TSV/Parquet column (--column)")
    p.add_argument("--column", default=None, help="the --candidates table's column holding the texts")
    p.add_argument("--compat", default=None, choices=["decode-retokenize", "authors"],
                   help="decode-retokenize: the papers' decode round trip (ids decoded to text, the whole conversation "
                        "re-tokenized); authors: their whole scoring loop (also a second BOS, and batches of --batch-size "
                        "padded together: auto = the papers' size for their models, else 32; plain-HF path). Default off")
    p.add_argument("--max-tokens", type=common.positive_int, default=None, help="longest text candidate in tokens (default 256)")
    p.add_argument("--device-map", default=None,
                   help="e.g. auto: spread a large model over the GPUs (accelerate; plain-HF path; default off)")
    p.add_argument("--audit", type=common.nonneg_int, default=512, metavar="N",
                   help="a bf16/fp16 scan rescores a seeded tenth of its candidates (at least 32, at most N) in "
                        "fp32 and reports the agreement and what it cost (manifest bf16_audit; default 512, 0: off)")
    p.add_argument("--states", default=None, metavar="LAYERS",
                   help="also keep each candidate's hidden state at the final position, from the same forward, in "
                        "<out stem>.states/: residual-stream indices as HF's hidden_states (0 = embeddings: under a "
                        "score head the template's last token, the same for every candidate of a token scan; under "
                        "the logprob head the candidate's own; k = after decoder layer k), "
                        "last_prenorm (after the last layer, BEFORE the final norm: not in HF's tuple), last_normed "
                        "(after the final norm: what the head reads, HF's hidden_states[-1]), or all; e.g. "
                        "0,8,16,last_normed. The old name last means last_prenorm (docs/representations.md)")
    p.add_argument("--states-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of the stored states (default: the model's)")
    p.add_argument("--lens", action="store_true",
                   help="reward lens: the score head read through the final norm after every layer, as lens_<layer> "
                        "columns (rmfast analyze lens)")
    p.add_argument("--random-head-seed", type=common.nonneg_int, default=None,
                   help="load a causal LM with a seeded random one-output score head, e.g. to keep its hidden "
                        "states at the score head's position (default: off)")
    p.add_argument("--top", type=common.nonneg_int, default=20, help="rows in the printed top/bottom tables (default 20)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def selection(args):
    """The candidates the options ask for (read before any model is loaded, so bad input fails fast)."""
    from ..scoring.candidate_files import read_candidates
    from ..scoring.candidates import DEFAULT_MAX_TOKENS
    from ..scoring.pipeline import Selection

    if args.column is not None and args.candidates is None:
        raise UserError("--column needs --candidates FILE")
    sel = Selection(token_ids=args.token_ids, exclude_special=args.exclude_special, wordlike=args.wordlike,
                    dedup=args.dedup, compat=args.compat,
                    max_tokens=args.max_tokens if args.max_tokens is not None else DEFAULT_MAX_TOKENS)
    if args.candidates is not None:
        sel.texts = []  # checked before the file is read
        sel.check()
        cands = read_candidates(args.candidates, args.column)
        sel.texts, sel.texts_info = cands.texts, cands.source
    sel.check()
    return sel


def _states_request(args, out, d):
    """The scan's states: ``<out stem>.states``; under torchrun each rank's beside its shard (rank 0 joins them)."""
    from ..scoring.pipeline import StatesRequest

    if args.states is None:
        return None
    if d is not None:  # a rank's own folder (a killed run's is replaced); the scan's is checked at the start
        from ..sweep import dist

        return StatesRequest(args.states, args.states_dtype, folder=states_dir(dist.shard_path(Path(out), d.rank, d.world)),
                             overwrite=True)
    return StatesRequest(args.states, args.states_dtype, folder=states_dir(out), overwrite=args.overwrite)


def _check_states_args(args) -> None:
    """--states/--lens checks that need no model: syntax, an existing states folder."""
    from ..states import check_states_target, parse_layers

    if args.states is None and args.states_dtype is not None:
        raise UserError("--states-dtype needs --states LAYERS")
    if args.states is not None:
        args.states = ",".join(parse_layers(args.states, None))  # names (an old 'last' noted once); ranges once loaded
        if args.out:
            check_states_target(states_dir(args.out), args.overwrite)


def drop_old_states(out) -> None:
    """Remove a states folder left beside ``out`` by an earlier scan of the same --out (now replaced). Only a
    folder that is a states folder (it has a states manifest) is removed; its readers would refuse it anyway
    (its manifest names the old write, :func:`rmfast.states.tie.check_scan_tie`)."""
    import shutil

    from ..states import MANIFEST

    folder = states_dir(out)
    if folder.is_dir() and not folder.is_symlink() and (folder / MANIFEST).is_file():
        shutil.rmtree(folder)
        print(f"removed {folder}: the states of the scan this one replaced")


def _ranks():
    """This process's place among torchrun's ranks (:mod:`rmfast.sweep.dist`), or None in a single process: decided
    once, here, so a plain scan never touches the scale-out code (no ``WORLD_SIZE``, or a world of one)."""
    if not os.environ.get("WORLD_SIZE", "").strip():
        return None
    from ..sweep import dist

    d = dist.from_env()  # checks RANK, MASTER_ADDR and MASTER_PORT
    return d if d.world > 1 else None


def _drop_finished_leftovers(out) -> None:
    """A finished scan's checkpoint and lock file, left by a kill between the output's write and their removal:
    removed (holding the lock, so never a running job's), as that job would have. Nothing else is touched: not a
    checkpoint saved after the output (a later job's, killed: a --states or --lens rerun has the same key), nor one
    beside partial states."""
    from ..io import partial_states, read_manifest, unfinished_result
    from ..parquet_read import read_parquet
    from ..scoring.batching import finished_checkpoint
    from ..scoring.plan import run_key

    ck = Path(f"{out}.partial.npz")
    try:
        if (not ck.is_file() or ck.stat().st_mtime_ns > Path(out).stat().st_mtime_ns or unfinished_result(out)
                or partial_states(states_dir(out)).exists()
                or not (man := read_manifest(out, required=False))):
            return
        with output_lock(out):
            if finished_checkpoint(ck, run_key(man), read_parquet(out, columns=["token_id"])["token_id"].to_numpy()):
                ck.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - busy, damaged, unwritable: check_output and the job itself say so
        pass


def run(args) -> int:
    from ..scoring.options import ScoringOptions
    from ..scoring.pipeline import drop_checkpoint, finish_states, run_scan

    sel = selection(args)
    options = ScoringOptions.from_args(args)  # the one options value, checked before anything loads
    d = _ranks()
    if args.out:
        _drop_finished_leftovers(args.out)
    _check_states_args(args)
    if args.out:
        check_output(args.out, args.overwrite, suffix=".parquet")  # refuse before loading anything
    if d is not None:
        from ..sweep import dist

        dist.init(d)
    try:
        lm = common.load_model(args, random_head_seed=args.random_head_seed,
                               device=args.device if d is None else dist.device_for(d, args.device),
                               device_map=args.device_map)
        tag = f"__{slug(sel.tag())}" if sel.tag() else ""
        out = args.out or common.default_output(slug(lm.source.get('name') or args.model), args.prompt, f"{tag}.parquet")
        out = check_output(out, args.overwrite, suffix=".parquet")
        rank_tag = "" if d is None else f".{d.tag()}"
        ck = Path(f"{out}.partial{rank_tag}.npz")
        main = d is None or d.is_main
        # the output's own lock on the process that writes it (a plain scan of the same --out waits for a torchrun
        # one's rank 0, and the reverse); every rank holds its own for its checkpoint
        with output_lock(f"{out}{rank_tag}"), output_lock(out) if d is not None and main else contextlib.nullcontext():
            check_output(out, args.overwrite)  # again, holding the lock: a job that just finished wrote it
            res, order = run_scan(
                lm.model, lm.tokenizer, args.prompt, sel, options, rows=None if d is None else d.mine,
                template=common.template_arg(args, lm), system=args.system,
                progress=not args.no_progress and main, checkpoint=ck, keep_checkpoint=True, model_info=lm.source,
                audit=args.audit, states=_states_request(args, out, d), lens=args.lens)
            if d is not None:
                res = dist.gather_shards(d, out, res, order)
                if res is None:  # this rank's checkpoint stays until rank 0 has written the output (drop_shards)
                    return 0
                check_output(out, args.overwrite)  # a file that appeared while the ranks scored is not replaced
            kept = ck if d is None else f"{out}.partial.rank*-of-{d.world}.npz (every rank's)"
            try:
                res.to_parquet(out, overwrite=args.overwrite)
            except OSError as e:  # a full disk, a read-only folder: the scores stay in the checkpoint
                raise UserError(f"cannot write {out}: {e.strerror or e}; the scores are kept in {kept} — free space "
                                "(or fix the folder) and rerun the same command to write them without rescoring") from None
            finish_states(res)  # the states folder's manifest, then the folder into place
            if args.states is None and main:
                drop_old_states(out)  # an overwrite without --states: the old states are not this scan's
            drop_checkpoint(res, ck)  # only now: the output, its manifest and states are in place
            if d is not None:
                dist.drop_shards(d, out, lambda tag: f"{out}.partial.{tag}.npz")
        _print_summary(res, args.top, out, 1 if d is None else d.world)
        return 0
    finally:
        if d is not None:
            dist.finish(d)


def _batch_said(m: dict) -> str:
    """", batch N" as planned, and the rows that ran where a batch ran as another size (a short job padded to a smaller
    measured size, or run as just its rows): "batch 2048" alone read as 2,048 rows run for a 10-id job."""
    bs = m.get("batch_size")
    if bs in (None, "auto"):
        return ""
    ran = {int(r): n for r, n in (m.get("rows_run") or {}).items()}
    if not ran or set(ran) == {int(bs)}:
        return f", batch {bs}"
    said = [f"{n} of {r} rows" for r, n in sorted(ran.items(), reverse=True)]
    said[0] = said[0].replace(" of ", f" batch{'es' if ran[max(ran)] > 1 else ''} of ", 1)
    return f", batch {bs}; ran {', '.join(said)}"


def _print_summary(res, top: int, out, world: int) -> None:
    m = res.manifest
    if top:
        common.print_tables(res, top)
    ranks = f", {world} ranks" if world > 1 else ""
    compiled = " (compiled)" if m.get("compiled") else ""
    batch = _batch_said(m)
    if m.get("tokens_per_row") == 0:  # every score came from the prompt's one forward pass
        print(f"\n{m['n_candidates']} candidates from one forward pass over the prompt (no per-candidate work: the "
              f"template has no end-of-turn to score; {m['engine']} engine, {m['dtype']}, {m['device']}); "
              f"total {m['wall_s']:.1f} s")
    else:
        rate = f"{m['candidates_per_s']} cand/s; " if m.get("candidates_per_s") else ""
        probe = ""
        if m.get("pad_probe_s"):  # the rate leaves the one-off measurement out; the time holds it, and says so first
            probe = f", {m['pad_probe_s']:.1f} s of it a one-off padding measurement"
            with_probe = m.get("candidates_per_s_with_pad_probe")
            rate = rate.replace(" cand/s; ", " cand/s without it" + (f", {with_probe} with it; " if with_probe else "; "))
        resumed = int(m.get("resumed_candidates") or 0)
        what = (f"{m['n_candidates'] - resumed} candidates scored by this run" if resumed else f"{m['n_candidates']} candidates")
        print(f"\n{what} in {m['scan_s']:.1f} s{probe} ({rate}{m['engine']} engine{compiled}, "
              f"{m['dtype']}, {m['device']}{batch}{ranks}); total {m['wall_s']:.1f} s"
              + (f"; {resumed} more from the checkpoint, {m['n_candidates']} in all" if resumed else ""))
    ca = m.get("compat_authors")
    if ca:
        print(f"--compat authors (batch {ca['batch_size']}, {ca['padding_side']} padding, tokenizer pad "
              f"{ca['tokenizer_pad_id']}, config pad {ca['config_pad_id']}): {ca['n_double_bos']} rows with a second BOS, "
              f"{ca['n_pad_reads']} read at a pad position, {ca['n_early_reads']} read before their end")
    if m.get("bf16_audit"):  # a bf16/fp16 scan's fp32 audit (none with --audit 0 or in fp32)
        from ..scoring.audit import audit_line

        print(audit_line(m["bf16_audit"]))
    st = m.get("states") or {}
    folder = f" and {states_dir(out)}/ ({len(st['layers'])} layers, {st['dtype']})" if st.get("folder") else ""
    print(f"wrote {out}, {out}.json{folder}" if folder else f"wrote {out} and {out}.json")
