"""Reward heads: what maps a model's final normed hidden states to one score per row.

The engine (and rmfast's own full-sequence forward of custom reward models,
:class:`rmfast.loading.custom_heads.CustomRewardModel`) computes the final RMSNorm of the positions a
head reads, in fp32, and hands them to a head object:

- :class:`LinearHead`: ``score = W h + b`` at the final position, output ``index`` (HF's ``score``
  module of ``*ForSequenceClassification``; also what a gated head becomes once its prompt part is
  known).
- :class:`GatedHead`: ArmoRM (``LlamaForRewardModelWithGating``) and QRM (quantile heads). A gating
  MLP reads the hidden state at a *prompt* position (the first token of the last occurrence of the
  end-of-user-turn pattern, e.g. Llama 3 ``<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n``)
  and gives objective weights ``g = softmax(mlp(h_gate) / temperature) * logit_scale`` (K,); a
  regression layer reads the final position, (K*Q, D) with Q quantiles per objective (ArmoRM: Q = 1),
  and ``score = sum_j g_j (mean_q(R h) @ T)_j`` with T the (K, K) ``reward_transform_matrix``. Since
  g depends only on the prompt, the score is linear in h: ``score = v . h`` with
  ``v = (T g) @ mean_q(R)`` (:meth:`GatedHead.fold`), one (D,) vector per prompt.
- :class:`URMHead`: URM (``LlamaForSequenceClassificationWithNormal_Weights``). A (2A, D) ``score``
  layer gives (mean, second value) pairs for A attributes; an MLP (Linear, SELU, Linear, SELU,
  Linear) of the SAME final state weighs the A means: ``score = sum_a (W h)[2a] * mlp(h)_a``. Not
  linear in h: it runs per row.

All heads compute in fp32 (weights upcast once): the originals run their heads in the model dtype
(URM's MLP in fp16), so in bf16 their outputs are rounded where rmfast's are not.

Example:
    >>> import torch
    >>> h = torch.randn(3, 8)
    >>> head = LinearHead(torch.randn(2, 8), torch.zeros(2), index=1)
    >>> head(h).shape
    torch.Size([3])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: The gating position rule: the first token of the LAST occurrence of this text's tokens (as the
#: originals' ``find_token_for_gating``), per backbone model_type. The texts tokenize, with the real
#: tokenizers, to the ids the originals hard-code: Llama 3 [128009, 128006, 78191, 128007, 271],
#: Gemma 2 [107, 108, 106, 2516, 108].
GATING_PATTERNS = {
    "llama": "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma2": "<end_of_turn>\n<start_of_turn>model\n",
}


def find_last(pattern: tuple[int, ...], ids: list[int]) -> int | None:
    """Start index of the last occurrence of ``pattern`` in ``ids``, or None.

    >>> find_last((1, 2), [1, 2, 0, 1, 2, 3])
    3
    """
    n = len(pattern)
    for j in range(len(ids) - n, -1, -1):
        if tuple(ids[j : j + n]) == pattern:
            return j
    return None


@dataclass
class LinearHead:
    """score = (h @ weight.T + bias)[:, index]; weight (K, D), bias (K,) or None, in the model dtype
    (the engine's fused norm + head kernel reads them as they are)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    index: int = 0

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, D) fp32 normed final states -> (N,) fp32."""
        out = h @ self.weight.float()[self.index]  # (N,)
        return out if self.bias is None else out + self.bias.float()[self.index]


@dataclass
class GatingLayer:
    """One step of a gating MLP: "linear" (weight (O, I), bias (O,) or None), "relu", or "batchnorm"
    (eval mode: running mean/var, affine weight/bias, eps)."""

    kind: str
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    running_mean: torch.Tensor | None = None
    running_var: torch.Tensor | None = None
    eps: float = 1e-5

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "linear":
            return F.linear(x, self.weight, self.bias)
        if self.kind == "relu":
            return torch.relu(x)
        return (x - self.running_mean) * torch.rsqrt(self.running_var + self.eps) * self.weight + self.bias


@dataclass
class GatedHead:
    """ArmoRM / QRM: prompt-gated mixture of objectives (module docstring). All tensors fp32.

    regression: (K*Q, D), rows objective-major (row k*Q + q); transform: (K, K); gating: the MLP's
    steps; pattern: token ids of the gating pattern.
    """

    regression: torch.Tensor
    transform: torch.Tensor
    gating: list[GatingLayer]
    temperature: float
    logit_scale: torch.Tensor  # (1,)
    num_quantiles: int
    pattern: tuple[int, ...]
    name: str = "armorm"

    def gate(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, D) fp32 normed states at the gating position -> (N, K) objective weights."""
        x = h
        for layer in self.gating:
            x = layer(x)
        return torch.softmax(x / self.temperature, dim=-1) * self.logit_scale[0]

    def fold(self, g: torch.Tensor) -> torch.Tensor:
        """g: (N, K) objective weights -> (N, D) vectors v with score = v . h_final."""
        K = self.transform.shape[0]
        per_objective = self.regression.view(K, self.num_quantiles, -1).mean(1)  # (K, D): mean over quantiles
        return (g @ self.transform.t()) @ per_objective  # (N, D) = (T g)^T mean_q(R)

    def gate_position(self, ids: list[int]) -> int | None:
        return find_last(self.pattern, ids)

    def __call__(self, h_final: torch.Tensor, h_gate: torch.Tensor) -> torch.Tensor:
        """(N, D) fp32 normed states at the final and the gating positions -> (N,) fp32 scores."""
        return (self.fold(self.gate(h_gate)) * h_final).sum(-1)


@dataclass
class URMHead:
    """URM: score (2A, D); mlp: the weights MLP's linear layers [(W, b)] with SELU between. fp32."""

    score: torch.Tensor
    mlp: list[tuple[torch.Tensor, torch.Tensor | None]]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, D) fp32 normed final states -> (N,) fp32."""
        means = (h @ self.score.t()).view(h.shape[0], -1, 2)[:, :, 0]  # (N, A): each attribute's first value
        w = h
        for i, (W, b) in enumerate(self.mlp):
            w = F.linear(w, W, b)
            if i < len(self.mlp) - 1:
                w = F.selu(w)
        return (means * w).sum(-1)  # (N,)
