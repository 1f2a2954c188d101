"""A wave's prompts in ONE batched prefill (issue 33): :func:`encode_prompts` and :func:`one_prompt_pass`.

The scorer shares batches between the rows of a wave of conversations (:meth:`rmfast.scoring.scorer.RewardScorer._waves`);
without this, each conversation's engine runs its own prompt pass (:meth:`rmfast.fast.engine.Engine._encode_prefix`):
batch-1 GEMMs and a layer's kernel launches per prompt. Here the prompts run packed back to back, (1, sum P_i, Dm),
with no padding in the GEMMs, norms or MLP, and a fixed number of launches per layer for the whole wave; attention
is each prompt's causal attention over its own tokens, the cascade's response part on one row per prompt
(:class:`rmfast.fast.layer.PackedPrompts`). Each engine ends up exactly as its own pass leaves it (K/V, gated head,
prompt log-probs), to fp32 rounding (other GEMM shapes): ``tests/test_prompt_wave.py``.

Only for engines in the cascade form (CUDA's form for texts): on CPU each prompt keeps its own pass.
"""

from __future__ import annotations

import contextlib

import torch

from .engine import _WAVE, Engine
from .layer import PackedPrompts, decoder_layer


@contextlib.contextmanager
def one_prompt_pass():
    """Engines in the cascade form built inside this block wait for their prompt pass; on leaving it, ONE
    batched pass encodes all their prompts (:func:`encode_prompts`). Engines of other forms encode their
    prompt as they are built, as always. A block, not an argument: the scorer builds a wave's engines one by
    one through its plans (:meth:`rmfast.scoring.scorer.RewardScorer._encode_wave`), and nothing between it
    and the engine has to pass a flag down. If the block raises, the waiting engines stay unencoded (``kv``
    None): the caller drops them."""
    wave: list = []
    token = _WAVE.set(wave)
    try:
        yield wave
    finally:
        _WAVE.reset(token)
    encode_prompts(wave)


@torch.no_grad()
def encode_prompts(engines: list[Engine]) -> None:
    """The prompt passes of several engines (one per prompt) in ONE batched prefill, each engine's K/V, gated
    head and prompt log-probs set as its own pass would set them (to fp32 rounding: other GEMM shapes).

    The prompts run as variable-length rows, packed back to back with no padding, (1, sum P_i, Dm): every
    projection and MLP GEMM is one wide GEMM for the wave, and each layer launches a fixed number of kernels
    whatever the number of prompts (one cascade response-part launch; :class:`rmfast.fast.layer.PackedPrompts`),
    where one pass per prompt launches a layer's kernels per prompt, with batch-1 GEMMs. Attention: each
    prompt causal over its own tokens, RoPE from each prompt's own tables (positions 0..P_i-1). The last
    layer runs every position (the heads read 1 to a few per prompt: 1/n_layers of the pass).

    Batched only for engines in the cascade form (CUDA's form for texts, decided where the engine's attention
    is, :func:`rmfast.scoring.plan.choose_attention`) that share ``layers`` with the first such engine: its
    ragged causal attention is what packs them (prompts of very different lengths: a few packed passes,
    :func:`_length_groups`). Any other engine is encoded alone, as on CPU, whose forms run one prompt per
    call (CPU GEMMs already run near peak at a few hundred tokens, docs/backend.md; not re-measured here).
    """
    batch = [e for e in engines if e.attention == "cascade" and e.layers is engines[0].layers] if engines else []
    if len(batch) < 2:
        batch = []
    for e in engines:
        if not any(e is b for b in batch):
            e._encode_prefix()
    for group in _length_groups(batch):
        _encode_packed(group)


#: a packed prompt pass scatters its prompts to one row each of the longest one's length for attention: it takes
#: prompts (shortest first) while those rows hold at most this many times its real tokens (memory and pad tiles)
MAX_PACKED_PAD = 2.0


def _length_groups(engines: list[Engine]) -> list[list[Engine]]:
    """Engines cut into packed passes, shortest prompt first: a group grows while n · P_max <= MAX_PACKED_PAD · sum
    P_i. Prompts of similar lengths (a wave's, usually) are one group; one very long prompt among short ones
    gets its own pass rather than rows of its length for every short one."""
    groups: list[list[Engine]] = []
    for e in sorted(engines, key=lambda e: e.P):
        g = groups[-1] if groups else None
        if g is not None and (len(g) + 1) * e.P <= MAX_PACKED_PAD * (sum(x.P for x in g) + e.P):
            g.append(e)
        else:
            groups.append([e])
    return groups


def _encode_packed(batch: list[Engine]) -> None:
    """One packed prompt pass for ``batch`` (sharing layers, cascade form): see :func:`encode_prompts`."""
    if len(batch) == 1:  # its own pass: the last layer at the read positions only
        return batch[0]._encode_prefix()
    e0 = batch[0]
    lens = [e.P for e in batch]
    n, T, Pm, dev = len(batch), sum(lens), max(lens), e0.device
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]  # prompt i's tokens at cu[i]:cu[i+1]
    ids = torch.tensor([t for e in batch for t in e.template.prefix_ids], dtype=torch.long, device=dev)  # (T,)
    h = e0.spec.embed(ids[None])  # (1, T, Dm)
    tables = [e.spec.rope(torch.arange(e.P, device=dev), h) for e in batch]  # key -> (P_i, D) cos, sin
    rope = {key: tuple(torch.cat([t[key][j] for t in tables]) for j in (0, 1)) for key in tables[0]}  # key -> (T, D)
    index = torch.cat([i * Pm + torch.arange(P) for i, P in enumerate(lens)]).to(dev)  # (T,) places in (n·P_max)
    empty = h.new_zeros(e0.spec.n_kv_heads, 0, e0.spec.head_dim)  # (Hkv, 0, D): no prompt part
    packed = PackedPrompts(index, Pm, e0._cascade(empty, empty, (0,), (n,), torch.tensor(lens)))  # lengths (n,)
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
