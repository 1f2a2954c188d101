"""rmfast.scoring.plan and rmfast.scoring.decisions: every decision made once from one options value, at one
site each, and recorded with its reason in every job's output (scan, texts, GCG, logprobs, the scorer, a resume)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import torch
import pytest

import tiny_models as T
from rmfast.errors import UserError
from rmfast.scoring.options import ScoringOptions
from rmfast.template import build_template

SRC = Path(__file__).resolve().parents[1] / "src" / "rmfast"

#: every job's manifest records these decisions, each with a reason in words
DECIDED = ("job", "device", "dtype", "head", "engine", "compile", "kernels", "attention", "elementwise", "projections",
           "batch_size", "padding")


# ------------------------------------------------------------------ one site per decision

#: the decision rules: called only inside rmfast.scoring.decisions (the plan, the scorer, GCG, the bench call
#: decide(), which applies them all)
RULES = ("choose_head", "choose_engine", "choose_compile", "choose_attention", "choose_kernels",
         "choose_share_batches", "choose_rows_per_batch", "engine_for", "choose_projections")
#: where the kernels' environment variable and device default may be read: the decision, the kernels'
#: dispatch for direct calls, and an Engine built without a plan (tests, the bench's fp32 check)
KERNEL_SITES = {"scoring/decisions.py", "fast/ops.py", "fast/engine.py"}


def _calls(tree) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name:
                out.append((name, node.lineno))
    return out


def test_one_site_per_decision():
    """No decision rule is applied outside rmfast.scoring.decisions, and the kernels' environment is read in
    one rule: a second site that decides an engine, a head, a compile or a kernel fails here."""
    offenders = []
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC).as_posix()
        text = p.read_text()
        for name, line in _calls(ast.parse(text)):
            if name in RULES and rel != "scoring/decisions.py":
                offenders.append(f"{rel}:{line} calls {name}")
            if name == "uses_triton" and rel not in KERNEL_SITES:
                offenders.append(f"{rel}:{line} calls uses_triton")
        for var in ("RMFAST_KERNELS", "RMFAST_COMPILE"):
            for m in re.finditer(rf"environ[^\n]*{var}", text):
                line = text[: m.start()].count("\n") + 1
                allowed = {"RMFAST_KERNELS": {"fast/ops.py", "scoring/decisions.py"},
                           "RMFAST_COMPILE": {"scoring/decisions.py"}}[var]
                if rel not in allowed:
                    offenders.append(f"{rel}:{line} reads {var}")
    assert not offenders, "decisions made outside rmfast.scoring.decisions:\n" + "\n".join(offenders)


# ------------------------------------------------------------------ recorded, with reasons, in every output


def _check_decisions(d: dict, job: str):
    missing = [k for k in DECIDED if k not in d]
    assert not missing, f"decisions lack {missing}"
    assert d["job"]["value"] == job
    for k, v in d.items():
        assert set(v) == {"value", "reason"} and isinstance(v["reason"], str) and v["reason"].strip(), (k, v)


def test_scan_and_texts_manifests_record_every_decision_with_its_reason():
    from rmfast.scoring.pipeline import run_scan, Selection

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    opts = ScoringOptions(compile="off", batch_size=16)
    res, _ = run_scan(model, tok, "Hi", Selection(token_ids="100:140"), opts, progress=False, audit=0)
    d = res.manifest["decisions"]
    _check_decisions(d, "scan")
    assert d["batch_size"] == {"value": 16, "reason": "asked for"}
    assert d["compile"] == {"value": False, "reason": "off"}
    assert d["engine"]["reason"] == "auto: the architecture is on the fast path"
    assert res.manifest["options"] == opts.replace(compat=None).as_dict()
    res, _ = run_scan(model, tok, "Hi", Selection(texts=["yes", "a longer answer"]), opts.replace(engine="hf"),
                      progress=False, audit=0)
    d = res.manifest["decisions"]
    _check_decisions(d, "texts")
    assert d["engine"] == {"value": "hf", "reason": "asked for"} and d["attention"]["value"] == "hf"
    assert d["padding"]["value"] == "none"  # texts of many lengths: batches as long as the texts


def test_options_whole_equal_the_keyword_form():
    """Options passed whole and the API's keyword form are one plan: the same decisions, the same bits."""
    from rmfast.scoring.pipeline import score_ids

    tok, model = T.chatml_tokenizer(), T.tiny("qwen2")
    ids = np.arange(300, 330)
    a = score_ids(model, tok, "Hi", ids, ScoringOptions(compile="off", batch_size=8), progress=False)
    b = score_ids(model, tok, "Hi", ids, compile="off", batch_size=8, progress=False)
    assert a.manifest["decisions"] == b.manifest["decisions"]
    np.testing.assert_array_equal(a.scores, b.scores)


def test_job_rules_are_the_plans():
    """What a job's kind decides (never its size) is decided by the plan, with its reason: the scorer and the
    audit run the eager layer, the bench compiles wherever it can, a spread model and the authors' loop take
    the plain-HF path."""
    from rmfast.scoring.decisions import decide
    from rmfast.template import build_template

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    tmpl = build_template(tok, "Hi")
    on = ScoringOptions(compile="on")
    for job in ("scorer", "audit"):
        d = decide(model, on, job, template=tmpl)
        assert d.compile is False and "but eager" in d.reasons["compile"]["reason"]
    d = decide(model, ScoringOptions(), "bench", template=tmpl, response_tokens=1)
    assert d.compile is True and "bench" in d.reasons["compile"]["reason"]
    d = decide(model, ScoringOptions(), "trl", template=tmpl, response_tokens=1)
    assert d.compile is False and "x-ray" in d.reasons["compile"]["reason"]
    d = decide(model, ScoringOptions(compat="authors"), "texts", template=tmpl)
    assert d.engine == "hf" and "--compat authors" in d.reasons["engine"]["reason"]
    with pytest.raises(UserError, match="drop engine='fast'"):
        decide(model, ScoringOptions(compat="authors", engine="fast"), "texts", template=tmpl)
    with pytest.warns(UserWarning, match="device_map"):
        d = decide(model, ScoringOptions(device_map="auto"), "scan", template=tmpl)
    assert d.engine == "hf"
    with pytest.raises(ValueError, match="unknown job"):
        decide(model, ScoringOptions(), "everything")


def test_kernels_are_decided_once_and_obeyed(monkeypatch):
    """RMFAST_KERNELS is read by the plan when it decides, not by the kernels per call: changing it after the
    plan is made changes nothing the plan runs."""
    from rmfast.fast import ops
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    plan = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off"), response_tokens=1)
    assert plan.decisions["kernels"] == {"value": "torch", "reason": "auto: torch kernels (no CUDA)"}
    calls = []
    monkeypatch.setattr(ops, "uses_triton", lambda t: calls.append(t) or False)
    plan.score([[5], [6]])
    assert not calls, "the kernels re-read their device/environment per call"
    monkeypatch.setenv("RMFAST_KERNELS", "torch")
    d = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off")).decisions
    assert d["kernels"] == {"value": "torch", "reason": "RMFAST_KERNELS=torch"}


def test_reward_scorer_decides_once_and_reports(tiny_dir):
    from rmfast.scoring.scorer import RewardScorer

    s = RewardScorer(str(tiny_dir), dtype="float32", device="cpu", options=ScoringOptions(batch_size=4))
    assert s.options.batch_size == 4 and s.options.dtype == "float32"
    s.score(["Hi", "Name a colour."], [["yes", "no"], ["blue"]])
    _check_decisions({**s.last_stats.decisions, "job": s.decisions["job"]}, "scorer")
    assert s.decisions["share_batches"]["value"] is False  # CPU: auto is off, said why
    assert "CPU" in s.decisions["share_batches"]["reason"]


def test_a_resumed_job_says_so_in_its_decisions(tmp_path):
    """A rerun that takes rows from the checkpoint records it next to the decisions (and reuses the batch sizes)."""
    from rmfast.scoring.pipeline import score_ids

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    ids, ck = np.arange(200, 240), tmp_path / "job.npz"
    first = score_ids(model, tok, "Hi", ids, ScoringOptions(compile="off", batch_size=16), progress=False,
                      checkpoint=ck, keep_checkpoint=True)
    assert "resumed" not in first.manifest["decisions"] and ck.exists()
    again = score_ids(model, tok, "Hi", ids, ScoringOptions(compile="off", batch_size=16), progress=False,
                      checkpoint=ck, keep_checkpoint=True)
    assert again.manifest["decisions"]["resumed"]["value"] == ids.size
    assert "checkpoint" in again.manifest["decisions"]["resumed"]["reason"]
    np.testing.assert_array_equal(first.scores, again.scores)


def test_logprobs_job_goes_through_the_plans_decisions():
    """rmfast logprobs decides its head by the plan's rule and records its decisions like every job."""
    from rmfast.logprobs import logprobs

    tok, model = T.chatml_tokenizer(), T.tiny("llama", "causal_lm")
    res = logprobs(model, tok, "Hi", token_ids="0:50")
    d = res.manifest["decisions"]
    assert d["job"]["value"] == "logprobs" and d["head"]["value"] == "logprob"
    assert d["engine"]["value"] == "hf" and "next-token" in d["engine"]["reason"]
    assert all(v["reason"] for v in d.values())
    with pytest.raises(UserError, match="logprobs needs a causal language model"):
        logprobs(T.tiny("llama"), tok, "Hi", token_ids="0:50")


# ------------------------------------------------------------------ the attention form (moved from test_cascade.py)


def test_the_projections_layout_is_decided_and_obeyed():
    """The weight layout (q|k|v and gate|up fused into one GEMM each, or separate) is the plan's "projections"
    decision, recorded with its reason, and the engine it builds runs it; the plain-HF path says it runs the
    model's own modules. A CUDA model keeps its own weights and the reason prices the copy fusing would make."""
    from rmfast.scoring.decisions import choose_projections
    from rmfast.scoring.plan import plan_scoring

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    plan = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off"), response_tokens=1)
    assert plan.decisions["projections"]["value"] == "fused" and "CPU" in plan.decisions["projections"]["reason"]
    assert {len(w.w_qkv) for w, _ in plan.eng.layers} == {1} and {len(w.w_gate_up) for w, _ in plan.eng.layers} == {1}
    hf = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(engine="hf"), response_tokens=1)
    assert hf.decisions["projections"]["value"] == "as stored"
    fuse, why = choose_projections(model, torch.device("cuda"))  # the rule reads the device it is given
    copy = sum(m.weight.numel() * m.weight.element_size() for n, m in model.named_modules()
               if n.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))) / 2**30
    assert fuse is False and f"copy {copy:.1f} GiB" in why
    fuse, why = choose_projections(T.tiny("phi3"), torch.device("cuda"))  # stored fused: no copy either way
    assert fuse is False and "no copy" in why
    asked = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off", projections="separate"),
                         response_tokens=1)
    assert asked.decisions["projections"] == {"value": "separate", "reason": "asked for"}
    assert {len(w.w_qkv) for w, _ in asked.eng.layers} == {3}
    np.testing.assert_allclose(asked.score([[5], [6]]), plan.score([[5], [6]]), rtol=1e-5, atol=1e-5)  # fp32


def test_fused_projections_without_room_for_the_copy_are_refused(monkeypatch):
    """--projections fused where the copy would take more than half the free memory: one clear error before any
    work, naming the sizes and the fix; auto on a CPU without that room runs the model's own weights and says why
    (a big model on a small machine: the copy beside it would run out of memory)."""
    from rmfast.scoring import decisions
    from rmfast.scoring.plan import plan_scoring

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    monkeypatch.setattr(decisions, "available_memory", lambda device: 1000)
    with pytest.raises(UserError, match=r"projections='fused' copies .* GiB of weights, more than half .* use "
                                        r"projections='auto'"):
        plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off", projections="fused"))
    auto = plan_scoring(model, build_template(tok, "Hi"), ScoringOptions(compile="off"))  # auto: the model's own
    assert auto.decisions["projections"]["value"] == "separate" and "more than half" in auto.decisions["projections"]["reason"]
    assert {len(w.w_qkv) for w, _ in auto.eng.layers} == {3}


def test_choose_attention_rules(monkeypatch):
    from rmfast.scoring.plan import CASCADE_MIN_ROW_TOKENS, choose_attention

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_attention("auto", cpu, "fast", False, 3)[0] == "cpu-flash"
    assert choose_attention("auto", cpu, "fast", True, 3)[0] == "block-diagonal"
    assert choose_attention("auto", cpu, "hf", False, 3)[0] == "hf"
    assert choose_attention("cascade", cpu, "fast", False, 3) == ("cascade", "asked for (torch twin)")
    with pytest.raises(UserError, match="compile off"):
        choose_attention("cascade", cpu, "fast", True, None)
    with pytest.raises(UserError, match="unknown attention"):
        choose_attention("flashy", cpu, "fast", False, None)
    # CUDA's rule, with the device's kernels as Triton (decided by ops.uses_triton, read here once)
    from rmfast.fast import ops

    monkeypatch.setattr(ops, "uses_triton", lambda t: True)
    assert choose_attention("auto", cuda, "fast", False, 3)[0] == "triton"
    assert choose_attention("auto", cuda, "fast", False, CASCADE_MIN_ROW_TOKENS)[0] == "triton"
    form, why = choose_attention("auto", cuda, "fast", False, CASCADE_MIN_ROW_TOKENS + 1)
    assert form == "cascade" and "tokens" in why
    assert choose_attention("auto", cuda, "fast", False, None)[0] == "cascade"  # texts of any length
    monkeypatch.setattr(ops, "uses_triton", lambda t: False)
    assert choose_attention("auto", cuda, "fast", False, None)[0] == "reference"


def test_scan_manifest_records_decisions(tmp_path):
    """A scan's manifest names the attention form and the compile decision, each with its reason."""
    from rmfast.scoring.pipeline import score_ids

    tok = T.chatml_tokenizer()
    model = T.tiny("llama")
    res = score_ids(model, tok, "Hi", np.arange(100, 140), progress=False, compile="off")
    d = res.manifest["decisions"]
    assert d["attention"]["value"] == "cpu-flash" and "CPU" in d["attention"]["reason"]
    assert d["compile"] == {"value": False, "reason": "off"}


def test_plan_forced_cascade_scores_equal_default():
    """plan_scoring(attention="cascade") on CPU runs the twin (recorded), and scores as the default form."""
    from rmfast.scoring.plan import plan_scoring, score_together

    tok = T.chatml_tokenizer()
    model = T.tiny("gemma2")
    tmpl = build_template(tok, "Name a colour.")
    ids = [[5, 600, 7000], [41], [900, 8, 77, 3000, 12]]
    out = {}
    for form in ("auto", "cascade"):
        plan = plan_scoring(model, tmpl, attention=form, fixed_shapes=False, compile="off")
        out[form] = score_together([plan], [ids], 8)
        assert plan.manifest("Name a colour.")["decisions"]["attention"]["value"] == ("cpu-flash" if form == "auto"
                                                                                     else "cascade")
    np.testing.assert_allclose(out["cascade"], out["auto"], atol=2e-5, rtol=1e-5)


def test_compile_on_a_gpu_is_the_triton_forms_and_asked_for():
    """On a GPU `auto` stays eager (measured on an H100: the compiled layer pays only for scans longer than its
    one-off compile makes worth it, and a decision never follows the job's size) and
    `on` compiles the layer around the Triton shared-prefix kernel; a compiled GPU layer does not forbid a form the
    way the compiled CPU layer does (decide() runs the cascade eagerly instead)."""
    from rmfast.scoring.decisions import choose_attention, choose_compile

    cuda = torch.device("cuda")
    on, why_on = choose_compile("on", cuda, "fast")
    auto, why_auto = choose_compile("auto", cuda, "fast")
    assert on is True and "Triton shared-prefix kernel" in why_on
    assert auto is False and "measured on an H100" in why_auto and "1.05x" in why_auto and "elementwise" in why_auto
    assert choose_compile("on", cuda, "hf")[0] is False
    assert choose_attention("triton", cuda, "fast", True, 2, True)[0] == "triton"
    assert choose_attention("cascade", cuda, "fast", True, None, True)[0] == "cascade"
    with pytest.raises(UserError, match="compile off"):
        choose_attention("cascade", torch.device("cpu"), "fast", True, None, False)


def test_cpu_flash_reason_names_the_prompts_kernel():
    """The CPU's eager form picks torch's flash kernel or bmm by the prompt's length; the decision says which this
    job's prompt gets, so a manifest tells which attention ran."""
    from rmfast.fast import ops
    from rmfast.scoring.decisions import decide
    from rmfast.template import build_template

    tok, model = T.chatml_tokenizer(), T.tiny("llama")
    opts = ScoringOptions(compile="off", kernels="torch")
    short = build_template(tok, "Hi")
    long = build_template(tok, "word " * ops.FLASH_MIN_PROMPT)
    for tmpl, kernel in ((short, "bmm"), (long, "flash kernel")):
        d = decide(model, opts, "scan", template=tmpl, response_tokens=1)
        assert d.attention == "cpu-flash"
        why = d.reasons["attention"]["reason"]
        assert f"this {len(tmpl.prefix_ids)}-token prompt" in why and kernel in why.split("prompt:")[-1], why
