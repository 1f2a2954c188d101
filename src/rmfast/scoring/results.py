"""Scan results: scores with everything needed to reproduce them, as tables and files.

:class:`ScanResult` holds token scans (one vocabulary id per row), :class:`TextScanResult` text
candidates (any number of tokens per row). Both write ``<out>.parquet`` + ``<out>.parquet.json``
(the manifest) as a pair (:func:`rmfast.io.write_pair`: a reader never takes one for the other's
partner), and :func:`merge_shards` joins the shards of a multi-process scan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..io import WRITE_ID, check_output, read_manifest, write_pair
from ..parquet_read import read_parquet


def _write(res, path, overwrite: bool) -> Path:
    """A result's pair (:func:`rmfast.io.write_pair`); the write id goes into ``res.manifest`` too, so
    that what is written after it (the states folder, :func:`rmfast.scoring.pipeline.finish_states`)
    can name the write it belongs to."""
    p = check_output(path, overwrite)
    res.manifest[WRITE_ID] = write_pair(p, res.to_pandas(), res.manifest)[WRITE_ID]
    return p


def rank_scores(scores: "pd.Series") -> "pd.Series":
    """Ranks of a score column: 1 = highest, ties share the best rank; int64, or nullable Int64 when
    some scores are NaN (non-finite, :func:`rmfast.scoring.pipeline.count_nonfinite`): those get no rank.

    >>> import pandas as pd
    >>> rank_scores(pd.Series([0.5, 2.0, 0.5])).tolist(), str(rank_scores(pd.Series([1.0, float("nan")])).dtype)
    ([2, 1, 2], 'Int64')
    """
    r = scores.rank(ascending=False, method="min")
    return r.astype("Int64") if r.isna().any() else r.astype(np.int64)


class _Result:
    """What token and text results share: timing, the rank and lens columns of the table, best / worst rows,
    the file pair. A subclass's ``to_pandas`` builds its own columns and ends with :meth:`_ranked`;
    ``_TIES``: the columns that order rows of one rank (ascending), none for the table's own order."""

    _TIES: tuple[str, ...] = ()

    @property
    def wall_s(self) -> float:
        return float(self.manifest.get("wall_s", float("nan")))

    @property
    def candidates_per_s(self) -> float:
        return float(self.manifest.get("candidates_per_s", float("nan")))

    def __repr__(self) -> str:
        """One line: how many, of what model, prompt and head, and the best (the manifest's detail: ``.manifest``).

        >>> ScanResult(np.arange(2), np.array([0.5, 2.0], np.float32), ["a", "b"], ["a", "b"],
        ...            {"model": {"name": "org/RM"}, "prompt": "Best?", "head": "score", "dtype": "float32"})
        ScanResult(2 candidates, model='org/RM', prompt='Best?', head='score', dtype='float32', best='b' 2.0000)
        """
        m, n = self.manifest, len(self.scores)
        model = m.get("model")
        model = model.get("name") if isinstance(model, dict) else model
        prompt = str(m.get("prompt", ""))
        fields = [f"{n:,} candidates", f"model={model!r}", f"prompt={prompt[:60] + ('…' if len(prompt) > 60 else '')!r}",
                  f"head={m.get('head')!r}", f"dtype={m.get('dtype')!r}"]
        finite = np.isfinite(self.scores)
        if finite.any():
            i = int(np.argmax(np.where(finite, self.scores, -np.inf)))
            fields.append(f"best={self.texts[i]!r} {float(self.scores[i]):.4f}")
        return f"{type(self).__name__}({', '.join(fields)})"

    def _ranked(self, df):
        """``df`` (score column made) + rank (1 = highest; ties share the best rank; none for a NaN score:
        :func:`rank_scores`) + the extra float columns (the reward lens), in that column order."""
        df["rank"] = rank_scores(df["score"])
        for name, v in self.columns.items():
            df[name] = np.asarray(v, dtype=np.float32)
        return df

    def _table(self):
        """The table :meth:`top` and :meth:`bottom` sort: :meth:`to_pandas` (a subclass may leave bulky columns out)."""
        return self.to_pandas()

    def top(self, k: int = 20):
        """The k highest-scoring rows, best first."""
        by = ["rank", *self._TIES]
        return self._table().sort_values(by, kind="stable").head(k).reset_index(drop=True)

    def bottom(self, k: int = 20):
        """The k lowest-scoring rows, worst first."""
        by = ["rank", *self._TIES]
        return (self._table().sort_values(by, ascending=[False] + [True] * len(self._TIES), kind="stable").head(k)
                .reset_index(drop=True))

    def to_parquet(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``path`` (Parquet) and ``path.json`` (manifest) as a pair (:func:`rmfast.io.write_pair`)."""
        return _write(self, path, overwrite)


@dataclass(repr=False)
class ScanResult(_Result):
    """Scores of candidate token ids, with everything needed to reproduce them.

    Attributes:
        token_ids: (N,) int64 candidate ids, ascending.
        scores: (N,) float32 rewards (score head) or log-probabilities (logprob head).
        tokens: raw vocabulary pieces (``convert_ids_to_tokens``).
        texts: decoded strings (``decode([id])``).
        manifest: model, prompt, template ids, head, dtype, device, versions, timing.

    Example:
        >>> res = rmfast.scan(model, tok, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
        >>> res.top(5)  # doctest: +SKIP
    """

    token_ids: np.ndarray
    scores: np.ndarray
    tokens: list[str]
    texts: list[str]
    manifest: dict = field(default_factory=dict)
    columns: dict = field(default_factory=dict)  # extra per-row float columns (the reward lens: lens_<layer>)

    _TIES = ("token_id",)  # one rank's rows by id, whatever the row order (a merged shard's need not be by id)

    def to_pandas(self):
        """DataFrame: token_id (int64), token, text, score (float32), rank (1 = highest; ties share the best
        rank; none for a NaN score: :func:`rank_scores`)."""
        import pandas as pd

        df = pd.DataFrame(
            {
                "token_id": self.token_ids.astype(np.int64),
                "token": self.tokens,
                "text": self.texts,
                "score": self.scores.astype(np.float32),
            }
        )
        return self._ranked(df)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike) -> "ScanResult":
        manifest = read_manifest(path, required=False) or {}
        df = read_parquet(path).sort_values("token_id")
        return cls(
            df["token_id"].to_numpy(np.int64),
            df["score"].to_numpy(np.float32),
            df["token"].tolist(),
            df["text"].tolist(),
            manifest,
        )


@dataclass(repr=False)
class TextScanResult(_Result):
    """Scores of response texts, with everything needed to reproduce them.

    Attributes:
        texts: the candidates, in input order (duplicates removed).
        scores: (N,) float32 rewards or log-probabilities.
        n_tokens: (N,) int64 response length in tokens, as scored.
        token_ids: the response ids scored, one list per text.
        manifest: model, prompt, template ids, head, compat mode, candidate source, timing.
        source_ids: vocabulary ids the texts were decoded from (compat vocabulary scans), else None.

    Example:
        >>> res = rmfast.score_texts(model, tok, "What is the greatest thing ever?", ["Love", "The universe"])  # doctest: +SKIP
        >>> res.top(2)  # doctest: +SKIP
    """

    texts: list[str]
    scores: np.ndarray
    n_tokens: np.ndarray
    token_ids: list[list[int]]
    manifest: dict = field(default_factory=dict)
    source_ids: np.ndarray | None = None
    columns: dict = field(default_factory=dict)  # extra per-row float columns (the reward lens: lens_<layer>)

    def to_pandas(self, token_ids: bool = True):
        """DataFrame: [token_id,] text, n_tokens, score (float32), rank (1 = highest; ties share the best), token_ids."""
        import pandas as pd

        cols = {}
        if self.source_ids is not None:
            cols["token_id"] = np.asarray(self.source_ids, dtype=np.int64)
        cols.update({"text": list(self.texts), "n_tokens": np.asarray(self.n_tokens, dtype=np.int64),
                     "score": np.asarray(self.scores, dtype=np.float32)})
        df = self._ranked(pd.DataFrame(cols))
        if token_ids:
            df["token_ids"] = [list(map(int, r)) for r in self.token_ids]
        return df

    def _table(self):
        return self.to_pandas(token_ids=False)  # best / worst rows without the id lists

    @classmethod
    def from_parquet(cls, path: str | os.PathLike) -> "TextScanResult":
        manifest = read_manifest(path, required=False) or {}
        df = read_parquet(path)
        tids = [list(map(int, r)) for r in df["token_ids"]] if "token_ids" in df else [[] for _ in range(len(df))]
        src = df["token_id"].to_numpy(np.int64) if "token_id" in df else None
        return cls(df["text"].tolist(), df["score"].to_numpy(np.float32), df["n_tokens"].to_numpy(np.int64), tids,
                   manifest, src)


def merge_shards(frames: list, manifests: list[dict]):
    """One result from the shards of a multi-process scan: rows back in job order, timing merged.

    ``frames``: each rank's ``to_pandas()`` table with an ``_order`` column (the rows' positions in
    the whole job, :meth:`rmfast.sweep.dist.Dist.mine`); ``manifests``: each rank's manifest. The merged
    scan time is the slowest rank's.
    """
    import pandas as pd

    from ..cpu import round_rate

    df = pd.concat(frames, ignore_index=True).sort_values("_order", kind="stable").reset_index(drop=True)
    man = dict(manifests[0])
    scan_s = max(float(m.get("scan_s") or 0) for m in manifests)
    man.update({"n_candidates": int(len(df)), "scan_s": round(scan_s, 3),
                "candidates_per_s": round_rate(len(df) / scan_s) if scan_s > 0 else None,
                "wall_s": max(float(m.get("wall_s") or 0) for m in manifests),
                "resumed_candidates": sum(int(m.get("resumed_candidates") or 0) for m in manifests),
                "scored_candidates": sum(int(m.get("scored_candidates") or 0) for m in manifests),
                "n_nonfinite": sum(int(m.get("n_nonfinite") or 0) for m in manifests),
                "distributed": {"world": len(frames), "split": "index % world == rank",
                                "ranks": [{"rank": r, "n": int(len(f)), "scan_s": m.get("scan_s"), "device": m.get("device")}
                                          for r, (f, m) in enumerate(zip(frames, manifests))]}})
    if "n_tokens" not in df:
        res = ScanResult(df["token_id"].to_numpy(np.int64), df["score"].to_numpy(np.float32), df["token"].tolist(),
                         df["text"].tolist(), man)
    else:
        res = TextScanResult(df["text"].tolist(), df["score"].to_numpy(np.float32), df["n_tokens"].to_numpy(np.int64),
                             [list(map(int, t)) for t in df["token_ids"]], man,
                             df["token_id"].to_numpy(np.int64) if "token_id" in df else None)
    res.columns.update({c: df[c].to_numpy() for c in df.columns if str(c).startswith("lens_")})  # the reward lens
    return res


def random_head_seed(manifest: dict) -> int | None:
    """The seed of a result's RANDOM score head (a causal LM given a seeded random head: its ranking is noise), or
    None where the head is the model's own.

    >>> random_head_seed({"model": {"name": "m", "random_head_seed": 3}, "head": "score"}), random_head_seed({})
    (3, None)
    """
    model = manifest.get("model")
    seed = model.get("random_head_seed") if isinstance(model, dict) else None
    return seed if manifest.get("head", "score") == "score" else None


def model_label(manifest: dict, default: str = "") -> str:
    """The model's name as a title gives it, a random head said (``SmolLM2 (RANDOM score head, seed 3)``).

    >>> model_label({"model": {"name": "m", "random_head_seed": 3}, "head": "score"})
    'm (RANDOM score head, seed 3)'
    """
    model = manifest.get("model")
    name = (model.get("name") if isinstance(model, dict) else model) or default
    seed = random_head_seed(manifest)
    return f"{name} (RANDOM score head, seed {seed})" if seed is not None else str(name)
