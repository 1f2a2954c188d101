"""The results store: one directory per sweep, Parquet parts partitioned by model, prompt and candidates.

Layout::

    STORE/
      store.json                        schema version, config hash, the normalised config
      manifest.json                     index of the parts: done or not, rows (rebuilt, informational)
      parts/model=<m>/prompt=<p>/candidates=<c>/
          part.parquet                  the part's rows
          part.parquet.json             its manifest; written LAST, so it marks the part finished
          part.partial.npz              checkpoint of a part in progress (removed when it lands)
          part.states/                  its hidden states (``states:`` in the config; rmfast-states/1),
                                        complete before the part's manifest is written
          part.states.partial/          states of a part in progress (resumed with its checkpoint)
          .part.lock                    held by the process computing the part
      dtypes.json                       the dtype ``dtype: auto`` became for each model, once (:meth:`Store.pin_dtype`)
      .store.lock                       held while store.json / manifest.json / dtypes.json are written

Every file is written atomically (temp file + rename), a part's Parquet and manifest as a pair
(:func:`rmfast.io.write_pair`). A part counts as finished only when its manifest exists, names the
part's key, and its Parquet is there with the manifest's write id: a run killed at any moment
(``kill -9`` included) leaves either a finished part or none, never half a part, and a rerun
recomputes exactly the unfinished ones (each part has one fixed file name, so nothing is ever
written twice). The index ``manifest.json`` is derived from the part manifests and can always be
rebuilt (:meth:`Store.write_index`).

Several writers may share a store (two sweeps, ``--shard`` jobs): a process computes a part only
while it holds the part's lock (:meth:`Store.claim`; an OS file lock, released when the process
dies, so a killed writer never leaves a stale one), and only the lock holder writes or cleans the
part's folder. store.json and manifest.json are written under the store lock (:meth:`Store.lock`).

Part files hold: token_id (Int64, <NA> for text candidates), token, text, n_tokens, score (float32),
rank (1 = best within the part), token_ids (the response ids scored). Each part manifest carries
``model.name`` and ``prompt``, so ``rmfast analyze`` can read ``STORE/parts`` like scan files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..version import __version__
from ..errors import UserError
from ..io import WRITE_ID, manifest_path, parquet_write_id, write_json, write_pair
from ..parquet_read import read_parquet
from ..locks import check_lock, drop_temps
from ..states import canonical_layer
from .config_compare import LOCAL, diff_keys, share, unplaced  # noqa: F401  (LOCAL: named here before)

SCHEMA_VERSION = 1
PART_FILE = "part.parquet"
TIDY_COLUMNS = ["model", "prompt", "token_id", "text", "score", "rank"]
EXTRA_COLUMNS = ["candidates", "prompt_name", "n_tokens", "token"]


@dataclass(frozen=True)
class PartRef:
    """One unit of work: a model × prompt × candidate set, and the key of its settings."""

    model: str  # display name
    model_slug: str
    prompt_name: str
    prompt_slug: str
    prompt: str
    candidates: str
    candidates_slug: str
    key: str  # sha256 of everything that determines the part's rows

    @property
    def relpath(self) -> str:
        return f"parts/model={self.model_slug}/prompt={self.prompt_slug}/candidates={self.candidates_slug}"



def _read_json(p: Path):
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class Store:
    """A results directory (see the module docstring).

    Example:
        >>> import tempfile
        >>> import pandas as pd
        >>> st = Store(Path(tempfile.mkdtemp()) / "paper_b")
        >>> part = PartRef("rm", "rm", "best", "best", "Best?", "words", "words", key="k1")
        >>> st.create("cfg1", {"models": ["rm"]}, [part])
        >>> st.is_done(part)
        False
        >>> _ = st.write_part(part, pd.DataFrame({"token_id": pd.array([5, 7], "Int64"), "token": ["Ġa", "Ġb"],
        ...                   "text": [" a", " b"], "n_tokens": 1, "score": [0.5, -0.5], "rank": [1, 2]}),
        ...                   {"model": {"name": "rm"}, "prompt": "Best?"})
        >>> st.is_done(part), st.check("cfg1", {"models": ["rm"]})
        (True, 'same')
        >>> st.load()[["model", "prompt", "token_id", "text", "score", "rank", "candidates"]]
          model prompt  token_id text  score  rank candidates
        0    rm  Best?         5    a    0.5     1      words
        1    rm  Best?         7    b   -0.5     2      words
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._content: dict = {}  # model name -> what names its files' content now (looked up once per Store)

    # ------------------------------------------------------------------ identity
    @property
    def info_path(self) -> Path:
        return self.root / "store.json"

    @property
    def index_path(self) -> Path:
        return self.root / "manifest.json"

    def info(self) -> dict | None:
        info = _read_json(self.info_path)
        return info if isinstance(info, dict) else None  # valid JSON of another shape is not a store.json

    def check(self, config_hash: str, config: dict, *, force: bool = False, source: str | None = None,
              keep: set[str] | None = None) -> str:
        """Whether this directory can hold results of ``config``: "new", "same", "moved" (the config differs
        only in where its files are or in the order of its models or candidate sets: :func:`unplaced`;
        :meth:`rekey` keeps the parts) or "adopt" (with force).

        Raises UserError for a file, a foreign non-empty folder, or (without force) another config (naming the
        parts ``--force`` deletes: those not in ``keep``, the new config's part folders)."""
        r = self.root
        if r.exists() and not r.is_dir():
            raise UserError(f"results path {r} is a file; give a directory for the results store")
        if not r.exists() or not [x for x in r.iterdir() if not ((x.name.startswith(".store.json.") and x.name.endswith(".tmp"))
                                                                 or x.name == ".store.lock")]:
            return "new"  # empty, or only the temp file (and lock) of a creation that was killed
        info = self.info()
        if info is None:
            raise UserError(f"{r} exists and is not an rmfast results store (no readable store.json); "
                            "choose another output directory")
        if info.get("schema") != SCHEMA_VERSION:
            raise UserError(f"{r} was written by store schema {info.get('schema')} (this rmfast writes {SCHEMA_VERSION}); "
                            "use another output directory")
        if info.get("config_hash") == config_hash:
            return "same"
        if unplaced(info.get("config") or {}) == unplaced(config):
            return "moved"
        if force:
            return "adopt"
        diff = diff_keys(info.get("config") or {}, config)
        what = "; ".join(diff[:4]) + (" …" if len(diff) > 4 else "") if diff else "its settings differ"
        gone = [r.split("/", 1)[1] for r in self.stale_parts(keep)] if keep is not None else []
        raise UserError(f"{r} holds results of a different config ({what}); "
                        "use another output directory, or --force to adopt this config (unchanged parts are kept"
                        + (f", and the {len(gone)} part(s) it lacks are deleted: {', '.join(gone[:2])}"
                           f"{' …' * (len(gone) > 2)}; copy them elsewhere first to keep them" if gone else "") + ")")

    def create(self, config_hash: str, config: dict, plan: list[PartRef], source: str | None = None) -> None:
        """Write store.json (atomically) for ``config`` and its parts."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise UserError(f"cannot write to {self.root}: permission denied; choose a writable output directory")
        write_json(self.info_path, {
            "schema": SCHEMA_VERSION,
            "rmfast_version": __version__,
            "config_hash": config_hash,
            "config_file": source,
            "config": config,
            "parts": [asdict(p) for p in plan],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })

    def carried_keys(self, plan: list[PartRef], config: dict) -> dict[str, str]:
        """relpath -> the key its finished part holds, for each part of ``plan`` (of ``config``) whose settings
        differ from those store.json recorded for the same folder only in where the files are (:func:`unplaced`):
        a store moved with its inputs, or --force adopting a config whose other parts changed. A part whose model
        is now read from another place is carried only where its manifest names the model's content, which
        :meth:`stale` then checks against the files found there (a part that names none is scored again)."""
        info = self.info() or {}
        try:
            old = {q.relpath: q for q in self.plan()}
        except UserError:
            return {}
        out = {}
        for p in plan:
            q = old.get(p.relpath)
            was, now = (None, None) if q is None else (share(info.get("config") or {}, q), share(config, p))
            if q is None or q.key == p.key or was is None or unplaced(was) != unplaced(now):
                continue
            m = self.done_manifest(q) or {}
            named = {"content_sha256", "sha256"} & set(m.get("model") or {})
            if m and (was["model"].get("model") == now["model"].get("model") or named):
                out[p.relpath] = q.key
        return out

    def rekey(self, plan: list[PartRef], config: dict) -> int:
        """Give each part :meth:`carried_keys` finds the key it has in ``plan`` (its manifest rewritten, atomically;
        its Parquet untouched); how many. Hold :meth:`lock`, before :meth:`create` records ``config``: a run
        killed between the two finds the same parts again and carries the rest."""
        keys = self.carried_keys(plan, config)
        for p in plan:
            if p.relpath in keys:
                m = self.done_manifest(PartRef(**{**asdict(p), "key": keys[p.relpath]}))
                write_json(manifest_path(self.part_path(p)), {**m, "key": p.key})
        return len(keys)

    # ------------------------------------------------------------------ parts
    def part_path(self, part: PartRef) -> Path:
        return self.root / part.relpath / PART_FILE

    def checkpoint_path(self, part: PartRef) -> Path:
        return self.root / part.relpath / "part.partial.npz"

    def states_path(self, part: PartRef) -> Path:
        return self.root / part.relpath / "part.states"

    def has_outputs(self, part: PartRef, want: dict) -> bool:
        """Whether a finished part holds what ``want`` asks beside its scores (:meth:`rmfast.sweep.ModelCfg.outputs`):
        states of those layers and dtype, in a complete folder of its rows; lens columns."""
        m = self.done_manifest(part)
        if m is None:
            return False
        got = m.get("outputs") or {}
        if want.get("lens") and not got.get("lens"):
            return False
        if want.get("states"):
            had = ",".join(canonical_layer(x, note=False) for x in str(got.get("states")).split(","))  # an old 'last'
            if (had, got.get("states_dtype")) != (want["states"], want.get("states_dtype")):
                return False
            sm = _read_json(self.states_path(part) / "manifest.json")
            return isinstance(sm, dict) and sm.get("n") == m.get("rows")
        return True

    def part_manifest(self, part: PartRef) -> dict | None:
        return _read_json(manifest_path(self.part_path(part)))

    def done_manifest(self, part: PartRef) -> dict | None:
        """The manifest of a finished part (its key, its Parquet with the same write id), else None."""
        m = self.part_manifest(part)
        if not m or m.get("key") != part.key or not self.part_path(part).is_file():
            return None
        try:
            return m if m.get(WRITE_ID) == parquet_write_id(self.part_path(part)) else None
        except Exception:  # an unreadable Parquet is not a finished part
            return None

    def is_done(self, part: PartRef) -> bool:
        return self.done_manifest(part) is not None

    def stale(self, part: PartRef) -> bool:
        """Whether a finished part was scored from other files than its model has now (weights, tokenizer, chat
        template: :mod:`rmfast.sweep.content`). Readers count it as not done until the sweep scores it again (at its
        next run; a refused re-score, e.g. a new tokenizer failing the template check, leaves it stale)."""
        from .content import same_content

        m = self.done_manifest(part)
        return m is not None and not same_content(m, self._model_content(part.model))

    def fresh_manifest(self, part: PartRef) -> dict | None:
        """The manifest of a finished part scored from its model's files as they are now, else None: what every
        reader of the store (status, index, export, load) counts as done."""
        m = self.done_manifest(part)
        return None if m is None or self.stale(part) else m

    def _model_content(self, name: str) -> dict | None:
        """What names the content of the config's model ``name`` now (its spec from store.json), once per Store."""
        from .content import model_content

        if name not in self._content:
            models = ((self.info() or {}).get("config") or {}).get("models") or []
            entry = next((m for m in models if isinstance(m, dict) and m.get("name") == name), {})
            spec = entry.get("model")
            try:  # an adapter's base as the runner read it: the one the config gives, else its own (content.py)
                self._content[name] = model_content(spec, base=entry.get("base")) if spec else None
            except (OSError, UserError):  # a model that cannot be read now: staleness unknown, as for an alias
                self._content[name] = None
        return self._content[name]

    def write_part(self, part: PartRef, df, manifest: dict) -> Path:
        """The part's Parquet and the manifest that marks it finished, as a pair (:func:`rmfast.io.write_pair`)."""
        p = self.part_path(part)
        write_pair(p, df, {**manifest, "key": part.key, "rows": int(len(df)), "schema": SCHEMA_VERSION})
        return p

    # ------------------------------------------------------------------ one dtype per model
    def parts_dtypes(self, plan: list[PartRef], model: str) -> dict[str, int]:
        """How many of ``model``'s finished parts (of ``plan``) were scored in each dtype (their manifests')."""
        seen: dict[str, int] = {}
        for p in plan:
            m = self.done_manifest(p) if p.model == model else None
            d = ((m or {}).get("scan") or {}).get("dtype")
            if d:
                seen[d] = seen.get(d, 0) + 1
        return seen

    def pin_dtype(self, key: str, dtype: str | None = None) -> str | None:
        """The dtype ``dtype: auto`` stands for in this store for the model whose settings hash to ``key``: the one
        pinned before, else ``dtype`` pinned now (None: only read). "auto" resolves per machine (bf16 on CUDA; on a
        CPU fp32 unless a measurement finds bf16 faster there), so a sweep resumed, or sharded, on other machines
        would otherwise score one model's parts in two dtypes. Call under :meth:`lock` when pinning."""
        path = self.root / "dtypes.json"
        pins = _read_json(path)
        pins = pins if isinstance(pins, dict) else {}
        if key in pins or dtype is None:
            return pins.get(key)
        write_json(path, {**pins, key: dtype})
        return dtype

    # ------------------------------------------------------------------ writers
    @contextlib.contextmanager
    def claim(self, part: PartRef, *, wait: bool = False):
        """Hold the part's lock while computing it: yields True when this process holds it, False when
        another writer does (with ``wait``, blocks until that one finishes or dies).

        The lock file stays (removing it would let a third writer lock a fresh file while a second
        waits on the old one).
        """
        from filelock import FileLock, Timeout

        d = self.root / part.relpath
        check_lock(d / ".part.lock", "remove it (no rmfast job holds it) or choose another store")
        d.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(d / ".part.lock"))
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    @contextlib.contextmanager
    def lock(self):
        """Hold the store lock (blocking) while writing store.json or manifest.json, or cleaning their temps."""
        from filelock import FileLock

        check_lock(self.root / ".store.lock", "remove it (no rmfast job holds it) or choose another store")
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / ".store.lock")):
            yield

    def clean_temp(self, part: PartRef) -> int:
        """Remove temp files a killed writer left in the part's folder. Call only while holding the
        part's :meth:`claim`: its holder is the only process that writes there."""
        n = 0
        for t in (self.root / part.relpath).glob(".part.*.tmp"):
            t.unlink(missing_ok=True)
            n += 1
        return n

    def clean_root_temp(self) -> None:
        """Remove temp files of store.json / manifest.json left by a killed writer (hold :meth:`lock`)."""
        drop_temps(self.info_path)
        drop_temps(self.index_path)

    def stale_parts(self, keep: set[str]) -> list[str]:
        """The part folders whose relpath is not in ``keep``: what --force removes when it adopts a new config (and
        what its --dry-run lists)."""
        parts = self.root / "parts"
        if not parts.is_dir():
            return []
        rels = (m.relative_to(self.root).as_posix() for m in sorted(parts.glob("model=*/prompt=*/candidates=*")))
        return [rel for rel in rels if rel not in keep]

    def remove_stale(self, keep: set[str]) -> list[str]:
        """Delete the :meth:`stale_parts` (after --force adopted a new config); their relpaths. A part another sweep
        is computing (its lock held) is left to it: that sweep stops before writing it (:meth:`check_still_ours`),
        and a later --force removes the folder."""
        from filelock import FileLock, Timeout

        removed = []
        for rel in self.stale_parts(keep):
            lock = FileLock(str(self.root / rel / ".part.lock"))
            try:
                with lock.acquire(timeout=0):
                    shutil.rmtree(self.root / rel, ignore_errors=True)
                removed.append(rel)
            except Timeout:
                continue
        parts = self.root / "parts"
        for d in sorted(parts.glob("**/"), key=lambda x: -len(x.parts)):  # prune empty folders
            if d != parts and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        return removed

    # ------------------------------------------------------------------ index
    def status(self, plan: list[PartRef]) -> list[dict]:
        out = []
        for part in plan:
            m = self.fresh_manifest(part) or {}
            done = bool(m)
            out.append({"model": part.model, "prompt_name": part.prompt_name, "prompt": part.prompt,
                        "candidates": part.candidates, "path": part.relpath + "/" + PART_FILE, "done": done,
                        "rows": m.get("rows") if done else None, "rank": m.get("rank") if done else None,
                        "wall_s": m.get("wall_s") if done else None,
                        "states": ((m.get("scan") or {}).get("states") or {}).get("layers") if done else None,
                        "lens": bool((m.get("outputs") or {}).get("lens")) if done else None,
                        "stale": not done and self.stale(part)})
        return out

    def check_still_ours(self, config_hash: str) -> None:
        """One line where another config adopted the store (``rmfast sweep --force``) while this sweep ran: its
        parts and index would be written into a store that no longer holds its config."""
        info = self.info() or {}
        if info.get("config_hash") != config_hash:
            raise UserError(f"{self.root} was adopted by another config ({info.get('config_file') or 'rmfast sweep --force'}) "
                            "while this sweep ran; its parts are no longer written there: rerun it with another --out")

    def write_index(self, plan: list[PartRef], config_hash: str) -> dict:
        self.check_still_ours(config_hash)
        st = self.status(plan)
        idx = {
            "schema": SCHEMA_VERSION,
            "config_hash": config_hash,
            "complete": all(s["done"] for s in st),
            "n_parts": len(st),
            "n_done": sum(s["done"] for s in st),
            "rows": int(sum(s["rows"] or 0 for s in st)),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "parts": st,
        }
        write_json(self.index_path, idx)
        return idx

    def plan(self) -> list[PartRef]:
        """The parts of the config recorded in store.json (what the store is meant to hold)."""
        info = self.info()
        if info is None:
            raise UserError(f"{self.root} is not an rmfast results store (no readable store.json)")
        try:
            return [PartRef(**p) for p in info.get("parts", [])]
        except TypeError:  # a hand-edited or foreign store.json: fields missing or unknown
            raise UserError(f"{self.info_path} is malformed (its parts do not match this rmfast version); "
                            "rerun the sweep into a new --out") from None

    def missing(self, plan: list[PartRef] | None = None) -> list[tuple[PartRef, str]]:
        """The parts of the config that the store does not hold, each with why, in words: a part never
        computed (or still in progress), or one whose manifest is there without its Parquet (deleted,
        or replaced by another file) — exporting "what is there" would silently leave either out."""
        out = []
        for part in self.plan() if plan is None else plan:
            if self.fresh_manifest(part) is not None:
                continue
            if self.stale(part):
                why = "stale: its model's files changed since it was scored"
            elif self.part_manifest(part) is None:
                why = "not computed"
            elif not self.part_path(part).is_file():
                why = f"{PART_FILE} missing"
            else:
                why = f"{PART_FILE} does not match its manifest"
            out.append((part, why))
        return out

    def missing_text(self, missing: list[tuple[PartRef, str]], n_parts: int, shown: int = 3) -> str:
        """One line naming the missing parts (the first ``shown`` of them, then how many more)."""
        names = [f"{part.relpath} ({why})" for part, why in missing[:shown]]
        more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
        return f"{len(missing)} of {n_parts} parts of {self.root} are missing: {', '.join(names)}{more}"

    def score_meanings(self) -> dict[str, str]:
        """What ``score`` is for each model of the finished parts (model -> its part manifests' ``score_meaning``;
        a store written before the field was lifted has it in each part's ``scan``)."""
        out = {}
        for part in self.plan():
            m = self.done_manifest(part) or {}
            meaning = m.get("score_meaning") or (m.get("scan") or {}).get("score_meaning")
            if meaning:
                out.setdefault(part.model, meaning)
        return out

    def export_provenance(self) -> dict:
        """The schema metadata of an export of this store (:func:`rmfast.io.read_provenance`): what ``score`` is
        (one text where every model's agrees, else model -> text), the store and rmfast's version."""
        meanings = self.score_meanings()
        same = len(set(meanings.values())) == 1
        return {"score_meaning": next(iter(meanings.values())) if same else meanings,
                "store": str(self.root), "rmfast_version": __version__}

    # ------------------------------------------------------------------ loading
    def load(self, *, token_ids: bool = False, complete: bool = False):
        """One tidy DataFrame of every finished part.

        Columns: model, prompt, token_id (Int64; <NA> for text candidates), text, score, rank
        (within model × prompt × candidates), then candidates, prompt_name, n_tokens, token
        (and token_ids if asked). Parts are in config order; rows in each part's order.

        Args:
            token_ids: also return the response ids scored (a list column).
            complete: raise UserError (before reading any part) if any part of the config is missing
                (:meth:`missing`); else the missing parts are left out, said in one warning.
        """
        import warnings

        import pandas as pd

        plan = self.plan()
        if complete and (missing := self.missing(plan)):  # before reading any part
            raise UserError(f"{self.missing_text(missing, len(plan))}; rerun the sweep to finish them")
        frames, left_out, dtypes = [], False, {}
        for part in plan:
            m = self.fresh_manifest(part)
            if m is None:  # not finished, or stale (scored from files its model no longer has)
                left_out = True
                continue
            d = (m.get("scan") or {}).get("dtype")
            dtypes.setdefault(part.model, {}).setdefault(d, 0)
            dtypes[part.model][d] += 1
            try:
                df = read_parquet(self.part_path(part))
            except UserError:
                raise
            except Exception as e:
                raise UserError(f"cannot read {self.part_path(part)} ({type(e).__name__}); delete it and rerun the sweep") from None
            if len(df) != m.get("rows"):
                raise UserError(f"{self.part_path(part)} holds {len(df)} rows but its manifest says {m.get('rows')}; "
                                "delete the part folder and rerun the sweep")
            df.insert(0, "model", part.model)
            df.insert(1, "prompt", part.prompt)
            df["candidates"] = part.candidates
            df["prompt_name"] = part.prompt_name
            frames.append(df)
        if left_out:  # a running sweep's results so far, or a damaged store: never a silent subset
            warnings.warn(f"rmfast: note: {self.missing_text(self.missing(plan), len(plan))}: left out of these results "
                          "(rerun the sweep to finish them; from Python, load_results(..., complete=True) refuses an unfinished "
                          "store)", stacklevel=3)
        for model, seen in dtypes.items():  # a store an rmfast before dtypes.json wrote on two kinds of machine
            if len(seen) > 1:
                each = ", ".join(f"{n} in {d}" for d, n in sorted(seen.items(), key=str))
                warnings.warn(f"rmfast: note: {model}'s parts were scored in different dtypes ({each}): their scores "
                              "differ by more than rounding; set its dtype in the config and rerun the sweep",
                              stacklevel=3)
        cols = TIDY_COLUMNS + EXTRA_COLUMNS + (["token_ids"] if token_ids else [])
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
        df = pd.concat(frames, ignore_index=True)
        df["token_id"] = df["token_id"].astype("Int64")
        df["score"] = df["score"].astype(np.float32)
        df["rank"] = df["rank"].astype("Int64" if df["rank"].isna().any() else np.int64)  # <NA>: a NaN score
        df["n_tokens"] = df["n_tokens"].astype(np.int64)
        df["token"] = df["token"].astype("str")  # missing (text candidates) stays missing
        key = ["model", "prompt", "candidates"]
        has_id = df["token_id"].notna()
        dup = (df[has_id].duplicated(key + ["token_id"]).sum()
               + df[~has_id].duplicated(key + ["text"]).sum())
        if dup:
            raise UserError(f"{int(dup)} duplicated rows in {self.root}; the store is corrupt")
        return df[cols]


def store_root(path: str | os.PathLike) -> Path | None:
    """The results store ``path`` names (its folder, or its ``parts/`` folder), else None."""
    p = Path(path)
    for root in (p, p.parent if p.name == "parts" else None):
        if root is not None and p.is_dir() and (root / "store.json").is_file():
            return root
    return None


def read_scans(paths, ledger=None):
    """The tidy scan frame of scan Parquet files or folders of them (:func:`rmfast.analysis.data.scans.load_scans`),
    or of ONE sweep store, given as its folder or its ``parts/`` folder: the store's own config's finished parts
    scored from its models' files as they are (:meth:`Store.load`), never a part another config (a ``--force``) or
    other model files left there. Its attrs name the scores' source and what ``score`` is."""
    from ..analysis.data.scans import MEANING_ATTR, SOURCE_ATTR, load_scans, validate_scans

    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not paths:
        raise UserError("no inputs: give scan Parquet files, folders of them, or a sweep store folder")
    stores = [r for r in map(store_root, paths) if r is not None]
    if stores and len(paths) > 1:
        raise UserError(f"{stores[0]} is a sweep store; give it alone (one store, or scan files)")
    if not stores:
        return load_scans(paths, ledger=ledger)
    st = Store(stores[0])
    df = st.load()
    if df.empty:
        raise UserError(f"the store {stores[0]} has no finished parts yet; run the sweep first")
    out = validate_scans(df, ledger=ledger)
    out.attrs[SOURCE_ATTR] = f"sweep store {stores[0]}"
    out.attrs[MEANING_ATTR] = st.score_meanings()
    return out


def load_results(path: str | os.PathLike, **kw):  # the tidy DataFrame of a results store (Store.load)
    st = Store(path)
    if not st.info_path.is_file():
        raise UserError(f"{path} is not an rmfast results store (no store.json); give the sweep's output directory")
    return st.load(**kw)
