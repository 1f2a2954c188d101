"""A sweep's configuration: the YAML file read and checked (every key, with its line), resolved
against its folder, into :class:`SweepConfig` (models, prompts, candidate sets). The format is
documented in :mod:`rmfast.sweep.runner`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..io import file_sha256, slug
from ..yaml_keys import yaml_load_unique
from ..loading.sources import model_name
from ..loading.training_checkpoints import expand_runs, is_adapter_folder
from ..scoring.audit import DEFAULT_AUDIT_N
from ..states import DTYPES, parse_layers
from ..scoring.candidate_files import Candidates, read_candidates
from ..scoring.candidates import COMPAT_MODES, DEFAULT_MAX_TOKENS, range_bounds
from .store import SCHEMA_VERSION, PartRef

TOP_KEYS = ("out", "defaults", "models", "prompts", "candidates", "compat", "max_tokens")
MODEL_KEYS = ("model", "name", "dtype", "device", "device_map", "head", "head_index", "template", "system",
              "batch_size", "trust_remote_code", "random_head_seed", "engine", "compile", "cache_dir", "audit",
              "allow_pickle", "base", "states", "states_dtype", "lens")
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
    states: str | None = None  # hidden states to keep, "0,8,last_prenorm" / "all" (docs/representations.md); None: none
    states_dtype: str | None = None  # their stored dtype (None: the model's)
    lens: bool = False  # the reward lens columns lens_<layer> in each part
    key: str = ""  # where the config gives it ("models[1]"; a run's checkpoints share their run's): errors name it

    def scoring(self, compat: str | None = None):
        """This model's scoring options as one value (:class:`rmfast.scoring.options.ScoringOptions`): what its
        parts are planned from (``compat``: the sweep's own)."""
        from ..scoring.options import ScoringOptions

        return ScoringOptions(head=self.head, head_index=self.head_index, engine=self.engine, compile=self.compile,
                              batch_size=self.batch_size, dtype=self.dtype, device=self.device,
                              device_map=self.device_map, compat=compat)

    def outputs(self) -> dict:
        """What this model's parts keep beside the scores (not in the part key: the scores do not change)."""
        return {k: v for k, v in (("states", self.states), ("states_dtype", self.states_dtype), ("lens", self.lens)) if v}

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

    def model_key(self, m: ModelCfg) -> str:
        """What names ``m``'s settings in the store (the key its ``dtype: auto`` is pinned under)."""
        return _hash({"schema": SCHEMA_VERSION, "model": m.result_fields()})

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
        name = model_name(spec)  # the name rmfast scan records: one model, one name
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
        states=_states_spec(c), lens=c.get("lens", "bool", False, allow_none=False),
        states_dtype=c.get("states_dtype", "str", choices=DTYPES), key=where,
    )
    if m.states_dtype is not None and m.states is None:
        raise c.err("states_dtype", "needs states: LAYERS")
    return m


def _states_spec(c: _Cfg) -> str | None:
    """``states:`` as one canonical spec string ("0,8,last_prenorm"; the old last is last_prenorm); layer names
    checked now (ranges once loaded)."""
    v = c.data.get("states")
    if v is None or v is False:
        return None
    if isinstance(v, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
        v = ",".join(map(str, v))
    if not isinstance(v, (str, int)) or isinstance(v, bool):
        raise c.err("states", f"expected layers such as 0,8,last_prenorm (or a list, or all), got {v!r}")
    try:
        return ",".join(parse_layers(str(v), None))
    except UserError as e:
        raise c.err("states", e.cli_message().removeprefix("--states ")) from None


def with_states(cfg: SweepConfig, states: str | None, dtype: str | None, lens: bool) -> SweepConfig:
    """``rmfast sweep --states/--states-dtype/--lens``: set them for every model (over the config's)."""
    if dtype is not None and states is None:
        raise UserError("--states-dtype needs --states LAYERS")
    spec = None if states is None else ",".join(parse_layers(states, None))
    cfg.models = [dataclasses.replace(m, states=spec or m.states, states_dtype=dtype if spec else m.states_dtype,
                                      lens=lens or m.lens) for m in cfg.models]
    return cfg


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
            raise UserError(f"{file}: prompts: {e.cli_message()}") from None
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
                else:  # the range's form now, before any store or model: its end against the vocabulary at the run
                    try:
                        range_bounds(tids)
                    except ValueError as e:
                        raise c.err("token_ids", str(e)) from None
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
        raise UserError(f"{file}: {where}: {e.cli_message()}") from None
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
    if not isinstance(models, list):
        raise UserError(f"{file}: models: expected a list of models")
    if not models:
        raise UserError(f"{file}: models: the list is empty; list at least one model")
    mcfgs = expand_runs([_model_cfg(file, i, m, defaults, base) for i, m in enumerate(models)], _slug)
    seen: dict[str, ModelCfg] = {}
    for m in mcfgs:
        if m.slug.lower() in seen:
            run = m.name.rsplit("/checkpoint-", 1)[0] if re.search(r"/checkpoint-\d+$", m.name) else None
            fix = (f"{{model: {Path(m.model).parent}, name: {run}-2}}: a run's checkpoints are named after it" if run
                   else f"{{model: {m.model}, name: {m.name}-2}}")  # a run's own: its name, not one checkpoint in place of it
            raise UserError(f"{file}: {m.key}.name: {m.name!r} clashes with {seen[m.slug.lower()].key}; give each model a "
                            f"distinct name (e.g. {fix})")
        seen[m.slug.lower()] = m
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
