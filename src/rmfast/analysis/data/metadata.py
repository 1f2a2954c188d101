"""Model metadata (developer, base model, size, leaderboard rank) and display labels.

The user gives a small YAML or CSV; both of the papers' formats are read:

* YAML: a list of mappings with ``name`` (hub id), ``nickname``, ``base_model``,
  ``base_version``, ``size`` ("27B"), ``reward_bench_rank``;
* CSV: ``RewardBench Rank, Model ID, Developer, Model Name, Base Model, Parameters (B)``.

:func:`load_model_metadata` normalises either to::

    model             str    the key matched against scan model names
    nickname          str    short display label (falls back to the name after "/")
    developer         str    (falls back to the hub organisation before "/")
    base              str    base model incl. version, e.g. "Llama 3.1"
    base_family       str    first word of base, e.g. "Llama"
    params_b          float  parameters in billions
    leaderboard_rank  float  e.g. RewardBench rank

Other columns are kept.
"""

from __future__ import annotations

import re
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...user_files import read_csv, read_text
from ...yaml_keys import yaml_load_unique, yaml_problem

META_COLUMNS = ["model", "nickname", "developer", "base", "base_family", "params_b",
                "leaderboard_rank"]

_ALIASES = {
    "model": ["name", "model", "model_name", "hf_id", "repo", "hub_id"],
    "nickname": ["nickname", "model_id", "short_name", "label", "display_name", "alias"],
    "developer": ["developer", "org", "organization", "organisation"],
    "base": ["base_model", "base"],
    "base_version": ["base_version"],
    "params_b": ["params_b", "parameters_b", "parameters", "size", "n_params", "params"],
    "leaderboard_rank": ["leaderboard_rank", "rewardbench_rank", "reward_bench_rank", "rank"],
}


def _norm(col: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(col).strip().lower()).strip("_")


def parse_params(value) -> float:
    """Parameter count in billions from 27, "27", "27B", "270M", "1.5b".

    >>> parse_params("270M"), parse_params("8B"), parse_params(27)
    (0.27, 8.0, 27.0)
    """
    if value is None or isinstance(value, (dict, list)):
        return float("nan")
    if isinstance(value, (int, float, np.number)):
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", str(value))
    if not m:
        return float("nan")
    scale = {"": 1.0, "b": 1.0, "m": 1e-3, "k": 1e-6, "t": 1e3}[m.group(2).lower()]
    return float(m.group(1)) * scale


def _basename(name: str) -> str:
    return str(name).rsplit("/", 1)[-1]


def load_model_metadata(path: str | PathLike | pd.DataFrame) -> pd.DataFrame:
    """Read model metadata from YAML/CSV (or normalise a DataFrame); see the module doc.

    >>> df = load_model_metadata(pd.DataFrame({"name": ["org/A-8B"], "size": ["8B"],
    ...                                         "base_model": ["Llama"], "reward_bench_rank": [3]}))
    >>> df.loc[0, ["model", "nickname", "developer", "base_family"]].tolist()
    ['org/A-8B', 'A-8B', 'org', 'Llama']
    >>> float(df.loc[0, "params_b"])
    8.0
    """
    if isinstance(path, pd.DataFrame):
        raw = path.copy()
        where = "the metadata frame"
    else:
        path = Path(path)
        where = path.name
        if not path.exists():
            raise UserError(f"metadata file {path} does not exist; give a YAML or CSV of models")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml_load_unique(read_text(path, "--metadata file"))
            except yaml.YAMLError as e:  # a model given twice included: PyYAML would keep only the last
                raise UserError(f"--metadata file {path} is not valid YAML {yaml_problem(e)}; fix it") from None
            if isinstance(data, dict):
                data = [{"name": k, **(v or {})} for k, v in data.items()]
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise UserError(f"{where}: expected a list of mappings (one per model) or a "
                                "mapping name -> fields")
            raw = pd.DataFrame(data)
        else:
            raw = read_csv(path, "--metadata file")
    cols = {_norm(c): c for c in raw.columns}
    out = pd.DataFrame(index=raw.index)
    for key, aliases in _ALIASES.items():
        for a in aliases:
            if a in cols and key not in out.columns:
                out[key] = raw[cols[a]]
    if "model" not in out.columns:
        if "nickname" in out.columns:
            out["model"] = out["nickname"]
        else:
            raise UserError(f"{where}: no model-name column (one of {_ALIASES['model']}); add one")
    out["model"] = out["model"].astype(str)
    if "nickname" not in out.columns:
        out["nickname"] = out["model"].map(_basename)
    out["nickname"] = out["nickname"].fillna(out["model"].map(_basename)).astype(str)
    if "developer" not in out.columns:
        out["developer"] = [m.split("/")[0] if "/" in m else np.nan for m in out["model"]]
    if "base" in out.columns:
        base = out["base"].astype("string")
        if "base_version" in out.columns:
            ver = out["base_version"].astype("string").fillna("")
            base = (base + " " + ver).str.strip()
        out["base"] = base.astype(object)
        out["base_family"] = out["base"].map(lambda b: str(b).split()[0] if pd.notna(b) else np.nan)
    else:
        out["base"] = np.nan
        out["base_family"] = np.nan
    out["params_b"] = [parse_params(v) for v in out["params_b"]] if "params_b" in out.columns \
        else np.nan
    out["leaderboard_rank"] = pd.to_numeric(out.get("leaderboard_rank", np.nan), errors="coerce")
    out = out.drop(columns=[c for c in ("base_version",) if c in out.columns])
    rest = raw[[c for c in raw.columns if c not in set().union(*[
        {cols[a] for a in al if a in cols} for al in _ALIASES.values()])]]
    rest = rest[[c for c in rest.columns if c not in META_COLUMNS]]
    out = pd.concat([out[META_COLUMNS], rest], axis=1)
    if out["model"].duplicated().any():
        raise UserError(f"{where}: model(s) {out['model'][out['model'].duplicated()].tolist()} "
                        "appear twice; keep one row per model")
    return out.reset_index(drop=True)


def match_metadata(models, meta: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Rows of ``meta`` for each scan model, matched by name, nickname or name after "/".

    Returns (frame indexed by scan model name with META_COLUMNS, unmatched model names).

    >>> meta = load_model_metadata(pd.DataFrame({"Model Name": ["A-8B"], "Model ID": ["A"]}))
    >>> m, missing = match_metadata(["org/A-8B", "B"], meta)
    >>> m.index.tolist(), missing
    (['org/A-8B'], ['B'])
    """
    keys: dict[str, int] = {}
    for i, row in meta.iterrows():
        for k in {row["model"], row["nickname"], _basename(row["model"])}:
            keys.setdefault(str(k).lower(), i)
    rows, unmatched = {}, []
    for m in models:
        i = keys.get(str(m).lower(), keys.get(_basename(m).lower()))
        if i is None:
            unmatched.append(m)
        else:
            rows[m] = meta.loc[i]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=meta.columns) if rows \
        else pd.DataFrame(columns=meta.columns)
    return frame, unmatched


def infer_family(name: str) -> str:
    """Base family guessed from a model name ("gemma", "llama", "qwen", ... or "other").

    >>> infer_family("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2")
    'Llama'
    """
    low = str(name).lower()
    for fam in ("gemma", "llama", "qwen", "mistral", "phi", "smollm", "deepseek", "internlm"):
        if fam in low:
            return fam.capitalize() if fam != "smollm" else "SmolLM"
    return "other"


def model_labels(models, meta: pd.DataFrame | None = None) -> dict[str, str]:
    """Short display label per model: the metadata nickname, else the name after "/".

    >>> model_labels(["org/Model-A"])
    {'org/Model-A': 'Model-A'}
    """
    labels = {m: _basename(m) for m in models}
    if meta is not None and len(meta):
        matched, _ = match_metadata(list(models), meta)
        for m, row in matched.iterrows():
            labels[m] = str(row["nickname"])
    return labels


def model_families(models, meta: pd.DataFrame | None = None) -> dict[str, str]:
    """Base family per model: from metadata when matched, else guessed from the name."""
    fam = {m: infer_family(m) for m in models}
    if meta is not None and len(meta):
        matched, _ = match_metadata(list(models), meta)
        for m, row in matched.iterrows():
            if pd.notna(row["base_family"]):
                fam[m] = str(row["base_family"])
    return fam


def model_order(models, meta: pd.DataFrame | None = None) -> list[str]:
    """Models sorted by leaderboard rank when known (then by name), else by name."""
    models = list(dict.fromkeys(models))
    if meta is None or not len(meta):
        return sorted(models)
    matched, _ = match_metadata(models, meta)
    rank = {m: matched.loc[m, "leaderboard_rank"] if m in matched.index else np.nan
            for m in models}
    return sorted(models, key=lambda m: (np.isnan(rank[m]), rank[m] if not np.isnan(rank[m])
                                         else 0, m))
