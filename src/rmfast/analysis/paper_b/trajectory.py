"""Value trajectories over a reward model's training checkpoints (paper B Figs. 4 and 5).

Input: one long table, one row per checkpoint × token (or × category), columns

    step       number  the checkpoint (``checkpoint`` is accepted too)
    run        str     optional: the training run (default "run"); model_id, base,
                       data_size, data_source, method: optional run attributes, carried along
    token      str     token-level input: the token text (``text`` accepted), with
    score | rank       the reward or its rank within run × step (1 = best)
    category   str     optional: the token's dictionary category (or give ``dictionary``)
    median_rank        category-level input instead of tokens: the category's median rank
                       per run × step (paper B's published ``rank_results_*.csv``)

rmfast scans of checkpoints fit too: the tidy scan frame (model, prompt, text, score, rank;
e.g. a sweep store's ``parts/``) becomes one run per prompt whose steps are read from the model
names (``checkpoint-500``, ``step-500``, ``..._500``); see :func:`from_scans`.

What :func:`trajectory` computes, per run × step:

- ``categories``: per dictionary category the median, mean and sum of the words' ranks (with ``dictionary``:
  ranked among the dictionary words, variants of a word averaged first, as paper B's Fig. 5 script; from a
  ``category`` column instead: each token ranked among ALL the run × step's tokens, variants apart, so the medians
  are on the vocabulary's scale and not comparable with the dictionary path's; a note says which);
- ``gaps``: between two categories, ``median_rank[b] - median_rank[a]`` (positive: A ranked higher);
- ``extremes``: the top and bottom ``k`` tokens;
- ``final_corr``: Spearman correlation of each checkpoint's ranking with the final one's;
- ``changes``: per token, first minus final rank (positive: preferred later; paper B Fig. 5).

Token-level tables stay empty for category-level input (a note says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.ledger import Ledger
from ..data.lexicons import as_dictionary, dictionary_notes, match_dictionary, normalize_word
from ..data.results import Result
from ..data.scans import MEANING_ATTR

RUN_ATTRS = ["model_id", "base", "data_size", "data_source", "method"]
_STEP_RE = re.compile(r"(?:checkpoint|step|ckpt|iter)[-_=]?(\d+)|[-_/](\d+)$", re.IGNORECASE)
#: the named step parts alone (``checkpoint-N``, ``step_N``, ...): a bare trailing number counts only without one
_NAMED_STEP_RE = re.compile(r"(?:checkpoint|step|ckpt|iter)[-_=]?(\d+)", re.IGNORECASE)


@dataclass(kw_only=True)
class TrajectoryResult(Result):
    """Tables (``run`` plus the run attributes present lead every table):

    categories: run, step, category, n_tokens, median_rank, mean_rank, sum_rank
    gaps:       run, step, category_a, category_b, median_rank_b_minus_a (positive: A ranked higher)
    extremes:   run, step, end (top/bottom), position, token, rank
    final_corr: run, step, spearman (with the run's final step), n_tokens
    changes:    run, token, category, rank_first, rank_final, change (first - final)
    """

    categories: pd.DataFrame = field(default_factory=pd.DataFrame)
    gaps: pd.DataFrame = field(default_factory=pd.DataFrame)
    extremes: pd.DataFrame = field(default_factory=pd.DataFrame)
    final_corr: pd.DataFrame = field(default_factory=pd.DataFrame)
    changes: pd.DataFrame = field(default_factory=pd.DataFrame)


def _last_step(name: str):
    """The LAST named step part of a name (a checkpoint's own ``checkpoint-N`` comes after its run's name, which may
    hold one too: a reward model trained from ``sft-step1200`` named after it), else a trailing ``-N``; a number
    after the named step (``step_100_seed-1``, ``checkpoint-500-lr1e-6``) is not the step."""
    named = list(_NAMED_STEP_RE.finditer(str(name)))
    return named[-1] if named else _STEP_RE.search(str(name))


def step_of(name: str) -> int | None:
    """The training step in a checkpoint's name (its last step-like part), or None.

    >>> step_of("runs/rm/checkpoint-1500"), step_of("gemma_step-20"), step_of("final")
    (1500, 20, None)
    >>> step_of("rm-from-sft-step1200/checkpoint-5"), step_of("iter2-rm-checkpoint-40"), step_of("rm/step_100_seed-1")
    (5, 40, 100)
    >>> step_of("rm-checkpoint-500-lr1e-6"), step_of("run-7"), step_of("rm/epoch3")
    (500, 7, None)
    """
    m = _last_step(name)
    return int(next(g for g in m.groups() if g)) if m else None


def _run_stem(name: str) -> str:
    """A checkpoint's run: its name without the last step-like part."""
    name, m = str(name), _last_step(name)
    return (name[:m.start()] + name[m.end():] if m else name).rstrip("/-_") or "run"


def from_scans(scans: pd.DataFrame, *, pool: bool = False, ledger: Ledger | None = None) -> pd.DataFrame:
    """A tidy scan frame of checkpoints (one model per checkpoint) as a trajectory table.

    The step comes from a ``step`` column when present, else from the model name; the run is
    the prompt (and the model name without its step when several runs are mixed), and the candidate set where a
    checkpoint × prompt holds several (a store's ``vocab`` and ``big2``: each set's trajectory apart, as the other
    analyses keep sets apart; they had been pooled, a word in both sets averaged over both; ``pool``: together, said).
    A run whose checkpoints' scores mean different things (a causal LM's log-probability beside reward scores) is
    noted in ``ledger``.

    >>> s = pd.DataFrame({"model": ["rm/checkpoint-10"] * 2 + ["rm/checkpoint-20"] * 2,
    ...                   "prompt": "Best?", "text": ["a", "b"] * 2, "score": [1.0, 0, 0, 1]})
    >>> from_scans(s)[["run", "step", "token", "score"]].values.tolist()[:2]
    [['rm | Best?', 10, 'a', 1.0], ['rm | Best?', 10, 'b', 0.0]]
    """
    df = scans.copy()
    if "step" not in df.columns:
        steps = {m: step_of(m) for m in df["model"].unique()}
        bad = [m for m, s in steps.items() if s is None]
        if bad:
            raise UserError(f"no training step in model name(s) {bad[:3]}; name checkpoints "
                            "'checkpoint-N' (as the HF Trainer does) or add a 'step' column")
        df["step"] = df["model"].map(steps)
    stem = df["model"].map(_run_stem)
    df["run"] = stem + " | " + df["prompt"].astype(str)
    ledger = ledger if ledger is not None else Ledger()
    _note_mixed_meanings(df, scans.attrs.get(MEANING_ATTR) or {}, ledger)
    if "candidates" in df.columns and df.groupby(["model", "prompt"])["candidates"].nunique().max() > 1:
        names = ", ".join(map(repr, pd.unique(df["candidates"].astype(str))))
        if pool:
            ledger.note(f"candidate sets {names} pooled into one trajectory per run (--pool-candidates); a text in "
                        "several sets is averaged over them")
        else:
            df["run"] = df["run"] + " | " + df["candidates"].astype(str)
            ledger.note(f"several candidate sets ({names}): each set's trajectory apart, as 'run | prompt | set' "
                        "(--pool-candidates pools them)")
    # the trajectory's token is the decoded text; scan files and store parts also carry the raw
    # vocabulary piece as "token", which would otherwise become a second "token" column
    return df.drop(columns=["model", "token"], errors="ignore").rename(columns={"text": "token"})


def _note_mixed_meanings(df: pd.DataFrame, meanings: dict, ledger: Ledger) -> None:
    """One note per run whose checkpoints' scores are not one quantity (``meanings``: model -> what its score is)."""
    if not meanings:
        return
    for run, models in df.groupby("run", sort=False)["model"].unique().items():
        kinds = {meanings.get(m) for m in models} - {None}
        if len(kinds) > 1:
            ledger.note(f"run {run!r}: its checkpoints' scores are not one quantity ({'; '.join(sorted(kinds))}); "
                        "their ranks are compared as one trajectory")


def _normalise_input(df: pd.DataFrame, ledger: Ledger) -> pd.DataFrame:
    df = df.rename(columns={"checkpoint": "step", "text": "token"}).copy()
    if "step" not in df.columns:
        raise UserError("the trajectory table needs a 'step' (or 'checkpoint') column")
    if "run" not in df.columns:
        df["run"] = "run"
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    bad = df["step"].isna()
    if bad.any():
        ledger.drop("validate", int(bad.sum()), "step is not a number")
        df = df[~bad]
    if "token" not in df.columns and "median_rank" not in df.columns:
        raise UserError("the trajectory table needs token rows (token + score or rank) or "
                        "category rows (category + median_rank)")
    if "token" in df.columns and not {"score", "rank"} & set(df.columns):
        raise UserError("token rows need a 'score' or a 'rank' column")
    if df.empty:
        raise UserError("no rows left in the trajectory table")
    return df


def _keys(df: pd.DataFrame) -> list[str]:
    return ["run"] + [c for c in RUN_ATTRS if c in df.columns]


def _word_ranks(df, dictionary, keys, ledger) -> pd.DataFrame:
    """Dictionary words per run × step: variants averaged, ranked among the words (1 = best)."""
    dic = as_dictionary(dictionary)
    for n in dictionary_notes(dic):
        ledger.note(n)
    d = df.assign(word=df["token"].map(normalize_word))
    cats = match_dictionary(d["word"], dic)
    hit = d["word"].isin(set(cats["word"]))
    if (~hit).any():
        ledger.drop("dictionary match", int((~hit).sum()), "token is not a dictionary word")
    # rank only when scores are missing; otherwise a lower rank is a higher score
    val = "score" if "score" in d.columns else "rank"
    sign = -1.0 if val == "score" else 1.0
    w = (d[hit].assign(v=lambda x: sign * x[val])
         .groupby(keys + ["step", "word"], dropna=False)["v"].mean().reset_index())
    w["rank"] = w.groupby(keys + ["step"], dropna=False)["v"].rank(method="average")
    return w.drop(columns="v").merge(cats, on="word").rename(columns={"word": "token"})


def _category_table(words, keys) -> pd.DataFrame:
    g = words.groupby(keys + ["step", "category"], dropna=False)["rank"]
    return g.agg(n_tokens="size", median_rank="median", mean_rank="mean",
                 sum_rank="sum").reset_index()


def _gaps(cat: pd.DataFrame, keys) -> pd.DataFrame:
    names = sorted(cat["category"].unique())
    cols = keys + ["step", "category_a", "category_b", "median_rank_b_minus_a"]
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ca = cat.loc[cat["category"] == a, keys + ["step", "median_rank"]]
            cb = cat.loc[cat["category"] == b, keys + ["step", "median_rank"]]
            m = ca.merge(cb, on=keys + ["step"], suffixes=("_a", "_b"))  # NaN keys match NaN
            rows.append(m.assign(category_a=a, category_b=b,
                                 median_rank_b_minus_a=m["median_rank_b"] - m["median_rank_a"])[cols])
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def _token_ranks(df, keys) -> pd.DataFrame:
    t = df.copy()
    if "score" in t.columns:  # re-rank within run × step: 1 = highest score, ties averaged
        t["rank"] = t.groupby(keys + ["step"], dropna=False)["score"].rank(
            ascending=False, method="average")
    return t


def _ids_apart(df: pd.DataFrame, keys, ledger: Ledger) -> pd.DataFrame:
    """Vocabulary rows whose ids share one decoded text (byte pieces all '\ufffd', a piece and its copy) kept apart,
    as "text [id N]": the token tables had averaged them into one (300 ids became 188 tokens), without a word. A
    dictionary's words are matched by their text instead (:func:`_word_ranks`: its variants averaged, as the paper)."""
    if "token_id" not in df.columns or df["token_id"].isna().any():
        return df
    # decided over every step of a run: a token labelled at one step only had dropped out of the changes table
    shared = df.groupby(keys + ["token"], dropna=False)["token_id"].transform("nunique") > 1
    if not shared.any():
        return df
    ledger.note(f"{df.loc[shared, 'token'].nunique():,} decoded texts are several token ids' (e.g. "
                f"{df.loc[shared, 'token'].iloc[0]!r}): kept apart as 'text [id N]'")
    out = df.copy()
    out.loc[shared, "token"] = (out.loc[shared, "token"].astype(str) + " [id "
                                + out.loc[shared, "token_id"].astype("int64").astype(str) + "]")
    return out


def _extremes(t, keys, k) -> pd.DataFrame:
    out = []
    for key, g in t.groupby(keys + ["step"], dropna=False, sort=True):
        g = g.sort_values("rank", kind="stable")
        for end, part in (("top", g.head(k)), ("bottom", g.tail(k).iloc[::-1])):
            out.append(part[keys + ["step", "token", "rank"]].assign(
                end=end, position=np.arange(1, len(part) + 1)))
    cols = keys + ["step", "end", "position", "token", "rank"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def _final_corr(t, keys) -> pd.DataFrame:
    rows = []
    for key, g in t.groupby(keys, dropna=False, sort=True):
        wide = g.pivot_table(index="token", columns="step", values="rank", aggfunc="mean")
        final = wide.columns.max()
        for s in wide.columns:
            both = wide[[s, final]].dropna()
            # Spearman = Pearson on ranks; re-rank the shared tokens so subsets are comparable
            rho = both.rank().corr().iloc[0, 1] if len(both) > 2 else np.nan
            rows.append(dict(zip(keys, key if isinstance(key, tuple) else (key,)),
                             step=s, spearman=float(rho), n_tokens=len(both)))
    return pd.DataFrame(rows, columns=keys + ["step", "spearman", "n_tokens"])


def _changes(t, keys) -> pd.DataFrame:
    rows = []
    for key, g in t.groupby(keys, dropna=False, sort=True):
        first, final = g["step"].min(), g["step"].max()
        a = g[g["step"] == first].groupby("token")["rank"].mean()
        b = g[g["step"] == final].groupby("token")["rank"].mean()
        both = pd.concat([a.rename("rank_first"), b.rename("rank_final")], axis=1).dropna()
        both["change"] = both["rank_first"] - both["rank_final"]
        both = both.reset_index().assign(**dict(zip(keys, key if isinstance(key, tuple)
                                                     else (key,))))
        if "category" in g.columns:
            both = both.merge(g[["token", "category"]].drop_duplicates("token"), on="token",
                              how="left")
        rows.append(both.sort_values("change", ascending=False, kind="stable"))
    cols = keys + ["token", "category", "rank_first", "rank_final", "change"]
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)
    if "category" not in out.columns:
        out["category"] = None
    return out[cols]


def trajectory(df: pd.DataFrame, dictionary=None, *, k: int = 10) -> TrajectoryResult:
    """Category ranks, extremes, correlation with the final checkpoint and rank changes.

    ``dictionary``: a path or frame (term, category) grouping tokens into categories; without
    one, a ``category`` column of the input is used, else no category tables.

    >>> d = pd.DataFrame({"step": [1, 1, 1, 2, 2, 2], "token": list("abc") * 2,
    ...                   "category": ["X", "X", "Y"] * 2, "score": [3, 2, 1, 1, 2, 3]})
    >>> r = trajectory(d, k=1)
    >>> r.gaps[["step", "median_rank_b_minus_a"]].values.tolist()  # median rank of Y minus X
    [[1.0, 1.5], [2.0, -1.5]]
    >>> r.changes[["token", "change"]].values.tolist()
    [['c', 2.0], ['b', 0.0], ['a', -2.0]]
    """
    ledger = Ledger()
    df = _normalise_input(df, ledger)
    keys = _keys(df)
    res = TrajectoryResult()
    if "token" not in df.columns:  # category-level input: the published checkpoint ranks
        cat = df[keys + ["step", "category", "median_rank"]].copy()
        for c in ("n_tokens", "mean_rank", "sum_rank"):
            cat[c] = np.nan
        res.categories = cat.sort_values(keys + ["category", "step"]).reset_index(drop=True)
        ledger.note("category-level input: no token tables (extremes, final_corr, changes)")
    else:
        if dictionary is not None:
            words = _word_ranks(df, dictionary, keys, ledger)
            res.categories = _category_table(words, keys)
            t = words
            ledger.note(f"with a dictionary the token tables (extremes, final_corr, changes) read its "
                        f"{words['token'].nunique():,} words found, ranked among themselves, not the "
                        f"{df['token'].nunique():,} tokens scanned (without --dictionary they read every token)")
        else:
            t = _token_ranks(_ids_apart(df, keys, ledger), keys)
            if "category" in t.columns:
                res.categories = _category_table(t.dropna(subset=["category"]), keys)
                ledger.note("categories from the input's category column: each token ranked among all the run × "
                            "step's tokens (categorised or not), spelling variants apart; a dictionary "
                            "(--dictionary) ranks its words among themselves, variants averaged (paper B's Fig. 5): "
                            "the two paths' medians are on different scales")
        res.extremes = _extremes(t, keys, k)
        res.final_corr = _final_corr(t, keys)
        res.changes = _changes(t, keys)
    if len(res.categories):
        res.gaps = _gaps(res.categories, keys)
    res.take_ledger(ledger)
    return res


def load_trajectory_inputs(paths, *, ledger: Ledger | None = None, read_scans=None, pool: bool = False) -> pd.DataFrame:
    """Read trajectory inputs: paper B's ``rank_results_*.csv`` (or its data folder), long CSV
    tables, or rmfast scan Parquet files / a sweep store of checkpoints. ``read_scans``: the reader of the scan
    inputs (default :func:`rmfast.analysis.data.scans.load_scans`, which refuses a sweep store; the CLI passes
    :func:`rmfast.sweep.store.read_scans`, which reads a store's own fresh parts). ``pool``: :func:`from_scans`'."""
    from .published import load_checkpoint_ranks
    from ..data.scans import load_scans

    read_scans = read_scans or load_scans
    ledger = ledger if ledger is not None else Ledger()
    published, csvs, scans = [], [], []
    for p in [paths] if isinstance(paths, (str, Path)) else list(paths):
        p = Path(p)
        if not p.exists():
            raise UserError(f"{p} does not exist; give CSV tables, scan Parquet files or folders")
        if p.is_dir() and (list(p.glob("rank_results_*.csv"))
                           or (p / "reward_model_training").is_dir()):
            published.append(p)
        elif p.is_dir():
            scans.append(p)
        elif p.name.startswith("rank_results_") and p.suffix == ".csv":
            published.append(p)
        elif p.suffix == ".csv":
            csvs.append(pd.read_csv(p))
        else:
            scans.append(p)
    frames = []
    if published:
        frames.append(load_checkpoint_ranks(published, ledger=ledger))
    frames += csvs
    if scans:
        frames.append(from_scans(read_scans(scans, ledger=ledger), pool=pool, ledger=ledger))
    return pd.concat(frames, ignore_index=True)


def _label(row: pd.Series, keys) -> str:
    return " ".join(str(row[k]) for k in keys if pd.notna(row[k]) and str(row[k]) != "")


def trajectory_figures(res: TrajectoryResult, *, max_runs: int = 30,
                       n_ranked: int | None = None) -> dict:
    """Figures of a trajectory result by file stem: category medians, gaps and the correlation
    with the final checkpoint over steps, and the first-vs-final rank changes (top/bottom).
    ``n_ranked``: how many words were ranked (the y axis then says "1 = best of N")."""
    from ..render.plots import new_figure

    figs = {}
    cat = res.categories
    if len(cat):
        keys = [c for c in ["run"] + RUN_ATTRS if c in cat.columns]
        names = sorted(cat["category"].unique())
        fig = new_figure(4.0 * len(names), 3.4)
        axes = fig.subplots(1, len(names), squeeze=False)[0]
        colours = {"Gemma": "#DB4437", "Llama": "#0064E0", "Qwen": "#7C3AED"}
        runs = cat[keys].drop_duplicates().head(max_runs)
        styles = {run: ("-", "--", ":", "-.")[i % 4] for i, run in enumerate(runs["run"].unique())}
        for ax, name in zip(axes, names):
            for _, r in runs.iterrows():
                sel = (cat["category"] == name) & (cat["run"] == r["run"])
                if "base" in keys:
                    sel &= cat["base"].eq(r["base"]) | (cat["base"].isna() & pd.isna(r["base"]))
                g = cat[sel].sort_values("step")
                ax.plot(g["step"], g["median_rank"], marker=".", label=_label(r, keys),
                        color=colours.get(str(r.get("base")), None), linestyle=styles[r["run"]])
            ax.invert_yaxis()  # rank 1 = best at the top, as the paper plots it
            ax.set_title(name)
            ax.set_xlabel("step")
        axes[0].set_ylabel("median rank (1 = best)" if n_ranked is None
                           else f"median rank (1 = best of {n_ranked:,})")
        fig.legend(*axes[0].get_legend_handles_labels(), fontsize=6, loc="outside right upper")
        figs["categories"] = fig
    if len(res.final_corr):
        fig = new_figure(5.0, 3.2)
        ax = fig.add_subplot()
        for run, g in list(res.final_corr.groupby("run"))[:max_runs]:
            ax.plot(g["step"], g["spearman"], marker=".", label=str(run))
        ax.set_xlabel("step")
        ax.set_ylabel("Spearman with final checkpoint")
        ax.legend(fontsize=6)
        figs["final_corr"] = fig
    if len(res.changes):
        runs = list(res.changes.groupby("run", sort=True))[:max_runs]
        fig = new_figure(4.0 * len(runs), 4.5)
        axes = fig.subplots(1, len(runs), squeeze=False)[0]
        for ax, (run, g) in zip(axes, runs):
            g = g.sort_values("change", ascending=False)
            show = pd.concat([g.head(10), g.tail(10)]).drop_duplicates("token")
            ax.barh(show["token"].astype(str), show["change"], color=[
                "#3CB371" if c == "Agency" else "#FFCE1B" if c == "Communion" else "grey"
                for c in show["category"]])
            ax.invert_yaxis()
            ax.set_title(str(run), fontsize=8)
            ax.set_xlabel("rank change, first - final (+ = preferred later)")
        figs["changes"] = fig
    return figs


def trajectory_files(out_dir, prefix: str = "trajectory_") -> list[Path]:
    """The files of a trajectory written into ``out_dir`` earlier: plain files of the names :func:`write_trajectory`
    writes (a table's CSV, a figure's PNG), nothing else (a user's own ``trajectory_notes.txt`` or folder is theirs)."""
    out = Path(out_dir)
    names = [f"{prefix}{t}{ext}" for t in TrajectoryResult.table_names() for ext in (".csv", ".png")]
    return [out / n for n in names if (out / n).is_file() and not (out / n).is_symlink()] if out.is_dir() else []


def write_trajectory(res: TrajectoryResult, out_dir, *, prefix: str = "trajectory_",
                     n_ranked: int | None = None, figures: bool = True) -> list[str]:
    """Write every non-empty table as CSV and (``figures``) every figure as PNG into ``out_dir``; returns the
    file names written (relative to ``out_dir``). ``n_ranked``: see :func:`trajectory_figures`."""
    from ...io import atomic_write, write_csv
    from ..render.plots import to_png

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, table in res.tables().items():
        if len(table):
            write_csv(out / f"{prefix}{name}.csv", table)
            files.append(f"{prefix}{name}.csv")
    for name, fig in (trajectory_figures(res, n_ranked=n_ranked) if figures else {}).items():
        png = to_png(fig)
        atomic_write(out / f"{prefix}{name}.png", lambda tmp, b=png: Path(tmp).write_bytes(b))
        files.append(f"{prefix}{name}.png")
    return files


__all__ = ["TrajectoryResult", "from_scans", "load_trajectory_inputs", "step_of", "trajectory", "trajectory_files",
           "trajectory_figures", "write_trajectory"]
