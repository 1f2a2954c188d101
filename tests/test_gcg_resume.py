"""A GCG search's checkpoint (rmfast.gcg.checkpoint): a search stopped anywhere (mid-step, between restarts, in
restart 0 or a later one) and run again with its checkpoint ends with exactly what an uninterrupted search gives
(every restart's trajectory, evaluations, best ids and score: the same bits); another search's checkpoint is never
trusted; the CLI's rerun of the same command goes on from it.

Tiny random Llama classifier with SmolLM2's tokenizer, fp32, one thread, small settings (seeded: deterministic).
"""

import json

import pytest
import torch

from rmfast.gcg import GCGConfig, GCGInterrupted, run

import tiny_models as T

PROMPT = "What, in one word, is the best thing ever?"
CFG = dict(length=4, steps=5, search_width=24, topk=16, patience=50, restarts=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model():
    return T.tiny("llama", "classifier")


@pytest.fixture(scope="module")
def clean(model, smol_tokenizer):
    """The uninterrupted search (no checkpoint)."""
    return run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False)


def _interrupt_at(monkeypatch, n_call: int):
    """The search's scorer raises KeyboardInterrupt (as Ctrl-C does) at its ``n_call``-th call, mid-step: the
    step's candidates were drawn (its generator moved on), its evaluation never came back."""
    from rmfast.gcg import search

    real, calls = search._score_all, [0]

    def call(plan, cands):
        calls[0] += 1
        if calls[0] == n_call:
            raise KeyboardInterrupt
        return real(plan, cands)

    monkeypatch.setattr(search, "_score_all", call)


def _same(a, b):
    keys = ("best_ids", "best_score", "trajectory", "evaluated", "init_ids", "steps_run", "stopped")
    assert [{k: r[k] for k in keys} for r in a.restarts] == [{k: r[k] for k in keys} for r in b.restarts]
    assert (a.best_ids, a.best_score, a.n_evaluated, a.n_skipped_duplicate, a.n_rejected_retokenize) == (
        b.best_ids, b.best_score, b.n_evaluated, b.n_skipped_duplicate, b.n_rejected_retokenize)


# scorer calls: restart 0's start (1) and 5 steps (2-6); restart 1's start (7) and steps (8-12)
@pytest.mark.parametrize("n_call", [4, 7, 10], ids=["restart-0-mid-step", "restart-1-start", "restart-1-mid-step"])
def test_a_search_stopped_anywhere_goes_on_to_the_uninterrupted_bits(model, smol_tokenizer, clean, tmp_path,
                                                                     monkeypatch, n_call):
    ck = tmp_path / "g.partial.npz"
    _interrupt_at(monkeypatch, n_call)
    with pytest.raises(GCGInterrupted):
        run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False, checkpoint=ck)
    assert ck.is_file()
    monkeypatch.undo()
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False, checkpoint=ck)
    _same(res, clean)
    r = res.manifest["resumed"]
    assert r["from"] == str(ck) and r["restarts_done"] == (0 if n_call < 7 else 1)
    assert r["step"] == {4: 2, 7: 0, 10: 2}[n_call], r
    assert not ck.exists(), "a finished search removes its checkpoint"
    assert clean.manifest["resumed"] is None


def test_another_searchs_checkpoint_is_never_trusted(model, smol_tokenizer, clean, tmp_path, monkeypatch):
    ck = tmp_path / "g.partial.npz"
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(GCGInterrupted):
        run(model, smol_tokenizer, PROMPT, GCGConfig(**{**CFG, "seed": 1}), progress=False, checkpoint=ck)
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"not resuming from .*seed.*differed|not resuming from .*gcg"):
        res = run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False, checkpoint=ck)
    _same(res, clean)
    assert res.manifest["resumed"] is None
    ck.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="it cannot be read"):
        _same(run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False, checkpoint=ck), clean)


def test_more_restarts_on_a_rerun_go_on_after_the_saved_ones(model, smol_tokenizer, clean, tmp_path):
    """--restarts only decides when the search stops: a kept checkpoint of one restart goes on into the second."""
    ck = tmp_path / "g.partial.npz"
    one = run(model, smol_tokenizer, PROMPT, GCGConfig(**{**CFG, "restarts": 1}), progress=False, checkpoint=ck,
              keep_checkpoint=True)
    assert ck.is_file() and len(one.restarts) == 1
    _same(run(model, smol_tokenizer, PROMPT, GCGConfig(**CFG), progress=False, checkpoint=ck), clean)


def test_cli_rerun_of_the_same_command_goes_on_from_ctrl_c(tiny_dir, capsys, tmp_path, monkeypatch):
    from rmfast.cli import main

    out = tmp_path / "g.json"
    argv = ["gcg", str(tiny_dir), "--prompt", "Hi", "--length", "3", "--steps", "4", "--search-width", "8", "--topk",
            "8", "--no-progress", "--no-plot", "--dtype", "float32"]
    assert main(argv + ["--out", str(tmp_path / "clean.json")]) == 0
    clean = json.loads((tmp_path / "clean.json").read_text())
    capsys.readouterr()
    _interrupt_at(monkeypatch, 3)  # the start and one step
    assert main(argv + ["--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"The same command goes on from {out}.partial.npz" in err, err
    assert json.loads(out.read_text())["interrupted"] is True
    monkeypatch.undo()
    assert main(argv + ["--out", str(out)]) == 0, capsys.readouterr().err  # no --overwrite: it said so
    d = json.loads(out.read_text())
    assert not d["interrupted"] and d["manifest"]["resumed"]["step"] == 1
    assert (d["best_ids"], d["restarts"][0]["trajectory"]) == (clean["best_ids"], clean["restarts"][0]["trajectory"])
    assert not (tmp_path / "g.json.partial.npz").exists()
    capsys.readouterr()
    assert main(argv + ["--out", str(out)]) == 2  # a finished output is not replaced without --overwrite
    assert "already exists" in capsys.readouterr().err
