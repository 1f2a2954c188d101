"""A token's score does not depend on the job it is in (issue 25 §1).

The scoring plan (:mod:`rmfast.scoring.plan`) decides nothing from a job's size: ``compile=auto`` is the
eager layer for ten ids and for a whole vocabulary alike, and every batch of a token scan is padded
to one row count (or to a smaller size measured on this machine to give the same bits,
:mod:`rmfast.scoring.batching`), so each row's arithmetic is the whole scan's. Without the padding a
7-row batch of SmolLM2 rounds differently from a 1,024-row one (MKL/oneDNN pick kernels by M):
this test fails then, in fp32 and bf16.
"""

import weakref

import numpy as np
import torch
import pytest

from rmfast.scoring import padding
from rmfast.scoring.pipeline import scan

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def smol_rm(request):
    from rmfast.loading.loader import load

    try:
        return load("smollm2-135m-instruct", dtype=request.param, device="cpu", random_head_seed=0)
    except Exception as e:
        pytest.skip(f"embedded SmolLM2 unavailable: {e}")


def test_a_subset_scores_like_the_whole_job_bit_for_bit(smol_rm):
    """Default settings: the same ids scored inside a job of several batches and alone, in small subsets.

    bf16 (emulated on an AVX2 CPU: ~31 ms a row for SmolLM2, 44 s for one default 1,365-row batch) runs the same
    rule at 256 rows a batch (a batch size the user gave pads alike): a job whose short last batch measures the
    32-row rung, and subsets that run at that rung (one probe in all, ~30 s instead of ~100 s)."""
    m, tok = smol_rm.model, smol_rm.tokenizer
    bf16 = str(next(m.parameters()).dtype) == "torch.bfloat16"
    n, kw = (530, {"batch_size": 256}) if bf16 else (3000, {})
    whole = scan(m, tok, PROMPT, token_ids=f"0:{n}", progress=False, **kw)
    assert whole.manifest["compiled"] is False and whole.manifest["fixed_shapes"] is True
    assert n > 2 * whole.manifest["batch_size"]  # full batches and a padded short one
    subsets = ([529], [5, 17, 255, 256, 257, 400, 529], list(range(300, 330))) if bf16 else (
        [2999], [5, 17, 400, 1024, 1025, 2048, 2999], list(range(1000, 1300)))
    for ids in subsets:
        sub = scan(m, tok, PROMPT, token_ids=np.array(ids), progress=False, **kw)
        assert sub.manifest["batch_size"] == whole.manifest["batch_size"]
        np.testing.assert_array_equal(sub.scores, whole.scores[ids])


def test_without_padding_the_rounding_would_differ(smol_rm):
    """The guard above can fail: the same ids in a batch of their own, unpadded, differ in the last bits."""
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    tmpl = build_template(smol_rm.tokenizer, PROMPT)
    bf16 = str(next(smol_rm.model.parameters()).dtype) == "torch.bfloat16"  # (emulated: 256 rows, as above)
    plan = plan_scoring(smol_rm.model, tmpl, head="score", batch_size=256 if bf16 else "auto")
    ids = np.arange(1000, 1000 + plan.rows_per_batch(1))[:, None]
    full = plan.score(ids)
    plan.fixed_shapes = False
    alone = np.concatenate([plan.score(ids[i:i + 7], 7) for i in range(0, 70, 7)])
    assert not np.array_equal(alone, full[:70])


def test_a_small_job_runs_a_measured_size_not_a_whole_batch(smol_rm, tmp_path, monkeypatch, capsys):
    """Issue 37 item 12: a short batch runs at the smallest ladder size measured (here, now, into a fresh
    cache) to give every row the full batch's bits, not at the full row count; the scores are still the
    whole job's, bit for bit, and a second job reads the verdict from the cache instead of measuring."""
    import json

    from rmfast.fast.engine import Engine
    from rmfast.scoring.batching import CACHE_NAME, ladder

    if str(next(smol_rm.model.parameters()).dtype) != "torch.float32":
        pytest.skip("fp32 only: bf16 is emulated (slow) on some CPUs, and the rule is the same")
    m, tok = smol_rm.model, smol_rm.tokenizer
    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path))
    # a first job here: no verdict on disk, and no full batch kept by an earlier test's plan in this process
    monkeypatch.setattr(padding, "_FULL_SCORES", weakref.WeakKeyDictionary())
    calls = []
    real = Engine.score
    monkeypatch.setattr(Engine, "score", lambda self, ids, *a, **k: calls.append(ids.shape[0]) or real(self, ids, *a, **k))
    ids = np.arange(2000, 2040)
    first = scan(m, tok, PROMPT, token_ids=ids, progress=False)
    rows = first.manifest["batch_size"]
    verdicts = json.loads((tmp_path / "cpu" / CACHE_NAME).read_text())
    (v,) = verdicts.values()
    expect = next((s for s in ladder(rows) if s >= ids.size and v.get(str(s))), rows)
    assert calls[-1] == expect and "measured now" in first.manifest["decisions"]["padding"]["reason"]
    assert first.manifest["rows_run"] == {str(expect): 1}  # what ran, beside the batch planned (the probe's not counted)
    # the one-off measurement is said (one line), timed, and left out of the job's rate
    assert "rmfast: measuring once which short batches" in capsys.readouterr().err
    fm = first.manifest
    assert 0 < fm["pad_probe_s"] < fm["scan_s"]
    assert fm["candidates_per_s"] == pytest.approx(ids.size / (fm["scan_s"] - fm["pad_probe_s"]), rel=0.01)
    calls.clear()
    second = scan(m, tok, PROMPT, token_ids=ids, progress=False)
    assert calls == [expect] and "measured earlier" in second.manifest["decisions"]["padding"]["reason"]
    assert "pad_probe_s" not in second.manifest and "measuring once" not in capsys.readouterr().err
    np.testing.assert_array_equal(first.scores, second.scores)  # bit for bit against a whole job: the test above


def test_a_job_under_one_asked_batch_runs_alone_not_padded(smol_rm, tmp_path, monkeypatch):
    """A --batch-size asked for above the job's rows padded the job to that whole batch and probed it first: 10 ids
    under a huge size (lowered to 129,136 rows by memory) took 6 minutes. The job is one batch of its own rows now,
    said in the padding decision; under auto it is padded as before (the test above)."""
    from rmfast.fast.engine import Engine

    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path))
    calls = []
    real = Engine.score
    monkeypatch.setattr(Engine, "score", lambda self, ids, *a, **k: calls.append(ids.shape[0]) or real(self, ids, *a, **k))
    res = scan(smol_rm.model, smol_rm.tokenizer, PROMPT, token_ids=np.arange(2000, 2010), batch_size=9000,
               progress=False)
    assert calls == [10] and res.manifest["decisions"]["padding"]["value"] == "none"
    assert res.manifest["fixed_shapes"] is False  # the manifest agrees with its padding decision
    assert "fewer than one batch of the --batch-size asked for (9000 rows, over 8,192)" in res.manifest["decisions"]["padding"]["reason"]
    # the summary said "batch 9000" alone, read as 9,000 rows run for a 10-id job
    from rmfast.cli.scan import _batch_said

    assert res.manifest["rows_run"] == {"10": 1} and _batch_said(res.manifest) == ", batch 9000; ran 1 batch of 10 rows"
    assert _batch_said({"batch_size": 64, "rows_run": {"64": 3, "32": 1}}) == ", batch 64; ran 3 batches of 64 rows, 1 of 32 rows"
    assert _batch_said({"batch_size": 64, "rows_run": {"64": 3}}) == ", batch 64"
    # a batch out of memory, run again halved, is not a batch that ran (it had been counted: {32: 1, 16: 1, 8: 5})
    def small_only(self, ids, *a, **k):
        if ids.shape[0] > 8:
            raise torch.OutOfMemoryError("simulated")
        return real(self, ids, *a, **k)

    monkeypatch.setattr(Engine, "score", small_only)
    res = scan(smol_rm.model, smol_rm.tokenizer, PROMPT, token_ids=np.arange(2000, 2040), batch_size=32, progress=False)
    assert res.manifest["rows_run"] == {"8": 5}, res.manifest["rows_run"]


def test_a_size_measured_to_differ_is_never_used(smol_rm, tmp_path):
    """A ladder size whose rows differ from the full batch's (a verdict False) is skipped: the next size up,
    at worst the full row count."""
    from rmfast.scoring.batching import PadSizes
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    plan = plan_scoring(smol_rm.model, build_template(smol_rm.tokenizer, PROMPT), head="score")
    pads = PadSizes(plan.eng, 1, 1365, None)
    pads.verdicts = {32: False, 64: True, 128: False, 256: False, 512: False, 1024: False}
    assert pads.rows_for(10) == 64 and pads.rows_for(64) == 64
    assert pads.rows_for(65) == 1365 and pads.measured == []
    assert "[32, 128, 256, 512, 1024] differ" in pads.summary()


def test_a_second_plan_reuses_the_full_batch_probe_until_the_weights_change(smol_rm, monkeypatch):
    """The probe's full batch is scored once per process for one model, shape and template: a second plan (GCG's
    random baseline after its search) measures another rung without it; an in-place weight update (an optimizer
    step) makes the model another one, scored again."""
    from rmfast.fast.engine import Engine
    from rmfast.scoring.batching import PadSizes
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    if str(next(smol_rm.model.parameters()).dtype) != "torch.float32":
        pytest.skip("fp32 only: bf16 is emulated (slow) on some CPUs, and the rule is the same")
    calls = []
    real = Engine.score
    monkeypatch.setattr(Engine, "score", lambda self, ids, *a, **k: calls.append(ids.shape[0]) or real(self, ids, *a, **k))
    tmpl = build_template(smol_rm.tokenizer, "Name one good thing.")

    def pads():
        return PadSizes(plan_scoring(smol_rm.model, tmpl, head="score").eng, 1, 128, None)

    first = pads()
    first.identical(32)
    assert calls == [32, 32, 128]  # the short batch, then again warm: its time estimates the full one's (said first)
    calls.clear()
    pads().identical(64)
    assert calls == [64]  # the full batch's scores from the first plan
    calls.clear()
    with torch.no_grad():
        next(smol_rm.model.parameters()).add_(0.0)  # an in-place update (here of nothing): a version bump
    pads().identical(32)
    assert calls == [32, 32, 128]
    assert first.verdicts[32] is True


@pytest.mark.parametrize("damage", ["list-entry", "folder"])
def test_a_damaged_padding_cache_is_measured_again(smol_rm, tmp_path, damage):
    """Issue 50 item 4: an entry of pad-probe.json that is not an object ({"<key>": [1, 2]}) raised AttributeError,
    and a folder at the file's path stopped the scan (exit 2) where an unwritable cache is skipped. Both are
    measured again, the verdict kept for this job only."""
    import json

    from rmfast.scoring.batching import CACHE_NAME, PadSizes, shape_key
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    if str(next(smol_rm.model.parameters()).dtype) != "torch.float32":
        pytest.skip("fp32 only: the cache's rule does not depend on the dtype")
    plan = plan_scoring(smol_rm.model, build_template(smol_rm.tokenizer, PROMPT), head="score")
    path = tmp_path / "cpu" / CACHE_NAME
    path.parent.mkdir(parents=True)
    if damage == "folder":
        path.mkdir()
    else:
        path.write_text(json.dumps({shape_key(plan.eng, 1, 64): [1, 2]}))
    pads = PadSizes(plan.eng, 1, 64, tmp_path)
    assert pads.verdicts == {}
    assert pads.rows_for(5) in (32, 64) and pads.measured == [32]
    assert path.is_dir() if damage == "folder" else 32 in {int(k) for k in json.loads(path.read_text())[pads.key]
                                                             if k.isdigit()}


def test_a_manifest_names_both_rates_with_enough_digits():
    """Issue 50 item 12: a manifest's rate left the one-off padding probe out (a 5,000-id scan reported 67.6 cand/s
    and ran at 39.6) with no rate of the job as it ran; both are given, named, and a slow job's rates keep their
    digits (two decimals made 0.005 cand/s 0.01, and 0.004 GFLOP/s 0.0)."""
    from types import SimpleNamespace

    from rmfast.scoring.plan import finish_manifest

    m = finish_manifest({"candidates_per_s": 0.003, "scan_s": 1000.0, "scored_candidates": 3}, 0.0,
                        plan=SimpleNamespace(pad_probe_s=400.0, decisions={}, rows_run={}))
    assert m["pad_probe_s"] == 400.0
    assert m["candidates_per_s"] == 0.005 and m["candidates_per_s_with_pad_probe"] == 0.003
    m = finish_manifest({"candidates_per_s": 5000 / 126.3, "scan_s": 126.3, "scored_candidates": 5000}, 0.0,
                        plan=SimpleNamespace(pad_probe_s=52.4, decisions={}, rows_run={}))
    assert m["candidates_per_s"] == pytest.approx(67.66, abs=0.01)
    assert m["candidates_per_s_with_pad_probe"] == pytest.approx(39.59, abs=0.01)


def test_the_padding_probe_is_announced_with_its_time_before_it_runs(smol_rm, tmp_path, monkeypatch, capsys):
    """Issue 51 item 2: the one-off padding probe ran ~52 s without a word. Its full batch is announced, with an
    estimate from the short batch timed first, before it runs."""
    from rmfast.fast.engine import Engine
    from rmfast.scoring.batching import PadSizes
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    if str(next(smol_rm.model.parameters()).dtype) != "torch.float32":
        pytest.skip("fp32 only: the rule is the same")
    monkeypatch.setattr(padding, "_FULL_SCORES", weakref.WeakKeyDictionary())
    plan = plan_scoring(smol_rm.model, build_template(smol_rm.tokenizer, PROMPT), head="score")
    said = []  # stderr so far, as each batch of the probe starts
    real = Engine.score
    monkeypatch.setattr(Engine, "score", lambda self, ids, *a, **k: said.append((ids.shape[0], capsys.readouterr().err))
                        or real(self, ids, *a, **k))
    pads = PadSizes(plan.eng, 1, 64, tmp_path)
    pads.rows_for(5)
    (n0, before_short), (n_warm, before_warm), (n1, before_full) = said  # the short batch, again warm, the full one
    assert (n0, n_warm, n1) == (32, 32, 64) and "measuring once" not in before_short + before_warm
    assert "measuring once which short batches" in before_full and "one batch of 64 rows, about " in before_full


def test_the_progress_bar_says_what_runs_during_the_first_batch(capsys):
    """Issue 51 item 2: a scan showed `0/N ?cand/s` for its whole first batch (minutes on a slow CPU), which looks
    like a hang; the bar says the first batch is running, and its size."""
    from rmfast.scoring.batching import Group, score_groups

    def score(rows, b):
        return np.zeros(len(rows), np.float32)

    score_groups([Group(np.arange(10), 4, score)], np.arange(10), key="k", progress=True, desc="scan")
    assert "first batch of 4 rows running" in capsys.readouterr().err
