"""The model a :class:`rmfast.scoring.scorer.RewardScorer` scores: loaded from a name, or taken as it was given and
checked (never silently re-typed, moved or given a head), and in eval mode only while a call runs."""

from __future__ import annotations

import contextlib
import inspect

import torch

from ..errors import UserError


def model_and_tokenizer(model, tokenizer, kw: dict):
    """(model, tokenizer, source, default template) from a spec, a LoadedModel or a (model, tokenizer) pair."""
    from ..loading.loader import LoadedModel, load

    if isinstance(model, (tuple, list)) and len(model) == 2 and tokenizer is None:
        model, tokenizer = model
    loads = isinstance(model, str) or hasattr(model, "__fspath__")
    if tokenizer is not None and (loads or isinstance(model, LoadedModel)):  # it would be dropped without a word
        what = "loads its own tokenizer with the model" if loads else "is a LoadedModel: it carries its tokenizer"
        raise UserError(f"RewardScorer: a tokenizer was given, but {model if loads else 'the model'} {what}; drop "
                        "the tokenizer (template= changes the chat template), or pass a (model, tokenizer) pair of "
                        "objects")
    if loads:
        unknown = sorted(set(kw) - set(inspect.signature(load).parameters))
        if unknown:  # a typo: named against RewardScorer's options, not load()'s
            raise TypeError(f"RewardScorer got an unexpected keyword argument {unknown[0]!r} (besides its own options "
                            f"it takes rmfast.load's: {', '.join(sorted(set(inspect.signature(load).parameters) - {'spec'}))})")
        lm = load(str(model), **kw)
        return lm.model, lm.tokenizer, lm.source, lm.default_template
    check_loaded(model.model if isinstance(model, LoadedModel) else model, kw)
    if isinstance(model, LoadedModel):
        return model.model, model.tokenizer, model.source, model.default_template
    if not isinstance(model, torch.nn.Module) or tokenizer is None:
        raise UserError("RewardScorer: pass a model alias, folder or hub id, a LoadedModel, or a (model, tokenizer) pair")
    name = getattr(getattr(model, "config", None), "name_or_path", None) or type(model).__name__
    return model, tokenizer, {"name": name}, None


def check_loaded(model, kw: dict) -> None:
    """A model already loaded is scored as it is: a dtype or device that it is not, or a loading option
    (random_head_seed, trust_remote_code, a typo), is refused rather than silently ignored."""
    from ..loading.loader import dtype_name, resolve_device

    if not isinstance(model, torch.nn.Module):
        return
    extra = sorted(k for k in kw if k not in ("dtype", "device"))
    if extra:
        raise UserError(f"RewardScorer: {', '.join(extra)} apply when RewardScorer loads the model (give its name or "
                        f"folder); this model is already loaded: pass them to rmfast.load(...) instead")
    check_runnable(model)
    p = next(model.parameters())
    want = dtype_name(kw.get("dtype", "auto"))
    if want != "auto" and want != str(p.dtype).removeprefix("torch."):
        raise UserError(f"RewardScorer: dtype={want} asked, but the model given is {str(p.dtype).removeprefix('torch.')}; "
                        "cast it first (model.to(dtype)) or leave dtype='auto'")
    dev = kw.get("device", "auto")
    if str(dev) != "auto" and resolve_device(dev).type != p.device.type:
        raise UserError(f"RewardScorer: device={dev} asked, but the model given is on {p.device}; move it first "
                        "(model.to(device)) or leave device='auto'")


#: the devices rmfast scores on (a model spread by a device_map over GPUs is on cuda too)
RUNNABLE = ("cpu", "cuda")


def check_runnable(model) -> None:
    """A model whose weights are all on a device rmfast scores on, else one line: a model on ``meta`` (its weights
    never loaded: ``from_config`` under ``init_empty_weights``, ``.to("meta")``) failed only at the first score with
    ``NotImplementedError: Cannot copy out of meta tensor``."""
    where = {t.device.type for t in (*model.parameters(), *model.buffers())}
    if not where:
        raise UserError("RewardScorer: the model given has no weights; pass a loaded model (rmfast.load(...))")
    other = sorted(where - set(RUNNABLE))
    if "meta" in other:
        raise UserError("RewardScorer: the model given is on the meta device (its weights were never loaded); load "
                        "them first (from_pretrained, or model.to_empty(device='cpu') and load_state_dict) or pass its "
                        "name or folder")
    if other:
        raise UserError(f"RewardScorer: the model given is on {', '.join(other)}; rmfast scores on cpu or cuda: move "
                        "it first (model.to('cpu'))")
