"""What a new user and real client code met (issue 37), on the real outputs of the CLI: one model (the
embedded SmolLM2, fp32) scanned over tokens (`rmfast scan --token-ids`) and over items (`rmfast scan
--candidates`), and swept (`rmfast sweep`, the same tokens and items as two candidate sets) into a store.
Nothing here is a hand-built fixture: every file is what the commands wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cli_run import one_line_error, run

MODEL = "smollm2-135m-instruct"
PROMPT = "What, in one word, is the greatest thing ever?"
WORST = "What, in one word, is the worst thing ever?"
ITEMS = ["Love", "Water", "Art", "Pizza", "Music", "The universe", "a cup of tea", "sunsets", "Albert Einstein"]


@pytest.fixture(scope="module")
def journey(tmp_path_factory, smollm2):
    """A token scan, an item scan and a sweep store of the same model and prompt, written by the CLI."""
    import yaml

    d = tmp_path_factory.mktemp("journey")
    tok = smollm2.tokenizer
    words = [tok.convert_tokens_to_ids(w) for w in ("Love", "Water", "Art")]
    assert [tok.decode([i]) for i in words] == ["Love", "Water", "Art"]  # in both the token scan and the items
    (d / "ids.txt").write_text("\n".join(map(str, list(range(40)) + words)) + "\n")
    (d / "items.txt").write_text("\n".join(ITEMS) + "\n")
    cfg = {"out": str(d / "store"), "defaults": {"dtype": "float32", "device": "cpu", "random_head_seed": 0,
                                                       "batch_size": 32},
           "models": [MODEL], "prompts": {"greatest": PROMPT},
           "candidates": {"tokens": {"vocabulary": {"token_ids": str(d / "ids.txt")}}, "items": str(d / "items.txt")}}
    (d / "sweep.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = {"dir": d, "tokens": d / "tokens.parquet", "items": d / "items.parquet", "store": d / "store",
           "worst": d / "worst.parquet",
           "config": d / "sweep.yaml", "words": words}
    from rmfast.cli import main

    # a seeded random score head and small batches: the cheapest real runs of this model
    common = ["--prompt", PROMPT, "--dtype", "float32", "--device", "cpu", "--no-progress", "--random-head-seed", "0",
              "--batch-size", "32"]
    assert main(["scan", MODEL, "--token-ids", str(d / "ids.txt"), "--out", str(out["tokens"]), *common]) == 0
    assert main(["scan", MODEL, "--candidates", str(d / "items.txt"), "--out", str(out["items"]), *common]) == 0
    worst = [a if a != PROMPT else WORST for a in common]
    assert main(["scan", MODEL, "--token-ids", str(d / "ids.txt"), "--out", str(out["worst"]), *worst]) == 0
    assert main(["sweep", str(d / "sweep.yaml"), "--no-progress"]) == 0
    return out


# ---------------------------------------------------------------- 1: explore / report on a finished sweep store
def test_explore_and_report_read_a_finished_sweep_store(journey, tmp_path, capsys):
    store = journey["store"]
    assert (store / "manifest.json").is_file()  # the store's index: not a states folder
    rc, so, se = run(["explore", store, "--out", tmp_path / "explorer.html"], capsys)
    assert rc == 0, se
    rc, so, se = run(["report", store, "--out", tmp_path / "report.html", "--n-perm", "1", "--no-progress"], capsys)
    assert rc == 0, se
    from rmfast.analysis.representations.views import states_beside

    assert states_beside([store]) == {}


# ---------------------------------------------------------------- 2: a token scan and an item scan are two columns
def test_explorer_keeps_candidate_sets_apart_and_ranks_what_it_shows(journey, tmp_path, capsys):
    from rmfast.explore import unpack

    out = tmp_path / "explorer.html"
    rc, so, se = run(["explore", journey["tokens"], journey["items"], "--out", out], capsys)
    assert rc == 0, se
    data = unpack(out.read_text(encoding="utf-8"))
    assert [(c["candidates"], c["rows"], c["duplicated"]) for c in data.columns] == [("vocabulary", 43, 0), ("items", 9, 0)]
    tokens, items = pd.read_parquet(journey["tokens"]), pd.read_parquet(journey["items"])
    for word in ("Love", "Water", "Art"):  # in both files: shown in both columns, never dropped as a duplicate
        k = data.texts.index(word)
        assert data.scores[0, k] == tokens.loc[tokens["text"] == word, "score"].item()
        assert data.scores[1, k] == items.loc[items["text"] == word, "score"].item()
    for c, scan in enumerate((tokens, items)):  # each column's ranks are its own rows' ranks: one #1 each
        shown = data.ranks[c][data.ranks[c] > 0]
        assert (shown == 1).sum() == 1 and sorted(shown) == sorted(scan["rank"])


# ---------------------------------------------------------------- 3: analyses keep candidate sets apart
@pytest.mark.parametrize("where", ["store", "parts", "files"])
def test_analyses_group_by_candidate_set_and_say_so(journey, where, capsys):
    inputs = {"store": [journey["store"]], "parts": [journey["store"] / "parts"],
              "files": [journey["tokens"], journey["items"]]}[where]
    rc, so, se = run(["analyze", "distributions", *inputs, "--out", journey["dir"] / f"dist-{where}.csv",
                      "--overwrite"], capsys)
    assert rc == 0, se
    table = pd.read_csv(journey["dir"] / f"dist-{where}.csv")
    sets = ("tokens", "items") if where != "files" else ("vocabulary", "items")
    name = "SmolLM2-135M-Instruct"  # one model, one name (item 4)
    assert dict(zip(table["model"], table["n"])) == {f"{name} [{sets[0]}]": 43, f"{name} [{sets[1]}]": 9}
    assert "several candidate sets" in se and "--pool-candidates" in se
    rc, so, se = run(["analyze", "distributions", *inputs, "--pool-candidates"], capsys)
    assert rc == 0 and "pooled" in se and " 52 " in so


# ---------------------------------------------------------------- 4: one model, one name
def test_scan_and_sweep_record_one_model_name(journey):
    from rmfast.io import read_manifest
    from rmfast.sweep.store import load_results

    names = {read_manifest(journey["tokens"])["model"]["name"], read_manifest(journey["items"])["model"]["name"],
             *load_results(journey["store"])["model"]}
    assert names == {"SmolLM2-135M-Instruct"}


# ---------------------------------------------------------------- 5: every model is checked before any work
def test_sweep_checks_every_model_before_any_work(journey, tmp_path, capsys):
    """The README's config shape: the embedded model, then a known reward model this machine lacks."""
    import yaml

    cfg = yaml.safe_load(journey["config"].read_text())
    cfg["models"] = [MODEL, {"model": "S-Lla-1B-V2", "name": "skywork-1b"}]
    cfg["out"] = str(tmp_path / "store")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for dry in (["--dry-run"], []):
        rc, so, se = run(["sweep", path, "--no-progress", *dry], capsys)
        assert one_line_error(rc, se), se
        assert "models[1] (skywork-1b)" in se and "S-Lla-1B-V2" in se
        assert not list(tmp_path.glob("store/parts/*/*/*/part.parquet")) and "rows in" not in se


# ---------------------------------------------------------------- 6: start-up imports only what it uses
def _modules_after(code: str) -> set[str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code + "; import sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=300, check=True)
    return set(out.stdout.split())


HEAVY = {"torch", "torch._inductor", "transformers", "pandas"}
LIGHT_ANALYSIS = {"rmfast.analysis", "rmfast.analysis.registry"}  # the lazy package and its list of analyses


def _analyses(mods: set[str]) -> set[str]:
    """The analysis modules among ``mods`` beyond the package and its registry (which the parser reads)."""
    return {m for m in mods if m.startswith("rmfast.analysis")} - LIGHT_ANALYSIS


def test_import_rmfast_and_the_cli_parser_import_nothing_heavy():
    """`import rmfast` and building the CLI's parser (all of `rmfast --help`) import neither torch nor
    inductor, transformers, pandas or the analyses: they are imported where they are used (issue 37: 8-11 s)."""
    for code in ("import rmfast", "from rmfast.cli import build_parser; build_parser()"):
        mods = _modules_after(code)
        assert not HEAVY & mods and not _analyses(mods), (HEAVY & mods, _analyses(mods))
    # the API is still there, on first use; loading it does not import inductor either
    mods = _modules_after("import rmfast; rmfast.load, rmfast.scan, rmfast.RewardScorer, rmfast.gcg.run")
    assert "torch" in mods and "torch._inductor" not in mods


def test_import_rmfast_installs_no_import_hook():
    """`import rmfast` leaves sys.meta_path as it found it: no finder aliases old module paths (rmfast.pipeline
    and the like are gone; their callers import rmfast.scoring.pipeline, ...)."""
    import subprocess
    import sys

    code = ("import sys; before = list(sys.meta_path); import rmfast; "
            "print(sys.meta_path == before, [type(f).__name__ for f in sys.meta_path if f not in before])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "True []", out.stdout


def test_the_parser_keeps_the_jobs_own_choices():
    """What the parser spells out so as not to import a job (implicit's --join/--agg) is the job's own list."""
    from rmfast.cli import build_parser
    from rmfast.implicit import AGGS, JOINS

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["implicit"]
    choices = {a.dest: tuple(a.choices) for a in sub._actions if a.choices}
    assert choices["join"] == JOINS and choices["agg"] == AGGS


# ---------------------------------------------------------------- 9 and 11: results that say what they are
def test_a_random_head_says_so_and_the_parquet_describes_itself(journey, capsys):
    import pyarrow.parquet as pq

    from rmfast.io import read_manifest, read_provenance

    for path in (journey["tokens"], journey["items"]):
        man, prov = read_manifest(path), read_provenance(path)
        assert man["score_meaning"].startswith("RANDOM score head (seed 0)")
        assert prov == {"model": {k: man["model"][k] for k in ("name", "spec", "type", "sha256", "random_head_seed")},
                        "prompt": PROMPT, "head": "score", "head_index": 0, "score_meaning": man["score_meaning"],
                        "dtype": "float32", "rmfast_version": man["rmfast_version"],
                        "candidates": "vocabulary" if path == journey["tokens"] else "items"}
        assert str(pq.read_schema(path).field("score").type) == "float"
    part = next(journey["store"].glob("parts/*/*/candidates=items/part.parquet"))
    assert read_provenance(part)["candidates"] == "items" and read_provenance(part)["model"]["name"] == "SmolLM2-135M-Instruct"
    # the printed table's title
    rc, so, se = run(["scan", MODEL, "--prompt", PROMPT, "--token-ids", "0:4", "--dtype", "float32", "--no-progress",
                      "--random-head-seed", "3", "--batch-size", "8", "--out", journey["dir"] / "t9.parquet"], capsys)
    assert rc == 0, se
    assert "all 4, best first (RANDOM score head, seed 3: not a reward model's ranking)" in so  # 4 ids: one table


def test_score_writes_float32_and_best_worst_integer_ids(journey, tmp_path, capsys):
    table = tmp_path / "pairs.csv"
    pd.DataFrame({"prompt": [PROMPT, PROMPT, WORST], "response": ["Love", "Pizza", "War"]}).to_csv(table, index=False)
    rc, so, se = run(["score", table, "--model", MODEL, "--prompt-column", "prompt", "--response-column", "response",
                      "--random-head-seed", "0", "--dtype", "float32", "--no-progress"], capsys)
    assert rc == 0, se
    import pyarrow.parquet as pq

    from rmfast.io import read_manifest

    out = tmp_path / "pairs.scores.parquet"
    assert str(pq.read_schema(out).field("score").type) == "float"
    assert read_manifest(out)["score_meaning"].startswith("RANDOM score head (seed 0)")
    # the screen shows the first rows' scores and what the number is (it had shown only a count)
    got = pd.read_parquet(out)["score"]
    assert "first 3 of 3 rows:" in so and f"{got.iat[0]:>12.6f}  'Love'" in so
    assert "score: RANDOM score head (seed 0)" in so
    rc, so, se = run(["analyze", "best-worst", journey["tokens"], journey["worst"], "--out", tmp_path / "bw.csv"], capsys)
    assert rc == 0, se
    ids = pd.read_csv(tmp_path / "bw.csv")["token_id"]
    assert ids.dtype == "int64"  # "30200", never "30200.0"


# ---------------------------------------------------------------- 10: a public way to clear the prompt cache
def test_reward_scorer_clear_cache():
    import tiny_models as T
    from rmfast import RewardScorer

    scorer = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), T.chatml_tokenizer())
    first = scorer.score(["Best?"], [["Love", "A cup of tea"]])
    scorer.score(["Best?"], [["Water"]])
    assert scorer.last_stats.prompts_from_cache == 1
    scorer.clear_cache()
    assert scorer.score(["Best?"], [["Love", "A cup of tea"]]) == first
    assert scorer.last_stats.prompts_from_cache == 0


# ---------------------------------------------------------------- 8: the bf16 audit sized to the job
def test_bf16_audit_is_sized_to_the_job_and_says_its_cost(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bf16.parquet"
    rc, so, se = run(["scan", tiny_dir, "--dtype", "bfloat16", "--token-ids", "0:300", "--compile", "off",
                      "--out", out, "--no-progress", "--top", "0"], capsys)  # --audit at its default, 512
    assert rc == 0, se
    a = json.loads(Path(str(out) + ".json").read_text())["bf16_audit"]
    assert a["n"] == 32 and a["job_s"] > 0  # a tenth of 300 rows, at least 32: never 300 of 300
    line = next(ln for ln in so.splitlines() if "audit:" in ln)
    # its cost: a percent of the scan's time, or, where the scan took under 0.1 s (a quiet fast CPU), that
    cost = f"% on the scan's {a['job_s']:.1f} s" if a["job_s"] >= 0.1 else "the scan itself took under 0.1 s"
    assert line.startswith("bf16 audit: 32 ids rescored in fp32") and cost in line, line


# ---------------------------------------------------------------- 7: long work says how long, up front
def test_gcg_says_what_the_whole_run_takes_after_its_first_step(tiny_dir, tmp_path, capsys):
    rc, so, se = run(["gcg", tiny_dir, "--prompt", PROMPT, "--length", "3", "--steps", "3", "--search-width", "16",
                      "--topk", "8", "--dtype", "float32", "--no-plot", "--out", tmp_path / "g.json"], capsys)
    assert rc == 0, se
    line = next(ln for ln in se.splitlines() if "the first step took" in ln)
    assert "3 steps x 1 restart(s) take about" in line


def test_analyze_similarity_says_its_work_up_front_and_shows_progress(tiny_dir, tmp_path, capsys):
    scans = []
    for k, prompt in enumerate((PROMPT, WORST)):
        scans.append(tmp_path / f"s{k}.parquet")
        rc, so, se = run(["scan", tiny_dir, "--prompt", prompt, "--token-ids", "0:200", "--dtype", "float32",
                          "--states", "0,last_prenorm", "--no-progress", "--top", "0", "--out", scans[-1]], capsys)
        assert rc == 0, se
    rc, so, se = run(["analyze", "similarity", *scans, "--bootstrap", "10", "--permutations", "9",
                      "--out", tmp_path / "sim.csv"], capsys)
    assert rc == 0, se
    # the work and its cost said before the replicates start (issue 51 item 4's cost line), then the progress
    assert ("10 bootstrap replicates and 9 permutations over 200 candidates × 2 × 2 layer pairs: one pass (the "
            "observed measures) took") in se and "in 10 steps" in se
    assert "the first of 10 steps took" in se and se.index("one pass (the observed") < se.index("the first of")
    rc, so, se = run(["analyze", "similarity", *scans, "--bootstrap", "10", "--permutations", "9", "--no-progress",
                      "--out", tmp_path / "sim2.csv"], capsys)
    assert rc == 0 and "steps" not in se
    assert (tmp_path / "sim.csv").read_text() == (tmp_path / "sim2.csv").read_text()


# ---------------------------------------------------------------- 14: smaller things
def test_exposure_defaults_to_wordfreq_as_the_report_does(journey, capsys):
    pytest.importorskip("wordfreq", reason="wordfreq not installed (pip install 'rmfast[analysis]')")
    rc, so, se = run(["analyze", "exposure", journey["tokens"], "--n-perm", "1"], capsys)
    assert rc == 0, se
    assert "frequencies: the wordfreq package's English list (the default" in se


def test_bench_plot_title_fits_and_its_note_clears_the_legend(tmp_path, monkeypatch):
    """The bench PNG: a long title (the machine's name) is wrapped inside the figure, and the (×N) note does
    not overlap the legend."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rmfast.bench.output import plot

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    rows = [{"model": "smollm2-135m", "method": m, "cand_per_s": v, "rmfast_speedup": 1000 / v, "head": "score",
             "tokens_per_candidate": 3, "peak_bound_cand_per_s": 3000.0 if m == "rmfast" else None}
            for m, v in (("naive", 80.0), ("hf-cache", 600.0), ("rmfast-eager", 900.0), ("rmfast", 1000.0))]
    title = ("rmfast bench — AMD EPYC 7B13 64-Core Processor [avx2], 2 threads, torch 2.13, float32, "
             "prompt 'What, in one word, is the greatest thing ever?', batch auto, 2026-11-26")
    assert plot(rows, tmp_path / "b.png", title) is not None and figs
    fig = figs[0]
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    box = fig.bbox
    t = ax.title.get_window_extent(r)
    assert box.x0 <= t.x0 and t.x1 <= box.x1 and t.y1 <= box.y1  # the title is inside the figure
    note = [x for x in (ax.xaxis.label, *ax.texts) if "rmfast is N" in x.get_text()]
    assert len(note) == 1 and not note[0].get_window_extent(r).overlaps(ax.get_legend().get_window_extent(r))


def test_import_rmfast_still_isolates_the_compile_cache_without_torch(tmp_path):
    """`import rmfast` points inductor's cache at a folder per CPU kind and kernel level (rmfast.cpu)
    before transformers can fix it, without importing torch; a user's own folder is kept."""
    import os
    import subprocess
    import sys

    code = "import os, sys, rmfast; print(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'torch' in sys.modules)"
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    base["TMPDIR"] = str(tmp_path)
    got = []
    for extra in ({}, {"ATEN_CPU_CAPABILITY": "default"}, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}):
        out = subprocess.run([sys.executable, "-c", code], env={**base, **extra}, capture_output=True, text=True,
                             timeout=120, check=True).stdout.split()
        assert out[1] == "False"
        got.append(out[0])
    assert all(g.startswith(str(tmp_path)) and os.path.basename(g).startswith("rmfast-") for g in got[:2])
    assert got[0] != got[1] and got[2] == str(tmp_path / "mine")  # one folder per kernel level; the user's kept


def test_a_head_a_causal_lm_cannot_give_is_refused_before_the_load(monkeypatch, capsys):
    """--lens (or --head score) on a causal LM was refused only once the model had loaded (7.7 s for SmolLM2, minutes
    for an 8B model): where the files tell (an embedded model, a GGUF, a folder's config.json), it is refused before
    the load, with the plan's own line; --random-head-seed still makes both fine."""
    from rmfast.loading import loader

    def never(*a, **k):
        raise AssertionError("the model was loaded before the head was checked")

    monkeypatch.setattr(loader, "load", never)
    for extra, said in ((["--lens"], "--lens reads a score head through the final norm; this scan's head is logprob"),
                        (["--head", "score"], "--head score needs a reward model or classifier")):
        rc, so, se = run(["scan", MODEL, "--token-ids", "0:4", *extra, "--out", "/tmp/never.parquet"], capsys)
        assert one_line_error(rc, se) and said in se, se
    with pytest.raises(AssertionError, match="loaded before"):  # a random head: checked by the plan, loaded
        run(["scan", MODEL, "--token-ids", "0:4", "--lens", "--random-head-seed", "0", "--out", "/tmp/never.parquet"],
            capsys)
