"""Training runs: a run folder's ``checkpoint-N/`` subfolders, and PEFT (LoRA) adapter checkpoints.

The Hugging Face Trainer (and TRL's trainers on top of it) saves ``OUTPUT_DIR/checkpoint-N/`` every
``save_steps``; N is the global step. A checkpoint is a full model folder (``config.json`` and
weights) or, when the model was wrapped by PEFT, an adapter folder (``adapter_config.json`` and
``adapter_model.safetensors``, no ``config.json``) that holds only the low-rank deltas and the
modules it trained in full (a reward model's ``score`` head) and names its base in
``base_model_name_or_path``.

- :func:`run_checkpoints` lists a run folder's checkpoints by step; :func:`expand_runs` turns a
  sweep's model list with run folders into one model per checkpoint, named ``RUN/checkpoint-N``
  (the name :func:`rmfast.analysis.paper_b.trajectory.step_of` reads the step from).
- :func:`merge_adapter` applies an adapter to its loaded base with peft and merges it
  (``merge_and_unload``), so every scan path sees a plain model; :func:`rmfast.loading.loader.load` does
  this for adapter folders (``base=`` overrides the base the adapter names, e.g. a hub id that
  is not available offline).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError, UserNote

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class Checkpoint:
    """One saved checkpoint of a run: its global step, its folder, and whether it is an adapter."""

    step: int
    path: Path
    adapter: bool


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter folder's ``adapter_config.json`` says: its base, task and PEFT method."""

    base: str | None  # base_model_name_or_path (a hub id or a path), None if absent
    task_type: str | None  # "SEQ_CLS" for reward models, "CAUSAL_LM", ...
    peft_type: str | None  # "LORA", ...


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A PEFT adapter checkpoint: ``adapter_config.json`` without a ``config.json`` beside it.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / ADAPTER_CONFIG).write_text("{}")
    >>> is_adapter_folder(d), is_adapter_folder(d.parent)
    (True, False)
    """
    p = Path(path)
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def _is_model_folder(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / ADAPTER_CONFIG).is_file()


def run_checkpoints(folder: str | os.PathLike) -> list[Checkpoint]:
    """The ``checkpoint-N/`` model folders directly inside ``folder``, by step (empty if none).

    >>> import tempfile; run = Path(tempfile.mkdtemp())
    >>> for n in (20, 5):
    ...     (run / f"checkpoint-{n}").mkdir(); _ = (run / f"checkpoint-{n}" / "config.json").write_text("{}")
    >>> [(c.step, c.path.name, c.adapter) for c in run_checkpoints(run)]
    [(5, 'checkpoint-5', False), (20, 'checkpoint-20', False)]
    """
    p = Path(folder)
    if not p.is_dir():
        return []
    out = []
    for sub in p.iterdir():
        m = CHECKPOINT_RE.match(sub.name)
        if m and sub.is_dir() and _is_model_folder(sub):
            out.append(Checkpoint(step=int(m.group(1)), path=sub, adapter=is_adapter_folder(sub)))
    return sorted(out, key=lambda c: c.step)


def is_run_folder(path: str | os.PathLike) -> bool:
    """A training run's output folder: ``checkpoint-N/`` model folders and no model of its own.

    (A folder that holds a model itself, e.g. the final ``trainer.save_model()``, is that model;
    sweep its checkpoints by listing ``RUN/checkpoint-N`` folders.)
    """
    p = Path(path)
    return p.is_dir() and not _is_model_folder(p) and bool(run_checkpoints(p))


def expand_runs(models: list, slugify) -> list:
    """Replace every sweep model whose spec is a run folder by one model per checkpoint.

    ``models`` are :class:`rmfast.sweep.ModelCfg` (any dataclass with ``name``, ``slug`` and
    ``model``); each checkpoint copies the run's options and is named ``<name>/checkpoint-N``.
    """
    out = []
    for m in models:
        if not is_run_folder(m.model):
            inner = run_checkpoints(m.model) if _is_model_folder(Path(m.model)) else []
            if inner:  # the final model saved beside its checkpoints: documented, said where it happens
                warnings.warn(UserNote(f"rmfast: {m.model} holds a model of its own and {len(inner)} checkpoint(s) "
                                       f"({inner[0].path.name} ... {inner[-1].path.name}): the folder's own model is "
                                       "scored; list its checkpoint-N folders to sweep them"), stacklevel=2)
            out.append(m)
            continue
        odd = sorted((sub.name for sub in Path(m.model).iterdir() if CHECKPOINT_RE.match(sub.name) and sub.is_dir()
                      and not _is_model_folder(sub)), key=lambda n: int(CHECKPOINT_RE.match(n).group(1)))
        if odd:  # left out, its step vanished from the store and the trajectory without a word
            raise UserError(f"training run {m.model}: {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''} holds no "
                            f"config.json or {ADAPTER_CONFIG} (a checkpoint still being saved, or copied without it): "
                            "wait for its save, or move it out of the run folder")
        for c in run_checkpoints(m.model):
            name = f"{m.name}/{c.path.name}"
            out.append(dataclasses.replace(m, name=name, slug=slugify(name), model=str(c.path.resolve())))
    return out


def read_adapter(folder: str | os.PathLike) -> AdapterInfo:
    """Read an adapter folder's ``adapter_config.json``; a missing or broken one is a UserError."""
    f = Path(folder) / ADAPTER_CONFIG
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the adapter config {f}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{f}: expected a JSON object (a PEFT adapter config)")
    return AdapterInfo(base=cfg.get("base_model_name_or_path") or None, task_type=cfg.get("task_type"),
                       peft_type=cfg.get("peft_type"))


def base_error(folder, spec: str, given: bool, why: str) -> UserError:
    """The one line for an adapter checkpoint whose base ``spec`` cannot be loaded: where that base came from
    (``given``: --base, or a sweep config's ``base:``, which wins over --base; else the adapter's own
    adapter_config.json) and what to do.

    >>> print(base_error("ck", "/x/base", True, "no such folder").cli_message())
    adapter checkpoint ck: cannot load the base '/x/base' given for it (a sweep config's base: wins over --base) (no such folder); give a base that loads
    """
    if given:
        return UserError(f"adapter checkpoint {folder}: cannot load the base {spec!r} given for it (a sweep config's "
                         f"base: wins over --base) ({why}); give a base that loads")
    return UserError(f"adapter checkpoint {folder}: cannot load its base {spec!r} (adapter_config.json's "
                     f"base_model_name_or_path) ({why}); pass --base PATH/ALIAS (the model it was trained from)")


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError("loading a PEFT/LoRA adapter checkpoint needs the package 'peft': "
                        "pip install 'rmfast[train]' (or pip install peft)") from None
    return peft


def merge_adapter(model, folder: str | os.PathLike):
    """``model`` (the loaded base) with the adapter in ``folder`` applied and merged: a plain model.

    The base should be float32 (the merge W + B·A·scale is computed in the weights' dtype); cast
    afterwards. Modules the adapter trained in full (``modules_to_save``: a reward model's score
    head) replace the base's. The base object is consumed (its modules are modified in place).
    """
    peft = _peft()
    try:
        with warnings.catch_warnings():
            # peft asks the model a property transformers has deprecated (a FutureWarning per checkpoint of a
            # sweep, about code neither the user nor rmfast wrote)
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            wrapped = peft.PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot apply the adapter {folder} to its base ({msg}): is --base the model it was "
                        "trained from?") from None
    return wrapped.merge_and_unload()


def adapter_weights_error(folder: str | os.PathLike) -> UserError | None:
    """Why an adapter checkpoint's weights cannot be read (none saved yet; pickled ones), else None: both had been
    reported as "no score head (modules_to_save)", after the models before them were scored."""
    f = Path(folder)
    if (f / "adapter_model.safetensors").is_file():
        return None
    if (f / "adapter_model.bin").is_file():
        return UserError(f"adapter checkpoint {f} holds pickled weights (adapter_model.bin), which rmfast does not read "
                         "(loading a pickle runs its code): save the adapter as safetensors (peft's save_pretrained "
                         "default)")
    return UserError(f"adapter checkpoint {f} has no adapter weights (adapter_model.safetensors): a checkpoint still "
                     "being saved (or saved without them) has nothing to score yet; wait for its save, or leave it out")


def adapter_saves_head(folder: str | os.PathLike) -> bool:
    """Whether the adapter's weights include a full ``score``/``classifier`` head (modules_to_save)."""
    from safetensors import safe_open

    f = Path(folder) / "adapter_model.safetensors"
    if not f.is_file():
        return False
    with safe_open(str(f), framework="pt") as fh:
        return any(re.search(r"(^|\.)(score|classifier)\.", k) for k in fh.keys())


__all__ = ["AdapterInfo", "Checkpoint", "adapter_saves_head", "adapter_weights_error", "expand_runs", "is_adapter_folder", "is_run_folder",
           "merge_adapter", "read_adapter", "run_checkpoints"]
