"""``rmfast sweep`` (models × prompts × candidate sets into a resumable store) and ``rmfast results``."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ..io import check_output, write_csv, write_parquet

#: The sweep config a user first needs to see (``rmfast sweep --help``, README.md's sweep example); a test
#: parses it with :func:`rmfast.sweep.load_config`, so it stays valid.
EXAMPLE_CONFIG = """\
out: results/greatest                 # the results store (or --out)
defaults: {dtype: auto, batch_size: auto}   # options for every model; each model may override them
models:
  - smollm2-135m-instruct             # the embedded model, an alias (rmfast models), folder, .gguf, hub id
  - model: S-Lla-1B-V2                # or a mapping: the model and its own options
    name: skywork-1b                  # its name in the results (default: the name rmfast scan records)
    dtype: float32
prompts:                              # name: text (or a list, or a YAML file of them)
  greatest: "What, in one word, is the greatest thing ever?"
  worst: "What, in one word, is the worst thing ever?"
candidates:                           # name: set (default: the whole vocabulary)
  vocab: vocabulary
  words: {vocabulary: {exclude_special: true, wordlike: true}}
  items: {file: items.csv, column: name}   # multi-token texts: a CSV's column (or a .txt, one a line)
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="models × prompts × candidate sets into a resumable results store",
                              epilog="example config (relative paths are relative to the config file; every "
                                     "key: docs/scale_out.md):\n\n" + textwrap.indent(EXAMPLE_CONFIG, "  "),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="sweep config (YAML): models, prompts, candidates, per-model options")
    p.add_argument("--out", default=None, help="results store directory (default: out: in the config)")
    p.add_argument("--force", action="store_true",
                   help="adopt this config in a store written by another one (unchanged parts are kept, others redone/removed)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only shard I of N (0-based; the parts dealt by size, largest first to the least-loaded "
                        "shard, the same split in every job: independent jobs, e.g. a SLURM array); torchrun needs no "
                        "flag; with --dry-run, lists this shard's parts")
    p.add_argument("--dry-run", action="store_true", help="check the config and the store, list the parts, run nothing")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--base", default=None, metavar="PATH/ALIAS",
                   help="adapter (LoRA) checkpoints: load them on this base model instead of the one their "
                        "adapter_config.json names (default: that one; e.g. a hub id not available offline)")
    p.add_argument("--states", default=None, metavar="LAYERS",
                   help="keep each part's hidden states in part.states/ beside it, for every model (over the config's "
                        "states:): e.g. 0,8,last_prenorm, or all (docs/representations.md)")
    p.add_argument("--states-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of the stored states (default: the model's)")
    p.add_argument("--lens", action="store_true", help="the reward lens columns lens_<layer> in every part")
    p.set_defaults(func=run)

    r = subparsers.add_parser("results", help="list what a results store holds; export its tidy table")
    r.add_argument("store", help="a sweep's results directory")
    r.add_argument("--parts", action="store_true", help="list every part")
    r.add_argument("--out", default=None, help="write the tidy table (model, prompt, token_id, text, score, rank, ...) "
                                               "to this .parquet (what score is in its schema metadata, "
                                               "rmfast.io.read_provenance) or .csv (a score_meaning column)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    r.add_argument("--allow-missing", action="store_true",
                   help="with --out, export the parts that are there when some are missing (never computed, or their "
                        "Parquet gone), naming them in one line (default off: refuse, naming them)")
    r.set_defaults(func=results)


def run(args) -> int:
    from ..loading.training_checkpoints import is_adapter_folder
    from ..errors import UserError
    from ..loading.loader import causal_lm_only, preflight
    from ..sweep import load_config, run_sweep, with_base, with_states

    cfg = with_states(load_config(args.config), args.states, args.states_dtype, args.lens)
    if args.base:
        cfg = with_base(cfg, args.base)
    for m in cfg.models:  # a broken model file stops the sweep here, before the store is touched
        if not is_adapter_folder(m.model):  # an adapter checkpoint is checked when it is loaded on its base
            preflight(m.model, cache_dir=m.cache_dir, allow_pickle=m.allow_pickle)
        if m.lens and m.random_head_seed is None and (m.head == "logprob" or m.head == "auto" and causal_lm_only(m.model)):
            raise UserError(f"model {m.name}: the lens reads a score head through the final norm, and {m.model} is a "
                            "causal LM (its head: logprob); give it a seeded score head (random_head_seed: N in the "
                            "config), or drop lens for it")
    idx = run_sweep(cfg, args.out, force=args.force, shard=args.shard, progress=not args.no_progress, dry_run=args.dry_run)
    root = Path(args.out) if args.out else cfg.out
    if idx.get("dry_run"):
        print(f"{root}: {idx['n_parts']} parts, {idx['n_done']} done ({idx['mode']} store); nothing run (--dry-run)")
        mine = idx.get("mine")
        if mine is not None:
            print(f"  shard {args.shard}: its {len(mine)} part(s)")
        for s, p in zip(idx["parts"], cfg.plan()):
            if mine is not None and p.relpath not in mine:  # --shard I/N: another shard's part
                continue
            word = "done" if s["done"] else "todo"
            print(f"  {word}  {p.relpath}" + ("  (stale: its model's files changed since it was scored)"
                                               if s.get("stale") else ""))
        for rel in idx["remove"]:  # (a dry run said "1 parts, 1 done" where the real one then removed 5)
            print(f"  remove  {rel}  (not in the new config: --force deletes it)")
        return 0
    if idx.get("complete") is None:
        return 0
    rows = f", {idx['rows']} rows" if idx.get("rows") is not None else ""
    state = "complete" if idx.get("complete") else "incomplete (other shards still running or failed)"
    print(f"{root}: {idx.get('n_done', '?')}/{idx['n_parts']} parts{rows}; {state}")
    return 0


def results(args) -> int:
    import pandas as pd

    from ..sweep import summarize

    s = summarize(args.store)
    missing = _export_checks(args)
    status = s["status"]
    done = sum(x["done"] for x in status)
    rows = sum(x["rows"] or 0 for x in status)
    cfg = s["config"] or {}
    print(f"{s['root']}: config {s['config_file']} (hash {s['config_hash']}, created {s['created']})")
    print(f"  {len(cfg.get('models', []))} models × {len(cfg.get('prompts', {}))} prompts × "
          f"{len(cfg.get('candidates', []))} candidate sets = {len(status)} parts; {done} done, {rows} rows")
    df = pd.DataFrame(status)
    if not df.empty:
        g = df.groupby(["model", "candidates"], sort=False).agg(parts=("done", "size"), done=("done", "sum"),
                                                                 rows=("rows", lambda r: int(pd.to_numeric(r).fillna(0).sum())))
        print(g.reset_index().to_string(index=False))
        for p in df[df["stale"]].itertuples():  # finished once, from files its model no longer has: not done
            print(f"  stale: {p.path} (its model's files changed since it was scored; `rmfast sweep` scores it again)")
    if args.parts and not df.empty:
        print()
        df["states"] = df["states"].map(lambda v: ",".join(v) if v else "-")
        print(df[["done", "model", "prompt_name", "candidates", "rows", "states", "path"]].to_string(index=False))
    if args.out:
        from ..sweep.store import Store, load_results

        import warnings

        with warnings.catch_warnings():  # the parts left out are said below, as the export's own line
            warnings.simplefilter("ignore")
            tidy = load_results(args.store, token_ids=False)
        st, out = Store(args.store), Path(args.out)
        if out.suffix.lower() == ".csv":  # no schema metadata in a CSV: what `score` is goes in a column
            write_csv(out, tidy.assign(score_meaning=tidy["model"].map(st.score_meanings())))
        else:
            write_parquet(out, tidy, st.export_provenance())
        print(f"wrote {len(tidy)} rows to {out}")
        if missing:
            print(f"rmfast: warning: exported without them: {missing}", file=sys.stderr)
    return 0


def _export_checks(args) -> str | None:
    """Before any part is read: --out may be written, and the store holds every part (else, with
    --allow-missing, the line naming what the export leaves out; without it, that line is the error)."""
    from ..errors import UserError
    from ..sweep.store import Store

    if args.allow_missing and not args.out:
        raise UserError("--allow-missing applies to an export: add --out FILE")
    if not args.out:
        return None
    check_output(args.out, args.overwrite)
    if Path(args.out).suffix.lower() not in (".parquet", ".csv"):  # (anything else was written as Parquet)
        raise UserError(f"--out {args.out}: the export is Parquet or CSV, by its name; give a path ending in .parquet "
                        "or .csv")
    st = Store(args.store)
    plan = st.plan()
    missing = st.missing(plan)
    if not missing:
        return None
    text = st.missing_text(missing, len(plan))
    if not args.allow_missing:
        raise UserError(f"{text}; rerun the sweep to finish them, or pass --allow-missing to export the "
                        f"{len(plan) - len(missing)} that are there")
    return text
