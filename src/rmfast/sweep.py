"""``rmfast sweep CONFIG.yaml``: models × prompts × candidate sets into one resumable results store.

The config (YAML; relative paths are relative to the config file)::

    out: results/paper_b                  # the results store (or --out)
    defaults:                             # options for every model (each model may override)
      dtype: bfloat16
      batch_size: auto
    models:
      - smollm2-135m-instruct             # a spec: embedded alias, folder, .gguf, hub id
      - model: ./models/my-rm             # or a mapping with per-model options:
        name: my-rm                       #   display name in the results (default from the spec)
        dtype: float32                    #   auto | bfloat16 | float16 | float32
        device: auto                      #   auto | cpu | cuda | cuda:N
        device_map: auto                  #   spread over GPUs with accelerate (plain-HF path)
        head: score                       #   auto | score | logprob
        head_index: 0
        template: "User: {prompt}\\nAssistant: {response}"
        system: null
        batch_size: 256                   #   rows per batch, or auto
        trust_remote_code: false
        random_head_seed: null
        engine: auto                      #   auto | fast | hf (the plain Hugging Face path)
        compile: auto                     #   auto | on | off (the compiled CPU layer)
        audit: 512                        #   bf16/fp16: rows rescored in fp32 (manifest scan.bf16_audit); 0: off
        base: null                        #   adapter (LoRA) checkpoints: the base model (default: the one
                                          #   adapter_config.json names; rmfast sweep --base sets it too)
      - ./runs/my-rm                      # a training run's folder: one model per checkpoint-N/ (below)
    prompts: ../shared/data/prompts/paper_b_prompts.yaml   # a YAML file (name: text), a mapping, or a list
    candidates:                           # name: set (default: the whole vocabulary)
      vocab: vocabulary
      words: {vocabulary: {exclude_special: true, wordlike: true, dedup: true}}
      elo: {file: ../shared/data/eloeverything/greatest.csv, column: name}
      nouns: ../lexicons/big2_nouns.txt
    compat: null                          # or decode-retokenize (the papers' decode round trip), authors (their loop)
    max_tokens: 256                       # longest text candidate, in tokens

Every model × prompt × candidate set is one *part* of the store (:mod:`rmfast.store`); finished
parts are skipped, so an interrupted sweep resumes where it stopped, and a part in progress
resumes from its checkpoint. Under torchrun (or ``--shard I/N``) the parts are split across
ranks (:mod:`rmfast.dist`).

A model that is a training run's output folder (``checkpoint-N/`` subfolders, as the Hugging Face
Trainer writes them, and no model of its own) becomes one model per checkpoint, named
``<name>/checkpoint-N``, so ``rmfast analyze trajectory STORE/parts`` reads each one's step;
PEFT/LoRA adapter checkpoints are merged onto their base (:mod:`rmfast.checkpoints`).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import dist
from .audit import DEFAULT_AUDIT_N
from .checkpoints import expand_runs, is_adapter_folder
from .candidates import COMPAT_MODES, DEFAULT_MAX_TOKENS, Candidates, read_candidates
from .errors import UserError
from .io import check_output, file_sha256, slug, yaml_load_unique
from .store import SCHEMA_VERSION, PartRef, Store
from .template import unescape

TOP_KEYS = ("out", "defaults", "models", "prompts", "candidates", "compat", "max_tokens")
MODEL_KEYS = ("model", "name", "dtype", "device", "device_map", "head", "head_index", "template", "system",
              "batch_size", "trust_remote_code", "random_head_seed", "engine", "compile", "cache_dir", "audit",
              "allow_pickle", "base")
RESULT_KEYS = ("name", "model", "dtype", "head", "head_index", "template", "system", "trust_remote_code",
               "random_head_seed")  # what changes the scores (device, batch size, engine do not)
VOCAB_KEYS = ("exclude_special", "wordlike", "dedup", "token_ids")
FILE_KEYS = ("file", "column", "format", "header")
PART_COLUMNS = ["token_id", "token", "text", "n_tokens", "score", "rank", "token_ids"]


# --------------------------------------------------------------------------------------------
# config


@dataclass
class ModelCfg:
    name: str
    slug: str
    model: str
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None
    head: str = "auto"
    head_index: int = 0
    template: str | None = None
    system: str | None = None
    batch_size: int | str = "auto"
    trust_remote_code: bool = False
    random_head_seed: int | None = None
    engine: str = "auto"
    compile: str = "auto"
    cache_dir: str | None = None
    audit: int = DEFAULT_AUDIT_N
    allow_pickle: bool = False  # load pickled pytorch_model.bin weights (unpickling can run code)
    base: str | None = None  # the base of an adapter checkpoint (None: the one it names)

    def result_fields(self) -> dict:
        # base only when set, so stores written before it existed keep their keys
        return {k: getattr(self, k) for k in RESULT_KEYS} | ({"base": self.base} if self.base else {})


@dataclass
class CandSet:
    name: str
    slug: str
    kind: str  # "vocabulary" | "file"
    view: dict = field(default_factory=dict)  # vocabulary: exclude_special, wordlike, dedup, token_ids
    file: dict = field(default_factory=dict)  # file: path, column, format, header, sha256
    texts: Candidates | None = None

    def result_fields(self) -> dict:
        return {"name": self.name, "kind": self.kind, **({"view": self.view} if self.kind == "vocabulary" else {"file": self.file})}


@dataclass
class SweepConfig:
    path: Path | None
    out: Path | None
    models: list[ModelCfg]
    prompts: dict[str, str]  # name -> text, in order
    prompt_slugs: dict[str, str]
    candidates: list[CandSet]
    compat: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS

    def normalized(self) -> dict:
        """What determines the results (hashed; stored in store.json)."""
        return {
            "schema": SCHEMA_VERSION,
            "models": [m.result_fields() for m in self.models],
            "prompts": dict(self.prompts),
            "candidates": [c.result_fields() for c in self.candidates],
            "compat": self.compat,
            "max_tokens": self.max_tokens,
        }

    def config_hash(self) -> str:
        return _hash(self.normalized())

    def part_key(self, m: ModelCfg, prompt: str, c: CandSet) -> str:
        return _hash({"schema": SCHEMA_VERSION, "model": m.result_fields(), "prompt": prompt,
                      "candidates": c.result_fields(), "compat": self.compat, "max_tokens": self.max_tokens})

    def plan(self) -> list[PartRef]:
        """Every part, model-major (model, then prompt, then candidate set)."""
        return [PartRef(model=m.name, model_slug=m.slug, prompt_name=pn, prompt_slug=self.prompt_slugs[pn], prompt=pt,
                        candidates=c.name, candidates_slug=c.slug, key=self.part_key(m, pt, c))
                for m in self.models for pn, pt in self.prompts.items() for c in self.candidates]


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _slug(s: str, n: int = 60) -> str:
    return slug(s, n, exact=True)


class _Cfg:
    """Typed access to one YAML mapping with errors that name the file and the key."""

    def __init__(self, file: str, where: str, data: dict, allowed):
        self.file, self.where, self.data = file, where, data
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise UserError(f"{file}: {self._at(unknown[0])}: unknown key (allowed: {', '.join(allowed)})")

    def _at(self, key) -> str:
        return f"{self.where}.{key}" if self.where else str(key)

    def err(self, key, msg) -> UserError:
        return UserError(f"{self.file}: {self._at(key)}: {msg}")

    def get(self, key, kind, default=None, *, choices=None, allow_none=True, minimum=None):
        if key not in self.data:
            return default
        v = self.data[key]
        if v is None:
            if allow_none:
                return None
            raise self.err(key, "must not be empty")
        ok = {"str": isinstance(v, str), "bool": isinstance(v, bool),
              "int": isinstance(v, int) and not isinstance(v, bool)}[kind]
        if not ok:
            raise self.err(key, f"expected {'a string' if kind == 'str' else 'true/false' if kind == 'bool' else 'an integer'}, "
                                f"got {type(v).__name__} {v!r}")
        if choices is not None and v not in choices:
            raise self.err(key, f"{v!r} is not one of {', '.join(map(str, choices))}")
        if minimum is not None and v < minimum:
            raise self.err(key, f"must be >= {minimum}, got {v}")
        return v


def _resolve(base: Path, p: str) -> Path:
    q = Path(os.path.expanduser(p))
    return q if q.is_absolute() else (base / q)


def _yaml_load(path: Path, what: str):
    """A YAML file of the config as Python data; one-line UserError naming the file and line (a key given
    twice in one mapping included: PyYAML would keep only the last)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        return yaml_load_unique(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{path}: not valid YAML{at} ({getattr(e, 'problem', None) or type(e).__name__})") from None


def _model_cfg(file: str, i: int, item, defaults: dict, base: Path) -> ModelCfg:
    where = f"models[{i}]"
    if isinstance(item, str):
        item = {"model": item}
    if not isinstance(item, dict):
        raise UserError(f"{file}: {where}: expected a model spec (string) or a mapping with model:, got {type(item).__name__}")
    c = _Cfg(file, where, {**defaults, **item}, MODEL_KEYS)
    spec = c.get("model", "str", allow_none=False)
    if spec is None or not spec.strip():
        raise c.err("model", "missing: give the model spec (embedded alias, folder, .gguf file or hub id)")
    spec = spec.strip()
    local = _resolve(base, spec)
    is_path = spec.startswith((".", "/", "~")) or (not Path(spec).is_absolute() and local.exists())
    if is_path:
        if not local.exists():
            raise c.err("model", f"no such model folder or file: {local}")
        spec = str(local.resolve())
    name = c.get("name", "str")
    if name is None:
        name = Path(spec).name.removesuffix(".gguf") if is_path else spec
    bs = c.data.get("batch_size", "auto")
    if not (bs == "auto" or (isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1)):
        raise c.err("batch_size", f"expected a positive integer or auto, got {bs!r}")
    m = ModelCfg(
        name=name, slug=_slug(name), model=spec,
        dtype=c.get("dtype", "str", "auto", choices=("auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32",
                                                       "fp32", "float"), allow_none=False),
        device=c.get("device", "str", "auto", allow_none=False),
        device_map=c.get("device_map", "str"),
        head=c.get("head", "str", "auto", choices=("auto", "score", "logprob"), allow_none=False),
        head_index=c.get("head_index", "int", 0, minimum=0, allow_none=False),
        template=c.get("template", "str"),
        system=c.get("system", "str"),
        batch_size=bs,
        trust_remote_code=c.get("trust_remote_code", "bool", False, allow_none=False),
        random_head_seed=c.get("random_head_seed", "int"),
        engine=c.get("engine", "str", "auto", choices=("auto", "fast", "hf", "reference"), allow_none=False),
        compile=c.get("compile", "str", "auto", choices=("auto", "on", "off"), allow_none=False),
        cache_dir=c.get("cache_dir", "str"),
        audit=c.get("audit", "int", DEFAULT_AUDIT_N, minimum=0, allow_none=False),
        allow_pickle=c.get("allow_pickle", "bool", False, allow_none=False),
        base=_base_spec(c.get("base", "str"), base),
    )
    return m


def _base_spec(spec: str | None, base: Path) -> str | None:
    """An adapter's base: a path relative to the config (when it exists there) or an alias / hub id."""
    if spec is None or not spec.strip():
        return None
    local = _resolve(base, spec.strip())
    return str(local.resolve()) if local.exists() else spec.strip()


def with_base(cfg: SweepConfig, base: str) -> SweepConfig:
    """``rmfast sweep --base``: ``base`` for every adapter checkpoint whose config gives none."""
    spec = str(Path(base).resolve()) if Path(base).exists() else base
    cfg.models = [dataclasses.replace(m, base=spec) if m.base is None and is_adapter_folder(m.model) else m
                  for m in cfg.models]
    return cfg


def _prompts(file: str, value, base: Path) -> dict[str, str]:
    src, where = file, "prompts"
    if isinstance(value, str):
        p = _resolve(base, value)
        try:
            value = _yaml_load(p, "prompts file")
        except UserError as e:
            raise UserError(f"{file}: prompts: {e}") from None
        src, where = str(p), ""
        if isinstance(value, dict) and set(value) == {"prompts"}:
            value, where = value["prompts"], "prompts"
    at = (lambda k: f"{where}.{k}" if where else str(k))
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(None, v) for v in value]
    else:
        raise UserError(f"{src}: {where or 'prompts'}: expected a mapping name: text, a list of prompts, or a YAML file of them")
    if not items:
        raise UserError(f"{src}: {where or 'prompts'}: no prompts")
    out: dict[str, str] = {}
    for i, (k, v) in enumerate(items):
        key = at(k) if k is not None else (f"{where}[{i}]" if where else f"[{i}]")
        if not isinstance(v, str) or not v.strip():
            raise UserError(f"{src}: {key}: expected a non-empty prompt string, got {v!r}")
        name = k if k is not None else _slug(v, 48)
        if name in out:
            if k is None and out[name] != v:
                j = 2
                while f"{name}-{j}" in out:
                    j += 1
                name = f"{name}-{j}"
            else:
                raise UserError(f"{src}: {key}: repeats the prompt {name!r}")
        if v in out.values():
            raise UserError(f"{src}: {key}: the same prompt text appears twice")
        out[name] = v
    return out


def _cand_set(file: str, name: str, spec, base: Path, where: str) -> CandSet:
    if spec is None or spec == "vocabulary" or spec is True:
        spec = {"vocabulary": {}}
    elif isinstance(spec, str):
        spec = {"file": spec}
    if not isinstance(spec, dict):
        raise UserError(f"{file}: {where}: expected 'vocabulary', a file path, or a mapping with vocabulary: or file:")
    if "vocabulary" in spec:
        if len(spec) != 1:
            extra = next(k for k in spec if k != "vocabulary")
            raise UserError(f"{file}: {where}.{extra}: unknown key next to vocabulary: (put view options under vocabulary:)")
        view = spec["vocabulary"]
        view = {} if view is None or view is True else view
        if not isinstance(view, dict):
            raise UserError(f"{file}: {where}.vocabulary: expected a mapping of {', '.join(VOCAB_KEYS)}")
        c = _Cfg(file, f"{where}.vocabulary", view, VOCAB_KEYS)
        tids = view.get("token_ids")
        if tids is not None:
            if isinstance(tids, list):
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in tids):
                    raise c.err("token_ids", "a list must hold integers only")
            elif isinstance(tids, str):
                q = _resolve(base, tids)
                if q.is_file():
                    tids = {"file": str(q.resolve()), "sha256": file_sha256(q)}
                elif ":" not in tids:
                    raise c.err("token_ids", f"{tids!r} is neither a range A:B nor an existing file")
            else:
                raise c.err("token_ids", f"expected a range A:B, a file or a list of ids, got {type(tids).__name__}")
        v = {"exclude_special": c.get("exclude_special", "bool", False, allow_none=False),
             "wordlike": c.get("wordlike", "bool", False, allow_none=False),
             "dedup": c.get("dedup", "bool", False, allow_none=False),
             "token_ids": tids}
        return CandSet(name=name, slug=_slug(name), kind="vocabulary", view=v)
    c = _Cfg(file, where, spec, FILE_KEYS)
    path = c.get("file", "str", allow_none=False)
    if not path:
        raise c.err("file", "missing: give the candidate file (or use vocabulary:)")
    col = spec.get("column")
    if col is not None and not (isinstance(col, str) or (isinstance(col, int) and not isinstance(col, bool))):
        raise c.err("column", f"expected a column name, got {type(col).__name__}")
    fmt = c.get("format", "str", choices=("lines", "csv", "tsv", "parquet"))
    header = c.get("header", "bool", True, allow_none=False)
    p = _resolve(base, path)
    try:
        cands = read_candidates(p, col, fmt=fmt, header=header)
    except UserError as e:
        raise UserError(f"{file}: {where}: {e}") from None
    f = {"path": str(p.resolve()), "column": None if col is None else str(col), "format": cands.source["format"],
         "header": header, "sha256": cands.source["sha256"]}
    return CandSet(name=name, slug=_slug(name), kind="file", file=f, texts=cands)


def _cand_sets(file: str, value, base: Path) -> list[CandSet]:
    if value is None or value == "vocabulary":
        return [_cand_set(file, "vocab", None, base, "candidates")]
    items: list[tuple[str, object, str]] = []
    if isinstance(value, dict):
        items = [(str(k), v, f"candidates.{k}") for k, v in value.items()]
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if v == "vocabulary":
                items.append(("vocab", v, f"candidates[{i}]"))
            elif isinstance(v, str):
                items.append((Path(v).stem, v, f"candidates[{i}]"))
            elif isinstance(v, dict) and "name" in v:
                items.append((str(v["name"]), {k: x for k, x in v.items() if k != "name"}, f"candidates[{i}]"))
            else:
                raise UserError(f"{file}: candidates[{i}]: expected 'vocabulary', a file path, or a mapping with name:")
    else:
        raise UserError(f"{file}: candidates: expected a mapping name: set (vocabulary, a file, or file:/vocabulary: options)")
    if not items:
        raise UserError(f"{file}: candidates: no candidate sets")
    out = [_cand_set(file, n, v, base, w) for n, v, w in items]
    slugs = [c.slug.lower() for c in out]
    for c in out:
        if slugs.count(c.slug.lower()) > 1:
            raise UserError(f"{file}: candidates: two sets share the name {c.name!r}; give them distinct names")
    return out


def load_config(path: str | os.PathLike) -> SweepConfig:
    """Read and check a sweep config; every problem is a one-line UserError naming the file and key."""
    p = Path(path)
    data = _yaml_load(p, "sweep config")
    file = str(p)
    if not isinstance(data, dict):
        raise UserError(f"{file}: expected a mapping with models:, prompts: and candidates:, got {type(data).__name__}")
    top = _Cfg(file, "", data, TOP_KEYS)
    base = p.resolve().parent
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{file}: defaults: expected a mapping of model options")
    _Cfg(file, "defaults", defaults, [k for k in MODEL_KEYS if k not in ("model", "name")])
    models = data.get("models")
    if models is None:
        raise UserError(f"{file}: models: missing; list at least one model")
    if isinstance(models, (str, dict)):
        models = [models]
    if not isinstance(models, list) or not models:
        raise UserError(f"{file}: models: expected a list of models")
    mcfgs = expand_runs([_model_cfg(file, i, m, defaults, base) for i, m in enumerate(models)], _slug)
    seen: dict[str, int] = {}
    for i, m in enumerate(mcfgs):
        if m.slug.lower() in seen:
            raise UserError(f"{file}: models[{i}].name: {m.name!r} clashes with models[{seen[m.slug.lower()]}]; "
                            "give each model a distinct name:")
        seen[m.slug.lower()] = i
    if "prompts" not in data or data["prompts"] is None:
        raise UserError(f"{file}: prompts: missing; give a mapping name: text, a list, or a YAML file of prompts")
    prompts = _prompts(file, data["prompts"], base)
    pslugs: dict[str, str] = {}
    for n in prompts:
        s = _slug(n)
        if s.lower() in {x.lower() for x in pslugs.values()}:
            raise UserError(f"{file}: prompts: the names {n!r} and another map to the same folder {s!r}; rename one")
        pslugs[n] = s
    compat = top.get("compat", "str", choices=COMPAT_MODES)
    max_tokens = top.get("max_tokens", "int", DEFAULT_MAX_TOKENS, minimum=1, allow_none=False)
    out = top.get("out", "str")
    cands = _cand_sets(file, data.get("candidates"), base)
    return SweepConfig(path=p, out=_resolve(base, out) if out else None, models=mcfgs, prompts=prompts,
                       prompt_slugs=pslugs, candidates=cands, compat=compat, max_tokens=max_tokens)


# --------------------------------------------------------------------------------------------
# part frames


def frame_from_scan(res):
    """A ScanResult as a store part frame."""
    df = res.to_pandas()
    df["token_id"] = df["token_id"].astype("Int64")
    df["n_tokens"] = np.int64(1)
    df["token_ids"] = [[int(i)] for i in res.token_ids]
    return df[PART_COLUMNS]


def frame_from_texts(res, tokenizer=None):
    """A TextScanResult as a store part frame."""
    import pandas as pd

    df = res.to_pandas()
    if "token_id" in df:
        df["token_id"] = df["token_id"].astype("Int64")
        toks = tokenizer.convert_ids_to_tokens(df["token_id"].astype(int).tolist()) if tokenizer is not None else None
        df["token"] = [t if isinstance(t, str) else "" for t in toks] if toks is not None else None
    else:
        df["token_id"] = pd.array([pd.NA] * len(df), dtype="Int64")
        df["token"] = pd.Series([None] * len(df), dtype=object)
    return df[PART_COLUMNS]


# --------------------------------------------------------------------------------------------
# running


def _cost(c: CandSet) -> float:
    """Rough work of one part of candidate set ``c`` (tokens through the model)."""
    if c.kind == "file":
        return float(sum(len(t) for t in c.texts.texts)) / 4.0 + len(c.texts.texts)
    t = c.view.get("token_ids")
    if isinstance(t, str) and ":" in t:
        a, _, b = t.partition(":")
        try:
            return float((int(b) if b.strip() else 50_000) - (int(a) if a.strip() else 0))
        except ValueError:
            return 50_000.0
    if isinstance(t, list):
        return float(len(t))
    return 50_000.0  # a whole vocabulary (nominal)


def assign(plan: list[PartRef], cfg: SweepConfig, world: int) -> list[list[PartRef]]:
    """Deal the parts to ``world`` ranks: largest first to the least-loaded rank (ties: lowest rank).

    Deterministic from the config alone, so every rank computes the same split without talking,
    whatever is already finished. Each rank's parts come back in plan order (model-major), so a
    rank loads each of its models once.
    """
    if world <= 1:
        return [list(plan)]
    cost = {c.name: _cost(c) for c in cfg.candidates}
    order = sorted(range(len(plan)), key=lambda i: (-cost[plan[i].candidates], i))
    load = [0.0] * world
    owner = [0] * len(plan)
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += cost[plan[i].candidates]
    return [[p for i, p in enumerate(plan) if owner[i] == r] for r in range(world)]


def _log(d: dist.Dist, msg: str) -> None:
    tag = f"[{d.tag()}] " if d.world > 1 else ""
    print(f"rmfast sweep: {tag}{msg}", file=sys.stderr, flush=True)


def _score_part(lm, m: ModelCfg, cfg: SweepConfig, prompt: str, c: CandSet, ck: Path, progress: bool):
    """One part through the scan pipeline; returns (part frame, manifest). The checkpoint stays
    until the store has the part."""
    from .pipeline import Selection, run_scan

    if c.kind == "vocabulary":
        tids = c.view["token_ids"]
        sel = Selection(token_ids=tids["file"] if isinstance(tids, dict) else tids, exclude_special=c.view["exclude_special"],
                        wordlike=c.view["wordlike"], dedup=c.view["dedup"], compat=cfg.compat, max_tokens=cfg.max_tokens)
    else:
        sel = Selection(texts=c.texts.texts, texts_info=c.texts.source, compat=cfg.compat, max_tokens=cfg.max_tokens)
    res, _ = run_scan(lm.model, lm.tokenizer, prompt, sel, head=m.head, head_index=m.head_index,
                      template=unescape(m.template) if m.template is not None else lm.default_template, system=m.system,
                      batch_size=m.batch_size, progress=progress, model_info={**lm.source, "name": m.name},
                      engine=dist.engine_for(m.device_map, m.engine), compile=m.compile, checkpoint=ck,
                      keep_checkpoint=True, audit=m.audit)
    if c.kind == "file":
        df = frame_from_texts(res)
    elif cfg.compat:
        df = frame_from_texts(res, lm.tokenizer)
    else:
        df = frame_from_scan(res)
    return df, res.manifest


def run_sweep(cfg: SweepConfig, out: str | os.PathLike | None = None, *, force: bool = False, shard: str | None = None,
              progress: bool = True, dry_run: bool = False) -> dict:
    """Run (or resume) a sweep into its results store. Returns the store index (parts, done, rows).

    Under torchrun (or ``shard="I/N"``) each rank takes its share of the parts (:func:`assign`); rank 0
    writes the index after a barrier.
    """
    root = Path(out) if out is not None else cfg.out
    if root is None:
        raise UserError(f"{cfg.path}: no output directory: set out: in the config or pass --out DIR")
    check_output(root, folder=True)
    d = dist.from_env(shard)
    plan = cfg.plan()
    chash = cfg.config_hash()
    store = Store(root)
    mode = store.check(chash, cfg.normalized(), force=force)
    if dry_run:
        st = store.status(plan) if mode != "new" else [{"done": False} for _ in plan]
        return {"n_parts": len(plan), "n_done": sum(bool(s["done"]) for s in st), "complete": False, "dry_run": True,
                "parts": st, "mode": mode}
    dist.init(d)
    try:
        dist.barrier(d)  # every rank has checked the store before rank 0 changes it
        if d.is_main or not d.group:
            with store.lock():  # another sweep on this store may be starting too
                store.clean_root_temp()
                mode = store.check(chash, cfg.normalized(), force=force)
                if mode in ("new", "adopt"):
                    store.create(chash, cfg.normalized(), plan, source=str(cfg.path) if cfg.path else None)
                if mode == "adopt":
                    removed = store.remove_stale({p.relpath for p in plan})
                    if removed:
                        _log(d, f"--force: removed {len(removed)} part(s) not in the new config")
        dist.barrier(d)
        mine = assign(plan, cfg, d.world)[d.rank]
        content = {m.name: model_content(m) for m in cfg.models if m.name in {p.model for p in mine}}
        changed = [p for p in mine if store.is_done(p) and not _same_content(store, p, content[p.model])]
        for name in dict.fromkeys(p.model for p in changed):
            _log(d, f"{name}: its files changed since {sum(p.model == name for p in changed)} finished part(s) were "
                    "written; scoring them again (a part is never kept from other weights)")
        todo = [p for p in mine if p in changed or not store.is_done(p)]
        _log(d, f"{len(plan)} parts ({len(cfg.models)} models × {len(cfg.prompts)} prompts × {len(cfg.candidates)} "
                f"candidate sets); this process: {len(mine)}, {len(mine) - len(todo)} already done")
        run = _PartRunner(store, cfg, d, plan, chash, progress and (d.is_main or not d.group), len(todo), content)
        busy = run.parts(todo, wait=False)
        if busy:  # another writer holds them: wait for it, then take over whatever it did not finish
            _log(d, f"{len(busy)} part(s) are being computed by another writer; waiting for them")
            run.parts(busy, wait=True)
        dist.barrier(d)
        if d.group and not d.is_main:
            return {"n_parts": len(plan), "complete": None}  # rank 0 reports
        n_done = sum(store.is_done(p) for p in plan)
        if d.group or d.world == 1 or n_done == len(plan):  # --shard jobs: only the one that sees it all done
            with store.lock():
                return store.write_index(plan, chash)
        return {"n_parts": len(plan), "n_done": n_done, "complete": False, "rows": None}
    finally:
        dist.finish(d)


class _PartRunner:
    """Computes parts of one store, each only while holding its lock (:meth:`rmfast.store.Store.claim`),
    loading each model once per pass and only when one of its parts is really computed."""

    def __init__(self, store: Store, cfg: SweepConfig, d: dist.Dist, plan: list[PartRef], chash: str, bars: bool, n: int,
                 content: dict | None = None):
        self.store, self.cfg, self.d, self.plan, self.chash, self.bars, self.n = store, cfg, d, plan, chash, bars, n
        self.content = content or {}  # model name -> what names its files' content now (:func:`model_content`)
        self.k = 0  # parts computed by this process

    def parts(self, parts: list[PartRef], *, wait: bool) -> list[PartRef]:
        """Compute ``parts`` (model-major); returns those another writer holds (none with ``wait``)."""
        busy: list[PartRef] = []
        by_model = {m.name: m for m in self.cfg.models}
        for name in dict.fromkeys(p.model for p in parts):
            lm = None
            for p in [p for p in parts if p.model == name]:
                with self.store.claim(p, wait=wait) as held:
                    if not held:
                        busy.append(p)
                    elif not (self.store.is_done(p) and _same_content(self.store, p, self.content.get(p.model))):
                        # not finished (another writer may have finished it meanwhile), or from other weights
                        lm = lm or self._load(by_model[name])
                        self._one(lm, by_model[name], p)
            if lm is not None:
                del lm
                _free_memory()
        return busy

    def _load(self, m: ModelCfg):
        t_load = time.perf_counter()
        lm = dist.load_model(m.model, dtype=m.dtype, device=dist.device_for(self.d, m.device), device_map=m.device_map,
                             trust_remote_code=m.trust_remote_code, cache_dir=m.cache_dir,
                             random_head_seed=m.random_head_seed, allow_pickle=m.allow_pickle,
                             base=m.base)
        _log(self.d, f"loaded {m.name} in {time.perf_counter() - t_load:.1f} s")
        return lm

    def _one(self, lm, m: ModelCfg, p: PartRef) -> None:
        """Compute one claimed part, write it, then drop its checkpoint."""
        from .audit import audit_line

        store, d = self.store, self.d
        store.clean_temp(p)  # a killed writer's temp files; this process holds the part's lock
        self.k += 1
        t0 = time.perf_counter()
        ck = store.checkpoint_path(p)
        df, man = _score_part(lm, m, self.cfg, p.prompt, {c.name: c for c in self.cfg.candidates}[p.candidates], ck,
                              self.bars)
        wall = time.perf_counter() - t0
        try:
            store.write_part(p, df, {"model": {**lm.source, "name": m.name}, "prompt": p.prompt,
                                     "prompt_name": p.prompt_name, "candidates": p.candidates, "rank": d.rank,
                                     "world": d.world, "wall_s": round(wall, 3), "scan": man})
        except OSError as e:  # a full disk, a read-only folder: the scores stay in the checkpoint
            raise UserError(f"cannot write {store.part_path(p)}: {e.strerror or e}; the part's scores are kept in "
                            f"{ck} — free space (or fix the folder) and rerun the sweep to write them without "
                            "rescoring") from None
        ck.unlink(missing_ok=True)  # only once the store holds the part
        line = audit_line(man.get("bf16_audit"))
        _log(d, f"[{self.k}/{self.n}] {p.model} × {p.prompt_name} × {p.candidates}: {len(df)} rows in {wall:.1f} s"
                + (f"; {line}" if line else ""))
        if d.world == 1:
            with store.lock():
                store.write_index(self.plan, self.chash)


def model_content(m: ModelCfg) -> dict | None:
    """What names a sweep model's files' content now, as its part manifests record it (the loader's
    provenance): a folder's (or an adapter checkpoint's) ``content_sha256``, a GGUF file's ``sha256``.
    None where only loading tells (an embedded alias, a hub id: their names fix the content)."""
    from . import loader

    path = Path(os.path.expanduser(m.model))
    cache = loader.cache_root(m.cache_dir)
    if path.is_dir() and (path / "config.json").is_file() or is_adapter_folder(path):
        return {"content_sha256": loader.content_sha256(path.resolve(), cache=cache)}
    if path.is_file():
        return {"sha256": loader.cached_sha256(path, cache)}
    return None


def _same_content(store: Store, p: PartRef, content: dict | None) -> bool:
    """Whether a finished part was scored from the files the model has now (True where that is unknown)."""
    if not content:
        return True
    model = (store.done_manifest(p) or {}).get("model") or {}
    return all(model.get(k) == v for k, v in content.items())


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


def summarize(root: str | os.PathLike) -> dict:
    """What a store holds: config, parts done per model, rows."""
    st = Store(root)
    if not Path(root).exists():
        raise UserError(f"results store {root}: no such directory")
    info = st.info()
    if info is None:
        raise UserError(f"{root} is not an rmfast results store (no readable store.json); give a sweep's output directory")
    plan = st.plan()
    status = st.status(plan)
    return {"root": str(root), "config_file": info.get("config_file"), "config_hash": info.get("config_hash"),
            "created": info.get("created"), "status": status, "config": info.get("config")}
