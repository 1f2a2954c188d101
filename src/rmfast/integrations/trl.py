"""X-ray a reward model while it trains: a ``TrainerCallback`` for TRL's ``RewardTrainer``.

At every checkpoint save (and/or every N steps) the callback scores the chosen candidates (the
vocabulary, a view of it, or a dictionary's words) as the one-turn answer to each prompt with
rmfast's shared-prompt engine (:func:`rmfast.scoring.pipeline.run_scan`, the same path as ``rmfast scan``),
then

- writes each scan as ``OUT/checkpoint-N/<prompt>.parquet`` (+ manifest, model name
  ``<name>/checkpoint-N``) and ``OUT/checkpoint-N/summary.json``: a folder that
  ``rmfast analyze trajectory OUT --dictionary D`` reads as the run's trajectory;
- logs scalars (per prompt: each dictionary category's median rank, the gaps between categories,
  the top and bottom scores; the x-ray's wall time) to ``state.log_history`` and, when the trainer
  is attached, to the trainer's loggers (TensorBoard, W&B, ... through its ``on_log``); the
  top/bottom tokens go to ``summary.json``, :attr:`XrayCallback.history` and the ``rmfast.xray``
  Python logger.

Training is not disturbed: the scan runs in eval mode under ``torch.no_grad``, each module's
train/eval flag and the RNG states (torch CPU and CUDA, Python ``random``, NumPy) are restored
afterwards, and the weights are only read. A PEFT (LoRA) model is scanned through a merged copy
(``merge_and_unload`` on a deep copy; merging in place and back would not restore the weights
bit for bit).

Example (needs ``pip install 'rmfast[train]'`` and a model; see ``examples/train_reward_model.py``)::

    >>> from rmfast.integrations.trl import XrayCallback, XrayConfig  # doctest: +SKIP
    >>> cb = XrayCallback(XrayConfig(prompts={"greatest": "What, in one word, is the greatest thing ever?"},
    ...                              out="runs/rm/xray", dictionary="big2_nouns.csv"))  # doctest: +SKIP
    >>> trainer = RewardTrainer(model=..., args=RewardConfig(output_dir="runs/rm", save_steps=20), callbacks=[cb], ...)  # doctest: +SKIP
    >>> cb.trainer = trainer  # optional: also log through the trainer's loggers  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import TrainerCallback

from ..analysis.paper_b.trajectory import trajectory
from ..errors import UserError
from ..io import slug, write_json
from ..scoring.pipeline import Selection, StatesRequest, run_scan
from ..states import DTYPES, parse_layers

log = logging.getLogger("rmfast.xray")


@dataclass
class XrayConfig:
    """What the callback scans, when, and where it writes.

    Attributes:
        prompts: name -> user prompt (a list of prompts is named by slug).
        selection: the candidates (default: the whole vocabulary); e.g.
            ``Selection(texts=words)`` for a dictionary's words, ``Selection(token_ids="0:5000")``.
        out: results folder (default None: nothing written, only logged).
        name: the run's name; scans are named ``<name>/checkpoint-N`` (default "run").
        dictionary: path or (term, category) frame for category medians and gaps (default None).
        k: top/bottom tokens kept in the summary (default 10).
        on_save: x-ray at every checkpoint save (default True).
        every_n_steps: also x-ray every N optimizer steps (default None: only at saves).
        batch_size, compile, template, system: as for ``rmfast scan`` (defaults "auto", "auto", None, None;
            the plan's "trl" job takes compile auto as eager: a one-off compile per x-ray is not repaid,
            :data:`rmfast.scoring.decisions.AUTO_EAGER_JOBS`). The scoring options reach the plan as one value
            (:meth:`scoring`).
        states: hidden states to keep from each x-ray's own forward, e.g. "last_normed" or "0,8,last_prenorm" or "all"
            (``rmfast scan --states``; needs ``out``): ``OUT/checkpoint-N/<prompt>.states/`` beside each
            scan (default None: none).
        states_dtype: their stored dtype, "float32", "bfloat16" or "float16" (default None: the model's).
        lens: add the reward lens columns ``lens_<layer>`` to each scan (default False).
    """

    prompts: dict[str, str] | list[str]
    selection: Selection = field(default_factory=Selection)
    out: str | Path | None = None
    name: str = "run"
    dictionary: object = None
    k: int = 10
    on_save: bool = True
    every_n_steps: int | None = None
    batch_size: int | str = "auto"
    compile: str = "auto"
    template: str | None = None
    system: str | None = None
    states: str | list | None = None
    states_dtype: str | None = None
    lens: bool = False

    def scoring(self):
        """The x-ray's scoring options as one value: a reward model's score head, this config's batch size and
        compile (:class:`rmfast.scoring.options.ScoringOptions`)."""
        from ..scoring.options import ScoringOptions

        return ScoringOptions(head="score", batch_size=self.batch_size, compile=self.compile)

    def __post_init__(self):
        """Every option checked here, before any training step (the model's own checks: :meth:`XrayCallback.check`,
        at the train's start): a bad one found at the first save would cost the steps before it."""
        from ..analysis.data.lexicons import as_dictionary
        from ..scoring.options import whole_number

        if isinstance(self.prompts, (str, bytes)):
            raise UserError("XrayConfig: prompts is one str; give a list of prompts or a dict name -> prompt")
        if isinstance(self.prompts, (list, tuple)):
            self.prompts = {slug(p): p for p in self.prompts}
        if not isinstance(self.prompts, dict) or not self.prompts:
            raise UserError("XrayConfig: give at least one prompt (a list of prompts or a dict name -> prompt)")
        bad = [n for n, p in self.prompts.items() if not isinstance(p, str) or not p.strip()]
        if bad:
            raise UserError(f"XrayConfig: prompt {bad[0]!r} is not a non-empty str")
        self.k = whole_number(self.k, "XrayConfig: k", 1)
        if self.every_n_steps is not None:
            self.every_n_steps = whole_number(self.every_n_steps, "XrayConfig: every_n_steps", 1)
        self.scoring()  # batch_size and compile: checked as the scan checks them
        if not isinstance(self.selection, Selection):
            raise UserError(f"XrayConfig: selection must be a rmfast Selection, got {type(self.selection).__name__}")
        self.selection.check()
        if self.dictionary is not None:
            self.dictionary = as_dictionary(self.dictionary)  # read now: a missing file is said before training
        if self.states_dtype is not None and (self.states is None or self.states_dtype not in DTYPES):
            raise UserError(f"XrayConfig: states_dtype {self.states_dtype!r} needs states and one of {', '.join(DTYPES)}")
        if self.states is not None:
            self.states = ",".join(parse_layers(self.states, None))  # names now; the range at the first x-ray's model
            if self.out is None:
                raise UserError("XrayConfig: states are written beside each scan; give out")

    def states_request(self, folder: Path, prompt_name: str) -> StatesRequest | None:
        """Where one x-ray's scan of ``prompt_name`` keeps its states (None: no states asked)."""
        if self.states is None:
            return None
        return StatesRequest(self.states, self.states_dtype, overwrite=True,  # an x-ray of the step again replaces it
                             folder=folder / f"{slug(prompt_name, 60, exact=True)}.states")


# --------------------------------------------------------------------------------------------
# not disturbing training


def rng_state() -> dict:
    """Every RNG a training step may draw from: torch CPU (and CUDA), Python ``random``, NumPy."""
    st = {"torch": torch.get_rng_state(), "random": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["random"])
    np.random.set_state(st["numpy"])
    if "cuda" in st:
        torch.cuda.set_rng_state_all(st["cuda"])


@contextlib.contextmanager
def undisturbed(model: torch.nn.Module):
    """Eval mode and no grad inside; every module's train flag and every RNG state restored after."""
    modes = [(m, m.training) for m in model.modules()]
    rng = rng_state()
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training  # per module: .train() would also flip modules a trainer left in eval
        set_rng_state(rng)


def plain_model(model: torch.nn.Module) -> torch.nn.Module:
    """What the engine can read: the model itself, or a merged copy of a PEFT model (unwrapped
    from DDP/accelerate's ``module`` first)."""
    model = getattr(model, "module", model)
    if hasattr(model, "peft_config") and hasattr(model, "merge_and_unload"):
        return copy.deepcopy(model).merge_and_unload()
    return model


# --------------------------------------------------------------------------------------------
# the summary


def summarize(frame: pd.DataFrame, dictionary=None, *, k: int = 10) -> dict:
    """Scalars and top/bottom tokens of one x-ray. ``frame``: prompt_name, step, text, score.

    >>> f = pd.DataFrame({"prompt_name": "p", "step": 5, "text": ["kind", "bold", "x"], "score": [3.0, 1.0, 2.0]})
    >>> d = pd.DataFrame({"term": ["kind", "bold"], "category": ["Communion", "Agency"]})
    >>> s = summarize(f, d, k=1)
    >>> s["scalars"]["rmfast/p/gap/Communion_minus_Agency"], s["top"]["p"], s["bottom"]["p"]
    (-1.0, ['kind'], ['bold'])
    """
    df = frame[["prompt_name", "step", "text", "score"]].set_axis(["run", "step", "token", "score"], axis=1)
    out = {"scalars": {}, "top": {}, "bottom": {}}
    ext = trajectory(df, None, k=k).extremes
    for (run, end), g in ext.groupby(["run", "end"]):
        out[end][run] = g.sort_values("position")["token"].tolist()
    for run, g in df.groupby("run"):
        out["scalars"][f"rmfast/{run}/score_max"] = float(g["score"].max())
        out["scalars"][f"rmfast/{run}/score_min"] = float(g["score"].min())
    if dictionary is not None:
        res = trajectory(df, dictionary, k=k)
        for r in res.categories.itertuples():
            out["scalars"][f"rmfast/{r.run}/median_rank/{r.category}"] = float(r.median_rank)
        for r in res.gaps.itertuples():  # positive = A ranked higher; the name says the direction
            out["scalars"][f"rmfast/{r.run}/gap/{r.category_b}_minus_{r.category_a}"] = float(r.median_rank_b_minus_a)
    return out


# --------------------------------------------------------------------------------------------
# the callback


class XrayCallback(TrainerCallback):
    """Scan the model being trained at each save (and/or every N steps); see the module doc.

    ``trainer`` (optional; settable later): the trainer, whose loggers then get the scalars too.
    ``history``: one summary per x-ray (step, label, scalars, top, bottom, xray_s).
    """

    def __init__(self, config: XrayConfig, trainer=None):
        self.config = config
        self.trainer = trainer
        self.history: list[dict] = []
        self._done: set[int] = set()

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
        """What the config cannot check alone fails here, before any training step (:meth:`check`)."""
        self.check(model, processing_class or kw.get("tokenizer"))

    def check(self, model=None, tokenizer=None) -> None:
        """The config against this model and tokenizer: ``states`` layers, each prompt in the template, the
        selection's ids (the first x-ray would find them at the first save, after the steps before it)."""
        cfg = self.config
        if model is not None and cfg.states is not None:
            n = getattr(getattr(getattr(model, "module", model), "config", None), "num_hidden_layers", None)
            parse_layers(cfg.states, n if isinstance(n, int) else None)
        if tokenizer is None:
            return
        from ..template import build_template

        for p in cfg.prompts.values():
            build_template(tokenizer, p, template=cfg.template, system=cfg.system)
        if model is not None and cfg.selection.texts is None:
            from ..scoring.candidates import select_ids

            sel = cfg.selection
            select_ids(getattr(model, "module", model), tokenizer, sel.token_ids, exclude_special=sel.exclude_special,
                       wordlike=sel.wordlike, dedup=sel.dedup)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
        n = self.config.every_n_steps
        # a save at this step comes right after (the flow callback has decided it): scan there
        if n and state.global_step % n == 0 and not (self.config.on_save and control.should_save):
            self.xray(model, processing_class or kw.get("tokenizer"), state.global_step, args, state, control)

    def on_save(self, args, state, control, model=None, processing_class=None, **kw):
        if self.config.on_save:
            self.xray(model, processing_class or kw.get("tokenizer"), state.global_step, args, state, control,
                      saved=True)

    def xray(self, model, tokenizer, step: int, args=None, state=None, control=None, *, saved: bool = False) -> dict:
        """Scan ``model`` now; write, log and return the summary."""
        if step in self._done:
            return next(h for h in self.history if h["step"] == step)
        if model is None or tokenizer is None:
            raise UserError("XrayCallback: the trainer passed no model or tokenizer (processing_class) to the callback")
        cfg = self.config
        label = f"{cfg.name}/{'checkpoint' if saved else 'step'}-{step}"
        t0 = time.perf_counter()
        folder = None if cfg.out is None else Path(cfg.out) / label.rsplit("/", 1)[1]
        with undisturbed(model):
            scan_model = plain_model(model)
            results = {pn: run_scan(scan_model, tokenizer, p, cfg.selection, cfg.scoring(), job="trl",
                                    template=cfg.template, system=cfg.system, progress=False, model_info={"name": label, "step": step},
                                    states=cfg.states_request(folder, pn), lens=cfg.lens)[0]
                       for pn, p in cfg.prompts.items()}
            del scan_model
        frame = pd.concat([r.to_pandas().assign(prompt_name=pn, step=step) for pn, r in results.items()])
        summary = summarize(frame, cfg.dictionary, k=cfg.k)
        xray_s = time.perf_counter() - t0
        summary["scalars"]["rmfast/xray_s"] = round(xray_s, 3)
        entry = {"step": step, "label": label, "xray_s": round(xray_s, 3), **summary}
        if folder is not None:
            self._write(folder, results, entry)
        self._log(entry, args, state, control)
        self._done.add(step)
        self.history.append(entry)
        return entry

    def _write(self, folder: Path, results: dict, entry: dict) -> None:
        for pn, res in results.items():
            res.to_parquet(folder / f"{slug(pn, 60, exact=True)}.parquet", overwrite=True)
        write_json(folder / "summary.json", entry)

    def _log(self, entry: dict, args, state, control) -> None:
        scalars = entry["scalars"]
        if state is not None:
            state.log_history.append({**scalars, "step": entry["step"]})
            if self.trainer is not None and args is not None:
                # the trainer's loggers, without Trainer.log: TRL's log() would flush and clear its own
                # running training metrics into this entry
                self.trainer.callback_handler.on_log(args, state, control, scalars)
        gaps = {k.split("/", 2)[2]: round(v, 1) for k, v in scalars.items() if "/gap/" in k}
        log.info("x-ray %s (%.1f s): top %s; gaps %s", entry["label"], entry["xray_s"],
                 {p: t[:3] for p, t in entry["top"].items()}, gaps)


__all__ = ["XrayCallback", "XrayConfig", "plain_model", "rng_state", "set_rng_state", "summarize", "undisturbed"]
