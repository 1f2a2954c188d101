"""``rmfast score``: score a table of (prompt, response) pairs and write the scores beside it.

Rows that share a prompt share one prompt encoding (:class:`rmfast.scoring.scorer.RewardScorer`);
the output is the input table plus a ``score`` column, in the input's row order, written as
``<input>.scores.parquet`` (and its manifest ``.json``) unless ``--out`` says otherwise. An
interrupted run keeps its finished batches in ``<out>.partial.npz``; the same command resumes there.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import UserError
from ..io import check_output, file_sha256
from ..parquet_read import read_parquet
from ..locks import output_lock
from . import common

_READERS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def register(sub) -> None:
    p = sub.add_parser("score", help="score a table of (prompt, response) pairs; scores written beside it",
                       description="Score every row of a Parquet/CSV/TSV/JSONL table: the response column as the "
                                   "assistant's answer to the prompt column (a string, or a list of chat messages "
                                   "whose last is the user's). Rows sharing a prompt share one prompt encoding.")
    p.add_argument("input", help="the table (.parquet, .csv, .tsv, .jsonl; .json: JSON Lines or an array of objects)")
    p.add_argument("--model", default=common.DEFAULT_MODEL,
                   help=f"hub id, local folder, .gguf file or embedded alias (default: {common.DEFAULT_MODEL})")
    common.add_model_args(p, positional=False)
    p.add_argument("--random-head-seed", type=common.nonneg_int, default=None,
                   help="load a causal LM with a seeded random one-output score head (default: off)")
    p.add_argument("--prompt-column", required=True, help="column holding the prompt (or a list of chat messages)")
    p.add_argument("--response-column", required=True, help="column holding the response")
    p.add_argument("--system-column", default=None, help="optional column holding a system message per row")
    p.add_argument("--score-column", default="score", help="name of the added column (default score)")
    p.add_argument("--template", default=None, help="chat template or plain format (default: the model's chat template)")
    p.add_argument("--compat", default=None, choices=["decode-retokenize"],
                   help="score a response that merges with the template as the template renders it (default: error)")
    p.add_argument("--max-tokens", type=common.positive_int, default=None,
                   help="longest response in tokens (default: the model's position limit)")
    common.add_output_args(p, "<input without its extension>.scores.parquet beside the input (pairs.csv: "
                              "pairs.scores.parquet); manifest at <out>.json")
    common.add_plan_args(p)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def read_table(path: str):
    """The input table as a DataFrame, text cells as text; one-line UserError for a missing or unreadable file."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise UserError(f"input {p}: no such file")
    kind = _READERS.get(p.suffix.lower())
    if kind is None:
        raise UserError(f"input {p}: unknown format {p.suffix!r}; give a .parquet, .csv, .tsv or .jsonl file")
    try:
        if kind == "parquet":
            return read_parquet(p)
        if kind == "jsonl":
            return _read_json_table(p)
        sep = "," if kind == "csv" else "\t"
        _check_header(p, sep)
        return pd.read_csv(p, sep=sep, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except UserError:
        raise
    except Exception as e:  # pandas/pyarrow raise many types for a malformed file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read {p} as {kind}: {msg[:200]}") from None


#: what a JSON line that is not an object holds, named in the message
_JSON_KINDS = {list: "arrays", str: "strings", int: "numbers", float: "numbers", bool: "booleans", type(None): "nulls"}
#: the JSON shapes read, named in the message for any other
_JSON_SHAPES = "JSON Lines (one object per line, as .jsonl or .json) or a .json array of objects"


def _read_json_table(p: Path):
    """A JSON Lines file, or a .json file holding one array of objects, as a DataFrame. Values keep their JSON
    types: a string stays text however it looks ("1", "2024-01-01"; pandas read them as numbers and dates), a
    number stays a number (and is refused where text is needed). Any other shape is one line saying what the
    file holds (it was "no column 'prompt'")."""
    import json

    import pandas as pd

    text = p.read_text(encoding="utf-8-sig")
    if p.suffix.lower() == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)  # (n,) objects, one per row
        bad = next((r for r in rows if not isinstance(r, dict)), None)
        if bad is not None or not rows:
            what = f"an array of {type(bad).__name__}" if bad is not None else "an empty array"
            raise UserError(f"input {p} holds {what}; rmfast reads {_JSON_SHAPES}, each object a row of named columns")
        return pd.DataFrame.from_records(rows)
    try:
        df = pd.read_json(p, lines=True, dtype=False, convert_dates=False, encoding="utf-8-sig")
    except ValueError as e:  # one object over several lines, or not JSON at all
        raise UserError(f"input {p} is not JSON Lines ({str(e).splitlines()[0][:120]}); rmfast reads {_JSON_SHAPES}, "
                        "each object a row of named columns") from None
    if len(df.columns) and all(isinstance(c, int) for c in df.columns):  # the lines are not objects
        first = next((json.loads(line) for line in text.splitlines() if line.strip()), None)
        raise UserError(f"input {p} holds JSON {_JSON_KINDS.get(type(first), 'values')}, one per line; rmfast reads "
                        f"{_JSON_SHAPES}, each object a row of named columns")
    return df


def _check_parquet_columns(df, inp: Path, prompt_col: str) -> None:
    """Every column of the input is written back beside the scores, as Parquet: a column Parquet cannot hold (a JSON
    field whose values mix types: strings in some rows, numbers in others) is named before any scoring. (It was an
    ArrowTypeError after the scoring, and the checkpoint left behind resumed into the same error.)"""
    import pyarrow as pa

    for c in df.columns:
        try:
            pa.array(df[c], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            fix = ("give them one type: every prompt a list of chat messages (a prompt string is "
                   "[{'role': 'user', 'content': ...}])" if c == prompt_col else "give them one type, or drop the column")
            raise UserError(f"input {inp}: column {c!r} cannot be written as Parquet beside the scores ({msg[:120]}): "
                            f"its values mix types; {fix}") from None


def _check_header(p: Path, sep: str) -> None:
    """A CSV/TSV header naming a column twice is refused: pandas renames the second ('response.1'), so a table
    with two response columns was scored from the first without a word."""
    import csv
    from collections import Counter

    with open(p, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f, delimiter=sep), [])
    twice = [c for c, n in Counter(header).items() if n > 1]
    if twice:
        raise UserError(f"input {p}: its header names column {twice[0]!r} {Counter(header)[twice[0]]} times; "
                        "rename the columns so each name is one column")


def _conversation(v, system, k: int):
    """A cell of the prompt column (a string, or chat messages from Parquet/JSON) as a conversation, with the
    row's system message (``system``, from --system-column) put first; a row whose messages begin with
    another system message is refused (which one to score is not ours to choose)."""
    import dataclasses

    from ..scoring.scorer import as_conversation

    if hasattr(v, "tolist") and not isinstance(v, str):
        v = v.tolist()  # a Parquet list column comes back as a numpy array of dicts
    if _missing(v):
        raise UserError(f"row {k + 1}: the prompt cell is empty (a missing value); give every row a prompt")
    conv = as_conversation(v, f"row {k + 1} (prompt column)")
    if system is None or conv.system == system:
        return conv
    if conv.system is not None:
        raise UserError(f"row {k + 1}: the prompt's messages begin with a system message, and --system-column gives "
                        "another; drop the column or that message")
    return dataclasses.replace(conv, system=system)


def _missing(v) -> bool:
    """A table's missing value: None, or the NaN pandas reads an empty cell as."""
    return v is None or isinstance(v, float) and v != v


def pairs(df, prompt_col: str, response_col: str, system_col: str | None):
    """(conversations, response lists, (conversation, slot) per row) from the table, rows in order. Errors name
    a row as a reader counts them: from 1, the header not counted."""
    for c in (prompt_col, response_col, system_col):
        if c is not None and c not in df.columns:
            raise UserError(f"the input has no column {c!r}; its columns are {', '.join(map(repr, map(str, df.columns)))}")
    convs, lists, where, seen = [], [], [], {}
    systems = df[system_col].tolist() if system_col else [None] * len(df)
    for k, (p, r, s) in enumerate(zip(df[prompt_col].tolist(), df[response_col].tolist(), systems)):
        if not isinstance(r, str):
            what = "empty (a missing value)" if _missing(r) else f"{type(r).__name__}, not text"
            raise UserError(f"row {k + 1}: the response is {what}; give every row a response to score (or drop the row)")
        conv = _conversation(p, _system(s, k), k)
        i = seen.setdefault(conv, len(convs))
        if i == len(convs):
            convs.append(conv)
            lists.append([])
        where.append((i, len(lists[i])))
        lists[i].append(r)
    return convs, lists, where


def _system(s, k: int) -> str | None:
    """Row k's --system-column cell: text, or None where the cell is empty (None, NaN, ""); any other value (a
    number) is refused as a response is: it was dropped, and the row scored as if the column were not there."""
    import math

    if s is None or s == "" or isinstance(s, float) and math.isnan(s):
        return None
    if not isinstance(s, str):
        raise UserError(f"row {k + 1}: the system message is {type(s).__name__}, not text; give text in "
                        "--system-column (or leave the cell empty for none)")
    return s


def _by_row(e: UserError, where) -> UserError:
    """The scorer's error about "response j of conversation i" as the table's row (what the user can find)."""
    import re

    m = re.match(r"response (\d+) of conversation (\d+)(.*)", e.cli_message(), re.S)
    p = re.match(r"the prompt of conversation (\d+): (.*)", e.cli_message(), re.S)
    if p is not None:  # a prompt too long: its first row, and the fix in the table's terms (score has no --prompt)
        k = next((k for k, (i, _) in enumerate(where) if i == int(p.group(1))), None)
        rest = p.group(2).replace("shorten --prompt, --system or --template", "shorten that row's prompt").replace(
            ", or score whole rendered texts with RewardScorer.score_rendered(texts)", "")  # (Python's; not score's)
        return e if k is None else UserError(f"row {k + 1} (prompt column): {rest}")
    if m is None:
        return e
    try:
        k = where.index((int(m.group(2)), int(m.group(1))))  # each (conversation, slot) is one table row
    except ValueError:
        return e
    rest = m.group(3).replace("compat='decode-retokenize'", "--compat decode-retokenize")
    return UserError(f"row {k + 1} (response column){rest}")


def run(args) -> int:
    import numpy as np

    from ..io import write_result
    from ..scoring.batching import count_nonfinite
    from ..scoring.plan import finish_manifest, score_meaning
    from ..version import __version__
    from ..scoring.options import ScoringOptions
    from ..scoring.scorer import RewardScorer

    t0 = time.perf_counter()
    inp = Path(args.input)
    out = Path(args.out) if args.out else inp.with_name(inp.name.rsplit(".", 1)[0] + ".scores.parquet")
    if out.suffix.lower() != ".parquet":
        raise UserError(f"--out {out}: rmfast score writes Parquet (and its manifest); give a path ending in .parquet")
    df = read_table(args.input)  # the input's own problems first (a missing file, its format, its columns)
    if args.score_column in df.columns:
        raise UserError(f"the input already has a column {args.score_column!r}; name the scores with --score-column")
    convs, lists, where = pairs(df, args.prompt_column, args.response_column, args.system_column)
    if not where:
        raise UserError(f"input {inp} has no rows")
    _check_parquet_columns(df, inp, args.prompt_column)
    check_output(out, args.overwrite)  # before loading the model
    lm = common.load_model(args, random_head_seed=args.random_head_seed)
    scorer = RewardScorer(lm, options=ScoringOptions.from_args(args), template=common.template_arg(args, lm),
                          compat=args.compat, max_tokens=args.max_tokens, cache_prompts=0)
    ck = Path(f"{out}.partial.npz")
    with output_lock(out):
        check_output(out, args.overwrite)
        from ..cpu import manifest_fields, say_choice

        say_choice(lm.model)  # the --dtype auto line a scan prints (README's quick start), as the work starts
        try:
            scores = scorer.score(convs, lists, progress=not args.no_progress, checkpoint=ck, nonfinite="count")
        except UserError as e:
            raise _by_row(e, where) from None
        st = scorer.last_stats
        # float32, as every scan writes it (the head's output is fp32)
        df[args.score_column] = np.asarray([scores[i][j] for i, j in where], dtype=np.float32)
        n_bad = count_nonfinite(df[args.score_column].to_numpy(), range(len(df)), "table rows",
                                "they are written as NaN, counted in the manifest's n_nonfinite",
                                dtype=scorer.key_fields()["dtype"])
        key = scorer.key_fields()
        manifest = {**key, "score_meaning": score_meaning(key["head"], key["head_index"],
                                                          (key.get("model") or {}).get("random_head_seed")),
                    "input": {"path": str(inp), "sha256": file_sha256(inp), "rows": len(df),
                                                   "prompt_column": args.prompt_column,
                                                   "response_column": args.response_column,
                                                   "system_column": args.system_column},
                    "stats": {k: getattr(st, k) for k in st.__dataclass_fields__ if k != "decisions"},  # those: below
                    "score_position": "final position of the whole conversation + response", "n_nonfinite": n_bad,
                    **manifest_fields(lm.model)}  # dtype_choice (the measurement behind --dtype auto), mkl_cbwr
        # the fields every job's manifest ends with: decisions as they ran, options, wall time, versions, creation
        finish_manifest(manifest, t0, decisions=st.decisions, options=scorer.options, rmfast_version=__version__)
        write_result(out, df, manifest, overwrite=args.overwrite)
        ck.unlink(missing_ok=True)  # only now: the output is in place
    _print_preview(df, args)
    print(f"score: {manifest['score_meaning']}")  # what the number is, as scan and logprobs say it
    print(f"{len(df)} rows ({st.n_prompts} prompts, {st.n_rows} distinct rows, {st.n_batches} batches, "
          f"0 padded rows{f', {st.resumed_rows} rows from the checkpoint' if st.resumed_rows else ''}) in "
          f"{st.wall_s:.1f} s; wrote {out} and {out}.json")
    return 0


def _print_preview(df, args, n: int = 5) -> None:
    """The first rows' prompt, response and score (a CSV of pairs in, and nothing on the screen but a count: the
    scores had to be read from the Parquet; a new user's walk)."""
    def cut(v, w: int) -> str:
        t = repr(v if isinstance(v, str) else str(v))
        return t if len(t) <= w else t[: w - 4] + "...'"

    print(f"first {min(n, len(df))} of {len(df)} rows:")
    for _, r in df.head(n).iterrows():
        print(f"  {r[args.score_column]:>12.6f}  {cut(r[args.response_column], 40):<40}  "
              f"prompt {cut(r[args.prompt_column], 50)}")
