"""A wave's prompts in ONE batched prefill (issue 33): :func:`encode_prompts` and :func:`one_prompt_pass`.

The scorer shares batches between the rows of a wave of conversations (:meth:`rmfast.scoring.scorer.RewardScorer._waves`);
without this, each conversation's engine runs its own prompt pass (:meth:`rmfast.fast.engine.Engine._encode_prefix`):
batch-1 GEMMs and a layer's kernel launches per prompt. Here the prompts run packed back to back, (1, sum P_i, Dm),
with no padding anywhere, and a fixed number of launches per layer for the whole wave; attention is each
prompt's causal attention over its own tokens, the cascade's response part in the varlen layout run on the
packed q/k/v as they are (:class:`rmfast.fast.layer.PackedPrompts`, ``cu_seqlens``): one launch per layer, no
scatter to padded rows, so a wave's prompts of any lengths go in ONE pass. Each engine ends up exactly as its own
pass leaves it (K/V, gated head, prompt log-probs), to fp32 rounding (other GEMM shapes): ``tests/test_prompt_wave.py``.

Only for engines in the cascade form (CUDA's form for texts): on CPU each prompt keeps its own pass.
"""

from __future__ import annotations

import contextlib

import torch

from .engine import _WAVE, Engine
from .layer import PackedPrompts, decoder_layer


@contextlib.contextmanager
def one_prompt_pass(packed_alone: bool = False):
    """Engines in the cascade form built inside this block wait for their prompt pass; on leaving it, ONE
    batched pass encodes all their prompts (:func:`encode_prompts`). Engines of other forms encode their
    prompt as they are built, as always. A block, not an argument: the scorer builds a wave's engines one by
    one through its plans (:meth:`rmfast.scoring.scorer.RewardScorer._encode_wave`), and nothing between it
    and the engine has to pass a flag down. If the block raises, the waiting engines stay unencoded (``kv``
    None): the caller drops them. ``packed_alone``: a wave of one prompt runs the packed prefill too (``rmfast serve``:
    a prompt's keys/values then come from one code path whatever else its wave brought)."""
    wave: list = []
    token = _WAVE.set(wave)
    try:
        yield wave
    finally:
        _WAVE.reset(token)
    encode_prompts(wave, packed_alone)


@torch.no_grad()
def encode_prompts(engines: list[Engine], packed_alone: bool = False) -> None:
    """The prompt passes of several engines (one per prompt) in ONE batched prefill, each engine's K/V, gated
    head and prompt log-probs set as its own pass would set them (to fp32 rounding: other GEMM shapes).

    The prompts run as variable-length rows, packed back to back with no padding, (1, sum P_i, Dm): every
    projection and MLP GEMM is one wide GEMM for the wave, and each layer launches a fixed number of kernels
    whatever the number of prompts (one varlen response-part launch on the packed q/k/v, no scatter to padded
    rows; :class:`rmfast.fast.layer.PackedPrompts`), where one pass per prompt launches a layer's kernels per
    prompt, with batch-1 GEMMs. Attention: each
    prompt causal over its own tokens, RoPE from each prompt's own tables (positions 0..P_i-1). The last
    layer runs every position (the heads read 1 to a few per prompt: 1/n_layers of the pass).

    Batched only for engines in the cascade form (CUDA's form for texts, decided where the engine's attention
    is, :func:`rmfast.scoring.plan.choose_attention`) that share ``layers`` with the first such engine: its
    varlen causal attention is what packs them, prompts of any lengths in ONE pass (nothing is padded, so a
    long prompt among short ones costs only its own tokens; the wave's size is bounded upstream by its prompt
    K/V bytes, :data:`rmfast.scoring.scorer.WAVE_KV_BYTES`). Any other engine is encoded alone, as on CPU,
    whose forms run one prompt per call (CPU GEMMs already run near peak at a few hundred tokens,
    docs/backend.md; not re-measured here).
    """
    batch = [e for e in engines if e.attention == "cascade" and e.layers is engines[0].layers] if engines else []
    if len(batch) < (1 if packed_alone else 2):
        batch = []
    for e in engines:
        if not any(e is b for b in batch):
            e._encode_prefix()
    if batch:  # every length in one pass: nothing is padded
        _encode_packed(batch, packed_alone)


def _encode_packed(batch: list[Engine], packed_alone: bool = False) -> None:
    """One packed prompt pass for ``batch`` (sharing layers, cascade form): see :func:`encode_prompts`."""
    if len(batch) == 1 and not packed_alone:  # its own pass: the last layer at the read positions only
        return batch[0]._encode_prefix()
    e0 = batch[0]
    lens = [e.P for e in batch]
    T, dev = sum(lens), e0.device
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]  # prompt i's tokens at cu[i]:cu[i+1]
    ids = torch.tensor([t for e in batch for t in e.template.prefix_ids], dtype=torch.long, device=dev)  # (T,)
    h = e0.spec.embed(ids[None])  # (1, T, Dm)
    tables = [e.spec.rope(torch.arange(e.P, device=dev), h) for e in batch]  # key -> (P_i, D) cos, sin
    rope = {key: tuple(torch.cat([t[key][j] for t in tables]) for j in (0, 1)) for key in tables[0]}  # key -> (T, D)
    packed = PackedPrompts(torch.tensor(cu, dtype=torch.int32, device=dev), max(lens), e0.triton)
    kvs: list = []
    h = e0._run_stack(h, 0, T, decoder_layer, kvs, rope=rope, prompts=[packed] * len(e0.layers))  # (1, T, Dm)
    own: list = [[] for _ in batch]  # per prompt, per layer: its own (Hkv, P_i, D) copies (cached plans own theirs)
    for li in range(len(kvs)):
        k, v = kvs[li]  # (Hkv, T, D)
        kvs[li] = None  # the packed layer freed as it is split: the wave's K/V held about once
        for i, o in enumerate(own):
            o.append((k[:, cu[i] : cu[i + 1]].contiguous(), v[:, cu[i] : cu[i + 1]].contiguous()))
    for i, e in enumerate(batch):
        e._set_prefix(h[:, cu[i] + e.gate_pos : cu[i + 1]], own[i])  # (1, P_i - gate_pos, Dm)
