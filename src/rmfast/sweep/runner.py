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
        states: null                      #   hidden states to keep per part, e.g. 0,8,last_normed or all: part.states/
        states_dtype: null                #   float32 | bfloat16 | float16 (default: the model's)
        lens: false                       #   the reward lens columns lens_<layer> in each part
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

Every model × prompt × candidate set is one *part* of the store (:mod:`rmfast.sweep.store`); finished
parts are skipped, so an interrupted sweep resumes where it stopped, and a part in progress
resumes from its checkpoint. Under torchrun (or ``--shard I/N``) the parts are split across
ranks (:mod:`rmfast.sweep.dist`). ``dtype: auto`` is one dtype per model in a store (the first writer's choice,
kept: :meth:`_PartRunner._load`), however many kinds of machine finish it.

A model that is a training run's output folder (``checkpoint-N/`` subfolders, as the Hugging Face
Trainer writes them, and no model of its own) becomes one model per checkpoint, named
``<name>/checkpoint-N``, so ``rmfast analyze trajectory STORE/parts`` reads each one's step;
PEFT/LoRA adapter checkpoints are merged onto their base (:mod:`rmfast.loading.training_checkpoints`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from . import dist
from ..loading.spread import load_spread
from ..errors import UserError, python_names
from ..io import check_output, say_on_interrupt
from ..io import partial_states, states_dir
from .store import PART_FILE, PartRef, Store
from ..scoring.candidates import range_bounds, read_ids_file
from ..template import unescape

from .config import CandSet, ModelCfg, SweepConfig
from .content import model_content as content_of, same_content

PART_COLUMNS = ["token_id", "token", "text", "n_tokens", "score", "rank", "token_ids"]


# --------------------------------------------------------------------------------------------
# part frames


def frame_from_scan(res):
    """A ScanResult as a store part frame."""
    df = res.to_pandas()
    df["token_id"] = df["token_id"].astype("Int64")
    df["n_tokens"] = np.int64(1)
    df["token_ids"] = [[int(i)] for i in res.token_ids]
    return df[PART_COLUMNS + _lens(df)]


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
    return df[PART_COLUMNS + _lens(df)]


def _lens(df) -> list[str]:
    """The reward lens columns of a scan's frame (``lens: true``), kept in the part after its columns."""
    return [c for c in df.columns if str(c).startswith("lens_")]


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
    """One part through the scan pipeline; returns (part frame, result). The checkpoint stays until
    the store has the part; the states (``m.states``) stream into ``part.states.partial/`` beside it."""
    from ..scoring.pipeline import Selection, StatesRequest, run_scan

    if c.kind == "vocabulary":
        tids = c.view["token_ids"]
        sel = Selection(token_ids=tids["file"] if isinstance(tids, dict) else tids, exclude_special=c.view["exclude_special"],
                        wordlike=c.view["wordlike"], dedup=c.view["dedup"], compat=cfg.compat, max_tokens=cfg.max_tokens)
    else:
        sel = Selection(texts=c.texts.texts, texts_info=c.texts.source, compat=cfg.compat, max_tokens=cfg.max_tokens)
    states = (StatesRequest(m.states, m.states_dtype, folder=states_dir(ck.with_name(PART_FILE)), overwrite=True)
              if m.states else None)  # the lock holder owns the part's folder: a states folder there is its own
    res, _ = run_scan(lm.model, lm.tokenizer, prompt, sel, m.scoring(cfg.compat), job="sweep",
                      template=unescape(m.template) if m.template is not None else lm.default_template, system=m.system,
                      progress=progress, model_info={**lm.source, "name": m.name}, checkpoint=ck,
                      keep_checkpoint=True, audit=m.audit, states=states, lens=m.lens)
    if c.kind == "file":
        df = frame_from_texts(res)
    elif cfg.compat:
        df = frame_from_texts(res, lm.tokenizer)
    else:
        df = frame_from_scan(res)
    return df, res


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
    mode = store.check(chash, cfg.normalized(), force=force, keep={p.relpath for p in plan})
    check_models(cfg)  # every model resolves before any work, dry run or not
    if dry_run:
        keys = store.carried_keys(plan, cfg.normalized()) if mode in ("moved", "adopt") else {}
        now = [dataclasses.replace(p, key=keys.get(p.relpath, p.key)) for p in plan]  # as the run will find them
        st = store.status(now) if mode != "new" else [{"done": False} for _ in plan]
        return {"n_parts": len(plan), "n_done": sum(bool(s["done"]) for s in st), "complete": False, "dry_run": True,
                "parts": st, "mode": mode,
                "remove": store.stale_parts({p.relpath for p in plan}) if mode == "adopt" else [],
                "mine": None if d.world <= 1 else {p.relpath for p in assign(plan, cfg, d.world)[d.rank]}}
    say_on_interrupt("rerun the same command: the finished parts are kept, and the part in progress resumes from "
                     "its checkpoint", level="job")
    dist.init(d)
    try:
        dist.barrier(d)  # every rank has checked the store before rank 0 changes it
        if d.is_main or not d.group:
            with store.lock():  # another sweep on this store may be starting too
                store.clean_root_temp()
                mode = store.check(chash, cfg.normalized(), force=force)
                if mode in ("moved", "adopt"):
                    kept = store.rekey(plan, cfg.normalized())
                    if mode == "moved" and kept:  # (else only the order of models or candidate sets changed)
                        _log(d, f"the config's files are in other places than when {root} was written (their contents "
                                f"the same); {kept} finished part(s) kept, each model's files checked by content")
                if mode in ("new", "adopt", "moved"):
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
                    "written; scoring them again (a part is never kept from other weights, tokenizer or template)")
        models = {m.name: m for m in cfg.models}
        short = [p for p in mine if store.is_done(p) and not store.has_outputs(p, models[p.model].outputs())]
        if short:
            _log(d, f"{len(short)} finished part(s) lack the states or lens asked; scoring them again (the same scores)")
        todo = [p for p in mine if p in changed or p in short or not store.is_done(p)]
        for p in mine:  # a finished part's checkpoint, left by a kill between the part's write and its removal
            if p not in todo and store.checkpoint_path(p).exists():
                with store.claim(p) as held:
                    if held:
                        store.checkpoint_path(p).unlink(missing_ok=True)
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
    """Computes parts of one store, each only while holding its lock (:meth:`rmfast.sweep.store.Store.claim`),
    loading each model once per pass and only when one of its parts is really computed."""

    def __init__(self, store: Store, cfg: SweepConfig, d: dist.Dist, plan: list[PartRef], chash: str, bars: bool, n: int,
                 content: dict | None = None):
        self.store, self.cfg, self.d, self.plan, self.chash, self.bars, self.n = store, cfg, d, plan, chash, bars, n
        self.content = content or {}  # model name -> what names its files' content now (:func:`model_content`)
        self.k = 0  # parts computed by this process
        self.dtype_why: dict[str, str] = {}  # model name -> why its dtype: auto is what the store pinned

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
                    elif not (self.store.has_outputs(p, by_model[name].outputs())
                              and _same_content(self.store, p, self.content.get(p.model))):
                        self.store.check_still_ours(self.chash)
                        # not finished (another writer may have finished it meanwhile), or from other weights
                        with self._named(by_model[name], p):
                            lm = lm or self._load(by_model[name])
                            self._one(lm, by_model[name], p)
            if lm is not None:
                del lm
                _free_memory()
        return busy

    @contextlib.contextmanager
    def _named(self, m: ModelCfg, p: PartRef):
        """A problem met once the model is loaded (a token id range past its vocabulary, a head it lacks) as one
        line naming the config's file, model and candidates, the options as the config's keys (not CLI flags)."""
        try:
            yield
        except UserError as e:
            if str(self.cfg.path) in e.cli_message():  # named already (a write that failed: its own line)
                raise
            where = f"{self.cfg.path}: {m.key or f'models[{self.cfg.models.index(m)}]'} ({m.name}) × candidates.{p.candidates}"
            raise UserError(f"{where}: {python_names(e.cli_message())}") from None

    def _load(self, m: ModelCfg):
        """``m`` loaded for its parts. ``dtype: auto`` means one dtype per model in a store: the one its finished parts
        were scored in, else the one the first writer to load it pinned (:meth:`Store.pin_dtype`), else this
        machine's choice, pinned now: "auto" resolves per machine, and a store resumed or sharded on another kind
        would otherwise hold one model's parts in two dtypes, their scores apart by more than rounding."""
        dtype = self._store_dtype(m)
        lm = self._load_as(m, dtype)
        if dtype == "auto":  # the first to load it: its choice holds for every later writer of the store
            got = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
            with self.store.lock():
                pinned = self.store.pin_dtype(self.cfg.model_key(m), got)
            if pinned != got:  # another writer, on a machine that chooses otherwise, pinned it meanwhile
                self.dtype_why[m.name] = f"dtype auto is {pinned} in this store: pinned by the writer that loaded it first"
                _log(self.d, f"{m.name}: {self.dtype_why[m.name]} (this machine chose {got}); loading it again")
                del lm
                _free_memory()
                lm = self._load_as(m, pinned)
        return lm

    def _store_dtype(self, m: ModelCfg) -> str:
        """The dtype to load ``m`` in: its own, or what ``auto`` already means in this store ("auto": not yet decided)."""
        if m.dtype != "auto":
            return m.dtype
        seen = self.store.parts_dtypes(self.plan, m.name)
        if seen:
            d = max(seen, key=lambda k: seen[k])
            self.dtype_why[m.name] = (f"dtype auto is {d} in this store: its {sum(seen.values())} finished part(s) were "
                                      f"scored in it{' (most of them)' if len(seen) > 1 else ''}")
            with self.store.lock():
                self.store.pin_dtype(self.cfg.model_key(m), d)
        elif d := self.store.pin_dtype(self.cfg.model_key(m)):
            self.dtype_why[m.name] = f"dtype auto is {d} in this store: pinned by the writer that loaded it first"
        else:
            return "auto"
        _log(self.d, f"{m.name}: {self.dtype_why[m.name]} (one dtype per model in a store; set dtype: to choose)")
        return d

    def _load_as(self, m: ModelCfg, dtype: str):
        from ..scoring.decisions import DTYPE_WHY_ATTR

        t_load = time.perf_counter()
        lm = load_spread(m.model, dtype=dtype, device=dist.device_for(self.d, m.device), device_map=m.device_map,
                         trust_remote_code=m.trust_remote_code, cache_dir=m.cache_dir,
                         random_head_seed=m.random_head_seed, allow_pickle=m.allow_pickle, base=m.base)
        if dtype != m.dtype:  # auto, as the store pinned it: the plan's dtype decision says so
            setattr(lm.model, DTYPE_WHY_ATTR, self.dtype_why[m.name])
        _log(self.d, f"loaded {m.name} in {time.perf_counter() - t_load:.1f} s")
        return lm

    def _one(self, lm, m: ModelCfg, p: PartRef) -> None:
        """Compute one claimed part, write it, then drop its checkpoint."""
        from ..scoring.audit import audit_line
        from ..scoring.pipeline import finish_states

        store, d = self.store, self.d
        store.clean_temp(p)  # a killed writer's temp files; this process holds the part's lock
        self.k += 1
        t0 = time.perf_counter()
        ck = store.checkpoint_path(p)
        if not m.states:  # computed again without states: states of earlier scores would not be its own
            for f in (store.states_path(p), partial_states(store.states_path(p))):
                shutil.rmtree(f, ignore_errors=True)
        df, res = _score_part(lm, m, self.cfg, p.prompt, {c.name: c for c in self.cfg.candidates}[p.candidates], ck,
                              self.bars)
        man = res.manifest
        wall = time.perf_counter() - t0
        try:
            store.check_still_ours(self.chash)  # a --force of another config meanwhile: its store now, not ours
            finish_states(res)  # the states folder complete and in place before the manifest that marks the part done
            # score_meaning at the top, where write_pair's provenance takes it into the part Parquet's metadata
            store.write_part(p, df, {"model": {**lm.source, "name": m.name}, "prompt": p.prompt,
                                     "score_meaning": man.get("score_meaning"),
                                     "prompt_name": p.prompt_name, "candidates": p.candidates, "rank": d.rank,
                                     "world": d.world, "wall_s": round(wall, 3), "scan": man, "outputs": m.outputs(),
                                     **({"dtype_auto": self.dtype_why[m.name]} if m.name in self.dtype_why else {})})
        except OSError as e:  # a full disk, a read-only folder: the scores stay in the checkpoint
            raise UserError(f"cannot write {store.part_path(p)}: {e.strerror or e}; the part's scores are kept in "
                            f"{ck} — free space (or fix the folder) and rerun the sweep to write them without "
                            "rescoring") from None
        ck.unlink(missing_ok=True)  # only once the store holds the part
        line = audit_line(man.get("bf16_audit"))
        resumed = int(man.get("resumed_candidates") or 0)  # rows the part's checkpoint held from an earlier run
        _log(d, f"[{self.k}/{self.n}] {p.model} × {p.prompt_name} × {p.candidates}: {len(df)} rows in {wall:.1f} s"
                + (f" ({resumed} of them from the checkpoint)" if resumed else "") + (f"; {line}" if line else ""))
        if d.world == 1:
            with store.lock():
                store.write_index(self.plan, self.chash)


def check_models(cfg: SweepConfig) -> None:
    """Every model of the config resolves on this machine (:func:`rmfast.loading.sources.check_model`: no
    loading), or one line naming the first that does not and the config key: a sweep never scores some
    models' parts for hours and then stops at a missing one. Prompts and candidate files are read when
    the config is (:func:`rmfast.sweep.load_config`)."""
    from ..loading.sources import check_model

    for i, m in enumerate(cfg.models):
        try:
            check_model(m.model, cache_dir=m.cache_dir, base=m.base)
        except UserError as e:
            raise UserError(f"{cfg.path}: {m.key or f'models[{i}]'} ({m.name}): {e.cli_message()}") from None
        _check_ids_fit(cfg, m)


def _check_ids_fit(cfg: SweepConfig, m: ModelCfg) -> None:
    """Token ids a vocabulary set asks for past a folder model's embedding rows (its config.json's ``vocab_size``,
    which bounds the ids a scan takes): one line now, dry run or not, not when that model's first part loads it
    after the models before it have run. Other models (an alias, a GGUF file, a hub id, an adapter) are checked
    when loaded."""
    try:
        c = json.loads((Path(m.model) / "config.json").read_text(encoding="utf-8"))
        v = c.get("vocab_size") or (c.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(v, int) or isinstance(v, bool):
        return
    for c in cfg.candidates:
        top = _top_id(c.view.get("token_ids")) if c.kind == "vocabulary" else None
        if top is not None and top >= v:
            raise UserError(f"{cfg.path}: candidates.{c.name}.token_ids: id {top} is outside {m.name}'s vocabulary "
                            f"0:{v} (its config.json's vocab_size); give ids below {v} for every model of the sweep")


def _top_id(spec) -> int | None:
    """The largest id a ``token_ids`` view names (a range's last, a list's or an ids file's largest), None where
    only the vocabulary tells (an open range) or the file is for the scan to judge."""
    if isinstance(spec, str):
        hi = range_bounds(spec)[1]
        return None if hi is None else hi - 1
    if isinstance(spec, list):
        return max(spec, default=None)
    if isinstance(spec, dict):
        try:
            return max(read_ids_file(spec["file"])[0], default=None)
        except (UserError, KeyError):  # a file the scan's own reading refuses, with its line
            return None
    return None


def model_content(m: ModelCfg) -> dict | None:
    """What names a sweep model's files' content now (:func:`rmfast.sweep.content.model_content`)."""
    return content_of(m.model, m.cache_dir, base=m.base)


def _same_content(store: Store, p: PartRef, content: dict | None) -> bool:
    """Whether a finished part was scored from the files the model has now (:func:`rmfast.sweep.content.same_content`)."""
    return same_content(store.done_manifest(p), content)


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
