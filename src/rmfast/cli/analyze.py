"""``rmfast analyze NAME ...`` and ``rmfast report ...``: the analyses (:mod:`rmfast.analysis`) from the command line.

Inputs: Parquet scan files or folders of them (``<file>.json`` manifests beside them),
and/or ``--eloeverything DIR`` (a folder given as an input that holds EloEverything CSVs
is recognised too). Model scores come from the scan files when any are given (the
EloEverything CSVs then supply only the human Elo, joined on the item text); with no scan
files they are the reward-model scores stored in the CSVs (the papers' published scores,
not rmfast scans). Either way a note says which. The main table goes to stdout (``--max-rows``), or as CSV to
``--out``; ``--table`` picks another table of the result. Rows dropped and notes go to
stderr.

Examples::

    rmfast analyze human --eloeverything ../shared/data/eloeverything
    rmfast analyze human my_items_scan.parquet --eloeverything ../shared/data/eloeverything
    rmfast analyze agreement scans/ --metadata models.yaml --table rsa --out rsa.csv
    rmfast report --eloeverything ../shared/data/eloeverything --out report.html
    rmfast analyze trajectory ../shared/data/iclr2026/reward_model_training --out traj/
    rmfast analyze trajectory sweep_store/parts --dictionary big2_nouns.csv --out traj/

``categories`` also reads a folder of paper B's published score CSVs in the authors' layout
(``<prefix>_rewards_<org>_<model>.csv``: a ``response`` column and one column per prompt key,
any prefix, e.g. big2_rewards_* or MFD20_rewards_*); every file read or skipped is counted in a
note, and a skipped file that would drop a model is an error unless --allow-skipped. With
--method paper it ranks and tests as paper B's R script does, and merges MFD 2.0's
<Foundation>_Virtue/_Vice categories into the five foundations (--virtue-vice keep: the ten):

    rmfast analyze categories ../shared/data/iclr2026/dict_big2_nouns --dictionary
        ../shared/data/lexicons/big2_nouns.csv --method paper --out medians.csv
    rmfast analyze categories dict_MFD_20/ --dictionary mfd2.0.dicx --method paper
        --table summaries

``similarity A B`` compares two sets of hidden states (scans written with ``--states``, or
states folders; docs/representations.md): layer × layer CKA, debiased CKA, RV and RV2 with
permutation p-values (19 by default) and, when asked (``--bootstrap 200``), bootstrap intervals, one row
per layer pair, to stdout or ``--out``; a cost line on stderr says about how long before the replicates start.
With three or more sets, ``similarity A B C ... --metadata FILE`` gives the models × models
table at one layer (``--layers-a``, default last_prenorm) and, with ``--table rsa``, its RSA with the
metadata predictors (permutation over models, ``--n-perm``).

``lens SCAN.parquet --out lens.csv`` reads a scan written with ``--lens`` (the reward head
read through the final norm after every layer): per layer the Spearman correlation with the
final scores and the top-/bottom-k overlap (``--k``), and with ``--table entry`` the layer where
each of the final top-k first enters (and stays in) the top-k; the figure goes to lens.png
beside ``--out``.

``trajectory`` reads checkpoint tables instead (paper B's rank_results_*.csv, long CSVs with
step, token, score or rank, or scans of checkpoints named checkpoint-N) and writes every table
(CSV) and figure (PNG) into the folder ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..analysis import registry
from ..errors import UserError
from ..io import check_output, write_csv
from ..parquet_read import read_parquet
from .common import add_states_view_args, nonneg_int, positive_int

if TYPE_CHECKING:  # pandas is imported where it is used: `rmfast --help` needs none of it
    import pandas as pd

ANALYSES = registry.names()  # one line each in rmfast.analysis.registry (no pandas, no analysis imported)


@dataclass
class _Loaded:
    """What the CLI inputs give: the scans, the human scores, and where each comes from."""

    scans: pd.DataFrame
    human: pd.DataFrame | None
    source: str  # every input, for the report's header
    scores_source: str  # where the model scores come from, in words
    human_source: str | None  # where the human scores come from, in words
    left_out: "Ledger"  # rows of the scan files left out when loading (a NaN score)
    meanings: dict  # what `score` is: model -> its scans' score_meaning, or {"": one text for every model}


def _inputs(args) -> _Loaded:
    """Scans, human scores and their provenance from the CLI inputs.

    Model scores come from the scan files when any are given; EloEverything folders then
    supply only the human Elo. With no scan files the CSVs' own model columns are the scores.
    """
    import pandas as pd

    from ..analysis.paper_a.eloeverything import (elo_scores_source, is_eloeverything_dir,
                                          load_eloeverything, load_human_scores)
    from ..analysis.data.ledger import Ledger
    from ..analysis.data.scans import MEANING_ATTR, SOURCE_ATTR, by_candidate_set, scans_source
    from ..sweep.store import read_scans

    from ..analysis.paper_b.published import is_published_scores_dir, load_published_scores

    left_out = Ledger()
    elo_dirs = list(args.eloeverything or [])
    scan_paths, published = [], []
    for p in args.inputs or []:
        if is_eloeverything_dir(p):
            elo_dirs.append(p)
        elif is_published_scores_dir(p):
            published.append(p)
        else:
            scan_paths.append(p)
    if not (scan_paths or elo_dirs or published):  # `analyze NAME` has a name; `report` has none
        raise UserError(f"{getattr(args, 'name', 'report')} needs inputs: scan Parquet files or folders, an "
                        "EloEverything folder (or --eloeverything DIR), or a folder of published score CSVs")
    if published:
        if scan_paths or elo_dirs:
            raise UserError("give either folders of published score CSVs or scans/EloEverything "
                            f"folders, not both (published: {', '.join(map(str, published))})")
        scans = pd.concat([load_published_scores(p, ledger=left_out,
                                                 allow_skipped=getattr(args, "allow_skipped", False))
                           for p in published], ignore_index=True)
        dup = scans.drop_duplicates(["model", "prompt", "text"]).shape[0] < len(scans)
        if dup and len(published) > 1:
            raise UserError("the score folders hold the same model twice; give each model once")
        source = ", ".join(str(p) for p in published)
        scores_source = f"published score CSVs in {source}"
        return _Loaded(scans, None, source, scores_source, None, left_out, _published_meaning(scores_source))
    elo = [(d, load_eloeverything(d)) for d in elo_dirs]
    human, human_source = (elo[0][1].human, elo[0][1].human.attrs.get(SOURCE_ATTR)) if elo \
        else (None, None)
    if scan_paths:
        loaded = read_scans(scan_paths, ledger=left_out)  # a sweep store: its config's finished parts only
        meanings = loaded.attrs.get(MEANING_ATTR, {})
        scans = by_candidate_set(loaded, pool=getattr(args, "pool_candidates", False), ledger=left_out)
        scores_source = loaded.attrs.get(SOURCE_ATTR) or scans_source(scan_paths)
        if elo:
            scores_source += (" (the model scores stored in the EloEverything CSVs are not used; "
                              "the CSVs give the human Elo only)")
    else:
        scans = pd.concat([data.scans for _, data in elo], ignore_index=True)
        scores_source = "; ".join(elo_scores_source(d, data.scans["model"].nunique())
                                  for d, data in elo)
        meanings = _published_meaning(scores_source)
    if getattr(args, "human", None):
        human = load_human_scores(args.human, item_column=args.human_item,
                                  score_column=args.human_score)
        human_source = human.attrs.get(SOURCE_ATTR)
    source = ", ".join(str(p) for p in elo_dirs + scan_paths)
    return _Loaded(scans, human, source, scores_source, human_source, left_out, meanings)


def _published_meaning(scores_source: str) -> dict:
    """What `score` is where the scores are not rmfast scans: one text for every model."""
    return {"": f"the reward model's score as published ({scores_source}), in its own units; higher = preferred"}


def with_score_meaning(table: "pd.DataFrame", meanings: dict) -> "pd.DataFrame":
    """``table`` with a ``score_meaning`` column where it holds a ``score`` column (a CSV has no schema metadata
    to say it in): per row, the meaning of the row's model (a label such as ``org/RM [items]`` takes its scan's,
    the longest model name it starts with), else the one text of ``meanings[""]``; tables without scores as given.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"model": ["a [items]", "b"], "score": [1.0, 2.0]})
    >>> with_score_meaning(t, {"a": "reward", "b": "log p"})["score_meaning"].tolist()
    ['reward', 'log p']
    """
    if "score" not in table.columns or not meanings:
        return table
    names = sorted((k for k in meanings if k), key=len, reverse=True)

    def of(label) -> str | None:
        label = str(label)
        return meanings.get(label) or next((meanings[n] for n in names if label.startswith(n)), meanings.get(""))

    col = table["model"].map(of) if "model" in table.columns else meanings.get("") or (
        next(iter(meanings.values())) if len(set(meanings.values())) == 1 else None)
    return table.assign(score_meaning=col)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="*", help="scan Parquet files or folders (with .json "
                   "manifests), or an EloEverything folder")
    p.add_argument("--eloeverything", action="append", metavar="DIR",
                   help="folder of EloEverything CSVs (one per prompt)")
    p.add_argument("--human", metavar="CSV", help="items with a human score (for 'human')")
    p.add_argument("--human-item", default="name", help="item column of --human (default name)")
    p.add_argument("--human-score", default="elo_score",
                   help="score column of --human (default elo_score)")
    p.add_argument("--metadata", metavar="FILE", help="model metadata YAML/CSV (labels, RSA, "
                   "groups)")
    p.add_argument("--afinn", metavar="FILE", help="AFINN lexicon (default: the afinn package, "
                   "if installed)")
    p.add_argument("--frequencies", metavar="FILE", help="word-frequency list (BNC format or "
                   "word,frequency), or 'wordfreq' (default: the wordfreq package's English list)")
    p.add_argument("--join", choices=("text", "id"), default=None,
                   help="shared vocabulary: decoded text (papers; the default) or token id + text "
                   "(similarity's default: token id when both sets come from one tokenizer, else text)")
    p.add_argument("--pool-candidates", action="store_true",
                   help="rank a model × prompt's candidate sets (e.g. vocabulary tokens and items) together "
                   "(default: each set apart, labelled 'model [set]', and a note says so)")
    p.add_argument("--k", type=positive_int, default=10, help="rows per top/bottom table (default 10)")
    p.add_argument("--best", metavar="PROMPT", help="positive prompt for best-worst")
    p.add_argument("--worst", metavar="PROMPT", help="negative prompt for best-worst")
    p.add_argument("--framing", action="append", metavar="PROMPT=positive|negative",
                   help="override a prompt's framing (repeatable)")
    p.add_argument("--n-perm", type=positive_int, default=9_999,
                   help="random permutations of every permutation test (default 9999, the paper B "
                   "authors' R default; rmfast's own test enumerates every relabelling instead where there are "
                   "at most 9999; the tables' n_perm and exact columns say what each test used)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed of the permutations (default 0)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file, or the trajectory a folder --out holds (default: refuse)")


def _plain(doc: str) -> str:
    """A docstring as help text: no reST markup (``code``, :mod:`x`, the '::' of a literal block)."""
    import re

    doc = re.sub(r":[a-z]+:`([^`]+)`", r"\1", doc).replace("``", "")
    return doc.replace("Examples::", "Examples:")


def register(subparsers) -> None:
    """Add the ``analyze`` and ``report`` subcommands to an argparse subparsers object."""
    a = subparsers.add_parser("analyze", help="run one analysis, print/write its table",
                              description=_plain(__doc__) + "\nAnalyses (rmfast.analysis.registry):\n\n"
                              + registry.table(rst=False),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("name", choices=ANALYSES, help="the analysis")
    _common(a)
    a.add_argument("--dictionary", metavar="FILE", help="category dictionary (categories)")
    a.add_argument("--group-by", default="base_family",
                   help="metadata column grouping models (categories; default base_family)")
    a.add_argument("--shared-vocab", action="store_true",
                   help="extremes: only strings every model shares (papers' option)")
    a.add_argument("--no-standardize", action="store_true",
                   help="use raw scores instead of z-scores within model × prompt")
    a.add_argument("--models", nargs="+", metavar="MODEL", help="only these models")
    a.add_argument("--prompts", nargs="+", metavar="PROMPT", help="only these prompts")
    a.add_argument("--method", choices=("rmfast", "paper"), default="rmfast",
                   help="agreement, sentiment, exposure, human, categories: rmfast's statistic "
                   "(default) or the paper's exactly (docs/paper_methods.md, "
                   "docs/paper_methods_b.md)")
    a.add_argument("--virtue-vice", choices=("merge", "keep"), default=None,
                   help="categories: merge MFD 2.0's <Foundation>_Virtue/_Vice categories into the "
                   "five foundations, or keep the ten (default: merge with --method paper, keep "
                   "otherwise)")
    a.add_argument("--allow-skipped", action="store_true",
                   help="categories on published score CSVs: go on when a skipped file drops a "
                   "model (default: refuse)")
    a.add_argument("--table", help="which table of the result (default: the main one)")
    a.add_argument("--out", metavar="CSV", help="write the table as CSV here")
    a.add_argument("--max-rows", type=positive_int, default=40, help="rows printed (default 40)")
    a.add_argument("--no-progress", action="store_true",
                   help="similarity: no bar and no estimate on stderr (default: both)")
    a.add_argument("--layers-a", metavar="L,L", help="similarity: layers of A (default all; with three or more sets "
                                                      "one layer, default last_prenorm)")
    a.add_argument("--layers-b", metavar="L,L", help="similarity: layers of B (default all)")
    # defaults sized for a first look (issue 51: 200 + 49 replicates took ~9 min on 1,000 candidates × 4 layers):
    # no intervals until asked (fewer than 200 replicates give untrustworthy 95% ends, so none rather than
    # few; 200 = analysis.similarity.MIN_TRUSTED_BOOTSTRAP, which the CLI does not import to build its parser),
    # and 19 permutations, a valid test down to p = 0.05; a cost line says the time before the replicates start
    a.add_argument("--bootstrap", type=nonneg_int, default=0,
                   help="similarity: bootstrap replicates for the intervals (--interval; default 0: none; give "
                   "200 or more for 95%% ends, fewer are noted as too few; at most 10,000; each costs one pass)")
    a.add_argument("--interval", choices=("recentred", "bca", "percentile", "basic"), default="recentred",
                   help="similarity: which bootstrap interval (default recentred: the median-recentred percentile "
                   "interval; bca: Efron's BCa, 20 more passes for its jackknife; percentile; basic)")
    a.add_argument("--permutations", type=nonneg_int, default=19,
                   help="similarity: permutations for the p-values (default 19: p down to 0.05; at most 10,000; "
                   "each costs one pass)")
    a.set_defaults(func=run_analyze)

    r = subparsers.add_parser("report", help="write one self-contained HTML report",
                              description="Run every analysis the inputs allow and write one "
                              "HTML file with embedded plots.")
    _common(r)
    r.add_argument("--dictionary", action="append", metavar="FILE",
                   help="category dictionary (repeatable)")
    r.add_argument("--title", default="rmfast report")
    r.add_argument("--no-progress", action="store_true",
                   help="do not announce each section on stderr")
    r.add_argument("--out", required=True, metavar="HTML", help="the report file")
    add_states_view_args(r)
    r.set_defaults(func=run_report)


def _run(name: str, args, scans, human):
    from ..analysis.data.framing import parse_framing_args, prompt_text

    fn = registry.BY_NAME[name].load()  # the analysis's function; the branches below pass its options
    framing = parse_framing_args(args.framing)
    args.join = args.join or "text"
    # a sweep's prompt names stand for their prompts (--best greatest), as the store's folders name them
    args.best, args.worst = prompt_text(scans, args.best), prompt_text(scans, args.worst)
    sel = {"models": args.models, "prompts": args.prompts and [prompt_text(scans, p) for p in args.prompts]}
    std = False if args.no_standardize else None  # None: the method's own default
    method = {"method": args.method} if name in ("agreement", "sentiment", "exposure",
                                                  "human", "categories") else {}
    if args.method != "rmfast" and not method:
        raise UserError(f"--method paper applies to agreement, sentiment, exposure, human and "
                        f"categories, not {name}")
    if getattr(args, "virtue_vice", None) and name != "categories":
        raise UserError(f"--virtue-vice applies to categories, not {name}")
    if name == "agreement":
        return fn(scans, join=args.join, metadata=args.metadata, n_perm=args.n_perm,
                  seed=args.seed, **method, **sel)
    if name == "sentiment":
        return fn(scans, args.afinn, standardize=std, framing=framing, **method, **sel)
    if name == "exposure":
        # as the report: wordfreq's English list unless --frequencies names another (its absence: one line)
        res = fn(scans, args.frequencies or "wordfreq", args.afinn, standardize=std, framing=framing,
                 **method, **sel)
        if not args.frequencies:
            res.notes.append("frequencies: the wordfreq package's English list (the default, as in rmfast report; "
                             "--frequencies FILE for a BNC list or word,frequency CSV)")
        return res
    if name == "best-worst":
        if args.prompts:
            raise UserError("best-worst takes --best and --worst, not --prompts")
        return fn(scans, best=args.best, worst=args.worst, join=args.join,
                  standardize=std is None, k=args.k, framing=framing, models=args.models)
    if name == "human":
        if human is None:
            raise UserError("human needs human scores: --eloeverything DIR or --human CSV")
        return fn(scans, human, k=args.k, **method, **sel)
    if name == "categories":
        if not args.dictionary:
            raise UserError("categories needs --dictionary FILE (CSV, .dicx or LIWC .dic)")
        group_by = args.group_by
        if "base" in scans.columns and group_by == "base_family" and args.metadata is None:
            # published score files: the paper's base-model rule, else rmfast's guess by name
            from ..analysis.data.metadata import model_families

            known = scans.drop_duplicates("model").set_index("model")["base"]
            guess = model_families(list(known.index[known.isna()]), None) if known.isna().any() \
                else {}
            group_by = {m: (b if isinstance(b, str) else guess[m]) for m, b in known.items()}
        if "framing" in scans.columns:  # the paper's rule for its prompt keys, unless overridden
            framing = {**dict(zip(scans["prompt"], scans["framing"])), **(framing or {})}
        return fn(scans, args.dictionary, group_by=group_by, metadata=args.metadata, framing=framing,
                  n_perm=args.n_perm, seed=args.seed, virtue_vice=args.virtue_vice, **method, **sel)
    if name == "extremes":
        return fn(scans, k=args.k, shared_vocab=args.shared_vocab, join=args.join, **sel)
    return fn(scans, **sel)  # distributions, and any analysis that takes only the scans


def _add_drops(res, ledger) -> None:
    """Put what loading the inputs left out (``ledger``) ahead of the analysis's own drops and notes."""
    import pandas as pd

    res.notes[:0] = ledger.notes
    res.dropped = pd.concat([d for d in (ledger.frame(), res.dropped) if len(d)] or [res.dropped],
                            ignore_index=True)


def _report_drops(res) -> None:
    if len(res.dropped):
        total = int(res.dropped["rows"].sum())
        print(f"rmfast: {total:,} rows left out:", file=sys.stderr)
        summary = res.dropped.groupby(["step", "reason"])["rows"].sum()
        for (step, reason), n in summary.items():
            print(f"  {step}: {n:,} ({reason})", file=sys.stderr)
    for n in res.notes:
        print(f"rmfast: note: {n}", file=sys.stderr)


def _run_trajectory(args) -> int:
    """``rmfast analyze trajectory INPUT... --out DIR``: every table and figure into DIR."""
    from ..analysis.data.ledger import Ledger
    from ..analysis.paper_b.trajectory import load_trajectory_inputs, trajectory, trajectory_files, write_trajectory

    if not args.inputs:
        raise UserError("trajectory needs inputs: rank_results_*.csv, long CSV tables, or scans "
                        "of checkpoints (files or folders)")
    if not args.out:
        raise UserError("trajectory writes several tables and figures: give --out DIR")
    from ..sweep.store import read_scans

    # another trajectory there: refused, or replaced whole (its files not written again had stayed beside the new ones)
    old = trajectory_files(args.out)
    if old and not args.overwrite:
        raise UserError(f"--out {args.out} already holds a trajectory ({old[0].name}{', ...' if len(old) > 1 else ''}); "
                        "pass --overwrite to replace it, or choose another --out")
    ledger = Ledger()
    df = load_trajectory_inputs(args.inputs, ledger=ledger, read_scans=read_scans,  # a store: its fresh parts
                                pool=getattr(args, "pool_candidates", False))
    res = trajectory(df, args.dictionary, k=args.k)
    if args.dictionary is not None and "token" in df and not any(len(t) for n, t in res.tables().items() if n != "dropped"):
        # every table empty: it wrote the dropped rows alone and exited 0
        ex = ", ".join(repr(t) for t in df["token"].drop_duplicates().head(3))
        raise UserError(f"none of the {df['token'].nunique():,} candidates is a word of --dictionary {args.dictionary} "
                        f"(e.g. {ex}): give the scans of its words (a scan or sweep of the dictionary's terms), or "
                        "drop --dictionary for the token tables alone")
    _add_drops(res, ledger)
    _report_drops(res)
    from ..analysis.data.deps import plots_available

    files = write_trajectory(res, args.out, figures=plots_available("the trajectory figures"))
    for f in old:  # the earlier trajectory's files this one did not write again
        if f.name not in files:
            f.unlink(missing_ok=True)
    print(f"rmfast: wrote {len(files)} files to {args.out}: {', '.join(files)}", file=sys.stderr)
    return 0


def _run_similarity(args) -> int:
    """``rmfast analyze similarity A B``: layer × layer similarity of two state sets."""
    import pandas as pd

    from ..analysis.representations.representation_rsa import RepresentationAgreementResult, representation_agreement
    from ..analysis.representations.similarity import SimilarityResult, similarity

    inputs = args.inputs or []
    if len(inputs) < 2:
        raise UserError(f"similarity compares state sets: give A and B (scans with a states folder "
                        f"beside them, or states folders), got {len(inputs)}")
    # --table before the work (the default layers of two 30-layer sets take minutes)
    (SimilarityResult if len(inputs) == 2 else RepresentationAgreementResult).check_table(args.table, "similarity")
    if len(inputs) == 2:
        res = similarity(*inputs, layers_a=args.layers_a, layers_b=args.layers_b,
                         bootstrap=args.bootstrap, permutations=args.permutations, interval=args.interval,
                         seed=args.seed,
                         join=args.join or "auto", progress=not args.no_progress)
        if not args.bootstrap:  # the CLI's default: say what is missing and how to get it
            res.notes.append("no bootstrap intervals (the <measure>_lo and _hi columns are empty; the default): "
                             "--bootstrap 200 gives 95% intervals, 200 more passes (the cost line gives one's time)")
    else:  # three or more: the models × models matrix at one layer, and its RSA with --metadata
        layer = args.layers_a or "last_prenorm"
        if "," in layer or args.layers_b:
            raise UserError("with three or more state sets give one layer, as --layers-a LAYER")
        from ..states import canonical_layer, open_states

        opened = [open_states(p) for p in inputs]
        lacking = [s for s in opened if canonical_layer(layer, note=False) not in s.layers]
        if lacking:  # the reader's own line named no fix
            common = [l for l in lacking[0].layers if all(l in s.layers for s in opened)]
            raise UserError(f"{lacking[0].path}: no layer {layer!r}; it has {lacking[0].layers}"
                            + (f": pass --layers-a {common[0]} (a layer every set has)" if common else
                               ": every set needs the layer compared (scan them with the same --states)"))
        seen = [s.path.resolve() for s in opened]
        if len(set(seen)) < len(seen):
            twice = next(p for p in seen if seen.count(p) > 1)
            raise UserError(f"{twice}: given twice; give each state set once")
        many = {s.name for s in opened if [o.name for o in opened].count(s.name) > 1}
        sets = {}
        for s in opened:  # sets of one model (prompts, checkpoints): each by its scan file's (or folder's) name too
            name = f"{s.name} [{(s.scan_path or s.path).stem}]" if s.name in many else s.name
            sets[f"{s.name} [{s.scan_path or s.path}]" if name in sets else name] = s  # one stem in two folders
        res = representation_agreement(sets, layer=layer, metadata=args.metadata, n_perm=args.n_perm,
                                       seed=args.seed, join=args.join or "auto")
        if many:
            res.notes.append(f"sets of one model are named by their files too: {', '.join(k for k in sets if '[' in k)}")
        if args.bootstrap or args.interval != "recentred":
            res.notes.append("--bootstrap and --interval apply to two state sets (A B); the models × models table has "
                             "no intervals (its RSA's p-value takes --n-perm)")
    _report_drops(res)
    tables = res.tables()
    name = args.table or next(iter(tables))
    if name not in tables:
        raise UserError(f"similarity has no table {name!r}; choose one of {list(tables)}")
    if args.out:
        write_csv(args.out, tables[name])
        print(f"rmfast: wrote {len(tables[name]):,} rows of similarity/{name} to {args.out}", file=sys.stderr)
    else:
        _show(tables[name], args.max_rows, 40)
    return 0


def _run_lens(args) -> int:
    """``rmfast analyze lens SCAN.parquet``: the reward lens tables, and the figure beside --out."""
    import pandas as pd

    from ..analysis.representations.lens import LensResult, lens, write_lens_figure

    if len(args.inputs or []) != 1:
        raise UserError(f"lens reads one scan written with --lens; got {len(args.inputs or [])} inputs")
    LensResult.check_table(args.table, "lens")
    if args.out:  # the figure beside --out follows the output rule too (io.check_output): no silent replace
        if Path(args.out).suffix.lower() == ".png":
            raise UserError(f"--out {args.out}: the lens table is CSV, and its figure goes beside it as .png; "
                            "give a .csv path")
        check_output(Path(args.out).with_suffix(".png"), args.overwrite)
    path = Path(args.inputs[0])
    if not path.is_file():
        raise UserError(f"{path}: no such scan file")
    try:
        df = read_parquet(path)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{path}: not a readable Parquet scan ({type(e).__name__})") from None
    if "score" not in df:
        raise UserError(f"{path}: no score column; give a scan Parquet")
    res = lens(df, k=args.k)
    _report_drops(res)
    tables = res.tables()
    name = args.table or "layers"
    if name not in tables:
        raise UserError(f"lens has no table {name!r}; choose one of {list(tables)}")
    if args.out:
        from ..io import read_manifest
        from ..scoring.results import model_label

        try:  # the model and whether its head is random, from the scan's manifest (the title said the file stem)
            man = read_manifest(path, required=False) or {}
        except UserError:  # a manifest of another write: the figure is still the table's
            man = {}
        meaning = man.get("score_meaning")
        write_csv(args.out, with_score_meaning(tables[name], {"": meaning} if meaning else {}))
        from ..analysis.data.deps import plots_available

        png = (write_lens_figure(res, Path(args.out).with_suffix(".png"),
                                 title=f"reward lens: {model_label(man, default=path.stem)}")
               if plots_available("the lens figure") else None)
        print(f"rmfast: wrote {len(tables[name]):,} rows of lens/{name} to {args.out}"
              + (f" and the figure {png}" if png else ""), file=sys.stderr)
    else:
        _show(tables[name], args.max_rows, 20)
    return 0


def _check_options(args) -> dict[str, str]:
    """What analyze and report can check before reading any input: the files the options name exist, and
    --framing is PROMPT=positive|negative (returned as a mapping). A report skips a section it cannot
    run and still exits 0, so a mistyped option must stop it here."""
    from ..analysis.data.framing import parse_framing_args

    dictionaries = args.dictionary if isinstance(args.dictionary, list) else [args.dictionary]
    files = [("--human", args.human), ("--metadata", args.metadata), ("--afinn", args.afinn),
             ("--similarity", getattr(args, "similarity", None)),
             ("--frequencies", None if args.frequencies == "wordfreq" else args.frequencies),
             *(("--dictionary", d) for d in dictionaries)]
    for option, path in files:
        if path is not None and not Path(path).is_file():
            what = "no such file" if not Path(path).exists() else "not a regular file (a folder or a device)"
            raise UserError(f"{option} {path}: {what}; give an existing file")
    return parse_framing_args(args.framing)


def run_analyze(args) -> int:
    """``rmfast analyze``: run one analysis; table to stdout or ``--out``."""
    import pandas as pd

    if args.out:
        check_output(args.out, args.overwrite, folder=args.name == "trajectory")  # before the work
    _check_options(args)
    if args.name == "trajectory":
        return _run_trajectory(args)
    if args.name == "similarity":
        return _run_similarity(args)
    if args.name == "lens":
        return _run_lens(args)
    data = _inputs(args)
    res = _run(args.name, args, data.scans, data.human)
    if args.name == "human":
        res.notes[:0] = [f"model scores: {data.scores_source}",
                         f"human scores: {data.human_source}"]
    tables = res.tables()
    name = args.table or next(iter(tables))
    if name not in tables:
        raise UserError(f"{args.name} has no table {name!r}; choose one of {list(tables)}")
    table = tables[name]
    _add_drops(res, data.left_out)
    _report_drops(res)
    if args.out:
        out = Path(args.out)
        write_csv(out, with_score_meaning(table, data.meanings))
        print(f"rmfast: wrote {len(table):,} rows of {args.name}/{name} to {out}", file=sys.stderr)
    else:
        _show(table, args.max_rows, 30)
    return 0


def _show(table, max_rows: int, max_columns: int) -> None:
    """A table on the screen, its text columns quoted as the scan's tables quote them: a token's leading space shows
    (" Love" and "Love", two tokens, had printed alike; the CSV kept the space)."""
    import pandas as pd

    shown = table.copy()
    for c in shown.columns:
        if (c in ("text", "token") or str(c).endswith("_text")) and not pd.api.types.is_numeric_dtype(shown[c]):
            shown[c] = shown[c].map(lambda v: repr(v) if isinstance(v, str) else v)
    with pd.option_context("display.width", 200, "display.max_columns", max_columns, "display.max_colwidth", 60):
        print(shown.to_string(max_rows=max_rows, index=False))


def run_report(args) -> int:
    """``rmfast report``: every applicable analysis in one HTML file."""
    from ..analysis.data.framing import prompt_text
    from ..analysis.report import build_report, explorer_beside, write_report
    from ..analysis.representations.views import states_beside

    check_output(args.out, args.overwrite, suffix=(".html", ".htm"))  # before the work
    framing = _check_options(args)
    data = _inputs(args)
    for line in data.left_out.summary() + data.left_out.notes:
        print(f"rmfast: note: {line}", file=sys.stderr)
    text = build_report(data.scans, human=data.human, metadata=args.metadata, afinn=args.afinn,
                        frequencies=args.frequencies, dictionaries=args.dictionary or (),
                        join=args.join or "text", k=args.k, n_perm=args.n_perm,
                        best=prompt_text(data.scans, args.best), worst=prompt_text(data.scans, args.worst),
                        framing=framing,
                        title=args.title, source=data.source, scores_source=data.scores_source,
                        human_source=data.human_source, progress=not args.no_progress, left_out=data.left_out,
                        explorer=explorer_beside(args.out), states=states_beside(args.inputs or []),
                        similarity_csv=args.similarity, states_layers=args.states_layers or None,
                        states_rows=args.states_rows or None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    path = write_report(args.out, text)
    print(f"rmfast: wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
