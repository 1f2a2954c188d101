"""The shared-prompt engine: encode the prompt once, then score candidate rows in big batches.

Every row is ``prefix ⊕ response ⊕ suffix``. The prefix (system + user turn + assistant
header) is identical for all rows, so it is encoded once (batch 1) and its keys/values are
kept as ONE copy per layer, (Hkv, P, D). Each batch of rows then runs only its own tokens
through the layers; attention reads the shared prefix K/V plus the row's own causal suffix
(the Triton kernel on CUDA, a block-diagonal GEMM form on CPU). Both passes run the one decoder
layer of :mod:`rmfast.layer`. At the last layer only the positions the head reads are computed
(queries, output projection, MLP), and the head is fused with the final norm. Hugging Face's
cache, by contrast, copies the prompt K/V into every row.

Heads:
    score:   the classifier's own head at the final position of the sequence.
    logprob: log p(response | prefix) + log p(end-of-turn continuation | prefix, response).
             For one-token responses the response term comes from the prefix pass (one
             forward for all candidates); the rest needs the per-row pass.
"""

from __future__ import annotations

import types
import warnings

import torch

from . import ops
from .kernels.blockdiag_attention import pack_prefix, visibility_bias
from .kernels.cpu_logprob import lse_update
from .layer import PackedPrompt, PromptKV, build_layers, compile_layer, decoder_layer
from .models.arch import ArchSpec, arch_spec
from .template import Template

#: The CPU engine uses the block-diagonal prompt attention (:class:`rmfast.layer.PackedPrompt`) while it
#: adds at most this fraction of a layer's projection FLOPs (:meth:`Engine.blockdiag_overhead`), and
#: scan's compile="auto" skips compiling beyond it (the compiled layer always uses that form).
MAX_BLOCKDIAG_EXTRA = 0.5
#: whether the eager CPU path also uses the block-diagonal form (default False: measured slower eager;
#: tests switch it on to check that form without compiling).
EAGER_PACKED = False


def _own_copy(fn):
    """fn with its own code object. torch.compile caches graphs (and counts recompiles, limit 8)
    per code object; an engine's graphs must neither evict nor be evicted by other engines'."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Engine:
    """Scores responses for one (model, template, head).

    Every layer of every pass (the prompt's and the candidate rows') runs through the one decoder
    layer :func:`rmfast.layer.decoder_layer`, eagerly or compiled.

    Args:
        model: a loaded HF model on the fast path (see :data:`rmfast.models.arch.SUPPORTED`).
        template: the split prompt (:func:`rmfast.template.build_template`).
        head: "score" (classifier head) or "logprob" (causal LM).
        head_index: which output of a multi-output score head.
        fuse: concatenate q|k|v and gate|up weights (default: on CPU; see :func:`rmfast.layer.build_layers`).
        compile: run the batched CPU pass through ``torch.compile`` of the decoder layer (default False).
            Pays a one-off compile (seconds) per batch shape, then ~1.8× the eager CPU throughput, with
            the same op order and rounding points as eager. Smaller batches are padded to the compiled
            one; where torch.compile cannot work here, a one-line warning and the eager path.

    Example:
        >>> eng = Engine(model, tmpl, head="score")  # doctest: +SKIP
        >>> eng.score(torch.tensor([[1234], [5678]]))  # (2,) fp32  # doctest: +SKIP
    """

    def __init__(
        self, model, template: Template, *, head: str, head_index: int = 0, fuse: bool | None = None, compile: bool = False
    ):
        spec = arch_spec(model)
        if spec is None:
            raise ValueError(f"architecture {model.config.model_type!r} is not on the fast path")
        self.spec: ArchSpec = spec
        self.model = model
        self.template = template
        self.head = head
        self.head_index = head_index
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        if head == "score" and spec.score_head is None:
            raise ValueError("head 'score' needs a classifier head (model.score)")
        if head == "logprob" and spec.lm_head_weight is None:
            raise ValueError("head 'logprob' needs a language-model head (model.lm_head)")
        self.suffix = torch.tensor(template.suffix_ids, dtype=torch.long, device=self.device)
        self.continuation = torch.tensor(template.continuation_ids, dtype=torch.long, device=self.device)
        if fuse is None:
            fuse = self.device.type == "cpu"
        self.layers = build_layers(spec, fuse)  # per layer: (LayerWeights, LayerConsts), built once
        self.compile = bool(compile) and self.can_compile(warn=True)
        self._packs = None  # per layer: the block-diagonal prompt K/V, built on first use
        self._layer_fn = None  # the compiled decoder layer, built on first use
        self._lm_update_fn = None
        self._compiled_rows: dict[int, int] = {}  # S -> rows of the compiled batch shape
        self._compile_checked = False
        self._encode_prefix()

    @property
    def fused(self) -> list[tuple] | None:
        """Per layer (W_qkv, b_qkv, W_gate_up, I) when q|k|v and gate|up are fused, else None."""
        if len(self.layers[0][0].w_qkv) != 1:
            return None
        return [(w.w_qkv[0], None if w.b_qkv is None else w.b_qkv[0], w.w_gate_up[0], w.w_down.shape[1]) for w, _ in self.layers]

    # ------------------------------------------------------------------ layers
    @torch.no_grad()
    def _run_layers(self, h: torch.Tensor, pos0: int, n_out: int, collect_kv: bool = False):
        """h: (B, S, Dm) embeddings at absolute positions pos0..pos0+S-1.

        Attends to the shared prefix K/V (self.kv) when pos0 > 0. Returns the last layer's
        residual stream at the final ``n_out`` positions, (B, n_out, Dm), and, if collect_kv,
        the per-layer (Hkv, S, D) keys/values of batch row 0 (used for the prefix pass).
        """
        B, S, _ = h.shape
        if pos0 > 0 and self.compile:
            # One compiled graph per suffix length: smaller batches are padded to the compiled rows.
            rows = self._compiled_rows.setdefault(S, B)
            if B < rows:
                h = torch.cat([h, h[:1].expand(rows - B, -1, -1)])
            elif B > rows:
                self._compiled_rows[S] = B
            try:
                out = self._run_stack(h, pos0, n_out, self._compiled_layer(), None)
            except Exception as e:  # the first compile failed: no C++ compiler, unsupported platform, ...
                if self._compile_checked:
                    raise
                first = (str(e).strip().splitlines() or [""])[0][:200]
                warnings.warn(f"rmfast: torch.compile failed ({type(e).__name__}: {first}); using the eager path",
                              stacklevel=3)
                self.compile = False
                return self._run_layers(h[:B], pos0, n_out, collect_kv)
            self._compile_checked = True
            return out[:B], None
        kvs = [] if collect_kv else None
        return self._run_stack(h, pos0, n_out, decoder_layer, kvs), kvs

    def _run_stack(self, h: torch.Tensor, pos0: int, n_out: int, layer_fn, kvs: list | None) -> torch.Tensor:
        """Every layer through ``layer_fn`` (:func:`decoder_layer` or its compiled copy): (B, S, Dm) ->
        (B, n_out, Dm); only the last layer narrows to n_out. With ``kvs``, appends each layer's
        (Hkv, S, D) keys/values of row 0."""
        S = h.shape[1]
        rope = self.spec.rope(torch.arange(pos0, pos0 + S, device=h.device), h)  # key -> (S, D) cos, sin
        prompts = self._prompts(S, h) if pos0 > 0 else [self._no_prompt(h)] * len(self.layers)
        last = len(self.layers) - 1
        for li, (w, c) in enumerate(self.layers):
            cos, sin = rope[c.rope_key]
            # The last layer (final positions only) runs the same function eagerly: compiled it would
            # be a second graph per suffix length (compile time, and torch.compile's recompile limit)
            # for ~1/n_layers of the work.
            fn = decoder_layer if li == last else layer_fn
            out = fn(h, w, cos, sin, prompts[li], c, n_out if li == last else S, kvs is not None)
            if kvs is None:
                h = out
            else:
                h, k, v = out  # k, v: (B, S, Hkv, D)
                kvs.append((k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()))  # (Hkv, S, D)
        return h

    def _no_prompt(self, h: torch.Tensor) -> PromptKV:
        """The prompt pass attends only to itself: P = 0 prompt keys, the reference/Triton form (its
        suffix part is a GEMM over all S keys; the packed form's is elementwise, meant for small S)."""
        sp = self.spec
        empty = h.new_zeros(sp.n_kv_heads, 0, sp.head_dim)  # (Hkv, 0, D)
        return PromptKV(empty, empty)

    def _prompts(self, S: int, h: torch.Tensor) -> list[PromptKV | PackedPrompt]:
        """Per layer, the prompt K/V in the form that picks the attention for S-token rows."""
        if not self._use_packed(h):
            return [PromptKV(k, v) for k, v in self.kv]
        if self._packs is None:
            self._packs = [pack_prefix(k, v, self.spec.n_heads) for k, v in self.kv]
        masks = {}  # window -> (pre_bias, suf_bias) for all S query positions
        out = []
        for (k_bd, v_bd), (_, c) in zip(self._packs, self.layers):
            if c.window not in masks:
                masks[c.window] = visibility_bias(self.P, S, S, c.window, torch.float32, h.device)
            out.append(PackedPrompt(k_bd, v_bd, *masks[c.window]))
        return out

    def _use_packed(self, h: torch.Tensor) -> bool:
        """Block-diagonal prompt attention: on CPU when compiling (its layouts are the compiled layer's,
        and inductor fuses the rest); eager, its H-fold zero blocks cost more than the ``bmm`` form
        saves (SmolLM2 bf16 eager, 1,024 rows: 5.2 s vs 4.8 s per batch), so elsewhere ops' kernels."""
        if h.device.type != "cpu" or ops._use_triton(h):
            return False
        return self.compile or (EAGER_PACKED and self.blockdiag_overhead() <= MAX_BLOCKDIAG_EXTRA)

    # ------------------------------------------------------------------ compiled CPU layers
    def can_compile(self, warn: bool = False) -> bool:
        """Whether the compiled decoder layer can serve this model (else, with warn, one line why)."""
        why = self._compile_plan()
        if why is not None and warn:
            warnings.warn(f"rmfast: compiled layers unavailable ({why}); using the eager path", stacklevel=3)
        return why is None

    def _compile_plan(self) -> str | None:
        """Why the compiled layer cannot serve this model, or None when it can."""
        if self.device.type != "cpu":
            # On CUDA the GEMMs and the Triton attention kernel dominate; the layer runs eagerly.
            return f"compiling is for CPU; on {self.device.type} the layer runs eagerly around the Triton kernels"
        return None

    def blockdiag_overhead(self) -> float:
        """Extra FLOPs of the block-diagonal prompt attention, as a fraction of a layer's projection
        FLOPs: H x the prompt-attention work, so it grows with prompt length and head count (SmolLM2,
        42-token prompt: 0.12; Llama-3-8B, 50 tokens: 0.06; 1,000 tokens: 1.2). The CPU engine uses
        that form, and ``scan(compile="auto")`` compiles, only while this is <= :data:`MAX_BLOCKDIAG_EXTRA`."""
        sp = self.spec
        L0 = sp.layers[0]
        H, D, P = sp.n_heads, sp.head_dim, len(self.template.prefix_ids)
        layer_flops = 2 * sum(p.numel() for m in L0.linears() for p in m.parameters())
        return 4 * H * H * D * P / layer_flops  # per token per layer: prompt scores + values, all heads' blocks

    def _compiled_layer(self):
        """The engine's own compiled copy of :func:`decoder_layer` (one graph per batch shape)."""
        if self._layer_fn is None:
            self._layer_fn = compile_layer(_own_copy(decoder_layer))
        return self._layer_fn

    def _compiled_lm_update(self):
        if self._lm_update_fn is None:
            self._lm_update_fn = torch.compile(_own_copy(lse_update), dynamic=False)
        return self._lm_update_fn

    @torch.no_grad()
    def _encode_prefix(self) -> None:
        sp = self.spec
        ids = torch.tensor([self.template.prefix_ids], dtype=torch.long, device=self.device)  # (1, P)
        self.kv = None
        h, kvs = self._run_layers(sp.embed(ids), 0, 1, collect_kv=True)
        self.kv = kvs  # per layer: (Hkv, P, D) — the ONE shared copy
        self.P = ids.shape[1]
        self.prefix_logprobs = None
        if self.head == "logprob":
            # log p(first response token | prefix) for every vocabulary id: one row, all of V.
            # One row over the whole vocabulary: a plain GEMM + log_softmax is the cheapest form.
            hn = ops.rmsnorm(h[0], sp.final_norm.weight, sp.norm_eps, gemma_style=sp.gemma_norm)  # (1, Dm)
            logits = (hn @ sp.lm_head_weight.t()).float()[0]  # (V,)
            if sp.final_logit_softcap is not None:
                logits = torch.tanh(logits / sp.final_logit_softcap) * sp.final_logit_softcap
            self.prefix_logprobs = torch.log_softmax(logits, dim=-1)  # (V,) fp32

    # ------------------------------------------------------------------ scoring
    def tokens_per_row(self, n: int) -> int:
        """Tokens a row of an n-token response feeds through the layers."""
        if self.head == "score":
            return n + len(self.suffix)
        return n - 1 + len(self.continuation)

    @torch.no_grad()
    def score(self, responses: torch.Tensor) -> torch.Tensor:
        """responses: (B, n) token ids, all of one length n >= 1. Returns (B,) fp32 scores."""
        sp = self.spec
        responses = responses.to(self.device)
        B, n = responses.shape
        if self.head == "score":
            ids = torch.cat([responses, self.suffix.expand(B, -1)], dim=1)  # (B, n + len(suffix))
            h, _ = self._run_layers(sp.embed(ids), self.P, 1)  # (B, 1, Dm)
            hd = sp.score_head
            out = ops.rmsnorm_head(h[:, 0], sp.final_norm.weight, sp.norm_eps, hd.weight, hd.bias, gemma_style=sp.gemma_norm)
            return out[:, self.head_index]  # (B,)
        # logprob head
        total = self.prefix_logprobs[responses[:, 0]].clone()  # (B,)
        targets = torch.cat([responses[:, 1:], self.continuation.expand(B, -1)], dim=1)  # (B, n-1+m)
        T = targets.shape[1]
        if T == 0:
            return total
        ids = torch.cat([responses, self.continuation[:-1].expand(B, -1)], dim=1)[:, :T]  # (B, T)
        h, _ = self._run_layers(sp.embed(ids), self.P, T)  # (B, T, Dm)
        lp = ops.rmsnorm_lmhead_logprob(
            h.reshape(B * T, -1),
            sp.final_norm.weight,
            sp.norm_eps,
            sp.lm_head_weight,
            targets.reshape(-1),
            gemma_style=sp.gemma_norm,
            final_softcap=sp.final_logit_softcap,
            update_fn=self._compiled_lm_update() if self.compile else None,
            pad_rows=self._compiled_rows.get(T, B) * T if self.compile else None,
        )
        return total + lp.view(B, T).sum(-1)
