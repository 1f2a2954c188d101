"""``rmfast reproduce``: every table and figure of the papers that their published data allows,
as CSV + PNG in one folder with an index (index.html, index.md) that sets each result beside
the paper's statement and says whether it holds.

Paper B's data folder (--data DIR/iclr2026, or --data pointing at it):

    dict_big2_nouns/<prefix>_rewards_<org>_<model>.csv   Fig. 1 (Big Two scores)
    dict_MFD_20/<prefix>_rewards_<org>_<model>.csv       Fig. 1b (MFD 2.0 scores; any file-name
                                                         prefix: the published folder names four
                                                         MFD20_rewards_* and six big2_rewards_*)
    reward_model_training/rank_results_<run>.csv         Fig. 4
    ../lexicons/big2_nouns.csv, ../lexicons/mfd2.0.dicx  the dictionaries (a .dicx inside
                                                         dict_MFD_20/ is used first)

Examples::

    rmfast reproduce --out reproduce/
    rmfast reproduce --data ../shared/data --papers a --out paper_a/ --overwrite
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    """Add the ``reproduce`` subcommand."""
    p = subparsers.add_parser("reproduce", help="regenerate the papers' tables and figures "
                              "from their published data", description=__doc__.replace(
                                  "Examples::", "Examples:").replace("``", ""),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, metavar="DIR",
                   help="folder holding eloeverything/ (paper A) and iclr2026/ (paper B) "
                   "(default: $RMFAST_SHARED_DATA or ../shared/data beside the repository)")
    p.add_argument("--papers", default=None, help="which papers, comma-separated (default: all, a,b)")
    p.add_argument("--out", default="reproduce", metavar="DIR",
                   help="output folder (default ./reproduce); written atomically")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out "
                   "(default: refuse)")
    p.add_argument("--allow-skipped", action="store_true", help="paper B: go on when a score "
                   "file is skipped and its model is missing (default: refuse)")
    p.set_defaults(func=run_reproduce)


def run_reproduce(args) -> int:
    """Run :func:`rmfast.analysis.reproduce.run`; one line per finding on stderr."""
    from ..analysis.reproduce import PAPERS, default_data_dir, run, verdict

    papers = PAPERS if args.papers is None else tuple(p.strip().lower() for p in args.papers.split(",") if p.strip())
    findings = run(args.data or default_data_dir(), args.out, papers, overwrite=args.overwrite,
                   allow_skipped=args.allow_skipped)
    for f in findings:
        print(f"{f['id']:<12} {verdict(f['holds']):<14} {f['summary']}", file=sys.stderr)
    print(f"rmfast: wrote {len(findings)} findings to {args.out}/index.html", file=sys.stderr)
    return 0
