"""GCG (rmfast.gcg): direction, GCG vs random search, reported score vs an independent forward,
the retokenization filter, excluded tokens, the CLI's one-line errors, Ctrl-C and the checkpoint's resume.

Tiny random models (a Llama classifier on the score head, a Gemma 2 causal LM on the logprob head,
both with the real 49,152-token vocabulary) and the embedded SmolLM2, all fp32, small settings.
Every run is seeded, so the comparisons are deterministic; the margins seen are wide (GCG's
best is several random-search spreads beyond random search's best).
"""

import json
import math

import pytest
import torch

from rmfast.errors import UserError
from rmfast.gcg import GCGConfig, GCGInterrupted, allowed_tokens, random_search, run
from rmfast.gcg.search import _Gradient
from rmfast.scoring.hf_path import hf_scores
from rmfast.scoring.candidates import special_ids
from rmfast.template import build_template, response_ids

import tiny_models as T

PROMPT = "What, in one word, is the best thing ever?"
SMALL = dict(length=4, steps=8, search_width=48, topk=24, patience=50)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on this shared 2-core box, two OpenMP threads under load run 4-8x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tmpl(smol_tokenizer):
    return build_template(smol_tokenizer, PROMPT)


@pytest.fixture(scope="module")
def allowed(smol_tokenizer):
    return allowed_tokens(smol_tokenizer, T.VOCAB)


MODELS = {"llama-score": ("llama", "classifier"), "gemma2-logprob": ("gemma2", "causal_lm")}


@pytest.fixture(scope="module", params=list(MODELS))
def runs(request, smol_tokenizer, tmpl):
    """One model, GCG in both directions, and random search with the same number of evaluations."""
    model = T.tiny(*MODELS[request.param])
    out = {"name": request.param, "model": model}
    for d, mx in (("max", True), ("min", False)):
        cfg = GCGConfig(**SMALL, maximize=mx)
        res = run(model, smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
        rnd = random_search(model, smol_tokenizer, PROMPT, cfg, res.n_evaluated, template=tmpl)
        out[d], out[f"rand_{d}"] = res, rnd
    return out


def test_maximize_ends_above_minimize(runs):
    mx, mn = runs["max"], runs["min"]
    assert mx.best_score > mn.best_score
    # both start from the same seeded random response and move in their own direction
    assert mx.trajectory[0] == mn.trajectory[0]
    assert mx.trajectory[-1] > mx.trajectory[0]
    assert mn.trajectory[-1] < mn.trajectory[0], "minimize must LOWER the reward (the fork's sign bug)"
    assert all(b >= a for a, b in zip(mx.trajectory, mx.trajectory[1:]))
    assert all(b <= a for a, b in zip(mn.trajectory, mn.trajectory[1:]))


def test_gcg_beats_random_search_same_budget(runs):
    for d, sign in (("max", 1), ("min", -1)):
        res, rnd = runs[d], runs[f"rand_{d}"]
        assert rnd.n_evaluated == res.n_evaluated
        spread = torch.tensor(rnd.scores).std().item()
        # a clear margin: GCG's best is at least half a random-score spread beyond random's best
        assert sign * (res.best_score - rnd.best_score) > 0.5 * spread, (runs["name"], d, res.best_score, rnd.best_score, spread)


def test_reported_score_equals_independent_forward(runs, tmpl):
    head = "score" if runs["name"].endswith("score") else "logprob"
    for d in ("max", "min"):
        res = runs[d]
        ref = hf_scores(runs["model"], tmpl, [res.best_ids], head=head)[0].item()
        assert res.best_score == pytest.approx(ref, abs=1e-4)
        assert res.best_score_reference == pytest.approx(ref, abs=1e-4)
        for r in res.restarts:  # every restart's best, too
            assert r["best_score"] == pytest.approx(hf_scores(runs["model"], tmpl, [r["best_ids"]], head=head)[0].item(), abs=1e-4)


def test_retokenization_and_excluded_tokens(runs, smol_tokenizer, tmpl, allowed):
    special = special_ids(smol_tokenizer)
    for d in ("max", "min"):
        res = runs[d]
        assert len(res.best_ids) == SMALL["length"]
        assert response_ids(smol_tokenizer, tmpl, res.best_text) == res.best_ids
        assert all(bool(allowed[t]) for t in res.best_ids)
        assert not special & set(res.best_ids)
        assert res.best_text.isascii() and res.best_text.isprintable()
        assert res.n_rejected_retokenize >= 0 and res.n_evaluated > SMALL["search_width"]


def test_gradient_pass_computes_the_reward(runs, tmpl):
    """The autograd path (one-hot @ W x embed scale, inputs_embeds) scores what the reference scores."""
    head = "score" if runs["name"].endswith("score") else "logprob"
    ids = runs["max"].best_ids
    r, g = _Gradient(runs["model"], tmpl, head, 0)(torch.tensor(ids))
    assert r == pytest.approx(hf_scores(runs["model"], tmpl, [ids], head=head)[0].item(), abs=1e-4)
    assert g.shape == (len(ids), T.VOCAB) and torch.isfinite(g).all()


def test_init_text_and_restarts(smol_tokenizer, tmpl):
    model = T.tiny("llama")
    cfg = GCGConfig(length=9, steps=3, search_width=16, topk=8, restarts=2, init=" good great", maximize=False)
    res = run(model, smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    init = response_ids(smol_tokenizer, tmpl, " good great")
    assert res.restarts[0]["init_ids"] == init and len(res.best_ids) == len(init)  # init sets the length
    assert len(res.restarts) == 2 and res.restarts[1]["init_ids"] != init
    assert res.best_score == min(r["best_score"] for r in res.restarts)
    assert res.manifest["engine"] == "fast" and res.manifest["length"] == len(init)
    assert res.config["length"] == len(init) != cfg.length  # the result's config says the length that ran


def test_a_plain_template_with_a_space_before_the_response(smol_tokenizer):
    """The embedded base models' default "User: {prompt}\nAssistant: {response}": the space before the response is
    its first token's. GCG starts from random tokens (every candidate was rejected: decode(ids) rendered two spaces),
    moves, and reports texts that render to exactly its ids, so scoring the reported text gives the reported score."""
    plain = build_template(smol_tokenizer, PROMPT, template="User: {prompt}\nAssistant: {response}")
    model = T.tiny("llama", "causal_lm")
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(length=3, steps=3, search_width=16, topk=16), progress=False,
              template=plain)
    assert res.n_evaluated > 1 and res.restarts[0]["best_text_exact"]
    assert response_ids(smol_tokenizer, plain, res.best_text) == res.best_ids
    assert float(hf_scores(model, plain, [response_ids(smol_tokenizer, plain, res.best_text)], head="logprob")[0]) \
        == pytest.approx(res.best_score, abs=1e-4)
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(steps=2, search_width=16, topk=16, init="The best thing"),
              progress=False, template=plain)
    assert res.restarts[0]["init_text"] == "The best thing" and res.n_evaluated > 1  # no spurious leading space
    rnd = random_search(model, smol_tokenizer, PROMPT, GCGConfig(length=3), 8, template=plain)
    assert response_ids(smol_tokenizer, plain, rnd.best_text) == rnd.best_ids


@pytest.mark.parametrize("bad, msg", [
    (dict(length=0), "length"), (dict(topk=0), "topk"), (dict(search_width=0), "search_width"),
    (dict(head="nope"), "head"), (dict(batch_size="x"), "batch_size"), (dict(compile="yes"), "compile='yes'"),
])
def test_config_errors(bad, msg):  # a Python caller reads its keyword arguments (the CLI's flags: below)
    with pytest.raises(UserError, match=msg):
        GCGConfig(**bad).validate()


@pytest.mark.parametrize("argv, msg", [
    (["--length", "0"], "--length must be"), (["--topk", "0"], "--topk must be"),
    (["--search-width", "0"], "--search-width must be"),
    (["--greedy-candidates", "--n-replace", "2"], "one position per candidate"),
    (["--distance-penalty", "-1"], "--distance-penalty must be"),
    (["--init", "a", "--init-string", "b"], "both given"),
    (["--init", "Hi", "--length", "5"], "--length 5 and --init both set the response length"),
])
def test_cli_errors_are_one_line(argv, msg, capsys, tmp_path):
    from rmfast.cli import main

    assert main(["gcg", "--out", str(tmp_path / "x.json"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_cli_refuses_existing_out(capsys, tmp_path):
    from rmfast.cli import main

    out = tmp_path / "worst.json"
    out.write_text("{}")
    assert main(["gcg", "--minimize", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and "--overwrite" in err and "\n" not in err
    # --out x.png: the JSON was written there, then the plot (x.png too) replaced it, exit 0 ("wrote x.png and x.png")
    assert main(["gcg", "--minimize", "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "give a path ending in .json" in err and "\n" not in err and not (tmp_path / "x.png").exists()


def test_embedded_smollm2(smollm2, capsys, tmp_path, monkeypatch):
    """The embedded SmolLM2 (logprob head) through the CLI and the API: direction, random search, oracle."""
    from rmfast.cli import common, main

    monkeypatch.setattr(common, "load_model", lambda args, random_head_seed=None, **kw: smollm2)  # the fp32 fixture, loaded once
    tok, model = smollm2.tokenizer, smollm2.model
    tmpl = build_template(tok, PROMPT)
    out = tmp_path / "worst.json"
    assert main(["gcg", "--prompt", PROMPT, "--length", "3", "--minimize", "--steps", "4",
                 "--search-width", "24", "--topk", "24", "--seed", "0", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "best score" in printed and "reference score" in printed
    mn = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file()
    assert mn["best_score"] == pytest.approx(mn["best_score_reference"], abs=1e-4)
    assert mn["best_score"] == pytest.approx(hf_scores(model, tmpl, [mn["best_ids"]], head="logprob")[0].item(), abs=1e-4)
    assert response_ids(tok, tmpl, mn["best_text"]) == mn["best_ids"]
    assert len(mn["trajectory"]) == 5 and mn["trajectory"][-1] < mn["trajectory"][0]
    for key in ("config", "timing", "manifest", "restarts", "n_evaluated"):
        assert key in mn
    # a first run's one-off padding measurement is its own figure, not the evaluations' rate
    t = mn["timing"]
    assert t["pad_probe_s"] >= 0 and t["evaluated_per_s"] == pytest.approx(mn["n_evaluated"] / t["evaluate_s"], rel=0.02)
    assert ("a one-off padding measurement" in printed) == (t["pad_probe_s"] > 0)
    # the time line's parts add up to the wall (the steps' split had been given beside the starts' evaluation too, and
    # summed past the steps' time): the evaluation inside the steps is within them, the rest is named
    import re

    line = next(ln for ln in printed.splitlines() if ln.startswith("time "))
    parts = [float(x) for x in re.findall(r"(?:set-up|steps|evaluation|the rest) ([\d.]+) s(?!/)", line)]
    setup, steps, ev_in, ev_start, rest = parts
    assert t["evaluate_in_steps_s"] <= sum(t["step_s"]) + 1e-3 and ev_in == pytest.approx(t["evaluate_in_steps_s"], abs=0.06)
    assert setup + steps + ev_start + rest == pytest.approx(t["wall_s"], abs=0.2), line
    assert ev_start == pytest.approx(t["evaluate_s"] - t["evaluate_in_steps_s"], abs=0.06) and ev_start > 0

    mx = run(model, tok, PROMPT, GCGConfig(length=3, steps=4, search_width=24, topk=24), progress=False, template=tmpl)
    assert mx.best_score > mn["best_score"]
    assert mx.best_score == pytest.approx(hf_scores(model, tmpl, [mx.best_ids], head="logprob")[0].item(), abs=1e-4)
    for d, best, n, sign in (("max", mx.best_score, mx.n_evaluated, 1), ("min", mn["best_score"], mn["n_evaluated"], -1)):
        rnd = random_search(model, tok, PROMPT, GCGConfig(length=3, maximize=sign > 0), n, template=tmpl)
        assert sign * (best - rnd.best_score) > 0, (d, best, rnd.best_score)


@pytest.mark.compiles
def test_compiled_engine_evaluator(smol_tokenizer, tmpl):
    """compile="on": the engine evaluator runs the compiled CPU layer (batches of varying size padded
    to one graph) and the reported best score still equals a plain-HF forward (fp32)."""
    model = T.tiny("llama")
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(**{**SMALL, "steps": 3}, compile="on"), progress=False, template=tmpl)
    assert res.manifest["compiled"] is True
    assert res.best_score == pytest.approx(res.best_score_reference, abs=1e-4)
    ref = hf_scores(model, tmpl, [res.best_ids], head="score")[0].item()
    assert res.best_score == pytest.approx(ref, abs=1e-4)


# --------------------------------------------------------------------------------------------
# the study fork's options (rmfast.gcg.select): greedy pairs, distance penalty, init strings, sign bug


def _search(model, tok, tmpl, **kw):
    from rmfast.gcg.search import _prepare

    cfg = GCGConfig(**{**SMALL, "retokenize_filter": False, **kw})
    cfg.validate()
    return _prepare(model, tok, PROMPT, cfg, tmpl)


def test_greedy_pairs_equal_brute_force_top_k():
    """Planted (L, V) scores with ties: the pairs in order are the brute-force sort of all allowed swaps."""
    from rmfast.gcg.select import greedy_pairs

    g = torch.Generator().manual_seed(0)
    L, V = 4, 50
    sel = torch.randint(-20, 20, (L, V), generator=g).float()  # many ties
    allowed = torch.rand(V, generator=g) > 0.3
    cur = torch.tensor([3, 7, 7, 40])
    brute = sorted(((sel[p, t].item(), p * V + t), (p, t)) for p in range(L) for t in range(V)
                   if allowed[t] and t != cur[p])
    assert list(greedy_pairs(sel, allowed, cur)) == [pt for _, pt in brute]


def test_greedy_candidates_are_the_best_single_swaps(smol_tokenizer, tmpl):
    """A greedy step's candidates: the search_width best (position, token) swaps of a planted selection
    matrix, past the already-seen ones."""
    from rmfast.gcg.search import _candidates
    from rmfast.gcg.tokens import key as _key

    s = _search(T.tiny("llama"), smol_tokenizer, tmpl, greedy=True, search_width=12)
    cur = torch.tensor([300, 301, 302, 303])
    sel = torch.randn(4, s.n_vocab, generator=torch.Generator().manual_seed(1))
    order = sorted(((sel[p, t].item(), p, t) for p in range(4) for t in s.allowed_ids.tolist() if t != cur[p]))
    rows = [[*cur[:p].tolist(), t, *cur[p + 1:].tolist()] for _, p, t in order]
    s.seen[_key(rows[1])] = None  # already evaluated: skipped, the 13th best takes its place
    got = _candidates(s, cur, sel, torch.Generator())
    assert got == [rows[0]] + rows[2:13] and s.n_dup == 1


def test_distance_penalty_formula(smol_tokenizer, tmpl):
    """The penalty on a planted embedding table, and the selection = loss gradient + penalty."""
    from rmfast.gcg.search import _loss_matrix
    from rmfast.gcg.select import distance_penalty

    W = torch.randn(30, 5, generator=torch.Generator().manual_seed(2))
    cur = torch.tensor([4, 17])
    want = torch.tensor([[2.5 * sum((W[c, d] - W[v, d]).item() ** 2 for d in range(5)) ** 0.5 for v in range(30)]
                         for c in cur])
    torch.testing.assert_close(distance_penalty(W, cur, 2.5), want, rtol=1e-5, atol=1e-5)

    s = _search(T.tiny("llama"), smol_tokenizer, tmpl, distance_penalty=4.5, maximize=False)
    g = torch.randn(4, s.n_vocab, generator=torch.Generator().manual_seed(3))
    s.grad_fn = lambda ids: (0.25, g)  # planted reward and gradient
    cur = torch.tensor([300, 301, 302, 303])
    torch.testing.assert_close(_loss_matrix(s, cur), g + distance_penalty(s.emb, cur, 4.5))  # minimize: loss = +reward


def test_authors_sign_bug_only_under_compat(smol_tokenizer, tmpl):
    """--compat authors: the selection is 2 (r - 30) g in both directions; without it the directions differ."""
    from rmfast.gcg.search import _loss_matrix

    g = torch.randn(4, T.VOCAB, generator=torch.Generator().manual_seed(4))
    cur = torch.tensor([300, 301, 302, 303])
    model = T.tiny("llama")
    sel = {}
    for compat in (None, "authors"):
        for mx in (True, False):
            s = _search(model, smol_tokenizer, tmpl, maximize=mx, compat=compat)
            s.grad_fn = lambda ids: (1.5, g)
            sel[compat, mx] = _loss_matrix(s, cur)
    torch.testing.assert_close(sel["authors", True], 2 * (1.5 - 30) * g)
    assert torch.equal(sel["authors", True], sel["authors", False])  # the bug: minimizing proposes the same swaps
    assert torch.equal(sel[None, True], -sel[None, False])


def test_authors_keeps_the_forks_pick_closest_to_30():
    """--compat authors kept rmfast's pick (the largest or smallest reward) where the fork keeps the least loss, the
    reward closest to +30 (maximize) or -30 (minimize): the two differ once a reward passes 30 (a QA probe: the fork
    keeps 35.07 where rmfast kept 35.79). Now the buffer, the step's "improved" and the best restart follow the fork
    under compat, and rmfast's own pick without it; a checkpoint of the old rule is another search."""
    import dataclasses

    from rmfast.gcg import checkpoint as gck
    from rmfast.gcg.search import _merge, _objective

    rows = [[1], [2], [3], [4]]
    up = torch.tensor([35.79, 35.07, 10.0, float("nan")])
    assert [r for _, r in _merge([], rows, up, 1.0, 4)] == [[1], [2], [3]]
    assert [r for _, r in _merge([], rows, up, 1.0, 4, "authors")] == [[2], [1], [3]]
    down = torch.tensor([-35.0, -29.0, 5.0, float("inf")])
    assert [r for _, r in _merge([], rows, down, -1.0, 4)] == [[1], [2], [3]]
    assert [r for _, r in _merge([], rows, down, -1.0, 4, "authors")] == [[2], [1], [3]]
    assert [r for _, r in _merge([(31.0, [9])], rows, up, 1.0, 2, "authors")] == [[9], [2]]  # 31 beats 35.07
    assert _objective(float("nan"), 1.0, "authors") == -math.inf
    cfg = GCGConfig(compat="authors")
    assert gck.job_of({}, cfg)["gcg"]["keep"] == "closest to +-30"
    assert "keep" not in gck.job_of({}, dataclasses.replace(cfg, compat=None))["gcg"]  # old plain checkpoints resume


def test_the_random_baseline_keeps_the_searchs_pick_under_compat(smol_tokenizer, tmpl, monkeypatch):
    """--baseline random kept the largest (or smallest) reward where GCG under --compat authors keeps the one closest
    to +-30: once rewards pass 30 the two were picked by different rules (a recheck)."""
    from rmfast.gcg import search as S

    planted = torch.tensor([35.79, 35.07, 10.0, 29.0, 40.0, 31.5, -3.0, 5.0])
    monkeypatch.setattr(S, "_score_all", lambda plan, ids: planted[: len(ids)])
    model = T.tiny("llama")
    for compat, want in ((None, 40.0), ("authors", 29.0)):
        rnd = S.random_search(model, smol_tokenizer, PROMPT, GCGConfig(length=3, compat=compat), 8, template=tmpl)
        assert rnd.best_score == pytest.approx(want), compat


def test_short_runs_with_each_fork_option(smol_tokenizer, tmpl):
    """Each option on a tiny classifier: it runs, moves the reward its way, and reports an exact score."""
    model = T.tiny("llama")
    base = dict(steps=4, search_width=16, topk=8, length=4)
    inits = [" good good good", " bad bad bad", " one two three"]
    for kw in (dict(greedy=True), dict(distance_penalty=4.5), dict(init_strings=inits),
               dict(compat="authors", maximize=False), dict(greedy=True, distance_penalty=4.5, compat="authors")):
        res = run(model, smol_tokenizer, PROMPT, GCGConfig(**{**base, **kw}), progress=False, template=tmpl)
        ref = hf_scores(model, tmpl, [res.best_ids], head="score")[0].item()
        assert res.best_score == pytest.approx(ref, abs=1e-4), kw
        sign = 1 if kw.get("maximize", True) else -1
        assert sign * (res.trajectory[-1] - res.trajectory[0]) >= 0, kw
        assert res.config["greedy"] == kw.get("greedy", False) and res.config["compat"] == kw.get("compat")
        keep = res.manifest["candidate_selection"]["keep"]
        assert keep == (f"the fork's: the reward closest to {'+' if sign > 0 else '-'}30 (its loss.argmin())"
                        if kw.get("compat") else "the largest reward"), kw
    # init strings: restart 0 starts from the best of them
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(**base, init_strings=inits), progress=False, template=tmpl)
    ids = [response_ids(smol_tokenizer, tmpl, t) for t in inits]
    scores = hf_scores(model, tmpl, ids, head="score")
    assert res.restarts[0]["init_ids"] == ids[int(scores.argmax())]


def test_init_strings_of_different_lengths_refused(smol_tokenizer, tmpl):
    with pytest.raises(UserError, match="different lengths"):
        _search(T.tiny("llama"), smol_tokenizer, tmpl, init_strings=[" good", " good good"])
    with pytest.raises(UserError, match="logprob"):
        _search(T.tiny("llama", kind="causal_lm"), smol_tokenizer, tmpl, compat="authors")


# --------------------------------------------------------------------------------------------
# NaN / inf scores (an fp16 overflow in a real model does this)


def _poisoned_scorer(monkeypatch, bad):
    """The run's scorer, with the rows ``bad(row)`` picks scored ``bad(row)`` (NaN, +inf or -inf) instead."""
    from rmfast.gcg import search

    real = search._score_all

    def call(plan, cands):
        out = real(plan, cands).clone()
        for i, row in enumerate(cands.tolist()):
            v = bad(row)
            if v is not None:
                out[i] = v
        return out

    monkeypatch.setattr(search, "_score_all", call)


@pytest.mark.parametrize("maximize", [True, False])
def test_nonfinite_candidates_are_never_the_best(maximize, smol_tokenizer, tmpl, monkeypatch):
    """A third of the candidates scored NaN, +inf or -inf: GCG and random search still finish, report a finite
    best that is no such row, count them in the result and the manifest, and warn once. (Before: a NaN in the
    buffer stalled the search at its start, no count, no word.)"""
    poison = {0: float("nan"), 1: float("inf"), 2: float("-inf")}
    _poisoned_scorer(monkeypatch, lambda row: poison.get(sum(row) % 9))
    model = T.tiny("llama")
    cfg = GCGConfig(**{**SMALL, "steps": 4}, maximize=maximize)
    with pytest.warns(UserWarning, match=r"gcg: \d+ of \d+ candidates scored NaN or inf .*never taken as best"):
        res = run(model, smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    assert res.n_nonfinite > 0 and res.manifest["n_nonfinite"] == res.n_nonfinite
    assert sum(res.best_ids) % 9 not in poison and torch.isfinite(torch.tensor(res.best_score))
    sign = 1 if maximize else -1  # the search still moves (before: NaN at the buffer's head stalled every step)
    assert sign * (res.trajectory[-1] - res.trajectory[0]) > 0, res.trajectory
    assert all(torch.isfinite(torch.tensor(r["best_score"])) or r["best_ids"] == r["init_ids"] for r in res.restarts)
    assert res.best_score == pytest.approx(res.best_score_reference, abs=1e-4)
    rnd = random_search(model, smol_tokenizer, PROMPT, cfg, 200, template=tmpl)
    assert sum(rnd.best_ids) % 9 not in poison and torch.isfinite(torch.tensor(rnd.best_score))


def test_every_candidate_nonfinite_is_one_line(smol_tokenizer, tmpl, monkeypatch):
    _poisoned_scorer(monkeypatch, lambda row: float("nan"))
    cfg = GCGConfig(**{**SMALL, "steps": 2})
    with pytest.raises(UserError, match="every candidate scored NaN or inf .*float32 has float32's range, so the "
                                        "model's own weights or activations are not finite"):
        run(T.tiny("llama"), smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    with pytest.raises(UserError, match="every candidate scored NaN or inf"):
        random_search(T.tiny("llama"), smol_tokenizer, PROMPT, cfg, 50, template=tmpl)


# --------------------------------------------------------------------------------------------
# the README's example


def _readme_gcg_example() -> list[str]:
    """The README's GCG example: the one line of README.md that starts ``rmfast gcg``, as argv."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in readme.splitlines() if ln.strip().startswith("rmfast gcg ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def test_readme_gcg_example_runs(smollm2, capsys, tmp_path, monkeypatch):
    """The README's GCG example parses with the CLI's own parser and runs as written (a tiny random
    causal LM on the embedded tokenizer stands in for SmolLM2; one narrow step) to the lines the README
    shows: the start, the best, and the random-search baseline of as many evaluations."""
    import dataclasses

    from rmfast.cli import build_parser, common, main

    argv = _readme_gcg_example()
    args = build_parser().parse_args(argv)
    assert args.model == "smollm2-135m-instruct" and args.baseline == "random" and args.init
    tiny = dataclasses.replace(smollm2, model=T.tiny("gemma2", "causal_lm"))
    monkeypatch.setattr(common, "load_model", lambda a, random_head_seed=None, **kw: tiny)
    out = tmp_path / "example.json"
    assert main([*argv, "--steps", "1", "--search-width", "8", "--topk", "8", "--no-progress", "--no-plot",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert f"start score     {res['trajectory'][0]:.6f}  {args.init!r}" in printed
    assert "best text" in printed and "random search" in printed
    base = res["baseline"]
    assert base["method"] == "random" and base["n_evaluated"] == res["n_evaluated"]
    assert len(base["best_ids"]) == res["manifest"]["length"]
    tmpl = build_template(smollm2.tokenizer, args.prompt)
    assert base["best_score"] == pytest.approx(hf_scores(tiny.model, tmpl, [base["best_ids"]], head="logprob")[0].item(), abs=1e-4)


def test_a_search_width_that_cannot_fit_is_one_line_before_any_work(smol_tokenizer, tmpl, monkeypatch):
    """A step samples search_width candidates at once: a width past half the host's available memory (here 1 GiB,
    monkeypatched) is refused naming the width, the memory it needs and the fix; so is random search's count.
    (A width of 10^9 was an out-of-memory kill of the whole process.)"""
    from rmfast.gcg import search

    monkeypatch.setattr(search, "available_memory", lambda device: 2**30)
    model = T.tiny("llama")
    with pytest.raises(UserError, match=r"search_width 10,000,000 x 4 tokens needs ~2\.2 GiB at once, over half of "
                                        r"this machine's available 1\.0 GiB: give a smaller search_width"):
        run(model, smol_tokenizer, PROMPT, GCGConfig(**{**SMALL, "search_width": 10**7}), progress=False, template=tmpl)
    with pytest.raises(UserError, match="n_candidates 10,000,000 x 4 tokens"):
        random_search(model, smol_tokenizer, PROMPT, GCGConfig(**SMALL), 10**7, template=tmpl)
    res = run(model, smol_tokenizer, PROMPT, GCGConfig(**{**SMALL, "steps": 1}), progress=False, template=tmpl)
    assert res.n_evaluated > 0  # a width that fits runs as before


# --------------------------------------------------------------------------------------------
# a new user's finds: Ctrl-C kept nothing; settings past what the search has were clamped without a word


def _interrupt_after(monkeypatch, n_calls: int):
    """The run's scorer, raising KeyboardInterrupt (as Ctrl-C does) at its ``n_calls``-th call."""
    from rmfast.gcg import search

    real, calls = search._score_all, [0]

    def call(plan, cands):
        calls[0] += 1
        if calls[0] == n_calls:
            raise KeyboardInterrupt
        return real(plan, cands)

    monkeypatch.setattr(search, "_score_all", call)


def test_an_interrupted_search_is_a_result_of_what_it_found(smol_tokenizer, tmpl, monkeypatch):
    cfg = GCGConfig(**{**SMALL, "steps": 5}, restarts=2)
    _interrupt_after(monkeypatch, 1 + 5 + 1 + 3)  # restart 0: its start and 5 steps; restart 1: its start, 2 steps
    with pytest.raises(GCGInterrupted) as got:
        run(T.tiny("llama"), smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    res = got.value.result
    assert res.interrupted and [r["stopped"] for r in res.restarts] == ["steps", "interrupted"]
    assert [r["steps_run"] for r in res.restarts] == [5, 2]
    best = max(max(r["trajectory"]) for r in res.restarts)
    assert res.best_score == best and res.best_score == pytest.approx(res.best_score_reference, abs=1e-4)
    _interrupt_after(monkeypatch, 1)  # nothing scored yet: a plain interrupt
    with pytest.raises(KeyboardInterrupt) as plain:
        run(T.tiny("llama"), smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    assert not isinstance(plain.value, GCGInterrupted)


def test_cli_writes_the_search_so_far_on_ctrl_c(tiny_dir, capsys, tmp_path, monkeypatch):
    from rmfast.cli import main

    import re
    import time as _time

    from rmfast.gcg import search

    out = tmp_path / "g.json"
    _interrupt_after(monkeypatch, 4)  # the start and two steps
    inner = search._score_all

    def slow(plan, cands):  # each evaluation 0.3 s first, the interrupted one's too: the cut step's share shows
        _time.sleep(0.3)
        return inner(plan, cands)

    monkeypatch.setattr(search, "_score_all", slow)
    argv = ["gcg", str(tiny_dir), "--prompt", "Hi", "--length", "3", "--steps", "6", "--search-width", "8", "--topk",
            "8", "--no-progress", "--no-plot", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    d = json.loads(out.read_text())
    assert d["interrupted"] is True and d["restarts"][0]["steps_run"] == 2, d["restarts"]
    assert "interrupted after 2 step(s); wrote the best so far" in err and "a new search from the best with --init" in err, err
    # the third step, stopped in its evaluation, has its own time (it had landed in "the rest")
    from rmfast.cli.gcg import time_line

    t = d["timing"]
    line = time_line(t, False)
    assert t["unfinished_step_s"] >= 0.3 and "the step Ctrl-C stopped" in line  # its 0.3 s evaluation is its own
    rest = float(re.search(r"the rest ([0-9.]+) s", line).group(1))  # and not in the rest as well: the parts add up
    start = max(t["evaluate_s"] - t["evaluate_in_steps_s"], 0.0)
    parts = t["setup_s"] + sum(t["step_s"]) + t["unfinished_step_s"] + start + rest
    assert abs(parts - t["wall_s"]) < 0.15, (parts, t)


def test_settings_past_what_the_search_has_are_said_and_recorded(smol_tokenizer, tmpl):
    cfg = GCGConfig(**{**SMALL, "steps": 1, "topk": 10**6}, n_replace=9)
    with pytest.warns(UserWarning) as w:
        res = run(T.tiny("llama"), smol_tokenizer, PROMPT, cfg, progress=False, template=tmpl)
    said = " ".join(str(x.message) for x in w)
    assert "--topk 1000000 is more than the" in said or "topk=1000000 is more than the" in said, said
    assert "is more than the response's 4 tokens: every candidate changes all 4" in said, said
    sel = res.manifest["candidate_selection"]
    assert sel["n_replace_run"] == 4 and sel["topk_run"] == res.manifest["n_allowed_tokens"]


# --------------------------------------------------------------------------------------------
# the checkpoint (rmfast.gcg.checkpoint): a search stopped anywhere (mid-step, between restarts, in restart 0 or a
# later one) and run again with its checkpoint ends with exactly what an uninterrupted search gives (every restart's
# trajectory, evaluations, best ids and score: the same bits); another search's checkpoint is never trusted; the
# CLI's rerun of the same command goes on from it

RESUME_CFG = dict(length=4, steps=5, search_width=24, topk=16, patience=50, restarts=2)


@pytest.fixture(scope="module")
def resume_model():
    return T.tiny("llama", "classifier")


@pytest.fixture(scope="module")
def clean_search(resume_model, smol_tokenizer):
    """The uninterrupted search (no checkpoint)."""
    return run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False)


def _same(a, b):
    keys = ("best_ids", "best_score", "trajectory", "evaluated", "init_ids", "steps_run", "stopped")
    assert [{k: r[k] for k in keys} for r in a.restarts] == [{k: r[k] for k in keys} for r in b.restarts]
    assert (a.best_ids, a.best_score, a.n_evaluated, a.n_skipped_duplicate, a.n_rejected_retokenize) == (
        b.best_ids, b.best_score, b.n_evaluated, b.n_skipped_duplicate, b.n_rejected_retokenize)


# scorer calls: restart 0's start (1) and 5 steps (2-6); restart 1's start (7) and steps (8-12)
@pytest.mark.parametrize("n_call", [4, 7, 10], ids=["restart-0-mid-step", "restart-1-start", "restart-1-mid-step"])
def test_a_search_stopped_anywhere_goes_on_to_the_uninterrupted_bits(resume_model, smol_tokenizer, clean_search, tmp_path,
                                                                     monkeypatch, n_call):
    ck = tmp_path / "g.partial.npz"
    _interrupt_after(monkeypatch, n_call)
    with pytest.raises(GCGInterrupted):
        run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False, checkpoint=ck)
    assert ck.is_file()
    monkeypatch.undo()
    res = run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False, checkpoint=ck)
    _same(res, clean_search)
    r = res.manifest["resumed"]
    assert r["from"] == str(ck) and r["restarts_done"] == (0 if n_call < 7 else 1)
    assert r["step"] == {4: 2, 7: 0, 10: 2}[n_call], r
    assert not ck.exists(), "a finished search removes its checkpoint"
    assert clean_search.manifest["resumed"] is None


def test_another_searchs_checkpoint_is_never_trusted(resume_model, smol_tokenizer, clean_search, tmp_path, monkeypatch):
    ck = tmp_path / "g.partial.npz"
    _interrupt_after(monkeypatch, 4)
    with pytest.raises(GCGInterrupted):
        run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**{**RESUME_CFG, "seed": 1}), progress=False, checkpoint=ck)
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"not resuming from .*: it was saved for a job whose gcg \(seed: 1 -> 0\) differed"):
        res = run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False, checkpoint=ck)
    _same(res, clean_search)
    assert res.manifest["resumed"] is None
    ck.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="it cannot be read"):
        _same(run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False, checkpoint=ck), clean_search)


def test_more_restarts_on_a_rerun_go_on_after_the_saved_ones(resume_model, smol_tokenizer, clean_search, tmp_path):
    """--restarts only decides when the search stops: a kept checkpoint of one restart goes on into the second."""
    ck = tmp_path / "g.partial.npz"
    one = run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**{**RESUME_CFG, "restarts": 1}), progress=False, checkpoint=ck,
              keep_checkpoint=True)
    assert ck.is_file() and len(one.restarts) == 1
    _same(run(resume_model, smol_tokenizer, PROMPT, GCGConfig(**RESUME_CFG), progress=False, checkpoint=ck), clean_search)


def test_cli_rerun_of_the_same_command_goes_on_from_ctrl_c(tiny_dir, capsys, tmp_path, monkeypatch):
    from rmfast.cli import main

    out = tmp_path / "g.json"
    argv = ["gcg", str(tiny_dir), "--prompt", "Hi", "--length", "3", "--steps", "4", "--search-width", "8", "--topk",
            "8", "--no-progress", "--no-plot", "--dtype", "float32"]
    assert main(argv + ["--out", str(tmp_path / "clean.json")]) == 0
    clean = json.loads((tmp_path / "clean.json").read_text())
    capsys.readouterr()
    _interrupt_after(monkeypatch, 3)  # the start and one step
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


def test_cli_ctrl_c_in_the_random_baseline_keeps_the_finished_search(tiny_dir, capsys, tmp_path, monkeypatch):
    """Ctrl-C while --baseline random scored its responses wrote nothing and said only "interrupted" (the finished
    search was in the checkpoint alone). Now the search is written, its baseline marked interrupted, the line says
    how to go on, and the same command scores the baseline (the search taken from the checkpoint, its bits as
    before). --no-progress keeps the one-line notes: the estimate, the resume, the baseline's; a resumed run's time
    line says what it counts."""
    from rmfast.cli import main, gcg as gcg_cli
    from rmfast import gcg as job

    out = tmp_path / "g.json"
    argv = ["gcg", str(tiny_dir), "--prompt", "Hi", "--length", "3", "--steps", "2", "--search-width", "8", "--topk",
            "8", "--no-progress", "--no-plot", "--dtype", "float32", "--baseline", "random", "--out", str(out)]

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "random_search", stop)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "the first step took" in err and "baseline: scoring" in err  # notes, with --no-progress
    assert f"interrupted in the random baseline; the search is finished and written to {out}" in err, err
    first = json.loads(out.read_text())
    assert first["baseline"] == {"method": "random", "interrupted": True} and not first["interrupted"]
    assert gcg_cli._interrupted_before(str(out), tmp_path / "g.json.partial.npz")
    monkeypatch.undo()
    assert main(argv) == 0  # no --overwrite: the rerun replaces what the interrupted one wrote
    o, err = capsys.readouterr()
    assert "going on from" in err and "in this process (it went on from a checkpoint" in o
    d = json.loads(out.read_text())
    assert d["baseline"]["n_evaluated"] == d["n_evaluated"] and d["best_ids"] == first["best_ids"]
    assert d["restarts"][0]["trajectory"] == first["restarts"][0]["trajectory"]


def test_a_second_search_for_the_same_out_stops_at_once(tiny_dir, capsys, tmp_path):
    """Two searches for one --out: gcg took no output lock, so both ran, shared the checkpoint, and the later
    silently replaced the earlier's result. Now the second stops at once with one line, as scan and score do."""
    from rmfast.cli import main
    from rmfast.locks import output_lock

    out = tmp_path / "g.json"
    argv = ["gcg", str(tiny_dir), "--prompt", "Hi", "--length", "3", "--steps", "1", "--search-width", "8", "--topk",
            "8", "--no-progress", "--no-plot", "--dtype", "float32", "--out", str(out)]
    with output_lock(out):  # the first search, running
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"another rmfast job is writing {out}" in err and "Traceback" not in err and not out.exists()
    assert main(argv) == 0 and out.exists()


def test_the_report_says_when_the_best_text_is_not_the_best_ids():
    """A GCG probe: with --no-retokenize-filter the printed best text re-tokenized to other ids (HF scored it -0.22
    where the ids score 1.14), said only deep in the JSON; the report now says so beside the text."""
    from types import SimpleNamespace

    from rmfast.cli.gcg import _text_exact

    res = SimpleNamespace(best_ids=[5, 6], restarts=[{"best_ids": [1], "best_text_exact": True},
                                                     {"best_ids": [5, 6], "best_text_exact": False}])
    assert not _text_exact(res)
    res.restarts[1]["best_text_exact"] = True
    assert _text_exact(res)
