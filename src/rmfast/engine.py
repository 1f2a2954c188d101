"""The shared-prompt engine: encode the prompt once, then score candidate rows in big batches.

Every row is ``prefix ⊕ response ⊕ suffix``. The prefix (system + user turn + assistant
header) is identical for all rows, so it is encoded once (batch 1) and its keys/values are
kept as ONE copy per layer, (Hkv, P, D). Each batch of rows then runs only its own tokens
through the layers; attention reads the shared prefix K/V plus the row's own causal suffix
(:func:`rmfast.ops.shared_prefix_attention`). At the last layer only the positions the head
reads are computed (queries, output projection, MLP), and the head is fused with the final
norm. Hugging Face's cache, by contrast, copies the prompt K/V into every row.

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
import torch.nn.functional as F

from . import ops
from .kernels.blockdiag_attention import pack_prefix, visibility_bias
from .kernels.cpu_logprob import lse_update
from .layer import ACTIVATIONS, LayerConsts, LayerWeights, decoder_layer
from .models.arch import ArchSpec, arch_spec
from .template import Template


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, S, D); cos/sin: (S, D) — same op order as HF's apply_rotary_pos_emb
    return (x * cos) + (_rotate_half(x) * sin)


def _apply_rope_sbhd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, S, heads, D) with cos/sin (S, D); same arithmetic as _apply_rope.

    rotate_half(x) * sin == roll(x, D/2) * [-sin_lo, sin_hi]: negation is exact, so the result is
    bit-identical to HF's, in 4 passes instead of 6.
    """
    h = x.shape[-1] // 2
    sin_signed = torch.cat([-sin[:, :h], sin[:, h:]], dim=-1)[:, None]  # (S, 1, D)
    return x * cos[:, None] + torch.roll(x, h, dims=-1) * sin_signed


#: scan's compile="auto" skips the compiled layer when its block-diagonal prompt attention would add
#: more than this fraction of a layer's projection FLOPs (:meth:`Engine.blockdiag_overhead`).
MAX_BLOCKDIAG_EXTRA = 0.5


def _own_copy(fn):
    """fn with its own code object. torch.compile caches graphs (and counts recompiles, limit 8)
    per code object; an engine's graphs must neither evict nor be evicted by other engines'."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Engine:
    """Scores responses for one (model, template, head).

    Args:
        model: a loaded HF model on the fast path (see :data:`rmfast.models.arch.SUPPORTED`).
        template: the split prompt (:func:`rmfast.template.build_template`).
        head: "score" (classifier head) or "logprob" (causal LM).
        head_index: which output of a multi-output score head.
        fuse: concatenate q|k|v and gate|up weights (default: on CPU).
        compile: run the batched CPU pass through the compiled decoder layer (:mod:`rmfast.layer`,
            ``torch.compile``; default False). Pays a one-off compile (seconds) per batch shape, then
            ~1.8× the eager CPU throughput. Smaller batches are padded to the compiled one; where
            torch.compile cannot work here, a one-line warning and the eager path.

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
        self.fused = self._fuse_weights() if fuse else None
        cfg = model.config
        self._act_name = (getattr(cfg, "hidden_activation", None) if spec.family in ("gemma2", "gemma3") else None) or getattr(
            cfg, "hidden_act", None
        )
        self.act = ACTIVATIONS.get(self._act_name)
        self.compile = bool(compile) and self.can_compile(warn=True)
        self._packs = None
        self._lm_update_fn = None
        self._compiled_rows: dict[int, int] = {}  # S -> rows of the compiled batch shape
        self._compile_checked = False
        self._encode_prefix()

    def _fuse_weights(self):
        """Per layer: (W_qkv, b_qkv, W_gate_up, I), concatenated once. Costs a copy of those weights,
        so it is the CPU default (small models, GEMM-call overhead matters) and off on CUDA."""
        out = []
        for L in self.spec.layers:
            mlp = L.mlp
            if not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
                return None
            w = torch.cat([L.q_proj.weight, L.k_proj.weight, L.v_proj.weight])
            b = None
            if L.q_proj.bias is not None:
                b = torch.cat([L.q_proj.bias, L.k_proj.bias, L.v_proj.bias])
            gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            out.append((w, b, gu, mlp.gate_proj.weight.shape[0]))
        return out

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
                out = self._run_layers_once(h, pos0, n_out, None)
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
        return self._run_layers_once(h, pos0, n_out, kvs), kvs

    def _run_layers_once(self, h: torch.Tensor, pos0: int, n_out: int, kvs: list | None) -> torch.Tensor:
        sp = self.spec
        S = h.shape[1]
        rope = sp.rope(torch.arange(pos0, pos0 + S, device=h.device), h)
        last = len(sp.layers) - 1
        compiled = self._compiled_layers(h, pos0, rope) if pos0 > 0 and self.compile else None
        for li in range(len(sp.layers)):
            if compiled is not None and li < last:  # the last layer (final positions only) stays eager
                h = compiled(li, h)
            else:
                h = self._layer(li, h, pos0, n_out if li == last else S, rope, kvs)
        return h

    def _layer(self, li: int, h: torch.Tensor, pos0: int, Sq: int, rope: dict, kvs: list | None) -> torch.Tensor:
        """Eager layer ``li`` (HF's op order and rounding points): (B, S, Dm) -> (B, Sq, Dm)."""
        sp = self.spec
        L = sp.layers[li]
        B, S, _ = h.shape
        H, Hkv, D = sp.n_heads, sp.n_kv_heads, sp.head_dim
        x = L.input_norm(h)  # (B, S, Dm)
        fw = self.fused[li] if self.fused is not None else None
        cos, sin = rope[L.rope_key]  # (S, D)
        if fw is not None and L.q_norm is None:
            # One GEMM for q, k and v, and RoPE on the q|k slab at once (fewer passes; the
            # last layer's extra q rows cost < 1% of the layer).
            qkv = F.linear(x, fw[0], fw[1]).view(B, S, H + 2 * Hkv, D)  # (B, S, H+2Hkv, D)
            qk = _apply_rope_sbhd(qkv[:, :, : H + Hkv], cos, sin)  # (B, S, H+Hkv, D)
            q = qk[:, S - Sq :, :H].transpose(1, 2)  # (B, H, Sq, D)
            k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, S, D)
            v = qkv[:, :, H + Hkv :].transpose(1, 2)
        else:
            xq = x[:, S - Sq :] if Sq < S else x
            q = L.q_proj(xq).view(B, Sq, H, D).transpose(1, 2)  # (B, H, Sq, D)
            k = L.k_proj(x).view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
            v = L.v_proj(x).view(B, S, Hkv, D).transpose(1, 2)
            if L.q_norm is not None:
                q, k = L.q_norm(q), L.k_norm(k)
            q = _apply_rope(q, cos[S - Sq :], sin[S - Sq :])
            k = _apply_rope(k, cos, sin)
        if kvs is not None:
            kvs.append((k[0].contiguous(), v[0].contiguous()))  # (Hkv, S, D)
        if pos0 > 0:
            kp, vp = self.kv[li]
        else:
            kp = vp = h.new_zeros(Hkv, 0, D)
        a = ops.shared_prefix_attention(q, kp, vp, k, v, scale=L.scale, softcap=L.softcap, window=L.window)
        a = L.o_proj(a.reshape(B, Sq, H * D))  # (B, Sq, Dm)
        if L.post_attn_norm is not None:
            a = L.post_attn_norm(a)
        h = (h[:, S - Sq :] if Sq < S else h) + a
        x = L.pre_mlp_norm(h)
        if fw is not None:
            gu = F.linear(x, fw[2])  # (B, Sq, 2 I): gate and up in one GEMM
            m = L.mlp.down_proj(L.mlp.act_fn(gu[..., : fw[3]]) * gu[..., fw[3] :])
        else:
            m = L.mlp(x)
        if L.post_mlp_norm is not None:
            m = L.post_mlp_norm(m)
        return h + m

    # ------------------------------------------------------------------ compiled CPU layers
    def can_compile(self, warn: bool = False) -> bool:
        """Whether the compiled decoder layer can serve this model (else, with warn, one line why)."""
        why = self._compile_plan()
        if why is not None and warn:
            warnings.warn(f"rmfast: compiled layers unavailable ({why}); using the eager path", stacklevel=3)
        return why is None

    def _compile_plan(self) -> str | None:
        """Why the compiled layer cannot serve this model, or None when it can."""
        sp = self.spec
        if self.fused is None:
            return "the fused q|k|v and gate|up weights are not built (CUDA, or an unusual MLP)"
        if self.act is None:
            return f"activation {self._act_name!r} has no compiled form"
        for L in sp.layers:
            if any(getattr(L.mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
                return "MLP biases"
        return None

    def blockdiag_overhead(self) -> float:
        """Extra FLOPs of the compiled layer's block-diagonal prompt attention, as a fraction of a
        layer's projection FLOPs: H x the prompt-attention work, so it grows with prompt length and
        head count (SmolLM2, 42-token prompt: 0.12; Llama-3-8B, 50 tokens: 0.06; 1,000 tokens: 1.2).
        ``scan(compile="auto")`` compiles only while this is <= :data:`MAX_BLOCKDIAG_EXTRA`."""
        sp = self.spec
        L0 = sp.layers[0]
        H, D, P = sp.n_heads, sp.head_dim, len(self.template.prefix_ids)
        layer_flops = 2 * sum(p.numel() for m in (L0.q_proj, L0.k_proj, L0.v_proj, L0.o_proj, L0.mlp) for p in m.parameters())
        return 4 * H * H * D * P / layer_flops  # per token per layer: prompt scores + values, all heads' blocks

    def _layer_weights(self, li: int) -> LayerWeights:
        sp = self.spec
        L = sp.layers[li]
        fw = self.fused[li]
        g = 1.0 if sp.gemma_norm else 0.0

        def eff(norm):  # the effective fp32 multiplier of an RMSNorm
            return None if norm is None else norm.weight.float() + g

        qk_norm = None
        if L.q_norm is not None:
            qk_norm = torch.cat([eff(L.q_norm).expand(sp.n_heads, -1), eff(L.k_norm).expand(sp.n_kv_heads, -1)])
        return LayerWeights(
            norm_in=eff(L.input_norm),
            w_qkv=fw[0],
            b_qkv=fw[1],
            qk_norm=qk_norm,
            w_o=L.o_proj.weight,
            b_o=L.o_proj.bias,
            norm_post_attn=eff(L.post_attn_norm),
            norm_pre_mlp=eff(L.pre_mlp_norm),
            w_gate_up=fw[2],
            w_down=L.mlp.down_proj.weight,
            norm_post_mlp=eff(L.post_mlp_norm),
        )

    def _compiled_lm_update(self):
        if self._lm_update_fn is None:
            self._lm_update_fn = torch.compile(_own_copy(lse_update), dynamic=False)
        return self._lm_update_fn

    def _compiled_layers(self, h: torch.Tensor, pos0: int, rope: dict):
        """A callable (li, h) -> h running layer li through the compiled decoder layer, or None
        (after a one-line warning) when torch.compile is unavailable here."""
        sp = self.spec
        if self._packs is None:
            self._packs = [pack_prefix(k, v, sp.n_heads) for k, v in self.kv]
            self._weights = [self._layer_weights(li) for li in range(len(sp.layers))]
            self._consts = [
                LayerConsts(
                    n_heads=sp.n_heads, n_kv_heads=sp.n_kv_heads, head_dim=sp.head_dim, eps=sp.norm_eps,
                    scale=L.scale, softcap=L.softcap, act=self.act, qk_norm=L.q_norm is not None,
                    sandwich=L.post_attn_norm is not None,
                )
                for L in sp.layers
            ]
            self._layer_fn = torch.compile(_own_copy(decoder_layer), dynamic=False)
        S = h.shape[1]
        biases = {}
        for L in sp.layers:
            if L.window not in biases:
                biases[L.window] = visibility_bias(self.P, S, S, L.window, torch.float32, h.device)

        def run(li: int, x: torch.Tensor) -> torch.Tensor:
            L = sp.layers[li]
            cos, sin = rope[L.rope_key]
            pre, suf = biases[L.window]
            k_bd, v_bd = self._packs[li]
            return self._layer_fn(x, self._weights[li], k_bd, v_bd, cos, sin, pre, suf, self._consts[li], S)

        return run

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
