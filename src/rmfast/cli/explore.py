"""``rmfast explore``: every scored token of several scans in one offline HTML page (:mod:`rmfast.explore`).

Examples::

    rmfast explore results/*.parquet --out explorer.html
    rmfast explore sweep_store/ --dictionary ../shared/data/lexicons/big2_nouns.csv --out explorer.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..io import check_output
from .common import add_states_view_args


def register(subparsers) -> None:
    p = subparsers.add_parser("explore", help="write one self-contained HTML page to browse and compare scans",
                              description=__doc__.replace("``", "").replace("::", ":").replace(
                                  ":mod:`rmfast.explore`", "rmfast.explore"),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="scan Parquet files (with .json manifests), folders of them, "
                   "or one sweep store folder")
    p.add_argument("--out", required=True, metavar="HTML", help="the page to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (default: refuse)")
    p.add_argument("--dictionary", action="append", metavar="FILE", default=[],
                   help="category dictionary (CSV, .dicx, LIWC .dic; repeatable; default none): its categories "
                   "become a filter")
    p.add_argument("--join", choices=("auto", "id", "text"), default="auto",
                   help="join rows on token id or decoded text (default auto: id when every scan has one "
                   "tokenizer, else text)")
    p.add_argument("--title", default="rmfast explorer", help="page title (default 'rmfast explorer')")
    p.add_argument("--no-pair-stats", action="store_true",
                   help="skip Kendall tau / Spearman / RBO of the column pairs (default: computed; needs scipy)")
    add_states_view_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..analysis.data.ledger import Ledger
    from ..analysis.representations.views import states_beside
    from ..errors import UserError
    from ..explore import build_explorer, load_inputs, render_html, write_explorer

    out = check_output(args.out, args.overwrite, suffix=(".html", ".htm"))
    if args.similarity and not Path(args.similarity).is_file():
        raise UserError(f"--similarity {args.similarity}: no such file; give a CSV of rmfast analyze similarity")
    left_out = Ledger()
    df, source = load_inputs(args.inputs, ledger=left_out)
    data = build_explorer(df, dictionaries=args.dictionary, join=args.join, pairs=not args.no_pair_stats,
                          title=args.title, source=source, states=states_beside(args.inputs),
                          similarity_csv=args.similarity, states_layers=args.states_layers or None,
                          states_rows=args.states_rows or None)
    data.notes[:0] = left_out.summary() + left_out.notes  # on the page and below: never a silent hole
    path = write_explorer(out, render_html(data))
    n_partial = int((data.ranks == 0).any(axis=0).sum())
    print(f"rmfast: wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {data.n_rows:,} tokens × "
          f"{len(data.columns)} columns, joined on {'decoded text' if data.join == 'text' else 'token id'}; "
          f"{n_partial:,} tokens not in every column", file=sys.stderr)
    for note in data.notes:
        print(f"rmfast: note: {note}", file=sys.stderr)
    return 0
