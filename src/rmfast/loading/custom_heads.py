"""Reward models with custom heads (ArmoRM, QRM, URM), loaded without running their remote code.

Their checkpoints ship modeling code for ``trust_remote_code``; rmfast never runs it. It
recognizes them from the safetensors weight names (:func:`rmfast.loading.folder_checks.custom_head_kind`), builds
the backbone with transformers' own class for the config's ``model_type`` (``LlamaModel``,
``Gemma2Model``: the fast path's :func:`rmfast.fast.arch.arch_spec` reads it like any other), and
loads the head tensors into rmfast's own head (:mod:`rmfast.fast.heads`). The facts, from the
originals' public modeling code:

- ArmoRM (``RLHFlow/ArmoRM-Llama3-8B-v0.1``, ``LlamaForRewardModelWithGating``): config keys
  ``num_objectives``, ``gating_temperature`` (default 10), ``gating_hidden_dim``, ``gating_n_hidden``;
  weights ``regression_layer.weight`` (K, D), ``reward_transform_matrix`` (K, K),
  ``gating.logit_scale`` (1,), ``gating.layers.{0..n}.weight/bias`` (Linear layers, ReLU between,
  applied in forward). Reward read from ``outputs.score``.
- QRM (``nicolinho/QRM-Llama3.1-8B``, ``nicolinho/QRM-Gemma-2-27B``): as ArmoRM plus ``num_quantiles``
  (regression (K*Q, D), reshaped (K, Q), the score uses the mean over quantiles) and a gating MLP
  of [Linear (no bias), ReLU, BatchNorm1d] per hidden layer, then Linear: ``gating.layers.{3i}`` are
  Linear, ``{3i+2}`` BatchNorm (running stats, eval mode), ``{3i+1}`` the parameterless ReLUs.
- QRM-Gemma-2 as published (``nicolinho/QRM-Gemma-2-27B``: 5 objectives x 19 quantiles): the same
  [Linear, ReLU, BatchNorm1d] blocks with a parameterless Dropout BETWEEN blocks (Linear at 0/4/8,
  BatchNorm at 2/6/10, output Linear at 11; Dropout is the identity in eval mode), and no
  ``reward_transform_matrix``: ``score = sum_k gate_k * mean_q(regression(h_last))_k`` (the identity
  transform). Only this layout, recognized by its Dropout slots, may lack the matrix: a checkpoint
  of another layout without it is refused as one whose head weights are missing.
- URM (``LxzGordon/URM-LLaMa-3.1-8B``, ``LlamaForSequenceClassificationWithNormal_Weights``):
  ``score.weight`` (2A, D, no bias), ``weights.fc.{0,2,4}.weight/bias`` (Linear, SELU, Linear, SELU,
  Linear -> A); ``logits[:, 0]`` is the weighted sum of the attribute means.

Gated heads find their gating position from the token pattern of :data:`rmfast.fast.heads.GATING_PATTERNS`
encoded with the model's own tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from ..fast.heads import GATING_PATTERNS, GatedHead, GatingLayer, URMHead

#: recognized custom heads: name -> what the checkpoint calls itself
KINDS = {"gated": "ArmoRM/QRM gated head", "urm": "URM weighted attribute head"}

_GATED_REQUIRED = ("regression_layer.weight", "reward_transform_matrix", "gating.logit_scale")
_TRANSFORM = "reward_transform_matrix"
_URM_REQUIRED = ("score.weight",)


def _read(files: dict[str, Path], names) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for n in names:
        by_file.setdefault(files[n], []).append(n)
    for path, ns in by_file.items():
        with safe_open(str(path), "pt") as f:
            for n in ns:
                out[n] = f.get_tensor(n)
    return out


def _missing(folder: Path, files: dict, required, what: str) -> None:
    gone = [n for n in required if n not in files]
    if gone:
        raise UserError(f"{folder} looks like a {what} but has no weights for {', '.join(gone)}: "
                        f"a reward model without its head cannot score; pass the complete checkpoint")


def _complete(folder: Path, layer: str, got: dict, needs) -> None:
    """A head layer's tensors as its layout has them: a missing one (a bias too) refused, never read as absent."""
    if gone := [f"{layer}.{p}" for p in needs if p not in got]:
        raise UserError(f"{folder} has no weights for {', '.join(gone)}: a reward model without its whole head "
                        "cannot score; pass the complete checkpoint")


def _gating_layers(folder: Path, t: dict[str, torch.Tensor]) -> tuple[list[GatingLayer], bool]:
    """The gating MLP's steps from its weight names (ArmoRM: Linear+ReLU; QRM: Linear, ReLU, BatchNorm;
    QRM-Gemma-2: the same with Dropout between blocks), and whether that layout has Dropout slots."""
    groups: dict[int, dict[str, torch.Tensor]] = {}
    for n, v in t.items():
        if n.startswith("gating.layers."):
            i, p = n[len("gating.layers."):].split(".", 1)
            groups.setdefault(int(i), {})[p] = v.float()
    idx = sorted(groups)
    if not idx or idx[0] != 0:
        raise UserError(f"{folder}: gating.layers.* starts at {idx[:1]}: not an ArmoRM/QRM gating network")
    batchnorm = any("running_mean" in g for g in groups.values())
    layers: list[GatingLayer] = []
    prev = None  # the kind of the previous slot of the checkpoint's ModuleList
    dropout = False
    for i in range(idx[-1] + 1):
        g = groups.get(i)
        if g is None:
            nxt = groups.get(i + 1)
            if not batchnorm:  # ArmoRM's layers are all Linear: a gap is not its layout
                raise UserError(f"{folder}: gating.layers.{i} is missing: not an ArmoRM/QRM gating network")
            if prev == "linear":
                layers.append(GatingLayer("relu"))  # QRM: the ReLU modules hold no weights
                prev = "relu"
            elif prev == "batchnorm" and nxt is not None and "running_mean" not in nxt:
                prev, dropout = "dropout", True  # QRM-Gemma-2: Dropout between blocks, the identity in eval
            else:
                raise UserError(f"{folder}: gating.layers.{i} is missing (after a {prev} layer): not an ArmoRM/QRM "
                                "gating network; pass the complete checkpoint")
        elif "running_mean" in g:
            _complete(folder, f"gating.layers.{i}", g, ("weight", "bias", "running_mean", "running_var"))
            layers.append(GatingLayer("batchnorm", g["weight"], g["bias"], g["running_mean"], g["running_var"]))
            prev = "batchnorm"
        else:
            # ArmoRM's Linears all carry a bias (nn.Linear's default); QRM's hidden ones have none by design
            _complete(folder, f"gating.layers.{i}", g, ("weight",) if batchnorm else ("weight", "bias"))
            layers.append(GatingLayer("linear", g["weight"], g.get("bias")))
            prev = "linear"
            if not batchnorm and i < idx[-1]:
                layers.append(GatingLayer("relu"))  # ArmoRM applies ReLU after every hidden Linear
    if layers[-1].kind != "linear":
        raise UserError(f"{folder}: the gating network does not end in a Linear layer")
    return layers, dropout


def gating_pattern(tokenizer, model_type: str) -> tuple[int, ...]:
    """The gating pattern's ids in this tokenizer (Llama 3 / Gemma 2 text, :data:`GATING_PATTERNS`)."""
    text = GATING_PATTERNS.get(model_type)
    if text is None:
        raise UserError(f"no gating pattern known for a {model_type!r} backbone (known: {', '.join(GATING_PATTERNS)})")
    ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    first = text.split(">", 1)[0] + ">"
    if not ids or tokenizer.convert_ids_to_tokens(ids[0]) != first:
        raise UserError(f"the tokenizer has no {first} token: this gated reward model finds its gating "
                        f"position by the pattern {text!r}")
    return ids


def build_head(folder: Path, config: dict, kind: str, files: dict, tokenizer, model_type: str):
    """The head object of a recognized checkpoint, its tensors read from the safetensors files (fp32)."""
    if kind == "urm":
        _missing(folder, files, _URM_REQUIRED, "URM reward model")
        t = _read(files, [n for n in files if n == "score.weight" or n.startswith("weights.fc.")])
        lin = sorted({int(n.split(".")[2]) for n in t if n.startswith("weights.fc.")})
        for i in lin:  # URM's Linears all carry a bias (nn.Linear's default)
            _complete(folder, f"weights.fc.{i}", {n.split(".")[3]: 1 for n in t if n.startswith(f"weights.fc.{i}.")},
                      ("weight", "bias"))
        mlp = [(t[f"weights.fc.{i}.weight"].float(), t[f"weights.fc.{i}.bias"].float()) for i in lin]
        return URMHead(t["score.weight"].float(), mlp)
    what = "gated reward model (ArmoRM/QRM)"
    _missing(folder, files, [n for n in _GATED_REQUIRED if n != _TRANSFORM], what)
    t = _read(files, [n for n in files if n in _GATED_REQUIRED or n.startswith("gating.layers.")])
    gating, dropout_layout = _gating_layers(folder, t)
    R = t["regression_layer.weight"].float()
    K = gating[-1].weight.shape[0]  # the gate's outputs: one weight per objective
    if _TRANSFORM in t:
        T = t[_TRANSFORM].float()
    elif dropout_layout:  # QRM-Gemma-2 as published: no transform, score = sum_k g_k mean_q(R h)_k
        T = torch.eye(K)  # exact: g @ I adds only zeros to each g_k
    else:
        _missing(folder, files, [_TRANSFORM], what)
    if tuple(T.shape) != (K, K):
        raise UserError(f"{folder}: {_TRANSFORM} is {tuple(T.shape)}, not ({K}, {K}) for a gate of {K} objectives: "
                        "a damaged or mismatched checkpoint")
    n_obj = config.get("num_objectives")
    if n_obj is not None and int(n_obj) != K:
        raise UserError(f"{folder}: config num_objectives is {n_obj} but the gating network has {K} outputs: "
                        "a damaged or mismatched checkpoint")
    Q = int(config.get("num_quantiles") or 1)
    if R.shape[0] != K * Q:
        raise UserError(f"{folder}: regression_layer has {R.shape[0]} rows, not num_objectives {K} x "
                        f"num_quantiles {Q}")
    return GatedHead(
        regression=R, transform=T, gating=gating, temperature=float(config.get("gating_temperature", 10)),
        logit_scale=t["gating.logit_scale"].float().reshape(1), num_quantiles=Q,
        pattern=gating_pattern(tokenizer, model_type), name="qrm" if Q > 1 or "num_quantiles" in config else "armorm",
    )


@dataclass
class CustomOutput:
    """What :class:`CustomRewardModel` returns: ``score`` (B, 1) fp32, as the originals' ``outputs.score``."""

    score: torch.Tensor

    @property
    def logits(self) -> torch.Tensor:
        return self.score


class CustomRewardModel(nn.Module):
    """A transformers backbone (``.model``) + an rmfast head (``.rmfast_head``): the plain full-sequence
    forward of ArmoRM / QRM / URM, written here from the originals' formulas (module docstring).

    ``forward(input_ids)`` runs the backbone over whole rows and reads the head at the final position
    (the token before the first ``pad_token_id``, as the originals do; the final token when no pad
    occurs) and, for gated heads, at the gating pattern found in each row.
    """

    base_model_prefix = "model"

    def __init__(self, backbone: nn.Module, head, kind: str):
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        self.rmfast_head = head
        self.rmfast_head_kind = kind

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def _apply(self, fn, *args, **kwargs):  # .to(device): the head's fp32 tensors follow the backbone's device
        out = super()._apply(fn, *args, **kwargs)
        dev = next(self.model.parameters()).device
        self.rmfast_head = _head_to(self.rmfast_head, dev)
        return out

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, gating_ids=None,
                **kwargs) -> CustomOutput:
        """``gating_ids``: with ``inputs_embeds`` (GCG's gradient), the (B, L) token ids those embeddings
        stand for: a gated head finds its gating position in them, as it would in ``input_ids``."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds)
        hs = out.last_hidden_state.float()  # (B, L, D) normed by the backbone's final norm
        B, L, _ = hs.shape
        rows = torch.arange(B, device=hs.device)
        last = torch.full((B,), L - 1, dtype=torch.long, device=hs.device)
        pad = self.config.pad_token_id
        if input_ids is not None and pad is not None:
            last = (torch.eq(input_ids, pad).int().argmax(-1) - 1) % L  # the token before the first pad
        h = hs[rows, last]  # (B, D)
        head = self.rmfast_head
        if isinstance(head, URMHead):
            return CustomOutput(head(h)[:, None])
        tokens = input_ids if input_ids is not None else gating_ids
        if tokens is None:
            raise ValueError("a gated reward model needs input_ids (or gating_ids with inputs_embeds): its gating "
                             "position is found from the tokens")
        pos = [head.gate_position(r) for r in tokens.tolist()]
        if any(p is None for p in pos):
            raise UserError(f"the gating pattern {head.pattern} does not occur in a row: this gated reward model reads "
                            "its gating position at the end of the user turn (use its chat template)")
        return CustomOutput(head(h, hs[rows, torch.tensor(pos, device=hs.device)])[:, None])


def _head_to(head, device):
    """A copy of a head dataclass with every tensor on ``device``."""
    import dataclasses

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, list):
            return [move(x) for x in v]
        if isinstance(v, tuple):
            return tuple(move(x) for x in v)
        if dataclasses.is_dataclass(v):
            return dataclasses.replace(v, **{f.name: move(getattr(v, f.name)) for f in dataclasses.fields(v)})
        return v

    return move(head)


def load_custom(folder: Path, config, kind: str, files: dict, tokenizer, *, dtype, attn_implementation=None):
    """Backbone (transformers' class for the config's ``model_type``: the model's ``model.*`` weights) +
    rmfast head. Returns (CustomRewardModel, missing backbone weight names)."""
    from transformers import AutoModel

    kwargs = dict(dtype=dtype, local_files_only=True, trust_remote_code=False)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    backbone, info = AutoModel.from_pretrained(folder, config=config, output_loading_info=True, **kwargs)
    head = build_head(folder, config.to_dict(), kind, files, tokenizer, config.model_type)
    model = CustomRewardModel(backbone, head, kind)
    return model, sorted(info.get("missing_keys") or [])
