"""EloEverything: items with a human Elo score and reward-model scores per prompt.

The folder holds one CSV per prompt, named after the prompt (file names cannot hold
``?``, so the loader restores a final question mark). Columns (wide)::

    elo_rank, elo_score, name, elo_matches, <one column per reward model: its score>

:func:`load_eloeverything` turns them into the tidy scan frame (``token_id`` <NA>,
``text`` = item name) plus a human-score frame, and :func:`load_human_scores` reads
any CSV of items with a human score.

The model scores in these CSVs are the papers' published scores of their reward models,
not rmfast scans; the loaders record where scores come from in ``DataFrame.attrs``
(:data:`~rmfast.analysis.data.scans.SOURCE_ATTR`) and the report shows it. To compare your own
scans of the items, score the item names with ``rmfast scan MODEL --candidates CSV
--column name`` and give those Parquet files together with ``--eloeverything DIR``: the
CSVs then supply only the human Elo.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import pandas as pd

from ...errors import UserError
from ...user_files import read_csv
from ..data.ledger import Ledger
from ..data.scans import SOURCE_ATTR, validate_scans

#: Non-model columns of the EloEverything CSVs.
HUMAN_COLUMNS = ["elo_rank", "elo_score", "name", "elo_matches"]


@dataclass
class HumanData:
    """Model scores of items plus the items' human scores.

    scans: tidy scan frame (model, prompt, token_id=<NA>, text, score, rank).
    human: one row per item: text, human_score, plus any extra columns (elo_rank, ...).
    """

    scans: pd.DataFrame
    human: pd.DataFrame


def prompt_from_filename(path: str | PathLike) -> str:
    """The prompt a CSV is named after: its stem, with the ``?`` file names cannot hold.

    >>> prompt_from_filename("What, in one word, is the greatest thing ever.csv")
    'What, in one word, is the greatest thing ever?'
    """
    stem = Path(path).stem.strip()
    return stem if stem[-1:] in "?.!" else stem + "?"


def is_eloeverything_dir(path: str | PathLike) -> bool:
    """True if ``path`` is a folder of CSVs whose header has elo_score and name."""
    p = Path(path)
    if not p.is_dir():
        return False
    for f in p.glob("*.csv"):
        with open(f, encoding="utf-8", errors="replace") as fh:
            head = fh.readline()
        if "elo_score" in head and "name" in head:
            return True
    return False


def load_eloeverything(folder: str | PathLike, *, ledger: Ledger | None = None) -> HumanData:
    """Load the EloEverything CSVs (one per prompt) into tidy scans + human scores.

    >>> data = load_eloeverything("../shared/data/eloeverything")
    >>> int(data.scans.groupby("prompt").size().iloc[0]), len(data.human)
    (75300, 7530)
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; give the folder of EloEverything CSVs")
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise UserError(f"{folder} holds no .csv files; expected one EloEverything CSV per prompt")
    ledger = ledger if ledger is not None else Ledger()
    scans, human = [], None
    for f in files:
        wide = read_csv(f, "EloEverything CSV")
        missing = [c for c in ("name", "elo_score") if c not in wide.columns]
        if missing:
            raise UserError(f"{f.name} lacks column(s) {missing}; EloEverything CSVs have "
                            f"{HUMAN_COLUMNS} then one column per model")
        models = [c for c in wide.columns if c not in HUMAN_COLUMNS]
        if not models:
            raise UserError(f"{f.name} has no model score columns after {HUMAN_COLUMNS}")
        dup = wide["name"].duplicated(keep=False)
        ledger.drop("load", int(dup.sum()), "item name occurs more than once in the CSV",
                    prompt=prompt_from_filename(f))
        wide = wide[~dup]
        h = wide[[c for c in HUMAN_COLUMNS if c in wide.columns]].rename(
            columns={"name": "text", "elo_score": "human_score"})
        if human is None:
            human = h
        elif not h["text"].reset_index(drop=True).equals(human["text"].reset_index(drop=True)) \
                and set(h["text"]) != set(human["text"]):
            ledger.note(f"{f.name} lists different items than the first CSV; human scores "
                        "are taken from the first file that names each item")
            human = pd.concat([human, h[~h["text"].isin(human["text"])]], ignore_index=True)
        long = wide.melt(id_vars=["name"], value_vars=models, var_name="model",
                         value_name="score").rename(columns={"name": "text"})
        long["prompt"] = prompt_from_filename(f)
        scans.append(long)
    tidy = validate_scans(pd.concat(scans, ignore_index=True), ledger=ledger, recompute_rank=True)
    tidy.attrs[SOURCE_ATTR] = elo_scores_source(folder, tidy["model"].nunique())
    human = human.reset_index(drop=True)
    human.attrs[SOURCE_ATTR] = f"EloEverything Elo (column elo_score) in {folder}"
    return HumanData(scans=tidy, human=human)


def elo_scores_source(folder: str | PathLike, n_models: int) -> str:
    """Where the model scores of :func:`load_eloeverything` come from, in words: the CSVs'
    own score columns (the papers' published scores), not rmfast scans.

    >>> elo_scores_source("elo", 10)
    "the 10 reward models' published scores stored in the EloEverything CSVs in elo (paper A), not rmfast scans"
    """
    return (f"the {n_models} reward models' published scores stored in the EloEverything CSVs "
            f"in {folder} (paper A), not rmfast scans")


def load_human_scores(path: str | PathLike, *, item_column: str = "name",
                      score_column: str = "elo_score") -> pd.DataFrame:
    """Read a CSV of items with a human score into columns text, human_score (+ the rest).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "items.csv"
    >>> _ = p.write_text("item,rating,source\\nLove,1700,web\\nTaxes,n/a,web\\n")
    >>> load_human_scores(p, item_column="item", score_column="rating")
        text  human_score source
    0   Love       1700.0    web
    1  Taxes          NaN    web
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist; give a CSV of items with a human score")
    df = read_csv(path, "--human file")
    missing = [c for c in (item_column, score_column) if c not in df.columns]
    if missing:
        raise UserError(f"{path.name} lacks column(s) {missing}; choose the item and score "
                        f"columns among {list(df.columns)}")
    df = df.rename(columns={item_column: "text", score_column: "human_score"})
    df["human_score"] = pd.to_numeric(df["human_score"], errors="coerce")
    df.attrs[SOURCE_ATTR] = f"{path} (column {score_column}, items in column {item_column})"
    return df
