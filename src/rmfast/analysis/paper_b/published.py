"""Paper B's published data (Christian et al., "Reward Models Inherit Value Biases from
Pretraining", ICLR 2026; repository brchristian/reward_models_inherit_value_biases_from_pretraining).

Two kinds of file, read into rmfast's shapes:

- ``dict_big2_nouns/big2_rewards_<org>_<model>.csv``: ten off-the-shelf RMs' scores for the
  Big Two nouns (column ``response``) under 54 prompts (columns ``<adjective>_<superlative>_
  <concision>``). :func:`load_big2_rewards` gives the tidy scan frame (model, prompt, text,
  score, rank) plus ``paper_id`` (the paper's short model id, e.g. ``R-Gem-2B``), ``base``
  (Gemma/Llama, the paper's rule: "Gem" in the id) and ``framing`` (best/greatest/good are
  positive, the rest negative).
- ``reward_model_training/rank_results_<run>.csv``: the authors' RM training runs, one
  row per model × category × checkpoint. The column ``sum_value`` is, despite its name, the
  category's MEDIAN rank among the ~1,365 expanded-dictionary words (the authors' Fig. 4 script
  computes ``sum_value = median(rank)`` and labels the axis "Median rank ... #1365 = worst").
  :func:`load_checkpoint_ranks` gives the long trajectory table (run, model_id, base, step,
  category, median_rank, data_size, data_source, method): the sizes/sources are the
  authors' own manifest (their Fig. 4 script), duplicated rows are dropped (``uf_100`` repeats
  every row once per word) and identical files are reported.
"""

from __future__ import annotations

import re
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.ledger import Ledger

#: The paper's short model ids (its Fig. 1 script), keyed by "<org>_<model>" of the file name.
PAPER_IDS = {
    "Ray2333_GRM-gemma2-2B-rewardmodel-ft": "R-Gem-2B",
    "Ray2333_GRM-Llama3.2-3B-rewardmodel-ft": "R-Lla-3B",
    "Skywork_Skywork-Reward-Llama-3.1-8B-v0.2": "S-Lla-8B-v0.2",
    "LxzGordon_URM-LLaMa-3.1-8B": "L-Lla-8B",
    "RLHFlow_ArmoRM-Llama3-8B-v0.1": "F-Lla-8B-v0.1",
    "nicolinho_QRM-Llama3.1-8B": "N-Lla-8B",
    "Skywork_Skywork-Reward-Gemma-2-27B": "S-Gem-27B",
    "nicolinho_QRM-Gemma-2-27B": "N-Gem-27B",
    "Skywork_Skywork-Reward-Gemma-2-27B-v0.2": "S-Gem-27B-v0.2",
    "Ray2333_GRM-Llama3-8B-rewardmodel-ft": "R-Lla-8B",
}
POSITIVE_ADJECTIVES = ("best", "greatest", "good")

#: The authors' ablation manifest (their Fig. 4 script): file stem -> data size in thousands of
#: preference pairs, data source, objective. GRM's single point is plotted at 632k.
RUNS = {
    "uf_13": (13, "uf", "BT"),
    "uf_27": (27, "uf", "BT"),
    "uf_54": (53, "uf", "BT"),
    "uf_100": (106, "uf", "BT"),
    "sky_80k": (77, "skywork", "BT"),
    "grm_80k": (550, "uf+skywork", "GRM"),
}


def base_of(model_id: str) -> str | None:
    """Base family from a model id, as the authors' scripts decide it (substring rules).

    >>> base_of("google--gemma-2b-it"), base_of("R-Lla-3B"), base_of("Qwen2.5-3B-Instruct")
    ('Gemma', 'Llama', 'Qwen')
    """
    low = str(model_id).lower()
    for key, fam in (("gem", "Gemma"), ("lam", "Llama"), ("lla", "Llama"), ("qwe", "Qwen")):
        if key in low:
            return fam
    return None


def prompt_framing_key(prompt: str) -> str:
    """Framing of a prompt key ``<adjective>_<superlative>_<concision>`` (the paper's rule).

    >>> prompt_framing_key("best_ever_one"), prompt_framing_key("terrible_time_please")
    ('positive', 'negative')
    """
    return "positive" if str(prompt).split("_")[0] in POSITIVE_ADJECTIVES else "negative"


def _folder(folder, sub: str) -> Path:
    p = Path(folder)
    if (p / sub).is_dir():
        p = p / sub
    if not p.is_dir():
        raise UserError(f"{folder} is not a folder; give paper B's data folder (holding {sub}/)")
    return p


#: ``<prefix>_rewards_<org>_<model>.<ext>``: the authors' score file names (prefix ``big2``,
#: ``MFD20``, or any other).
SCORE_FILE = re.compile(r"^(?P<prefix>.+?)_rewards_(?P<key>.+)$")


def score_file_key(path: str | PathLike) -> str | None:
    """The model key ``<org>_<model>`` of a published score file name, or None.

    >>> score_file_key("MFD20_rewards_nicolinho_QRM-Gemma-2-27B.csv")
    'nicolinho_QRM-Gemma-2-27B'
    >>> score_file_key("token_intersection.csv") is None
    True
    """
    m = SCORE_FILE.match(Path(path).stem)
    return m.group("key") if m else None


def is_published_scores_dir(path: str | PathLike) -> bool:
    """Is ``path`` a folder of paper B score CSVs (``<prefix>_rewards_<model>.csv``)?"""
    p = Path(path)
    return p.is_dir() and any(score_file_key(f) for f in p.glob("*.csv"))


def _header(f: Path) -> list[str] | None:
    try:
        return list(pd.read_csv(f, nrows=0).columns)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError):
        return None


def load_published_scores(folder: str | PathLike, *, allow_skipped: bool = False,
                          ledger: Ledger | None = None) -> pd.DataFrame:
    """Paper B's published score CSVs in the authors' layout, under any file-name prefix.

    ``folder`` holds one wide CSV per model: a ``response`` column (the scored word) and one
    column per prompt key (``<adjective>_<superlative>_<concision>``), named
    ``<prefix>_rewards_<org>_<model>.csv`` (``big2_rewards_*``, ``MFD20_rewards_*``, ...; a CSV
    with a ``response`` column under another name is read too, its model is its file stem).
    Every file read or skipped is counted in one ledger note. A skipped file that names a model
    no read file gives (``<prefix>_rewards_<model>.*``) would change the model set: that is an
    error unless ``allow_skipped``. Two files for one model are an error.

    Columns: model (``org/name``), paper_id, base, prompt, framing, text, score, rank (1 = best
    within model × prompt over all the file's responses).

    >>> d = load_published_scores("../shared/data/iclr2026/dict_big2_nouns")
    >>> d["model"].nunique(), d["prompt"].nunique(), d.groupby("base")["model"].nunique().to_dict()
    (10, 54, {'Gemma': 4, 'Llama': 6})
    """
    ledger = ledger if ledger is not None else Ledger()
    p = Path(folder)
    if not p.is_dir():
        raise UserError(f"{folder} is not a folder; give the folder of score CSVs "
                        "(<prefix>_rewards_<org>_<model>.csv)")
    read: dict[str, Path] = {}
    skipped: list[tuple[Path, str]] = []
    frames = []
    for f in sorted(x for x in p.iterdir() if not x.name.startswith(".")):
        if f.is_dir():
            skipped.append((f, "a folder"))
            continue
        if f.suffix.lower() != ".csv":
            skipped.append((f, f"not a .csv ({f.suffix or 'no extension'})"))
            continue
        cols = _header(f)
        if cols is None:
            skipped.append((f, "not a readable CSV"))
            continue
        if "response" not in cols:
            skipped.append((f, "no 'response' column"))
            continue
        prompts = [c for c in cols if c != "response" and not c.startswith("Unnamed")]
        if not prompts:
            skipped.append((f, "no prompt columns beside 'response'"))
            continue
        key = score_file_key(f) or f.stem
        if key in read:
            raise UserError(f"{f.name} and {read[key].name} both hold scores for model {key}; "
                            "keep one of them in the folder")
        read[key] = f
        wide = pd.read_csv(f, keep_default_na=False, na_values=[""])
        long = wide[["response", *prompts]].melt(id_vars=["response"], var_name="prompt",
                                                 value_name="score")
        org, _, name = key.partition("_")
        paper_id = PAPER_IDS.get(key, key)
        frames.append(long.assign(model=f"{org}/{name}" if name else org, paper_id=paper_id,
                                  base=base_of(paper_id)))
    if not frames:
        raise UserError(f"{p} holds no score CSVs with a 'response' column "
                        f"({len(skipped)} files skipped); give the folder of "
                        "<prefix>_rewards_<org>_<model>.csv files")
    prefixes: dict[str, int] = {}
    for f in read.values():
        m = SCORE_FILE.match(f.stem)
        pre = f"{m.group('prefix')}_rewards_*" if m else "other names"
        prefixes[pre] = prefixes.get(pre, 0) + 1
    lost = sorted({score_file_key(f) for f, _ in skipped} - {None} - set(read))
    why = "; ".join(f"{f.name}: {r}" for f, r in skipped[:6]) + ("; ..." if len(skipped) > 6 else "")
    ledger.note(f"score files in {p}: read {len(read)} ("
                + ", ".join(f"{n} {k}" for k, n in sorted(prefixes.items()))
                + f"), skipped {len(skipped)}" + (f" ({why})" if skipped else "")
                + (f"; models with no file read: {', '.join(lost)}" if lost else ""))
    if lost and not allow_skipped:
        f, r = next((f, r) for f, r in skipped if score_file_key(f) in lost)
        raise UserError(f"{f.name} was skipped ({r}), so model(s) {', '.join(lost)} would be "
                        "missing; fix or remove the file, or pass --allow-skipped to go on "
                        "without them")
    df = pd.concat(frames, ignore_index=True).rename(columns={"response": "text"})
    df["prompt"] = df["prompt"].astype(str)
    df["framing"] = df["prompt"].map(prompt_framing_key)
    df["score"] = pd.to_numeric(df["score"], errors="coerce")
    df["text"] = df["text"].astype("string").astype(object)
    bad = df["score"].isna() | df["text"].isna()
    if bad.any():
        ledger.drop("load", int(bad.sum()), "missing score or response")
        df = df[~bad]
    df["rank"] = (df.groupby(["model", "prompt"])["score"].rank(ascending=False, method="min")
                  .astype("int64"))
    return df[["model", "paper_id", "base", "prompt", "framing", "text", "score", "rank"]
              ].reset_index(drop=True)


def load_big2_rewards(folder: str | PathLike, *, ledger: Ledger | None = None,
                      allow_skipped: bool = False) -> pd.DataFrame:
    """The ten RMs' published Big Two scores: :func:`load_published_scores` on ``folder`` or
    its ``dict_big2_nouns/``.

    >>> d = load_big2_rewards("../shared/data/iclr2026")
    >>> d["model"].nunique(), d["prompt"].nunique(), d.groupby("base")["model"].nunique().to_dict()
    (10, 54, {'Gemma': 4, 'Llama': 6})
    """
    return load_published_scores(_folder(folder, "dict_big2_nouns"), ledger=ledger,
                                 allow_skipped=allow_skipped)


def load_checkpoint_ranks(paths, *, ledger: Ledger | None = None) -> pd.DataFrame:
    """The authors' training-run category ranks as a long trajectory table.

    ``paths``: paper B's data folder, its ``reward_model_training/``, or ``rank_results_*.csv``
    files. Columns: run (file stem without ``rank_results_``), same_as (the run an identical file
    was read as first, else None), model_id, base, data_size (thousands of pairs; the authors'
    Fig. 4 manifest; NaN for a file outside it), data_source, method, file_data_size and
    file_data_source (what the file's own columns say, where it has them: grm_80k's say 85k
    Skywork where the manifest says 550k UltraFeedback + Skywork), step (the checkpoint),
    category, median_rank (the file's ``sum_value``).

    >>> t = load_checkpoint_ranks("../shared/data/iclr2026")
    >>> sorted(t["run"].unique())
    ['grm_80k', 'sky_80k', 'uf_100', 'uf_13', 'uf_27', 'uf_54']
    """
    ledger = ledger if ledger is not None else Ledger()
    files = []
    for p in [paths] if isinstance(paths, (str, PathLike)) else list(paths):
        p = Path(p)
        if p.is_dir():
            files += sorted(_folder(p, "reward_model_training").glob("rank_results_*.csv"))
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{p} does not exist; give rank_results_*.csv files or their folder")
    if not files:
        raise UserError(f"no rank_results_*.csv files in {paths}; give paper B's data folder")
    ledger.note("the files' sum_value is read as the category's MEDIAN rank among the expanded dictionary's words "
                "(median_rank): the authors' Fig. 4 script computes sum_value = median(rank), despite its name")
    frames, seen = [], {}
    for f in files:
        raw = pd.read_csv(f)
        need = {"model_id", "Category", "checkpoint", "sum_value"}
        if not need <= set(raw.columns):
            raise UserError(f"{f.name} lacks column(s) {sorted(need - set(raw.columns))}; "
                            "expected paper B's rank_results_*.csv")
        run = re.sub(r"^rank_results_", "", f.stem)
        t = raw[["model_id", "Category", "checkpoint", "sum_value"]].drop_duplicates()
        if len(t) < len(raw):
            ledger.drop("load", len(raw) - len(t), "exact duplicate rows", model=run)
        body = t.sort_values(["model_id", "Category", "checkpoint"]).to_csv(index=False)
        same_as = seen.get(body)
        if same_as is not None:
            ledger.note(f"{f.name} holds exactly the same rows as rank_results_{same_as}.csv (the "
                        f"published runs {same_as} and {run} cannot be told apart; verdicts count "
                        "them once)")
        seen.setdefault(body, run)
        size, source, method = RUNS.get(run, (np.nan, None, None))
        own = {}
        for col in ("data_size", "data_source", "method"):
            vals = raw[col].dropna().unique() if col in raw.columns else []
            own[col] = vals[0].item() if len(vals) == 1 and hasattr(vals[0], "item") else (
                vals[0] if len(vals) == 1 else None)
        manifest = {"data_size": size, "data_source": source, "method": method}
        differs = [f"{c} {own[c]} (file) vs {manifest[c]} (manifest)" for c in own
                   if own[c] is not None and manifest[c] is not None
                   and str(own[c]) != str(manifest[c])]
        if differs:
            ledger.note(f"{f.name}: the file's own columns disagree with the authors' Fig. 4 "
                        f"manifest: {'; '.join(differs)}. data_size/data_source/method are the "
                        "manifest's (what Fig. 4b plots); file_data_size/file_data_source keep "
                        "the file's")
        frames.append(pd.DataFrame({
            "run": run, "same_as": same_as, "model_id": t["model_id"].to_numpy(),
            "base": t["model_id"].map(base_of).to_numpy(), "data_size": size,
            "data_source": source, "method": method,
            "file_data_size": pd.to_numeric(own["data_size"], errors="coerce")
            if own["data_size"] is not None else np.nan,
            "file_data_source": own["data_source"],
            "step": pd.to_numeric(t["checkpoint"]).to_numpy(),
            "category": t["Category"].to_numpy(),
            "median_rank": pd.to_numeric(t["sum_value"]).to_numpy()}))
    out = pd.concat(frames, ignore_index=True)
    dup = out.duplicated(["run", "model_id", "step", "category"], keep=False)
    if dup.any():
        raise UserError(f"{int(dup.sum())} rows give different values for the same run × model "
                        "× checkpoint × category; the file is inconsistent")
    return out.sort_values(["run", "model_id", "category", "step"]).reset_index(drop=True)


__all__ = ["PAPER_IDS", "RUNS", "base_of", "is_published_scores_dir", "load_big2_rewards",
           "load_checkpoint_ranks", "load_published_scores", "prompt_framing_key",
           "score_file_key"]
