"""The GPU path on the tiny models of every architecture: the engine against plain HF on the device,
in fp32 (elementwise), bf16 and fp16 (ranks), both heads, multi-token responses, out-of-memory back-off.

`make gpu-check` runs this file (with tests/test_kernels.py) on a CUDA machine. The tokenizer is
generated here (``tiny_models.chatml_tokenizer``: byte-level, ChatML template), so nothing needs the
SmolLM2 package or a model hub. Without CUDA only the smoke tests run (a few ids on the CPU, the same
code), so the file cannot rot where no GPU is lent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rmfast.bench.baselines import agreement
from rmfast.fast.engine import Engine
from rmfast.scoring.hf_path import hf_scores
from rmfast.template import build_template

import tiny_models as T

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA (run by `make gpu-check` on a GPU machine)")
ARCHS = list(T.ARCHS)
PROMPT = "What, in one word, is the greatest thing ever?"
# fp32 on the GPU: cuBLAS and the Triton kernels (ieee dots in fp32) sum in other orders than HF's eager path.
SCORE_ATOL = 1e-4 if CUDA else 2e-5
LP_ATOL, LP_RTOL = (2e-4, 2e-5) if CUDA else (5e-5, 1e-5)


@pytest.fixture(scope="module")
def tok():
    return T.chatml_tokenizer()


@pytest.fixture(scope="module")
def tmpl(tok):
    return build_template(tok, PROMPT)


def on_device(arch, kind="classifier", dtype=torch.float32, **kw):
    return T.tiny(arch, kind, pad_token_id=2, **kw).to(device=DEVICE, dtype=dtype)


@pytest.fixture
def kernels(request, monkeypatch):
    """"auto" (Triton on CUDA) or "torch" (the torch twins on CUDA too)."""
    monkeypatch.setenv("RMFAST_KERNELS", request.param)
    return request.param


def test_generated_tokenizer_splits_the_chat_template(tok, tmpl):
    """What the tiny-model tests need from a tokenizer: the full vocabulary, a ChatML split, special ids."""
    assert len(tok) == T.VOCAB and tok.pad_token_id == 2
    assert PROMPT in tok.decode(list(tmpl.prefix_ids))
    assert len(tmpl.prefix_ids) > 16  # longer than the tiny models' sliding windows
    assert tmpl.suffix_ids == (tok.convert_tokens_to_ids("<|im_end|>"), tok.encode("\n")[-1])
    assert tmpl.n_continuation == 1  # up to <|im_end|>, a special token
    assert tok.decode([5000]) == tok.convert_ids_to_tokens(5000)  # filler ids decode to their names


@pytest.mark.parametrize("arch,head", [("llama", "score"), ("gemma2", "logprob")])
def test_smoke_engine_matches_hf_on_this_device(arch, head, tmpl):
    """A few ids on whatever device there is (the CPU here): the same code as the CUDA cases."""
    model = on_device(arch, "classifier" if head == "score" else "causal_lm")
    ids = torch.arange(3, T.VOCAB, 1531)[:, None]  # 33 ids across the vocabulary
    fast = Engine(model, tmpl, head=head).score(ids)
    ref = hf_scores(model, tmpl, ids.tolist(), head=head)
    torch.testing.assert_close(fast.cpu(), ref.cpu(), atol=LP_ATOL, rtol=LP_RTOL)


@requires_cuda
@pytest.mark.parametrize("kernels", ["auto", "torch"], indirect=True)
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_full_vocab_fp32_matches_hf(arch, kernels, tmpl):
    """Every id of the vocabulary, score head, on the GPU; windows shorter than the prompt, softcaps, GQA."""
    model = on_device(arch)
    ids = torch.arange(T.VOCAB)[:, None]
    fast = Engine(model, tmpl, head="score", head_index=1).score(ids)
    ref = hf_scores(model, tmpl, ids.tolist(), head="score", head_index=1, batch_size=8192)
    assert ref.std() > 1e-3, "degenerate model: scores barely vary"
    torch.testing.assert_close(fast.float().cpu(), ref.float().cpu(), atol=SCORE_ATOL, rtol=0)


@requires_cuda
@pytest.mark.parametrize("kernels", ["auto", "torch"], indirect=True)
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_logprob_head_matches_hf(arch, kernels, tmpl):
    model = on_device(arch, "causal_lm")
    ids = torch.randint(0, T.VOCAB, (512, 1), generator=torch.Generator().manual_seed(1))
    fast = Engine(model, tmpl, head="logprob").score(ids)
    ref = hf_scores(model, tmpl, ids.tolist(), head="logprob")
    torch.testing.assert_close(fast.float().cpu(), ref.float().cpu(), atol=LP_ATOL, rtol=LP_RTOL)


@requires_cuda
@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3"])
@pytest.mark.parametrize("head", ["score", "logprob"])
def test_cuda_multi_token_responses(arch, head, tmpl):
    model = on_device(arch, "classifier" if head == "score" else "causal_lm")
    resp = torch.randint(0, T.VOCAB, (64, 5), generator=torch.Generator().manual_seed(2))
    fast = Engine(model, tmpl, head=head).score(resp)
    ref = hf_scores(model, tmpl, resp.tolist(), head=head)
    torch.testing.assert_close(fast.float().cpu(), ref.float().cpu(), atol=LP_ATOL, rtol=LP_RTOL)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_half_precision_ranks_like_hf(arch, dtype, tmpl):
    """In bf16/fp16 the engine ranks candidates as well as HF in the same dtype, judged against fp32 truth."""
    model = on_device(arch)
    ids = torch.arange(0, T.VOCAB, 16)[:, None]  # 3,072 ids across the vocabulary
    truth = hf_scores(model, tmpl, ids.tolist(), head="score", batch_size=4096).float().cpu().numpy()
    model = model.to(dtype)
    fast = Engine(model, tmpl, head="score").score(ids).float().cpu().numpy()
    ref = hf_scores(model, tmpl, ids.tolist(), head="score", batch_size=4096).float().cpu().numpy()
    assert np.isfinite(fast).all()
    rho_fast, rho_ref = agreement(truth, fast)["spearman"], agreement(truth, ref)["spearman"]
    assert rho_fast > rho_ref - 0.01, (rho_fast, rho_ref)


@requires_cuda
def test_cuda_out_of_memory_halves_the_batch(tok, tmpl):
    """A real CUDA out-of-memory (memory capped 64 MiB above what is held) halves the batch and
    retries the same rows, in the loop every job uses and in `scan` itself; the scores are unchanged."""
    from rmfast.scoring.batching import oom_batches
    from rmfast.scoring.pipeline import scan

    model = on_device("llama")
    eng = Engine(model, tmpl, head="score")
    ids = torch.arange(T.VOCAB)
    want = torch.cat([eng.score(ids[i : i + 1024, None]).float().cpu() for i in range(0, T.VOCAB, 1024)])
    want_scan = scan(model, tok, PROMPT, batch_size=1024, progress=False).scores
    told: list[int] = []
    # set_per_process_memory_fraction wants an indexed device (an int or cuda:N): a bare "cuda" is a ValueError
    # (what the first GPU run hit). The cap is total x fraction on the caching allocator of that device.
    idx = torch.cuda.current_device()
    torch.cuda.synchronize(idx)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(idx).total_memory
    torch.cuda.set_per_process_memory_fraction(float(torch.cuda.memory_reserved(idx) + 64 * 2**20) / total, idx)
    try:
        out = list(oom_batches(T.VOCAB, T.VOCAB, DEVICE, lambda lo, hi, b: eng.score(ids[lo:hi, None]).float().cpu(),
                               told.append))
        got_scan = scan(model, tok, PROMPT, batch_size=T.VOCAB, progress=False)  # the same cap: it must back off too
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, idx)
        torch.cuda.empty_cache()
    assert told and told[0] == T.VOCAB // 2, told  # the whole vocabulary in one batch does not fit in 64 MiB
    torch.testing.assert_close(torch.cat([o for *_, o, _ in out]), want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got_scan.scores, want_scan, atol=1e-4, rtol=0)


@requires_cuda
def test_cuda_states_written_in_the_background_are_the_synchronous_bytes(tok, tmp_path, monkeypatch):
    """On CUDA a batch's states come back as pinned copies still running (waited for before any read), and the
    background writer's folder is the synchronous writer's: the same tensors, counts and manifest."""
    import json
    import uuid

    from rmfast.scoring import batching
    from rmfast.scoring.pipeline import StatesRequest, score_ids
    from rmfast.scoring.plan import plan_scoring

    model = on_device("llama", dtype=torch.bfloat16)
    st = plan_scoring(model, build_template(tok, PROMPT), head="score").score(torch.arange(8)[:, None], states=["last"])
    assert st.states.pending and st.states["last"].is_pinned() and not st.states.pending
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=33))
    got = []
    for background in (False, True):
        folder = tmp_path / f"{background}.states"
        score_ids(model, tok, PROMPT, np.arange(1024), batch_size=128, progress=False,
                  checkpoint=tmp_path / f"{background}.npz",
                  states=StatesRequest("all", "float32", folder=folder, background=background))
        files = {}
        for p in sorted(folder.iterdir()):
            b = p.read_bytes()
            n = 8 + int.from_bytes(b[:8], "little") if p.suffix == ".safetensors" else 0
            files[p.name] = (json.loads(b[8:n]) if n else None, b[n:])  # the header parsed: hash-map order
        got.append(files)
    assert got[0] == got[1] and len(got[0]) == 1 + 8  # the manifest, a shard a batch


@requires_cuda
def test_cuda_copies_run_on_their_own_stream_and_survive_the_sources_reuse():
    """On CUDA the copies run on the copy stream (not the compute stream), after the forward that made the
    states; the sources' memory, freed and reused by the next batch at once, still reaches the host intact."""
    from rmfast.scoring import states_stream as ss
    from rmfast.scoring.states_stream import host_states

    dev = torch.device("cuda")
    x = torch.randn(4096, 2048, device=dev)
    y = x * 2  # the "forward": queued on the compute stream before the copies
    want = y.cpu()
    st = host_states({"last": y})
    assert st.pending and ss._COPY_STREAMS[x.device] != torch.cuda.current_stream(x.device)  # keyed by cuda:0
    del y
    for _ in range(4):  # the next batches: the caching allocator would hand out y's block here without record_stream
        z = torch.full((4096, 2048), -1.0, device=dev)
        del z
    assert torch.equal(st["last"], want) and not st.pending


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_states_bring_their_rows_nonfinite_counts(dtype):
    """host_states counts each row's NaN/inf on the device before the copy (the shard writers then only sum them):
    the counts are the host bytes' own, row by row."""
    from rmfast.scoring.states_stream import host_states
    from rmfast.states.shard import count_nonfinite

    x = torch.randn(3000, 512, device="cuda").to(dtype)
    x[5, 3], x[5, 9], x[2999, 0], x[100, 511] = float("nan"), float("inf"), float("-inf"), float("nan")
    st = host_states({"0": x})
    got = st.row_counts()["0"]  # (3000,) int32, waited for
    host = st["0"]
    assert got.device.type == "cpu" and got.tolist() == [count_nonfinite(host[i:i + 1]) for i in range(3000)]
    assert int(got.sum()) == 4


@requires_cuda
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_serve_gives_a_sample_its_own_bits_in_any_wave(arch, dtype, tok):
    """``rmfast serve``'s core on CUDA (cuBLAS under the probed rows rule, the Triton varlen cascade on packed
    rows): 24 samples of 4 prompts scored alone, in one wave shuffled, and in two waves: every score's bits equal
    (issue 49's guarantee, measured on CPU in tests/test_serve.py); fp32 equals plain HF to SCORE_ATOL. Gemma 2: a
    window of 16 that most samples pass, and a softcap."""
    from rmfast.scoring.options import ScoringOptions
    from rmfast.serve.core import ServeCore

    model = on_device(arch, num_labels=1, dtype=dtype)
    core = ServeCore(model, tok, ScoringOptions(dtype=str(dtype).removeprefix("torch.")), name=arch)
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(5, T.VOCAB, (int(n),), generator=g).tolist() for n in (3, 9, 30, 12)]
    ids = [p + torch.randint(5, T.VOCAB, (int(torch.randint(1, 60, (1,), generator=g)),), generator=g).tolist()
           for p in prompts for _ in range(6)]
    samples = [core.sample(i, prompt_ids=prompts[k // 6]) for k, i in enumerate(ids)]
    alone = np.concatenate([core.score([s]) for s in samples])
    order = torch.randperm(len(samples), generator=g).tolist()
    wave = np.empty_like(alone)
    wave[order] = core.score([samples[k] for k in order])
    halves = np.concatenate([core.score(samples[:11]), core.score(samples[11:])])
    assert np.isfinite(alone).all()
    assert np.array_equal(alone, wave) and np.array_equal(alone, halves), (
        f"{int((alone != wave).sum())} / {int((alone != halves).sum())} of {alone.size} scores moved with the wave "
        f"(rows rule {core.decisions['gemm_rows']['value']})")
    if dtype == torch.float32:
        with torch.no_grad():
            ref = [float(model(torch.tensor([i], device=DEVICE)).logits[0, 0]) for i in ids]
        assert np.abs(alone - ref).max() < SCORE_ATOL
