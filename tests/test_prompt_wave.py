"""A wave's prompts in ONE batched prefill (issue 33): :func:`rmfast.fast.wave.encode_prompts` and
:func:`~rmfast.fast.wave.one_prompt_pass` against each prompt encoded alone (fp32 K/V, gated-head states,
prompt log-probs and scores, every tiny architecture, the cascade's torch twin and its Triton kernels
interpreted), the scorer's use of it, and the Triton launches and compilations of one scorer call: a
fixed number per layer for a wave of any size, and no new compilation for new lengths.

No GPU here: the Triton kernels run in the interpreter (small shapes). Compilations are counted as Triton
counts them on CUDA: each launch's cache key from Triton's own argument binder
(:func:`triton.runtime.jit.create_function_from_signature`: the constexprs and the integer/pointer
specialisations, divisible by 16 or equal to 1), which is what picks a compiled variant there.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is first imported (tests/conftest.py too)
    os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tiny_models as T  # noqa: E402
from rmfast.fast.engine import Engine  # noqa: E402
from rmfast.fast.wave import encode_prompts, one_prompt_pass  # noqa: E402
from rmfast.template import build_template  # noqa: E402

CUDA = torch.cuda.is_available()
SKIP_TRITON = "" if importlib.util.find_spec("triton") else "triton is not installed"
if not SKIP_TRITON:
    from rmfast.kernels import triton_cascade as tc

    if not CUDA and type(tc._prompt_kernel).__name__ != "InterpretedFunction":
        SKIP_TRITON = "triton was imported before TRITON_INTERPRET=1 was set (see tests/conftest.py)"
requires_triton = pytest.mark.skipif(bool(SKIP_TRITON), reason=SKIP_TRITON or "-")

# prompts of 21, 82, 23 and 67 tokens under the ChatML template: longer than the tiny models' 16-token windows
PROMPTS = ("Hi", "The greatest thing ever, in one word? Think first, then answer.", "Why?", "A longer prompt " * 3)
TOL = dict(atol=1e-5, rtol=1e-5)


def _alone_and_wave(model, head="score", n=len(PROMPTS), prompts=PROMPTS):
    """Each prompt's engine encoded alone, and the same engines built inside one_prompt_pass (one prefill)."""
    tok = T.chatml_tokenizer()
    tmpls = [build_template(tok, p) for p in prompts[:n]]
    alone = [Engine(model, tmpls[0], head=head, attention="cascade")]
    alone += [Engine(model, t, head=head, attention="cascade", layers=alone[0].layers) for t in tmpls[1:]]
    with one_prompt_pass() as wave:
        e0 = Engine(model, tmpls[0], head=head, attention="cascade")
        assert e0.kv is None  # waiting for the wave's pass
        engs = [e0] + [Engine(model, t, head=head, attention="cascade", layers=e0.layers) for t in tmpls[1:]]
    assert [id(e) for e in wave] == [id(e) for e in engs]
    return alone, engs


def _assert_same_prompts(alone, engs):
    for a, b in zip(alone, engs):
        assert len(a.kv) == len(b.kv) and a.P == b.P
        for (ka, va), (kb, vb) in zip(a.kv, b.kv):
            assert kb.shape == ka.shape and kb.is_contiguous()  # (Hkv, P, D), its own memory
            torch.testing.assert_close(kb, ka, **TOL)
            torch.testing.assert_close(vb, va, **TOL)


@pytest.mark.parametrize("arch", list(T.ARCHS))
def test_wave_prefill_equals_each_prompt_alone(arch):
    """Four prompts of 21-82 tokens in one packed prefill (the cascade's torch twin): every layer's K/V and
    the scores of ragged rows equal each prompt's own pass in fp32, on every architecture (windows shorter
    than the prompts, softcaps, q/k norms, local/global RoPE, partial LongRoPE, biases)."""
    from rmfast.fast.engine import score_prompts

    model = T.tiny(arch)
    alone, engs = _alone_and_wave(model)
    assert not engs[0].triton
    _assert_same_prompts(alone, engs)
    g = torch.Generator().manual_seed(1)
    resp = [torch.randint(5, T.VOCAB, (2, 9), generator=g) for _ in PROMPTS]
    lens = [torch.tensor([9, 3])] * len(PROMPTS)
    for a, b in zip(alone, engs):  # each prompt's rows on its own engine
        torch.testing.assert_close(b.score(resp[0]), a.score(resp[0]), **TOL)
    torch.testing.assert_close(score_prompts(engs, resp, lens), score_prompts(alone, resp, lens), **TOL)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_wave_prefill_logprob_head(arch):
    """The logprob head reads the prompt pass's last position: its next-token log-softmax over the vocabulary
    (and so every score) equals each prompt's own pass."""
    model = T.tiny(arch, "causal_lm")
    alone, engs = _alone_and_wave(model, head="logprob", n=3)
    _assert_same_prompts(alone, engs)
    ids = torch.randint(5, T.VOCAB, (3, 4), generator=torch.Generator().manual_seed(2))
    for a, b in zip(alone, engs):
        torch.testing.assert_close(b.prefix_logprobs, a.prefix_logprobs, **TOL)
        torch.testing.assert_close(b.score(ids), a.score(ids), **TOL)


def test_wave_prefill_gated_head_reads_its_positions():
    """A gated head (ArmoRM-like) reads the prompt pass from its gating position (the last <|im_start|>) on:
    those states, and the folded head, equal each prompt's own pass (each engine gets its own positions)."""
    from rmfast.fast.heads import GatedHead, GatingLayer
    from rmfast.loading.custom_heads import CustomRewardModel

    g = torch.Generator().manual_seed(0)
    head = GatedHead(regression=torch.randn(2, 64, generator=g), transform=torch.randn(2, 2, generator=g),
                     gating=[GatingLayer("linear", torch.randn(2, 64, generator=g))], temperature=1.0,
                     logit_scale=torch.ones(1), num_quantiles=1, pattern=(3,))  # <|im_start|>
    model = CustomRewardModel(T.tiny("llama", "causal_lm").model, head, "armorm").eval()
    alone, engs = _alone_and_wave(model, n=3)
    _assert_same_prompts(alone, engs)
    for a, b in zip(alone, engs):
        assert a.gate_pos < a.P - 1 and b.gate_pos == a.gate_pos
        torch.testing.assert_close(b.prefix_states, a.prefix_states, **TOL)
        torch.testing.assert_close(b.row_head.weight, a.row_head.weight, **TOL)


def test_other_forms_encode_alone():
    """Outside the cascade form (the CPU's forms) an engine encodes its prompt as it is built, inside
    one_prompt_pass too; encode_prompts of one engine is its own pass."""
    model = T.tiny("llama")
    tmpl = build_template(T.chatml_tokenizer(), "Hi")
    with one_prompt_pass() as wave:
        e = Engine(model, tmpl, head="score")
        assert e.kv is not None and e.attention != "cascade"
    assert wave == []
    c = Engine(model, tmpl, head="score", attention="cascade")
    before = [k.clone() for k, _ in c.kv]
    encode_prompts([c])
    for k, b in zip((k for k, _ in c.kv), before):
        torch.testing.assert_close(k, b, atol=0, rtol=0)


#: two short prompts (21, 23 tokens under the template) and a long one (215; phi3's tiny LongRoPE ends at 256)
FAR_APART = ("Hi", "Why?", "A much longer prompt, many times the short ones: " * 4)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3", "phi3"])
def test_prompts_of_very_different_lengths_go_in_one_pass(arch, monkeypatch):
    """Prompts of 21, 23 and 215 tokens (nothing is padded, so nothing splits them; the scatter to padded
    rows that came before the varlen part cut such a wave into passes): ONE packed pass, one varlen attention
    call per layer over all three, and each prompt's K/V and scores equal its own pass in fp32 (windows
    shorter than the long prompt, softcaps, local/global RoPE, partial LongRoPE)."""
    from rmfast.fast import ops

    calls, real = [], ops.varlen_causal_attention

    def counting(q, k, v, cu, max_len, **kw):
        calls.append((q.shape[0], cu.tolist(), max_len))
        return real(q, k, v, cu, max_len, **kw)

    monkeypatch.setattr(ops, "varlen_causal_attention", counting)
    model = T.tiny(arch)
    tok = T.chatml_tokenizer()
    tmpls = [build_template(tok, p) for p in FAR_APART]
    alone = [Engine(model, tmpls[0], head="score", attention="cascade")]
    alone += [Engine(model, t, head="score", attention="cascade", layers=alone[0].layers) for t in tmpls[1:]]
    assert not calls  # each prompt alone: the padded response part
    with one_prompt_pass():
        e0 = Engine(model, tmpls[0], head="score", attention="cascade")
        engs = [e0] + [Engine(model, t, head="score", attention="cascade", layers=e0.layers) for t in tmpls[1:]]
    lens = [e.P for e in engs]
    assert max(lens) > 10 * min(lens), lens
    cu = [0, lens[0], lens[0] + lens[1], sum(lens)]
    assert calls == [(sum(lens), cu, max(lens))] * len(e0.layers)  # one pass, one call per layer
    _assert_same_prompts(alone, engs)
    resp = torch.randint(5, T.VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    for a, b in zip(alone, engs):
        torch.testing.assert_close(b.score(resp), a.score(resp), **TOL)


@requires_triton
@pytest.mark.parametrize("arch,prompts", [("llama", "PROMPTS"), ("gemma2", "PROMPTS"), ("gemma3", "PROMPTS"),
                                          ("gemma2", "FAR_APART")])
def test_wave_prefill_triton_interpreted(arch, prompts, monkeypatch):
    """The CUDA path's kernels (interpreted): the packed prefill through the cascade's Triton varlen response
    part equals each prompt's own pass (its padded response part): windows, softcaps, local/global layers,
    prompts of 21-82 tokens and of 21-215 in one pass."""
    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    model = T.tiny(arch)
    alone, engs = _alone_and_wave(model, n=3, prompts=globals()[prompts])
    assert engs[0].triton
    _assert_same_prompts(alone, engs)


# ---------------------------------------------------------------------------------- the scorer


def _convs(k):
    return [f"Question {i}: {'why ' * (1 + i % 3)}?" for i in range(k)]


def _responses(k, lens):
    return [[" ".join(["word"] * n) for n in lens] for _ in range(k)]


def test_scorer_wave_one_prefill_scores_as_alone():
    """RewardScorer with the cascade (its twin here) and shared batches: a wave's prompts encoded in one
    prefill (each counted in prompt_passes), scores equal to the default CPU path's (each prompt alone)."""
    from rmfast.scoring.scorer import RewardScorer

    tok, model = T.chatml_tokenizer(), T.tiny("gemma2")
    convs, resps = _convs(5), _responses(5, (3, 7, 12))
    calls = []
    import rmfast.fast.wave as fe

    real = fe.encode_prompts
    monkey = lambda engines, *a: (calls.append(len(engines)), real(engines, *a))  # noqa: E731
    fe.encode_prompts = monkey
    try:
        sc = RewardScorer(model, tok, attention="cascade", share_batches=True)
        got = np.asarray(sc.score(convs, resps))
    finally:
        fe.encode_prompts = real
    assert calls == [5] and sc.last_stats.prompt_passes == 5
    want = np.asarray(RewardScorer(model, tok).score(convs, resps))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    again = np.asarray(sc.score(convs, resps))  # all five from the cache: no prefill
    assert sc.last_stats.prompts_from_cache == 5 and sc.last_stats.prompt_passes == 0
    np.testing.assert_array_equal(again, got)


# ---------------------------------------------------------------------------------- launches and compilations


def _launch_log(monkeypatch) -> list:
    """Every launch of an rmfast Triton kernel from now on, as (kernel name, cache key): the key is what
    Triton's own binder specialises on (constexprs, dtypes, integers and pointers divisible by 16 or equal
    to 1, minus ``do_not_specialize``) plus the launch options, so two launches with one key share one
    compiled variant on CUDA. The kernels' ``run`` (what ``kernel[grid](...)`` calls, interpreted or
    compiled) is wrapped per instance."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from rmfast.kernels import triton_attention, triton_cascade, triton_elementwise, triton_logprob, triton_norm_head

    log = []
    for mod in (triton_attention, triton_cascade, triton_elementwise, triton_logprob, triton_norm_head):
        for name, k in vars(mod).items():
            if not name.endswith("_kernel") or not hasattr(k, "run"):
                continue
            opts = getattr(k, "kwargs", None) or {"do_not_specialize": k.do_not_specialize,
                                                  "do_not_specialize_on_alignment": k.do_not_specialize_on_alignment}
            jf = JITFunction(k.fn, do_not_specialize=opts.get("do_not_specialize"),
                             do_not_specialize_on_alignment=opts.get("do_not_specialize_on_alignment"))
            binder = create_function_from_signature(jf.signature, jf.params, BaseBackend)

            def run(*args, grid, warmup, _real=k.run, _name=name, _binder=binder, **kw):
                _, spec, options = _binder(*args, **kw)
                log.append((_name, repr((spec, sorted(options.items())))))
                return _real(*args, grid=grid, warmup=warmup, **kw)

            monkeypatch.setattr(k, "run", run)
    return log


@requires_triton
def test_triton_launches_do_not_grow_with_the_wave_and_lengths_do_not_recompile(monkeypatch):
    """One scorer call on a wave of K prompts launches per layer a fixed number of Triton kernels, whatever K:
    the wave's prompt pass one varlen response-part launch per layer (not one per prompt), each batch of
    rows (packed) three per layer (prompt part, varlen response part, merge) and one fused norm + head. A later call with
    other prompts and new response lengths launches only variants already compiled (no kernel specialises
    on a length, a count or an offset)."""
    from collections import Counter

    from rmfast.scoring.scorer import RewardScorer

    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    log = _launch_log(monkeypatch)
    tok, model = T.chatml_tokenizer(), T.tiny("gemma2")
    L = model.config.num_hidden_layers
    sc = RewardScorer(model, tok, attention="cascade", share_batches=True)
    counts, keys = [], []
    for convs, lens in ((_convs(2), (3, 5)), ([c + " Again." for c in _convs(4)], (3, 5))):
        log.clear()
        sc.score(convs, _responses(len(convs), lens))
        st = sc.last_stats
        assert st.prompt_passes == len(convs) and st.attention == "cascade"
        counts.append(Counter(name for name, _ in log))
        keys.append({k for _, k in log})
        nb = st.n_batches
        # the rows run packed (Gemma 2's window by each token's own position): their response part is varlen too
        assert counts[-1] == {"_response_varlen_kernel": L + L * nb, "_prompt_kernel": L * nb,
                              "_merge_kernel": L * nb, "_rmsnorm_head_kernel": nb}, (len(convs), nb, counts[-1])
    assert counts[0] == counts[1]  # 2 prompts or 4: the same launches
    log.clear()  # other prompts (other lengths), new response lengths, other row counts (a batch of one row)
    sc.score(["Something else entirely, and longer than before: " * 2, "Ok"],
             [[" ".join(["tok"] * n) for n in (1, 17, 40)], ["a b c d e f g h i j k", "x"]])
    assert sc.last_stats.prompt_passes == 2 and log
    new = {k for _, k in log} - keys[0] - keys[1]
    assert not new, f"{len(new)} new compiled variant(s): {sorted(new)[:2]}"


@requires_triton
def test_a_layer_on_the_cuda_path_launches_only_its_gemms_and_kernels(monkeypatch):
    """What one decoder layer dispatches on the path CUDA runs (Triton kernels and elementwise kernels, separate
    projections, the cascade; here interpreted): besides the Triton kernels, torch runs the seven projection GEMMs
    and the MLP's residual add, nothing else, in the prompt's pass and in the packed rows' pass alike. Small
    calls are launch-bound on a GPU (gpu_h100_2026-11-27_f: a 512 x 16 best-of-N call's device busy 55% of its
    wall): the prompt part's out/lse fills and the response part's per-layer lengths were three launches per layer
    more, counted this way on the commit before (21 torch ops per layer over the two passes, now 16), and RoPE of
    q and of k two launches (now one)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode
    import triton.runtime.interpreter as interp

    from rmfast.fast import engine as E
    from rmfast.fast import wave
    from rmfast.fast.layer import PackedRows, decoder_layer
    from rmfast.scoring import decisions
    from rmfast.scoring.options import ScoringOptions
    from rmfast.scoring.scorer import RewardScorer

    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    cuda_rule = lambda device, triton, compiled: bool(triton) and not compiled  # noqa: E731 - fused_elementwise on CUDA
    monkeypatch.setattr(E, "fused_elementwise", cuda_rule)
    monkeypatch.setattr(decisions, "fused_elementwise", cuda_rule)
    state = {"in_triton": 0, "layer": None}
    per_layer = []  # (pass, torch ops outside the Triton kernels, Triton launches) of each layer but the last
    real_run = interp.InterpretedFunction.run

    def run(self, *a, **kw):
        state["in_triton"] += 1
        if state["layer"] is not None:
            state["layer"][1] += 1
        try:
            return real_run(self, *a, **kw)
        finally:
            state["in_triton"] -= 1

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if state["layer"] is not None and not state["in_triton"] and not func.is_view and \
                    func.overloadpacket.__name__ not in ("empty", "empty_strided", "_unsafe_view"):  # no kernel either
                state["layer"][0][func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    def counted(h, w, cos, sin, prompt, c, n_out, *a, **kw):
        state["layer"] = [Counter(), 0]
        try:
            return decoder_layer(h, w, cos, sin, prompt, c, n_out, *a, **kw)
        finally:
            per_layer.append(("rows" if isinstance(prompt, PackedRows) else "prompt", *state["layer"]))
            state["layer"] = None

    monkeypatch.setattr(interp.InterpretedFunction, "run", run)
    monkeypatch.setattr(E, "decoder_layer", counted)
    monkeypatch.setattr(wave, "decoder_layer", counted)
    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    L = model.config.num_hidden_layers
    sc = RewardScorer(model, tok, attention="cascade", share_batches=True, cache_prompts=0,
                      options=ScoringOptions(projections="separate"))
    with Count():
        sc.score(_convs(2), _responses(2, (3, 5)))  # a wave: the prompts' packed pass
        sc.score(_convs(1), _responses(1, (3, 5)))  # one prompt: its own pass (the cascade's response part alone)
    d = sc.last_stats.decisions
    assert (d["elementwise"]["value"], d["projections"]["value"], d["rows"]["value"]) == ("triton", "separate", "packed")
    assert len(per_layer) % L == 0 and len(per_layer) >= 2 * L  # whole passes: the prompts' and the rows'
    kept = [x for i, x in enumerate(per_layer) if i % L != L - 1]  # the last layer of a pass narrows: left out
    assert {p for p, _, _ in kept} == {"prompt", "rows"}
    for what, ops_, launches in kept:
        assert ops_ == {"mm": 7, "add": 1}, (what, dict(ops_))
        # norm in, RoPE of q and k (one launch), attention (rows: the prompt part, the response part, the merge),
        # add + norm, SiLU·up
        assert launches == (7 if what == "rows" else 5), (what, launches)
        # the cost model prices these launches (rmfast.bench.cascade_cost): its counts are these
        from rmfast.bench import cascade_cost as cc

        attention = cc.LAYER_LAUNCHES["rows_attention" if what == "rows" else "prompt_attention"]
        assert sum(ops_.values()) + launches == cc.LAYER_LAUNCHES["layer"] + attention == cc.Gpu().kernels_per_layer + attention


def test_packed_attention_issues_no_torch_op_around_the_kernel(monkeypatch):
    """The packed prompt pass's attention is the varlen kernel alone: with it stubbed, ``attend`` on
    :class:`~rmfast.fast.layer.PackedPrompts` dispatches no torch op (views only). The scatter to padded rows
    it replaces issued 7 per layer (q, k, v: a zeros and an index_put each; the output's gather), measured
    the same way on the commit before."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rmfast.fast import layer, ops

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    model = T.tiny("gemma2")
    e = Engine(model, build_template(T.chatml_tokenizer(), "Hi"), head="score", attention="cascade")
    w, c = e.layers[0]
    lens, H, Hkv, D = [5, 17, 1], c.n_heads, c.n_kv_heads, c.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, sum(lens), h, D, generator=g) for h in (H, Hkv, Hkv))
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    out = torch.randn(sum(lens), H, D, generator=g)  # made before counting
    seen = []
    monkeypatch.setattr(ops, "varlen_causal_attention", lambda *a, **kw: (seen.append(a[3]), out)[1])
    with Count() as n:
        got = layer.attend(q, k, v, layer.PackedPrompts(cu, 17, False), c)
    assert seen == [cu] and n.ops == [] and torch.equal(got[0], out.view(sum(lens), H * D))


def test_cost_model_wave_prompt_pass():
    """The packed prompt pass does each prompt's own FLOPs (no padding anywhere) with one pass's launches, and
    is predicted no slower than one pass per prompt; for short prompts the launches and weight reads it saves
    dominate."""
    from rmfast.bench import cascade_cost as cc

    m = cc.LLAMA_31_8B
    for prompts in ([512], [64] * 16, [512, 17, 300]):
        wave = cc.wave_prompt_pass(m, prompts)
        assert wave["flops"] == pytest.approx(sum(cc.prompt_pass(m, P)["flops"] for P in prompts))
        assert wave["launches_s"] == pytest.approx(m["n_layers"] * (cc.Gpu().kernels_per_layer + 1) * 4e-6)
    alone = sum(cc.prompt_pass(m, 64)["s"] for _ in range(16))
    assert cc.wave_prompt_pass(m, [64] * 16)["s"] < alone / 3


def test_cost_model_prices_a_waves_prompts_as_one_packed_pass():
    """The best-of-N prediction prices a wave's prompts as the scorer runs them: one packed pass per wave, waves cut
    at the scorer's own caps (prompt K/V bytes, conversations); a lone prompt its own pass."""
    from rmfast.bench import cascade_cost as cc
    from rmfast.scoring.scorer import WAVE_KV_BYTES, WAVE_PROMPTS

    m = cc.LLAMA_31_8B
    kv = m["n_layers"] * 2 * m["n_kv_heads"] * m["head_dim"] * 2  # bf16 K/V bytes per prompt token
    per_wave = WAVE_KV_BYTES // (512 * kv)
    waves = cc.prompt_waves(m, [512] * (per_wave + 3))
    assert [len(w) for w in waves] == [min(per_wave, WAVE_PROMPTS), per_wave + 3 - min(per_wave, WAVE_PROMPTS)]
    row = cc.best_of_n(m, 512, 4, 16)
    assert row["parts_ms"]["prompt_passes"] == pytest.approx(1e3 * cc.wave_prompt_pass(m, [512] * 16)["s"])
    assert cc.best_of_n(m, 512, 16, 1)["parts_ms"]["prompt_passes"] == pytest.approx(1e3 * cc.prompt_pass(m, 512)["s"])
