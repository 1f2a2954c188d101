"""The shared-prompt engine: encode the prompt once, then score candidate rows in big batches.

Every row is ``prefix ⊕ response ⊕ suffix``. The prefix (system + user turn + assistant
header) is identical for all rows, so it is encoded once (batch 1) and its keys/values are
kept as ONE copy per layer, (Hkv, P, D). Each batch of rows then runs only its own tokens
through the layers; attention reads the shared prefix K/V plus the row's own causal suffix
(the Triton kernel on CUDA, a block-diagonal GEMM form on CPU). Both passes run the one decoder
layer of :mod:`rmfast.fast.layer`. At the last layer only the positions the head reads are computed
(queries, output projection, MLP), and the head is fused with the final norm. Hugging Face's
cache, by contrast, copies the prompt K/V into every row. Several prompts (a scorer's wave) in the cascade
form encode in ONE packed pass (:mod:`rmfast.fast.wave`), each as its own pass would.

Heads:
    score:   the reward head (:mod:`rmfast.fast.heads`) at the final position of the sequence:
             the classifier's own linear head, or a custom one (ArmoRM/QRM gated, URM). A gated
             head's prompt part (its gating MLP at the end-of-user-turn position) is computed once in
             the prefix pass and folded into one (D,) vector, so per row it is a linear head too.
    logprob: log p(response | prefix) + log p(end-of-turn continuation | prefix, response).
             For one-token responses the response term comes from the prefix pass (one
             forward for all candidates); the rest needs the per-row pass.

The final norm and the head run in fp32 by default (``fp32_head``): the layers keep the model's
dtype, but a bf16 head output would round every score to 8 significant bits.
"""

from __future__ import annotations

import contextvars
import sys
import time
import types
import warnings

import torch

from . import ops
from ..cpu import compile_here
from ..errors import UserError
from .layer import (CascadePrompt, MultiPrompt, PackedPrompt, PackedRows, PromptKV, build_layers, compile_layer,
                    decoder_layer)
from .arch import ArchSpec, arch_spec
from .heads import GatedHead, LinearHead
from ..template import Template

#: ``compile=auto`` compiles the CPU layer (whose prompt attention is the block-diagonal form,
#: :class:`rmfast.fast.layer.PackedPrompt`) only while that form adds at most this fraction of a layer's
#: projection FLOPs (:meth:`Engine.blockdiag_overhead`; :func:`rmfast.scoring.decisions.choose_compile`).
MAX_BLOCKDIAG_EXTRA = 0.5
#: inside :func:`rmfast.fast.wave.one_prompt_pass`: the engines (cascade form) whose prompt pass waits for the wave's one pass
_WAVE: contextvars.ContextVar[list | None] = contextvars.ContextVar("rmfast_prompt_wave", default=None)


def _own_copy(fn):
    """fn with its own code object. torch.compile caches graphs (and counts recompiles, limit 8)
    per code object; an engine's graphs must neither evict nor be evicted by other engines'."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Engine:
    """Scores responses for one (model, template, head).

    Every layer of every pass (the prompt's and the candidate rows') runs through the one decoder
    layer :func:`rmfast.fast.layer.decoder_layer`, eagerly or compiled.

    Args:
        model: a loaded HF model on the fast path (see :data:`rmfast.fast.arch.SUPPORTED`).
        template: the split prompt (:func:`rmfast.template.build_template`).
        head: "score" (classifier head) or "logprob" (causal LM).
        head_index: which output of a multi-output score head.
        fuse: concatenate q|k|v and gate|up weights (default: on CPU; see :func:`rmfast.fast.layer.build_layers`).
        elementwise: the layer's norms, RoPE and SiLU·up as Triton kernels (default :func:`fused_elementwise`:
            on CUDA where the layer runs eagerly; the plan's "elementwise" decision).
        compile: run the batched CPU pass through ``torch.compile`` of the decoder layer (default False;
            :func:`rmfast.scoring.plan.choose_compile` decides it for jobs). A one-off compile (seconds) per batch
            shape; the same rounding points as eager but another summation order (docs/determinism.md).
            Smaller batches are padded to the compiled one; where torch.compile fails here, a one-line
            warning and the eager path. On CPU any form; elsewhere only the Triton shared-prefix form (the token
            scan's; ignored for the cascade and the reference form, which run eagerly).
        fp32_head: final norm and head (score and logprob) in fp32 with fp32 output (default True);
            False rounds where HF does (normed rows and head output in the model dtype). Custom
            heads always run in fp32.
        layers: another engine's ``layers`` of the same model and ``fuse`` (default None: built
            here). Engines of one model for several prompts share them: the fused weight copies
            are made once, and :func:`score_prompts` batches their rows together.
        attention: the rows' attention form, one of :data:`rmfast.fast.ops.ATTENTION_FORMS` (jobs: decided by
            :func:`rmfast.scoring.plan.choose_attention`; default None: the device's,
            :func:`rmfast.fast.ops.device_attention`). "cascade" runs the prompt pass in that form too
            (its response part alone). "block-diagonal" eagerly on CPU: the compiled layer's form, for tests.
            A "cascade" engine built inside :func:`rmfast.fast.wave.one_prompt_pass` waits for the wave's one packed
            prompt pass (``kv`` None until the block ends); every other engine encodes its prompt here.
        triton: the fused kernels (norm+head, log-prob, cascade) as Triton, else their torch twins (jobs: decided by
            :func:`rmfast.scoring.decisions.choose_kernels`; default None: :func:`rmfast.fast.ops.uses_triton` of
            the device, read here once). Never re-read per call.

    Example:
        >>> eng = Engine(model, tmpl, head="score")  # doctest: +SKIP
        >>> eng.score(torch.tensor([[1234], [5678]]))  # (2,) fp32  # doctest: +SKIP
    """

    def __init__(
        self, model, template: Template, *, head: str, head_index: int = 0, fuse: bool | None = None, compile: bool = False,
        fp32_head: bool = True, layers: list | None = None, attention: str | None = None, triton: bool | None = None,
        elementwise: bool | None = None,
    ):
        if head not in ("score", "logprob"):  # another value ran to a TypeError at the first score
            raise ValueError(f"head {head!r}: give 'score' or 'logprob'")
        spec = arch_spec(model)
        if spec is None:
            raise ValueError(f"architecture {model.config.model_type!r} is not on the fast path")
        self.spec: ArchSpec = spec
        self.model = model
        self.template = template
        self.head = head
        self.head_index = head_index
        self.fp32_head = bool(fp32_head)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        if head == "score" and spec.score_outputs is None:
            raise ValueError("head 'score' needs a reward head (model.score or a custom head)")
        self.score_head = None  # the model's reward head; self.row_head: what each row's final state meets
        if head == "score":
            hd = spec.score_head
            self.score_head = spec.custom_head or LinearHead(hd.weight, hd.bias, head_index)
        if head == "logprob" and spec.lm_head_weight is None:
            raise ValueError("head 'logprob' needs a language-model head (model.lm_head)")
        self.suffix = torch.tensor(template.suffix_ids, dtype=torch.long, device=self.device)
        self.continuation = torch.tensor(template.continuation_ids, dtype=torch.long, device=self.device)
        if fuse is None:
            fuse = self.device.type == "cpu"
        cpu = self.device.type == "cpu"
        self.attention = attention or ops.device_attention(self.device, bool(compile) and cpu)
        # compiled: the CPU layer, or elsewhere the layer around the Triton shared-prefix kernel (one opaque op,
        # :func:`rmfast.fast.ops.shared_prefix_attention`); the cascade's ragged rows and the reference run eagerly
        self.compile = bool(compile) and (cpu or self.attention == "triton")
        if self.attention not in ops.ATTENTION_FORMS:
            raise ValueError(f"unknown attention form {self.attention!r}; one of {ops.ATTENTION_FORMS}")
        self.triton = ops.uses_triton(self.device) if triton is None else bool(triton)  # (torch twins where False)
        if elementwise is None:
            elementwise = fused_elementwise(self.device, self.triton, self.compile)
        # per layer: (LayerWeights, LayerConsts), built once (or shared with the engines of other prompts)
        self.layers = layers if layers is not None else build_layers(spec, fuse, bool(elementwise))
        self._cu: dict = {}  # (rows, ...) -> the cascade's (n+1,) int32 offsets on the device
        self._packs = None  # per layer: the block-diagonal prompt K/V, built on first use
        self._layer_fn = None  # the compiled decoder layer, built on first use
        self._lm_update_fn = None
        self._compiled_rows: dict[int, int] = {}  # S -> rows of the compiled batch shape
        self._compile_checked = False
        self._prompt_shape()
        wave = _WAVE.get()
        if wave is not None and self.attention == "cascade":
            wave.append(self)  # encoded with the wave's other prompts in one pass (rmfast.fast.wave)
        else:
            self._encode_prefix()

    # ------------------------------------------------------------------ layers
    @torch.no_grad()
    def _run_layers(self, h: torch.Tensor, pos0: int, n_out: int, collect_kv: bool = False, taps: dict | None = None,
                    tap_at: torch.Tensor | None = None, lengths: torch.Tensor | None = None):
        """h: (B, S, Dm) embeddings at absolute positions pos0..pos0+S-1.

        Attends to the shared prefix K/V (self.kv) when pos0 > 0. Returns the last layer's
        residual stream at the final ``n_out`` positions, (B, n_out, Dm), and, if collect_kv,
        the per-layer (Hkv, S, D) keys/values of batch row 0 (used for the prefix pass).
        ``taps``: {k: None} for residual-stream indices k (0 = the embeddings, k = after decoder layer
        k); filled with each one's (B, Dm) state at the final position (or at ``tap_at``, see
        :meth:`_run_stack`), in the model dtype. ``lengths``: (B,) real positions per row (ragged rows,
        the cascade form skips keys after them), or None.
        """
        B, S, _ = h.shape
        if pos0 > 0 and self.compile:
            # One compiled graph per suffix length: smaller batches are padded to the compiled rows.
            rows = self._compiled_rows.setdefault(S, B)
            if B < rows:
                h = torch.cat([h, h[:1].expand(rows - B, -1, -1)])
                tap_at = None if tap_at is None else torch.cat([tap_at, tap_at[:1].expand(rows - B)])
            elif B > rows:
                self._compiled_rows[S] = B
            if not self._compile_checked:  # the first call compiles: seconds to a minute, say so
                print(f"rmfast: compiling the decoder layer for this {self.device.type.upper()} (one-off; inductor "
                      "caches it on disk) ...",
                      file=sys.stderr, flush=True)
                t0 = time.perf_counter()
            try:
                out = self._run_stack(h, pos0, n_out, self._compiled_layer(), None, taps, tap_at=tap_at)
                for k in taps or ():
                    taps[k] = taps[k][:B]  # (B, Dm): the padding rows dropped
            except Exception as e:  # the first compile failed: no C++ compiler, unsupported platform, ...
                if self._compile_checked:
                    raise
                first = (str(e).strip().splitlines() or [""])[0][:200]
                warnings.warn(f"rmfast: torch.compile failed ({type(e).__name__}: {first}); using the eager path",
                              stacklevel=3)
                self.compile = False
                if self.attention == "block-diagonal":
                    self.attention = "cpu-flash"  # what the eager layer runs instead
                return self._run_layers(h[:B], pos0, n_out, collect_kv, taps,
                                        None if tap_at is None else tap_at[:B], lengths)
            if not self._compile_checked:
                print(f"rmfast: compiled in {time.perf_counter() - t0:.1f} s (with the first batch)", file=sys.stderr,
                      flush=True)
            self._compile_checked = True
            return out[:B], None
        kvs = [] if collect_kv else None
        prompts = self._prompts(S, h, lengths) if pos0 > 0 else None
        return self._run_stack(h, pos0, n_out, decoder_layer, kvs, taps, tap_at=tap_at, prompts=prompts), kvs

    def _run_stack(self, h: torch.Tensor, pos0: int, n_out: int, layer_fn, kvs: list | None,
                   taps: dict | None = None, *, tap_at: torch.Tensor | None = None, rope: dict | None = None,
                   prompts: list | None = None, tap_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer through ``layer_fn`` (:func:`decoder_layer` or its compiled copy): (B, S, Dm) ->
        (B, n_out, Dm); only the last layer narrows to n_out. With ``kvs``, appends each layer's
        (Hkv, S, D) keys/values of row 0. With ``taps`` ({k: None}), stores a copy of the residual
        stream's final position, (B, Dm), at each index k asked: 0 = the input embeddings, k = the
        output of decoder layer k (1-based; HF's ``hidden_states`` indexing). Copies only: the
        arithmetic, and so every score, is the same with or without taps. ``tap_at``: (B,) each row's
        tap position counted back from the last (0: the last; ragged rows end earlier).
        ``rope`` (key -> (B, S, D) cos, sin) and ``prompts`` (per layer) given: rows of several
        prompts (:func:`score_prompts`); else this engine's prompt, positions pos0.. . ``tap_tokens``: (R,) the
        tap positions of a packed batch (h (1, T, Dm), every layer but the last returning all T, :class:`PackedRows`;
        the last runs its output projection and MLP at those R tokens only and returns (1, R, Dm))."""
        S = h.shape[1]

        def tap(x):  # (B, S', Dm) whose last position is S - 1 -> (B, Dm) copy at each row's tap position
            if tap_tokens is not None:
                return x[0, tap_tokens]  # (R, Dm): a gather is a copy
            if tap_at is None:
                return x[:, -1].clone()
            return x[torch.arange(x.shape[0], device=x.device), x.shape[1] - 1 - tap_at]

        if taps is not None and 0 in taps:
            taps[0] = tap(h)  # (B, Dm)
        if rope is None:
            rope = self.spec.rope(torch.arange(pos0, pos0 + S, device=h.device), h)  # key -> (S, D) cos, sin
        if prompts is None:
            prompts = self._prompts(S, h) if pos0 > 0 else [self._no_prompt(h)] * len(self.layers)
        last = len(self.layers) - 1
        for li, (w, c) in enumerate(self.layers):
            cos, sin = rope[c.rope_key]
            # The last layer (final positions only) runs the same function eagerly: compiled it would
            # be a second graph per suffix length (compile time, and torch.compile's recompile limit)
            # for ~1/n_layers of the work.
            fn = decoder_layer if li == last else layer_fn
            narrow = li == last and tap_tokens is not None  # packed rows: the last layer at each row's final token
            out = fn(h, w, cos, sin, prompts[li], c, n_out if li == last else S, kvs is not None,
                     **({"keep": tap_tokens} if narrow else {}))
            if kvs is None:
                h = out
            else:
                h, k, v = out  # k, v: (B, S, Hkv, D)
                kvs.append((k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()))  # (Hkv, S, D)
            if taps is not None and li + 1 in taps:
                taps[li + 1] = h[0].clone() if narrow else tap(h)  # (B, Dm)
        return h

    def _no_prompt(self, h: torch.Tensor) -> PromptKV | CascadePrompt:
        """The prompt pass attends only to itself: P = 0 prompt keys, the reference/Triton/CPU-flash form (its
        suffix part is a GEMM over all S keys; the packed form's is elementwise, meant for small S), or the
        cascade's response part alone (flash tiles on tensor cores, where the Triton form walks keys one by one)."""
        sp = self.spec
        empty = h.new_zeros(sp.n_kv_heads, 0, sp.head_dim)  # (Hkv, 0, D)
        if self.attention == "cascade":
            # the Triton response part's lengths (all S) made once for the pass, not a fill at each layer's launch
            full = torch.full((h.shape[0],), h.shape[1], dtype=torch.int32, device=h.device) if self.triton else None
            return self._cascade(empty, empty, (0,), (h.shape[0],), full)
        return PromptKV(empty, empty, self.attention)

    def _cascade(self, k, v, kv_lens: tuple, rows: tuple, lengths) -> CascadePrompt:
        """A :class:`CascadePrompt` over K/V (Hkv, sum P_i, D) of prompts with ``kv_lens`` keys and ``rows`` rows."""
        key = (kv_lens, rows)
        if key not in self._cu:  # a few tiny host-to-device copies per batch shape, not per layer
            cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device=self.device)
                  for x in (kv_lens, rows)]
            self._cu = {key: cu}  # only the last shape is kept: ragged waves rarely repeat one
        cu_kv, cu_rows = self._cu[key]
        if lengths is not None:
            lengths = lengths.to(device=self.device, dtype=torch.int32)
        return CascadePrompt(k, v, cu_kv, cu_rows, max(rows), lengths, self.triton)

    def _prompts(self, S: int, h: torch.Tensor, lengths: torch.Tensor | None = None) -> list:
        """Per layer, the prompt K/V in the form that picks the attention for S-token rows (``lengths``: (B,)
        real positions per row, read by the cascade form)."""
        if self.attention == "cascade":
            return [self._cascade(k, v, (self.P,), (h.shape[0],), lengths) for k, v in self.kv]
        if not self._use_packed(h):
            return [PromptKV(k, v, self.attention) for k, v in self.kv]
        if self._packs is None:
            self._packs = [ops.pack_prefix(k, v, self.spec.n_heads) for k, v in self.kv]
        masks = {}  # window -> (pre_bias, suf_bias) for all S query positions
        out = []
        for (k_bd, v_bd), (_, c) in zip(self._packs, self.layers):
            if c.window not in masks:
                masks[c.window] = ops.visibility_bias(self.P, S, S, c.window, torch.float32, h.device)
            out.append(PackedPrompt(k_bd, v_bd, *masks[c.window]))
        return out

    def _use_packed(self, h: torch.Tensor) -> bool:
        """Block-diagonal prompt attention: the compiled CPU layer's form (its layouts are the compiled
        layer's, and inductor fuses the rest), eagerly only where asked for (tests): eager, its H-fold zero
        blocks cost more than the ``bmm`` form saves (measured: docs/design.md)."""
        return h.device.type == "cpu" and self.attention == "block-diagonal"

    # ------------------------------------------------------------------ compiled CPU layers
    def blockdiag_overhead(self) -> float:
        """:func:`blockdiag_overhead` of this engine's model and prompt."""
        return blockdiag_overhead(self.spec, len(self.template.prefix_ids))

    def _compiled_layer(self):
        """The engine's own compiled copy of :func:`decoder_layer` (one graph per batch shape)."""
        if self._layer_fn is None:
            self._layer_fn = compile_layer(_own_copy(decoder_layer))
        return self._layer_fn

    def _compiled_lm_update(self):
        if self._lm_update_fn is None:
            self._lm_update_fn = compile_here(_own_copy(ops.lse_update))
        return self._lm_update_fn

    def _final_norm(self, h: torch.Tensor, fp32: bool) -> torch.Tensor:
        sp = self.spec
        return ops.rmsnorm(h, sp.final_norm.weight, sp.norm_eps, gemma_style=sp.gemma_norm, fp32=fp32)

    def _prompt_shape(self) -> None:
        """The prompt's length P and the first position its pass must return (gate_pos), before that pass."""
        prefix = list(self.template.prefix_ids)
        self.P = P = len(prefix)
        self.gate_pos = P - 1  # the first prefix position the head reads (a gated head: its gating position)
        if isinstance(self.score_head, GatedHead):
            g = self.score_head.gate_position(prefix)
            if g is None:
                raise UserError(f"the prompt has no gating pattern {self.score_head.pattern}: this gated reward "
                                f"model reads its gating position at the end of the user turn (use its chat template)")
            self.gate_pos = g
        self.kv = None  # set by the prompt pass (this engine's own, or a wave's: rmfast.fast.wave.encode_prompts)

    @torch.no_grad()
    def _encode_prefix(self) -> None:
        """The prompt's own pass: batch 1, causal over its P tokens."""
        ids = torch.tensor([list(self.template.prefix_ids)], dtype=torch.long, device=self.device)  # (1, P)
        h, kvs = self._run_layers(self.spec.embed(ids), 0, self.P - self.gate_pos, collect_kv=True)  # (1, P - gate_pos, Dm)
        self._set_prefix(h, kvs)

    def _set_prefix(self, h: torch.Tensor, kvs: list) -> None:
        """The prompt pass's results, however it ran: h (1, P - gate_pos, Dm), the last layer's residual stream
        from the gating position on; kvs per layer (Hkv, P, D) keys/values (roped)."""
        sp = self.spec
        self.kv = kvs  # per layer: (Hkv, P, D) — the ONE shared copy
        self.prefix_logprobs = None
        self.row_head = self.score_head
        if isinstance(self.score_head, GatedHead):
            # The gating depends on the prompt only: one (1, D) vector per prompt, score = v . h_final.
            self.prefix_states = self._final_norm(h[0], True)  # (P - gate_pos, Dm) fp32, from the gating position on
            v = self.score_head.fold(self.score_head.gate(self.prefix_states[:1]))  # (1, Dm)
            self.row_head = LinearHead(v)
        if self.head == "logprob":
            # log p(first response token | prefix) for every vocabulary id: one row, all of V.
            # One row over the whole vocabulary: a plain GEMM + log_softmax is the cheapest form.
            hn = self._final_norm(h[0, -1:], self.fp32_head)  # (1, Dm)
            W = sp.lm_head_weight
            logits = torch.cat([(hn @ W[v0 : v0 + 32768].to(hn.dtype).t()).float()[0]  # chunks: no fp32 copy of W
                                for v0 in range(0, W.shape[0], 32768)])  # (V,)
            self.prefix_logprobs = ops.vocab_logprobs(logits, final_softcap=sp.final_logit_softcap)  # (V,) fp32

    def _head_scores(self, h: torch.Tensor) -> torch.Tensor:
        """h: (B, Dm) last-layer states at the final position -> (B,) fp32 scores of the row head."""
        sp, hd = self.spec, self.row_head
        if isinstance(hd, LinearHead):
            fp32 = self.fp32_head or self.spec.custom_head is not None
            out = ops.rmsnorm_head(h, sp.final_norm.weight, sp.norm_eps, hd.weight, hd.bias, gemma_style=sp.gemma_norm,
                                   fp32=fp32, triton=self.triton)
            return out[:, hd.index]
        return hd(self._final_norm(h, True))  # a nonlinear head (URM): its own fp32 maths

    def _regated_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows whose own tokens hold a later gating pattern (its last occurrence moves there), and
        that occurrence's absolute start. ids: (B, S)."""
        pat = torch.tensor(self.score_head.pattern, device=ids.device)
        L = pat.numel()
        tail = torch.tensor(self.template.prefix_ids[self.gate_pos + 1 :], dtype=torch.long, device=ids.device)
        seq = torch.cat([tail.expand(ids.shape[0], -1), ids], dim=1)  # (B, T + S): positions gate_pos+1 ..
        if seq.shape[1] < L:
            return ids.new_zeros(0), ids.new_zeros(0)
        hit = (seq.unfold(1, L, 1) == pat).all(-1)  # (B, W)
        rows = hit.any(-1).nonzero()[:, 0]
        last = hit.shape[1] - 1 - hit[rows].flip(-1).int().argmax(-1)  # last window start per row
        return rows, last + self.gate_pos + 1

    def _score_regated(self, ids: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Scores of rows gated inside their own tokens (or the prompt tail): every position of those rows."""
        S = ids.shape[1]
        h, _ = self._run_layers(self.spec.embed(ids[rows]), self.P, S)  # (R, S, Dm)
        hn = self._final_norm(h, True)  # (R, S, Dm)
        own = (pos - self.P).clamp(min=0)
        gate = torch.where((pos >= self.P)[:, None], hn[torch.arange(len(rows)), own],
                           self.prefix_states[(pos - self.gate_pos).clamp(max=self.prefix_states.shape[0] - 1)])
        return self.score_head(hn[:, -1], gate)

    # ------------------------------------------------------------------ scoring
    def can_score_ragged(self) -> bool:
        """Whether :meth:`score_ragged` serves this engine (:func:`ragged_ok`)."""
        return ragged_ok(self.head, self.score_head)

    def score_ragged(self, responses: torch.Tensor, lengths: torch.Tensor, taps: set | None = None):
        """Rows of different lengths in one batch: (B, n) right-padded ids, (B,) response lengths -> (B,) fp32
        (with ``taps``: (scores, {k: (B, Dm)}) at each row's own final position). :func:`score_prompts`
        with this engine alone."""
        return score_prompts([self], [responses], [lengths], taps)

    def tokens_per_row(self, n: int) -> int:
        """Tokens a row of an n-token response feeds through the layers."""
        if self.head == "score":
            return n + len(self.suffix)
        return n - 1 + len(self.continuation)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def lens(self, states: dict) -> torch.Tensor:
        """The reward lens: the row head read through the final norm at every residual-stream index
        in ``states`` ({k: (B, Dm) model-dtype final-position states}, as :meth:`score` returns them).
        Returns (B, len(states)) fp32, columns in the dict's order; index n_layers is the score itself,
        bit for bit (the same function of the same tensor), except rows a gated head re-gated in their
        own tokens (:meth:`_regated_rows`): NaN there, their head is another vector."""
        out = torch.stack([self._head_scores(h) for h in states.values()], dim=1)  # (B, K)
        if isinstance(self.score_head, GatedHead) and getattr(self, "_last_regated", None) is not None:
            out[self._last_regated] = float("nan")
        return out

    def states_position_ok(self) -> bool:
        """Whether rows have a per-row pass whose final position holds their states (a logprob head
        on a template with no continuation scores one-token responses from the prompt pass alone)."""
        return self.head == "score" or len(self.continuation) > 0

    @torch.no_grad()
    def score(self, responses: torch.Tensor, taps: set | None = None):
        """responses: (B, n) token ids, all of one length n >= 1. Returns (B,) fp32 scores.

        ``taps``: residual-stream indices 0..n_layers (0: the embeddings, k: after decoder layer k;
        n_layers: what the final norm reads). Then returns (scores, {k: (B, Dm)}) with each index's
        state at the final position of the row's own pass, in the model dtype: the sequence's final
        position for the score head, the position that predicts the last continuation token for
        the logprob head (:meth:`states_position_ok`). Rows of several lengths: :meth:`score_ragged`.
        """
        sp = self.spec
        responses = responses.to(self.device)
        B, n = responses.shape
        tap = None if taps is None else dict.fromkeys(sorted(taps))
        if self.head == "score":
            ids = torch.cat([responses, self.suffix.expand(B, -1)], dim=1)  # (B, n + len(suffix))
            h, _ = self._run_layers(sp.embed(ids), self.P, 1, taps=tap)  # (B, 1, Dm)
            out = self._head_scores(h[:, 0])  # (B,)
            self._last_regated = None
            if isinstance(self.score_head, GatedHead):
                rows, pos = self._regated_rows(ids)
                if rows.numel():
                    out[rows] = self._score_regated(ids, rows, pos)
                    self._last_regated = rows
            return out if tap is None else (out, tap)
        # logprob head
        total = self.prefix_logprobs[responses[:, 0]].clone()  # (B,)
        targets = torch.cat([responses[:, 1:], self.continuation.expand(B, -1)], dim=1)  # (B, n-1+m)
        T = targets.shape[1]
        if T == 0:
            if tap is not None:
                raise ValueError("no per-row pass to take states from (a logprob head, one-token responses, no continuation)")
            return total
        ids = torch.cat([responses, self.continuation[:-1].expand(B, -1)], dim=1)[:, :T]  # (B, T)
        h, _ = self._run_layers(sp.embed(ids), self.P, T, taps=tap)  # (B, T, Dm)
        lp = ops.rmsnorm_lmhead_logprob(
            h.reshape(B * T, -1),
            sp.final_norm.weight,
            sp.norm_eps,
            sp.lm_head_weight,
            targets.reshape(-1),
            gemma_style=sp.gemma_norm,
            final_softcap=sp.final_logit_softcap,
            update_fn=self._compiled_lm_update() if self.compile else None,
            triton=self.triton,
            pad_rows=self._compiled_rows.get(T, B) * T if self.compile else None,
            fp32=self.fp32_head,
        )
        out = total + lp.view(B, T).sum(-1)
        return out if tap is None else (out, tap)


def ragged_ok(head: str, score_head) -> bool:
    """Whether rows of several lengths or prompts may share one batch (:func:`score_prompts`: right-padded,
    each row read at its own final position): a score head read at ONE position per row. Not a gated head
    (ArmoRM/QRM: a row may re-gate inside its own tokens, :meth:`Engine._regated_rows`), not the logprob
    head (it reads every position of a row). ``score_head``: the engine's, or, before one is built, the
    model's custom head (:attr:`rmfast.fast.arch.ArchSpec.custom_head`; None for a linear head).

    The one rule: :meth:`Engine.can_score_ragged` (hence :func:`score_prompts` and
    :func:`rmfast.scoring.plan.score_together`) and the scorer's batch grouping
    (:meth:`rmfast.scoring.scorer.RewardScorer._ragged_ok`) ask it.
    """
    return head == "score" and not isinstance(score_head, GatedHead)


def blockdiag_overhead(spec: ArchSpec, P: int) -> float:
    """Extra FLOPs of the block-diagonal prompt attention for a P-token prompt, as a fraction of a layer's
    projection FLOPs: H x the prompt-attention work, so it grows with prompt length and head count (SmolLM2,
    42-token prompt: 0.12; Llama-3-8B, 50 tokens: 0.06; 1,000 tokens: 1.2). The eager CPU engine uses that
    form (with EAGER_PACKED) only while this is <= :data:`MAX_BLOCKDIAG_EXTRA`."""
    L0 = spec.layers[0]
    H, D = spec.n_heads, spec.head_dim
    layer_flops = 2 * sum(p.numel() for m in L0.linears() for p in m.parameters())
    return 4 * H * H * D * P / layer_flops  # per token per layer: prompt scores + values, all heads' blocks


def fused_elementwise(device: torch.device, triton: bool, compiled: bool) -> bool:
    """Whether the decoder layer's norms, RoPE and SiLU·up run as Triton kernels (:attr:`LayerConsts.fused`): on
    CUDA with the Triton kernels, where the layer runs eagerly (a compiled layer gets inductor's fusion; the CPU
    has no Triton). The plan's "elementwise" decision (:mod:`rmfast.scoring.decisions`) is this rule."""
    return torch.device(device).type == "cuda" and bool(triton) and not compiled


def _ragged_ids(eng: Engine, responses: torch.Tensor, lengths: torch.Tensor, S: int,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) ids ``responses[i, :L_i] ⊕ suffix ⊕ pads`` and (B,) each row's final position (on ``device``,
    default the engine's)."""
    dev = device or eng.device
    responses, lengths = responses.to(dev), lengths.to(dev).long()
    B, n = responses.shape
    m = len(eng.suffix)
    ids = responses.new_zeros(B, S)  # pads are id 0, after each row's end
    ids[:, :n] = responses
    cols = lengths[:, None] + torch.arange(m, device=dev)  # (B, m): where each row's suffix goes
    suffix = eng.suffix if eng.suffix.device == torch.device(dev) else torch.tensor(eng.template.suffix_ids, dtype=torch.long)
    ids.scatter_(1, cols, suffix.expand(B, -1))
    return ids, lengths + m - 1


def _packed_rows_pass(engines: list[Engine], responses: list[torch.Tensor], lengths: list[torch.Tensor], S: int,
                      tap: dict | None) -> torch.Tensor:
    """:func:`score_prompts`'s rows' pass with the rows packed back to back (:class:`PackedRows`): (1, T, Dm)
    through every layer, T the rows' real tokens (response ⊕ suffix), nothing padded; -> (B, Dm) last-layer
    states at each row's final token (``tap`` filled there too). The packing is built on the host (ids,
    positions, offsets: no device sync) and copied once."""
    e0, dev = engines[0], engines[0].device
    parts = [_ragged_ids(e, r, n, S, torch.device("cpu")) for e, r, n in zip(engines, responses, lengths)]
    ids = torch.cat([p[0] for p in parts])  # (B, S) on the host
    lens = torch.cat([p[1] for p in parts]) + 1  # (B,) real tokens per row
    rows = [p[0].shape[0] for p in parts]
    B, T = ids.shape[0], int(lens.sum())
    flat = ids[torch.arange(S)[None, :] < lens[:, None]]  # (T,) rows back to back, row-major
    cu = torch.zeros(B + 1, dtype=torch.long)
    cu[1:] = lens.cumsum(0)  # row r's tokens at cu[r]:cu[r+1]
    row_of = torch.repeat_interleave(torch.arange(B), lens)  # (T,)
    P_row = torch.repeat_interleave(torch.tensor([e.P for e in engines]), torch.tensor(rows))  # (B,)
    place = torch.arange(T) - cu[row_of]  # (T,) each token's place in its row
    pos = place + P_row[row_of]  # (T,) absolute positions: P_i + the token's place in its row
    cu_rows = [0, *torch.tensor(rows).cumsum(0).tolist()]
    cu_q = cu[cu_rows]  # (n+1,) prompt i's rows' tokens
    max_q, max_len = int((cu_q[1:] - cu_q[:-1]).max()), int(lens.max())
    cu_kv = [0, *torch.tensor([e.P for e in engines]).cumsum(0).tolist()]
    flat, pos, place, cu_d, cu_q_d, cu_kv_d = (t.to(dev, non_blocking=True) for t in (
        flat, pos, place.int(), cu.int(), cu_q.int(), torch.tensor(cu_kv, dtype=torch.int32)))
    h = e0.spec.embed(flat[None])  # (1, T, Dm)
    rope = ops.rope_tables(e0.spec.rope, pos, h, e0.spec.rope_max_len)  # key -> (T, D) cos, sin (each alike)
    one = len(engines) == 1  # one prompt: its K/V as they are, no per-layer concatenation
    prompts = [PackedRows(e0.kv[li][0] if one else torch.cat([e.kv[li][0] for e in engines], 1),
                          e0.kv[li][1] if one else torch.cat([e.kv[li][1] for e in engines], 1),
                          cu_kv_d, cu_q_d, max_q, cu_d, max_len, place, e0.triton) for li in range(len(e0.layers))]
    final = cu_d[1:].long() - 1  # (B,) each row's final token
    h = e0._run_stack(h, e0.P, T, decoder_layer, None, tap, rope=rope, prompts=prompts, tap_tokens=final)
    return h[0]  # (B, Dm): the last layer ran at each row's final token only


@torch.no_grad()
def score_prompts(engines: list[Engine], responses: list[torch.Tensor], lengths: list[torch.Tensor],
                  taps: set | None = None, packed: bool | None = None):
    """Rows of one or several prompts, of different lengths, in ONE batch -> (B,) fp32 scores, the rows of
    ``engines[0]`` first, then ``engines[1]``'s, ... (with ``taps``: (scores, {k: (B, Dm)}) as
    :meth:`Engine.score` returns them, each at the row's own final position).

    ``engines``: one per prompt, sharing ``layers`` (the ``layers=`` argument) and a score head read at
    one position (:meth:`Engine.can_score_ragged`); ``responses[i]``: (B_i, n_i) right-padded ids
    (any ids after the end), ``lengths[i]``: (B_i,) their lengths. Row r of prompt i runs
    ``responses[i][r, :L] ⊕ suffix_i`` at positions P_i, P_i + 1, ... and then pad ids; attention is
    causal, so the pads (after every real token) change nothing a row's final position sees. The
    projections and the MLP run over all rows at once (wider GEMMs than any one prompt's rows give);
    attention reads each prompt's own K/V (:class:`rmfast.fast.layer.MultiPrompt`, a call per prompt; in the
    cascade form :class:`rmfast.fast.layer.CascadePrompt`, one call for all, ``engines[0].attention`` deciding). Equal to scoring
    each row alone to fp32 rounding (other GEMM shapes), not bit for bit. One engine: its own path,
    compiled where it compiles; several: eager.

    In the cascade form the rows do not run right-padded at all: they are packed back to back, (1, T, Dm) with T
    the real tokens, every layer's GEMMs over those only, attention :class:`rmfast.fast.layer.PackedRows` (eager;
    one pass whatever the rows' lengths; a sliding window by each token's own position). ``packed``: the caller's
    plan decided it (the "rows" decision, :attr:`rmfast.scoring.decisions.Decisions.packed_rows`; ``rmfast serve``
    packs in every form, the torch twin on CPU); None: the cascade form packs.
    """
    e0 = engines[0]
    if any(e.layers is not e0.layers or not e.can_score_ragged() for e in engines):
        raise ValueError("score_prompts needs engines that share layers, each with a score head read at one position")
    S = max(r.shape[1] + len(e.suffix) for e, r in zip(engines, responses))
    tap = None if taps is None else dict.fromkeys(sorted(taps))
    if packed is None:
        packed = e0.attention == "cascade"
    if packed:
        out = e0._head_scores(_packed_rows_pass(engines, responses, lengths, S, tap))
        return out if tap is None else (out, tap)
    ends = [int(n.max()) + len(e.suffix) if n.numel() else 1 for e, n in zip(engines, lengths)]  # a prompt's longest
    parts = [_ragged_ids(e, r, n, S) for e, r, n in zip(engines, responses, lengths)]
    ids = torch.cat([p[0] for p in parts])  # (B, S)
    back = S - 1 - torch.cat([p[1] for p in parts])  # (B,) each row's final position, counted from the last
    n_out = int(back.max()) + 1  # the last layer computes the last n_out positions
    h = e0.spec.embed(ids)  # (B, S, Dm)
    lengths = S - back  # (B,) real positions per row: the cascade form never reads keys after them
    if len(engines) == 1:
        h, _ = e0._run_layers(h, e0.P, n_out, taps=tap, tap_at=back, lengths=lengths)  # (B, n_out, Dm)
    else:
        rows = tuple(p[0].shape[0] for p in parts)
        # key -> (S, D) x2; a prompt's positions end at its own longest row (the pads after it repeat that angle:
        # causal rows never read them), so a length-dependent RoPE (LongRoPE) sees no sequence longer than a real one
        tables = [e.spec.rope(torch.arange(e.P, e.P + S, device=e.device).clamp(max=e.P + n - 1), h)
                  for e, n in zip(engines, ends)]
        rope = {key: tuple(torch.cat([t[key][j].expand(b, -1, -1) for t, b in zip(tables, rows)]) for j in (0, 1))
                for key in tables[0]}  # key -> (B, S, D) cos, sin per row
        if e0.attention == "cascade":  # every prompt's rows in ONE attention call per layer
            kv_lens = tuple(e.P for e in engines)
            prompts = [e0._cascade(torch.cat([e.kv[li][0] for e in engines], 1), torch.cat([e.kv[li][1] for e in engines], 1),
                                   kv_lens, rows, lengths) for li in range(len(e0.layers))]  # K/V (Hkv, sum P_i, D)
        else:
            prompts = [MultiPrompt(tuple(PromptKV(*e.kv[li], e.attention) for e in engines), rows)
                       for li in range(len(e0.layers))]
        h = e0._run_stack(h, e0.P, n_out, decoder_layer, None, tap, tap_at=back, rope=rope, prompts=prompts)
    h = h[torch.arange(h.shape[0], device=h.device), n_out - 1 - back]  # (B, Dm)
    out = e0._head_scores(h)
    return out if tap is None else (out, tap)

