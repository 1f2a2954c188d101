"""Scan results as one tidy DataFrame, from DataFrames or from rmfast's Parquet files.

The tidy frame (one row per model × prompt × candidate)::

    model     str    the reward model's name (manifest ``model.name``)
    prompt    str    the user prompt
    token_id  Int64  the vocabulary id; <NA> for text candidates (multi-token strings)
    text      str    the decoded string that was scored
    score     float  the reward
    rank      int64  1 = highest score within model × prompt
    candidates str   the candidate set (:func:`candidate_set`: a sweep's set name, ``vocabulary`` for a token
                     scan, the items file's name for ``scan --candidates``); scan files only

Every function here returns the frame plus a :class:`~rmfast.analysis.data.ledger.Ledger` of
the rows it dropped.
"""

from __future__ import annotations

import warnings

import json
from collections.abc import Iterable
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...io import candidate_set, manifest_path, read_manifest  # noqa: F401  (candidate_set: re-exported)
from ...parquet_read import read_parquet
from .ledger import Ledger

TIDY_COLUMNS = ["model", "prompt", "token_id", "text", "score", "rank"]
REQUIRED = ["model", "prompt", "text", "score"]
#: ``DataFrame.attrs`` key the loaders set: where the scores come from, in words (the report shows it).
SOURCE_ATTR = "scores_source"
#: the attrs key of what each model's ``score`` is (model label -> its manifests' ``score_meaning``), for the
#: tables an analysis writes with a score column (issue 51: the meaning was lost outside ``scan``)
MEANING_ATTR = "score_meaning"


def scans_source(paths) -> str:
    """Where scores loaded from rmfast scan files come from, in words.

    >>> scans_source(["a.parquet", "b.parquet"])
    'rmfast scans: a.parquet, b.parquet'
    """
    paths = [paths] if isinstance(paths, (str, PathLike)) else list(paths)
    return "rmfast scans: " + ", ".join(str(p) for p in paths)


def by_candidate_set(df: pd.DataFrame, *, pool: bool = False, ledger: Ledger | None = None) -> pd.DataFrame:
    """Keep candidate sets apart: where a model × prompt holds more than one (a token scan and an item scan,
    a sweep's ``vocab`` and ``items``), every row's model becomes ``model [set]``, so each set is ranked and
    analysed as its own; with ``pool`` they are ranked together instead (ranks recomputed on the pooled
    rows). Either way a note in ``ledger`` says so. A frame with one set per model × prompt is returned as is.

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": ["a", "b", "a"], "score": [1.0, 2.0, 3.0],
    ...                   "rank": [2, 1, 1], "candidates": ["tok", "tok", "items"]})
    >>> by_candidate_set(d)["model"].tolist(), by_candidate_set(d, pool=True)["rank"].tolist()
    (['m [tok]', 'm [tok]', 'm [items]'], [3, 2, 1])
    """
    if "candidates" not in df.columns or df.empty:
        return df
    sets = df["candidates"].astype(str)
    n = sets.groupby([df["model"], df["prompt"]]).nunique()
    if n.max() <= 1:
        return df
    names = ", ".join(map(repr, pd.unique(sets)))
    if pool:
        out = add_rank(df)
        msg = (f"candidate sets {names} pooled into one ranking per model × prompt (--pool-candidates); "
               "ranks recomputed on the pooled rows")
    else:
        out = df.assign(model=df["model"].astype(str) + " [" + sets + "]")
        msg = (f"{int((n > 1).sum())} model × prompt pair(s) hold several candidate sets ({names}): each set is "
               "analysed apart, as 'model [set]' (--pool-candidates ranks them together)")
    if ledger is not None:
        ledger.note(msg)
    return out


def add_rank(df: pd.DataFrame, column: str = "rank") -> pd.DataFrame:
    """Rank scores within model × prompt (1 = highest; ties share the lowest rank).

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "score": [0.1, 0.9, 0.5]})
    >>> add_rank(d)["rank"].tolist()
    [3, 1, 2]
    """
    df = df.copy()
    df[column] = (df.groupby(["model", "prompt"], sort=False)["score"]
                  .rank(ascending=False, method="min").astype("int64"))
    return df


def validate_scans(df: pd.DataFrame, *, ledger: Ledger | None = None,
                   recompute_rank: bool = False) -> pd.DataFrame:
    """Check and normalise a tidy scan frame; rows without a usable score are dropped.

    Adds ``token_id`` (all <NA>) and ``rank`` when absent. Drops (and records in
    ``ledger``) rows whose model, prompt or text is missing or whose score is not a
    finite number. Raises :class:`UserError` when a required column is absent or
    nothing is left.

    >>> d = pd.DataFrame({"model": ["m"] * 3, "prompt": "p", "text": ["a", "b", "c"],
    ...                   "score": [1.0, float("nan"), 0.0]})
    >>> led = Ledger(); out = validate_scans(d, ledger=led)
    >>> len(out), led.total()
    (2, 1)
    """
    ledger = ledger if ledger is not None else Ledger()
    if not isinstance(df, pd.DataFrame):
        raise UserError(f"scan results must be a pandas DataFrame, got {type(df).__name__}; "
                        "use load_scans(paths) for Parquet files")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"scan results lack column(s) {missing}; expected columns "
                        f"{TIDY_COLUMNS} (token_id and rank optional)")
    out = df.copy()
    if "token_id" not in out.columns:
        out["token_id"] = pd.array([pd.NA] * len(out), dtype="Int64")
    else:
        try:
            out["token_id"] = pd.to_numeric(out["token_id"], errors="raise").astype("Int64")
        except (TypeError, ValueError):
            raise UserError("column token_id must hold integers (or be empty for text "
                            "candidates); fix the input or drop the column") from None
    out["score"] = pd.to_numeric(out["score"], errors="coerce").astype("float64")
    for col in ("model", "prompt", "text"):
        bad = out[col].isna()
        for (m, p), n in out[bad].groupby(["model", "prompt"], dropna=False).size().items():
            ledger.drop("validate", n, f"missing {col}", model=None if pd.isna(m) else str(m),
                        prompt=None if pd.isna(p) else str(p))
        out = out[~bad]
    out["model"] = out["model"].astype(str)
    out["prompt"] = out["prompt"].astype(str)
    out["text"] = out["text"].astype(str)
    bad = ~np.isfinite(out["score"].to_numpy())
    total = out.groupby(["model", "prompt"]).size()
    for (m, p), n in out[bad].groupby(["model", "prompt"]).size().items():
        ledger.drop("validate", n, "score is missing or not finite", model=m, prompt=p)
        if n == total[(m, p)]:  # the whole model x prompt goes: named (it vanished from the tables unnamed)
            ledger.note(f"model {m} is left out for prompt {p!r}: every one of its {n:,} scores is missing or not "
                        "finite")
    out = out[~bad]
    if out.empty:
        raise UserError("no scored rows left in the scan results (all scores missing?); "
                        "check the input files")
    if "rank" not in out.columns or recompute_rank or out["rank"].isna().any():
        out = add_rank(out)
    else:
        out["rank"] = out["rank"].astype("int64")
    extra = [c for c in out.columns if c not in TIDY_COLUMNS]
    return out[TIDY_COLUMNS + extra].reset_index(drop=True)


def _expand(paths: Iterable[str | PathLike] | str | PathLike) -> list[Path]:
    if isinstance(paths, (str, PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        # a sweep store holds parts of other configs and of model files since changed: it is read by its store.json
        # (rmfast.sweep.store.read_scans), never by its Parquet files, whether given as the store, its parts/ folder,
        # a part's folder or file, or a folder holding a store
        inside = next((d for d in p.resolve().parents if _is_store(d)), None) if p.exists() else None
        below = sorted(x.parent for x in p.rglob("store.json") if _is_store(x.parent)) if p.is_dir() else []
        if inside is not None or below:
            raise UserError(f"{inside or below[0]} is a sweep store: give its folder alone to an rmfast command (it "
                            "reads the store's own finished, fresh parts; rmfast.sweep.store.read_scans in Python), "
                            "not its Parquet files, which may be another config's or scored from older weights")
        if p.is_dir():
            found = sorted(p.rglob("*.parquet"))
            if not found:
                from ...loading.training_checkpoints import is_run_folder

                if is_run_folder(p):  # its checkpoints are models, not scores yet
                    raise UserError(f"{p} is a training run's folder (checkpoint-N/ models), not scores: sweep it first "
                                    "(rmfast sweep, docs/training.md) and give its store")
                raise UserError(f"{p} holds no .parquet files; point at rmfast scan output")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise UserError(f"{p} does not exist; give scan Parquet files or a folder of them")
    return files


def _is_store(d: Path) -> bool:
    """A sweep store's folder: its store.json beside its parts/ (an unrelated store.json is not one)."""
    return (d / "store.json").is_file() and (d / "parts").is_dir()


def _job_of(manifest) -> str | None:
    """What wrote a manifest that is not a scan's, in words (None: it looks like a damaged scan manifest)."""
    if not isinstance(manifest, dict):
        return None
    if "input" in manifest and "score_position" in manifest:
        return "rmfast score's output (a table of scored pairs)"
    if "model" in manifest and "prompt" not in manifest:
        return "another rmfast job's output"
    return None


def load_scans(paths: Iterable[str | PathLike] | str | PathLike, *,
               ledger: Ledger | None = None) -> pd.DataFrame:
    """Build the tidy frame from rmfast scan Parquet files (or folders of them).

    Each Parquet holds columns token_id, token, text, score, rank; the manifest beside
    it (``<path>.json``) gives ``{"model": {"name": ...}, "prompt": ...}``. The raw
    ``token`` column is kept as an extra column.

    >>> import tempfile
    >>> from rmfast.io import write_result
    >>> d = Path(tempfile.mkdtemp())
    >>> scan = pd.DataFrame({"token_id": [5, 7], "token": ["Ġlove", "Ġwar"], "text": [" love", " war"],
    ...                      "score": [1.5, -2.0], "rank": [1, 2]})
    >>> _ = write_result(d / "rm.parquet", scan, {"model": {"name": "org/RM"}, "prompt": "Best?"})
    >>> load_scans([d])[["model", "prompt", "text", "score", "rank", "token"]]
        model prompt   text  score  rank  token
    0  org/RM  Best?   love    1.5     1  Ġlove
    1  org/RM  Best?    war   -2.0     2   Ġwar
    """
    files = _expand(paths)
    if not files:
        raise UserError("no scan files given; pass Parquet paths or a folder of them")
    frames, meaning = [], {}
    for f in files:
        mpath = manifest_path(f)
        manifest = read_manifest(f)  # only the Parquet's own partner (io.write_pair's write id)
        try:
            info = manifest["model"]
            model = next((info.get(k) for k in ("name", "alias", "spec", "path") if info.get(k)),
                         None) if isinstance(info, dict) else info
            prompt = manifest["prompt"]
            if not model or prompt is None:
                raise KeyError("model.name" if not model else "prompt")
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            kind = _job_of(manifest)
            if kind:  # another job's output (rmfast score's table of pairs, a GCG run): not a scan
                raise UserError(f"{f} is {kind}, not a scan (its manifest has no model and prompt); analyses, reports "
                                "and the explorer read scans: rmfast scan's outputs or a sweep store") from None
            raise UserError(f"manifest {mpath} is unreadable or lacks model.name/prompt "
                            f"({exc.__class__.__name__}: {exc}); fix or regenerate it") from None
        try:
            part = read_parquet(f)
        except UserError:  # damaged: said so
            raise
        except Exception as exc:  # pyarrow raises many types
            raise UserError(f"cannot read {f} as Parquet ({exc.__class__.__name__}); "
                            "is it an rmfast scan file?") from None
        if part.empty:  # nothing to show, but said: a column missing without a word reads as a bug
            msg = f"{f}: a scan with no rows ({model}, {str(prompt)[:60]!r}) left out"
            if ledger is not None:
                ledger.note(msg)
            else:
                warnings.warn(f"rmfast: {msg}", stacklevel=2)
            continue
        part.insert(0, "prompt", str(prompt))
        part.insert(0, "model", str(model))
        part["candidates"] = candidate_set(manifest)
        if manifest.get("prompt_name"):  # a sweep part's prompt id: analyses take it for the prompt (--best greatest)
            part["prompt_name"] = str(manifest["prompt_name"])
        frames.append((f, scan_variant(manifest), part))
        meaning[str(f)] = manifest.get("score_meaning")
    if not frames:
        raise UserError(f"every scan given has no rows ({len(files)} file(s)); rerun the scans")
    df = pd.concat(_label_variants(frames), ignore_index=True)
    key = ["model", "prompt", "candidates", "token_id"]
    dup = df.duplicated(key, keep=False) & df["token_id"].notna() \
        if "token_id" in df.columns else pd.Series(False, index=df.index)
    if dup.any():
        raise UserError(_repeat_line(df, dup))
    for model, seed in sorted({(p["model"].iat[0], v["random_head_seed"]) for _, v, p in frames
                               if v.get("random_head_seed") is not None}):
        msg = (f"{model}: a RANDOM score head (--random-head-seed {seed}): its scores are no reward and its "
               "ranking is no model's preference")  # the scan said so; analyze's tables had shown it as any model
        if ledger is not None:
            ledger.note(msg)
        else:
            warnings.warn(f"rmfast: {msg}", stacklevel=2)
    out = validate_scans(df.drop(columns="_file"), ledger=ledger)
    out.attrs[SOURCE_ATTR] = scans_source(paths)
    out.attrs[MEANING_ATTR] = {m: meaning[f] for m, f in df.groupby("model", sort=False)["_file"].first().items()
                               if meaning[f]}
    return out


#: the settings that make two scans of one model and prompt different scores (the rest is how they ran)
VARIANT_KEYS = ("head", "head_index", "dtype", "template", "random_head_seed")


def scan_variant(manifest: dict) -> dict:
    """What a scan scored besides its model and prompt: head (and logit index), dtype, template, random head.

    >>> scan_variant({"head": "logprob", "dtype": "bfloat16", "template": {"kind": "chat_template"}})
    {'head': 'logprob', 'dtype': 'bfloat16', 'template': 'chat_template'}
    """
    t = manifest.get("template")
    if isinstance(t, dict):  # the kind, and a format/system where one was given: never the ids
        t = " ".join(f"{k}={t[k]}" if k != "kind" else str(t[k]) for k in ("kind", "format", "system") if t.get(k))
    info = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    v = {"head": manifest.get("head"), "head_index": manifest.get("head_index"), "dtype": manifest.get("dtype"),
         "template": t or None, "random_head_seed": info.get("random_head_seed")}
    return {k: v[k] for k in VARIANT_KEYS if v[k] is not None}


def _label_variants(frames: list[tuple[Path, dict, pd.DataFrame]]) -> list[pd.DataFrame]:
    """Each file's frame, its model named apart (``name [bfloat16]``) where scans of one model and candidate set
    differ in a setting (:func:`scan_variant`), under any prompts: an fp32 and a bf16 scan, or a score and a
    log-prob one, are two models to compare, not one scan given twice, and a "best" scan of one head is never
    paired with a "worst" scan of another (the labels were given within one prompt only, so best vs worst
    paired a log-prob scan with a reward head's as one model)."""
    groups: dict[tuple, list[dict]] = {}
    for _, variant, part in frames:
        groups.setdefault((part["model"].iat[0], part["candidates"].iat[0]), []).append(variant)
    out = []
    for f, variant, part in frames:
        seen = groups[(part["model"].iat[0], part["candidates"].iat[0])]
        differ = [k for k in VARIANT_KEYS if len({repr(v.get(k)) for v in seen}) > 1
                  and not (k == "head_index" and len({v.get("head") for v in seen}) > 1)]  # the head says it
        if differ:
            tag = ", ".join(str(variant[k]) if k in ("head", "dtype") else f"{k}={variant[k]}"
                            for k in differ if variant.get(k) is not None)
            part["model"] = f"{part['model'].iat[0]} [{tag or 'default'}]"
        part["_file"] = str(f)
        out.append(part)
    return out


def _repeat_line(df: pd.DataFrame, dup: pd.Series) -> str:
    """Why ids repeat across the given files, naming what to leave out: the same file twice, or a scan whose ids are
    all in another's (a quick --token-ids scan beside the whole vocabulary's, the README's own two), or two scans
    that overlap. ("pass each scan once, or one file of overlapping subsets" had not said which file.)"""
    where = sorted(pd.unique(df.loc[dup, "_file"]))
    n = int(dup.sum()) // 2 or 1
    if len(where) == 1:
        return f"{n} ids repeat in {where[0]}: the same scan was given twice; pass it once"
    ids = {f: set(g["token_id"].dropna()) for f, g in df[df["_file"].isin(where)].groupby("_file")}
    small, big = sorted(where[:2], key=lambda f: len(ids[f]))
    same = "scans of the same model, prompt, head, dtype and template"
    if ids[small] <= ids[big]:
        return (f"{small}'s {len(ids[small]):,} ids are all in {big} ({same}): give only one of them (the larger "
                "holds every score of the smaller)")
    return (f"{n} ids repeat across {', '.join(where[:3])} ({same}, overlapping); give scans of disjoint ids, or "
            "only one of them")


def select(df: pd.DataFrame, *, models: Iterable[str] | None = None,
           prompts: Iterable[str] | None = None) -> pd.DataFrame:
    """Keep the named models/prompts; a name not in the data is a UserError listing those that are.

    >>> d = pd.DataFrame({"model": ["a", "b"], "prompt": "p", "text": "x", "score": 1.0})
    >>> select(d, models=["a"])["model"].tolist()
    ['a']
    """
    for col, wanted in (("model", models), ("prompt", prompts)):
        if wanted is None:
            continue
        wanted = list(wanted)
        have = list(pd.unique(df[col]))
        absent = [w for w in wanted if w not in have]
        if absent:
            raise UserError(f"{col}(s) {absent} not in the scan results; available: {have}")
        df = df[df[col].isin(wanted)]
    return df


def check_balance(df: pd.DataFrame, ledger: Ledger) -> None:
    """Note every model that lacks a prompt other models have (the matrix is unbalanced)."""
    have = df.groupby("model")["prompt"].unique()
    prompts = list(pd.unique(df["prompt"]))
    for m, ps in have.items():
        lacking = [p for p in prompts if p not in set(ps)]
        if lacking:
            ledger.note(f"model {m} has no rows for prompt(s) {lacking}; "
                        "it is left out of those prompts' comparisons")
