"""Sweeps and the results store: end to end, kill -9 and resume, the results command, scan with text
candidates, and every bad input -> one line naming the file and key, exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rounding as R
import tiny_models as T
from rmfast.sweep.store import load_results
from cli_run import kill_9_when, one_line_error, run

pytestmark = pytest.mark.filterwarnings("ignore:rmfast. texts.txt. 1 duplicate:UserWarning")

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?",
           "best": "What, in one word, is the best thing ever?",
           "worst": "What, in one word, is the worst thing ever?"}
TEXTS = ["Love", "The universe", "Water", "music and art", "Albert Einstein", "a cup of tea", "Pizza", "sunsets"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, smol_tokenizer):
    """Two tiny reward models and a tiny causal LM, saved as HF folders with the real SmolLM2 tokenizer."""
    d = tmp_path_factory.mktemp("sweep-models")
    for name, arch, kind, seed in (("rm-a", "llama", "classifier", 0), ("rm-b", "qwen2", "classifier", 1),
                                   ("lm-c", "llama", "causal_lm", 2)):
        m = T.tiny(arch, kind, num_labels=1, pad_token_id=smol_tokenizer.pad_token_id, seed=seed)
        m.save_pretrained(d / name)
        smol_tokenizer.save_pretrained(d / name)
    import yaml

    (d / "prompts.yaml").write_text("# like paper_b_prompts.yaml: name: text\n" + yaml.safe_dump(PROMPTS, sort_keys=False))
    (d / "texts.txt").write_text("\n".join(TEXTS + ["Love", ""]) + "\n")
    return d


def write_cfg(d: Path, name="sweep.yaml", **over) -> Path:
    import yaml

    cfg = {
        "defaults": {"dtype": "float32", "device": "cpu"},
        "models": ["./rm-a", {"model": "./rm-b", "name": "rm-b", "batch_size": 64}],
        "prompts": "prompts.yaml",
        "candidates": {"vocab": {"vocabulary": {"token_ids": "0:200"}},
                       "words": {"vocabulary": {"token_ids": "0:300", "exclude_special": True, "wordlike": True,
                                                "dedup": True}},
                       "texts": "texts.txt"},
    }
    cfg.update(over)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    p = d / name
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p




def part_files(store: Path):
    return sorted(store.glob("parts/*/*/*/part.parquet.json"))


# ------------------------------------------------------------------ end to end


def test_sweep_store_results_and_rerun(models_dir, tmp_path, capsys):
    cfg = write_cfg(models_dir, "e2e.yaml", models=["./rm-a", {"model": "./lm-c", "head": "logprob"}])
    store = tmp_path / "store"
    with pytest.warns(UserWarning, match="1 duplicate"):
        rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    assert "18/18 parts" in so
    df = load_results(store)
    assert list(df.columns[:6]) == ["model", "prompt", "token_id", "text", "score", "rank"]
    assert set(df["model"]) == {"rm-a", "lm-c"} and set(df["prompt"]) == set(PROMPTS.values())
    sizes = df.groupby(["model", "prompt", "candidates"]).size().unstack()
    assert (sizes["vocab"] == 200).all() and (sizes["texts"] == len(TEXTS)).all() and (sizes["words"] < 300).all()
    texts = df[df["candidates"] == "texts"]
    assert texts["token_id"].isna().all() and (texts["n_tokens"] >= 1).all() and set(texts["text"]) == set(TEXTS)
    assert df[df["candidates"] == "vocab"]["token_id"].notna().all()
    assert df.groupby(["model", "prompt", "candidates"])["rank"].min().eq(1).all()
    # a part equals the same scan run directly, to the bit: same process, threads and batches
    from rmfast.loading.loader import load
    from rmfast.scoring.pipeline import scan

    lm = load(str(models_dir / "rm-a"), dtype="float32", device="cpu")
    direct = scan(lm.model, lm.tokenizer, PROMPTS["best"], token_ids="0:200", progress=False).to_pandas()
    part = df[(df.model == "rm-a") & (df.prompt == PROMPTS["best"]) & (df.candidates == "vocab")]
    np.testing.assert_array_equal(part["score"].to_numpy(), direct["score"].to_numpy())
    # a rerun skips every finished part and rewrites nothing
    before = {p: p.stat().st_mtime_ns for p in part_files(store)}
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "18 already done" in se
    assert {p: p.stat().st_mtime_ns for p in part_files(store)} == before
    # rmfast results: the listing and the tidy export
    rc, so, se = run(["results", store, "--parts", "--out", tmp_path / "tidy.parquet"], capsys)
    assert rc == 0, se
    assert "18 done" in so and "rm-a" in so and "lm-c" in so and "candidates=texts" in so
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tidy.parquet"), df)
    assert run(["results", store, "--out", tmp_path / "tidy.csv"], capsys)[0] == 0
    assert (tmp_path / "tidy.csv").read_text().startswith("model,prompt,token_id,text,score,rank,")
    rc, so, se = run(["results", store, "--out", tmp_path / "tidy.txt"], capsys)  # (it wrote Parquet under .txt)
    assert one_line_error(rc, se) and "give a path ending in .parquet or .csv" in se and not (tmp_path / "tidy.txt").exists()
    idx = json.loads((store / "manifest.json").read_text())
    assert idx["complete"] and idx["n_done"] == 18 and idx["rows"] == len(df)


def test_sweep_survives_kill_9(models_dir, tmp_path, capsys):
    """kill -9 a sweep mid-way (a part in progress holds a checkpoint), rerun: the store holds the rows of a
    clean run, scores equal to fp32 rounding (the killed run had one thread, this process its own
    count; tests/test_trust.py has the bit-identical case, one thread everywhere)."""
    cfg = write_cfg(models_dir, "kill.yaml", defaults={"dtype": "float32", "device": "cpu", "batch_size": 32},
                    models=["./rm-a", "./rm-b"], prompts={k: PROMPTS[k] for k in ("greatest", "best")},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:320"}}, "texts": "texts.txt"})
    store = tmp_path / "killed"
    code = ("import sys; import rmfast.scoring.batching; rmfast.scoring.batching.CHECKPOINT_EVERY_S = 0.0; "
            "from rmfast.cli import main; sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", str(cfg), "--out", str(store), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    kill_9_when(proc, lambda: bool(part_files(store) and list(store.glob("parts/*/*/*/part.partial.npz"))), 120)
    done_before = part_files(store)
    # the part killed mid-way (a kill between a part's write and its checkpoint's removal leaves one beside a
    # finished part, which the rerun removes)
    checkpoints = [c for c in store.glob("parts/*/*/*/part.partial.npz") if not (c.parent / "part.parquet.json").exists()]
    assert 1 <= len(done_before) < 8
    # resume; then a clean run elsewhere
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    assert f"{len(done_before)} already done" in se
    if checkpoints:  # the part killed mid-way resumed from its checkpoint
        man = json.loads((checkpoints[0].parent / "part.parquet.json").read_text())
        assert man["scan"]["resumed_candidates"] > 0
        assert f"({man['scan']['resumed_candidates']} of them from the checkpoint)" in se  # the log line says so
    assert not list(store.glob("parts/*/*/*/part.partial.npz")) and not list(store.rglob("*.tmp"))
    rc, so, se = run(["sweep", cfg, "--out", tmp_path / "clean", "--no-progress"], capsys)
    assert rc == 0, se
    a = load_results(store, token_ids=True)
    b = load_results(tmp_path / "clean", token_ids=True)
    assert len(a) == 2 * 2 * (320 + len(TEXTS))  # no lost rows, no duplicated rows
    R.assert_same_rows_scores_to_rounding(b, a, R.float64_scores(b, {m: models_dir / m for m in ("rm-a", "rm-b")}))


# ------------------------------------------------------------------ scan with text candidates


def test_scan_text_candidates_cli(models_dir, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    with pytest.warns(UserWarning, match="1 duplicate"):
        rc, so, se = run(["scan", models_dir / "rm-a", "--candidates", models_dir / "texts.txt", "--dtype", "float32",
                          "--out", out, "--no-progress", "--top", "3"], capsys)
    assert rc == 0, se
    df = pd.read_parquet(out)
    assert list(df.columns) == ["text", "n_tokens", "score", "rank", "token_ids"] and len(df) == len(TEXTS)
    man = json.loads(Path(str(out) + ".json").read_text())
    assert man["candidates"]["n_duplicates"] == 1 and man["engine"] == "fast"
    assert "top 3" in so and "n_tokens" in so
    csv = tmp_path / "c.csv"
    pd.DataFrame({"id": range(3), "name": ["Water", "Fire", "The Moon"]}).to_csv(csv, index=False)
    rc, so, se = run(["scan", models_dir / "rm-a", "--candidates", csv, "--column", "name", "--out", tmp_path / "c.parquet",
                      "--no-progress", "--top", "0"], capsys)
    assert rc == 0, se
    assert pd.read_parquet(tmp_path / "c.parquet")["text"].tolist() == ["Water", "Fire", "The Moon"]
    # vocabulary views and the papers' pipeline on token scans
    rc, so, se = run(["scan", models_dir / "rm-a", "--token-ids", "0:300", "--wordlike", "--dedup", "--exclude-special",
                      "--out", tmp_path / "w.parquet", "--no-progress", "--top", "0"], capsys)
    assert rc == 0, se
    w = pd.read_parquet(tmp_path / "w.parquet")
    assert 0 < len(w) < 300 and w["text"].str.lstrip(" ").str.isalpha().all()
    with pytest.warns(UserWarning, match="merge with the template"):
        rc, so, se = run(["scan", models_dir / "rm-a", "--token-ids", "190:220", "--compat", "decode-retokenize",
                          "--out", tmp_path / "k.parquet", "--no-progress", "--top", "0"], capsys)
    assert rc == 0, se
    k = pd.read_parquet(tmp_path / "k.parquet")
    assert k["token_id"].tolist() == list(range(190, 220)) and (k["n_tokens"] >= 1).all()


@pytest.mark.parametrize("case", ["empty-file", "missing-file", "column-without-candidates", "candidates-and-ids",
                                  "over-long", "bad-csv-column"])
def test_scan_candidates_bad_input(case, models_dir, tmp_path, capsys):
    out = tmp_path / "o.parquet"
    base = ["scan", models_dir / "rm-a", "--out", out, "--no-progress"]
    f = tmp_path / "c.txt"
    f.write_text("Love\nA much longer candidate with many many tokens in it\n")
    extra = {"empty-file": ["--candidates", tmp_path / "empty.txt"],
             "missing-file": ["--candidates", tmp_path / "nope.txt"],
             "column-without-candidates": ["--column", "name"],
             "candidates-and-ids": ["--candidates", f, "--token-ids", "0:10"],
             "over-long": ["--candidates", f, "--max-tokens", "4"],
             "bad-csv-column": ["--candidates", tmp_path / "c.csv", "--column", "nope"]}[case]
    (tmp_path / "empty.txt").write_text("")
    pd.DataFrame({"name": ["x"]}).to_csv(tmp_path / "c.csv", index=False)
    rc, so, se = run(base + extra, capsys)
    assert one_line_error(rc, se), se
    assert not out.exists()
    if case == "over-long":
        assert "--max-tokens 4" in se and "candidate 2" in se


# ------------------------------------------------------------------ bad configs and foreign stores


BAD = {
    "unknown-top": ({"modles": ["./rm-a"]}, "modles"),
    "unknown-model-key": ({"models": [{"model": "./rm-a", "dtyp": "float32"}]}, "models[0].dtyp"),
    "missing-models": ({"models": None}, "models"),
    "empty-models": ({"models": []}, "models: the list is empty; list at least one model"),
    "missing-model-spec": ({"models": [{"name": "x"}]}, "models[0].model"),
    "missing-model-folder": ({"models": ["./rm-a", "./no-such-model"]}, "models[1].model"),
    "bad-dtype-type": ({"models": [{"model": "./rm-a", "dtype": 16}]}, "models[0].dtype"),
    "bad-head-index": ({"models": [{"model": "./rm-a", "head_index": "one"}]}, "models[0].head_index"),
    "bad-batch": ({"models": [{"model": "./rm-a", "batch_size": -3}]}, "models[0].batch_size"),
    "bad-bool": ({"models": [{"model": "./rm-a", "trust_remote_code": "yes"}]}, "models[0].trust_remote_code"),
    "dup-model-names": ({"models": ["./rm-a", {"model": "./rm-b", "name": "rm-a"}]}, "models[1].name"),
    "bad-prompts": ({"prompts": {"a": 3}}, "prompts.a"),
    "missing-prompts-file": ({"prompts": "nope.yaml"}, "nope.yaml"),
    "bad-vocab-key": ({"candidates": {"v": {"vocabulary": {"word_like": True}}}}, "candidates.v.vocabulary.word_like"),
    "empty-id-range": ({"candidates": {"v": {"vocabulary": {"token_ids": "5:1"}}}},
                       "candidates.v.vocabulary.token_ids: range 5:1 is empty"),
    # ids past a folder model's embedding rows: said before any part (was: when its first part loaded it)
    "ids-past-vocab": ({"candidates": {"v": {"vocabulary": {"token_ids": "0:60000"}}}},
                       "candidates.v.token_ids: id 59999 is outside rm-a's vocabulary 0:49152"),
    "id-list-past-vocab": ({"candidates": {"v": {"vocabulary": {"token_ids": [3, 99999]}}}},
                           "candidates.v.token_ids: id 99999 is outside rm-a's vocabulary"),
    "ids-file-past-vocab": ({"candidates": {"w": "texts.txt", "v": {"vocabulary": {"token_ids": "far-ids.txt"}}}},
                            "candidates.v.token_ids: id 70000 is outside rm-a's vocabulary"),
    "empty-cands": ({"candidates": {"e": "empty.txt"}}, "candidates.e"),
    "missing-cands": ({"candidates": {"e": "missing.txt"}}, "candidates.e"),
    "bad-compat": ({"compat": "retokenize"}, "compat"),
    "bad-defaults": ({"defaults": {"model": "x"}}, "defaults.model"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config(case, models_dir, tmp_path, capsys):
    (models_dir / "empty.txt").write_text("\n\n")
    (models_dir / "far-ids.txt").write_text("# ids\n5\n70000\n")
    over, key = BAD[case]
    cfg = write_cfg(models_dir, f"bad-{case}.yaml", **over)
    rc, so, se = run(["sweep", cfg, "--out", tmp_path / "s"], capsys)
    assert one_line_error(rc, se), se
    assert cfg.name in se and key in se, se
    assert not (tmp_path / "s").exists()


DUPLICATES = {  # a key given twice, at three depths: PyYAML alone keeps the last and drops the first
    "top": ("models: [./rm-a]\nprompts: {g: hi}\ncandidates: {t: texts.txt}\nmodels: [./rm-b]\n", "'models'", 4, 1),
    "prompts": ("models: [./rm-a]\nprompts:\n  g: hi\n  b: best\n  g: worst\ncandidates: {t: texts.txt}\n",
                "'g'", 5, 3),
    "model-spec": ("models:\n  - model: ./rm-a\n    dtype: float32\n    dtype: bfloat16\nprompts: {g: hi}\n"
                   "candidates: {t: texts.txt}\n", "'dtype'", 4, 3),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_duplicate_yaml_key_is_refused(case, models_dir, tmp_path, capsys):
    """A duplicate key is one line naming the key and both lines, before anything runs (issue 25)."""
    text, key, line, first = DUPLICATES[case]
    cfg = models_dir / f"dup-{case}.yaml"
    cfg.write_text(text)
    rc, so, se = run(["sweep", cfg, "--out", tmp_path / "s"], capsys)
    assert one_line_error(rc, se), se
    assert f"duplicate key {key}" in se and f"line {line}" in se and f"first given at line {first}" in se, se
    assert cfg.name in se and not (tmp_path / "s").exists()


def test_duplicate_key_in_a_prompts_file_is_refused(models_dir, tmp_path, capsys):
    """The prompts file a config names is read by the same rule."""
    (tmp_path / "prompts.yaml").write_text("best: What is best?\nbest: What is worst?\n")
    cfg = write_cfg(models_dir, "dup-prompts-file.yaml", prompts=str(tmp_path / "prompts.yaml"))
    rc, so, se = run(["sweep", cfg, "--out", tmp_path / "s"], capsys)
    assert one_line_error(rc, se) and "duplicate key 'best'" in se and "prompts.yaml" in se and "line 2" in se, se


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    """``<<`` merges defaults that a mapping then overrides: that is not a duplicate."""
    from rmfast.yaml_keys import yaml_load_unique

    assert yaml_load_unique("d: &d {dtype: float32, device: cpu}\nm:\n  <<: *d\n  dtype: bfloat16\n")["m"] == \
        {"dtype": "bfloat16", "device": "cpu"}


def test_bad_yaml_and_foreign_stores(models_dir, tmp_path, capsys):
    bad = models_dir / "broken.yaml"
    bad.write_text("models: [./rm-a\nprompts: {a: b}\n")
    rc, so, se = run(["sweep", bad, "--out", tmp_path / "s"], capsys)
    assert one_line_error(rc, se) and "broken.yaml" in se and "line" in se
    # a directory that is not a store is refused
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("mine")
    small = write_cfg(models_dir, "small.yaml", models=["./rm-a"], prompts={"g": PROMPTS["greatest"]},
                      candidates={"texts": "texts.txt"})
    rc, so, se = run(["sweep", small, "--out", tmp_path / "other"], capsys)
    assert one_line_error(rc, se) and "not an rmfast results store" in se
    # a store written by another config: refused; --force adopts (unchanged parts kept, stale removed)
    store = tmp_path / "s"
    assert run(["sweep", small, "--out", store, "--no-progress"], capsys)[0] == 0
    kept = store / "parts/model=rm-a/prompt=g/candidates=texts/part.parquet.json"
    t_kept = kept.stat().st_mtime_ns
    other = write_cfg(models_dir, "small2.yaml", models=["./rm-a"], prompts={"b": PROMPTS["best"], "g": PROMPTS["greatest"]},
                      candidates={"texts": "texts.txt"})
    rc, so, se = run(["sweep", other, "--out", store], capsys)
    assert one_line_error(rc, se) and "different config" in se and "--force" in se
    assert "prompts.b added" in se, se  # what differs, by name ("prompts differs" had been all it said)
    rc, so, se = run(["sweep", other, "--out", store, "--force", "--no-progress"], capsys)
    assert rc == 0, se
    assert kept.stat().st_mtime_ns == t_kept and "1 already done" in se
    assert len(load_results(store)) == 2 * len(TEXTS)
    rc, so, se = run(["sweep", small, "--out", store, "--dry-run", "--force"], capsys)  # back to g alone: b would go
    assert rc == 0 and "remove  parts/model=rm-a/prompt=b/candidates=texts" in so, so  # (it listed no deletion)
    assert len(load_results(store)) == 2 * len(TEXTS)  # a dry run removes nothing
    rc, so, se = run(["sweep", small, "--out", store], capsys)  # the refusal names what --force would delete
    assert one_line_error(rc, se) and "the 1 part(s) it lacks are deleted: model=rm-a/prompt=b/candidates=texts" in se
    rc, so, se = run(["results", tmp_path / "nothing"], capsys)
    assert one_line_error(rc, se)


def test_results_export_refuses_missing_parts(models_dir, tmp_path, capsys):
    """An export of a store missing parts (one never computed, one whose Parquet was deleted) is refused,
    naming both, with nothing written; --allow-missing exports the rest and names what it left out."""
    cfg = write_cfg(models_dir, "missing.yaml", models=["./rm-a"],
                    prompts={k: PROMPTS[k] for k in ("greatest", "best", "worst")}, candidates={"texts": "texts.txt"})
    store = tmp_path / "store"
    rc, so, se = run(["sweep", cfg, "--out", store, "--shard", "1/2", "--dry-run"], capsys)  # (it listed all 3)
    assert rc == 0 and "shard 1/2: its 1 part(s)" in so and so.count("  todo  ") == 1, so
    rc, so, se = run(["sweep", cfg, "--out", store, "--shard", "0/2", "--no-progress"], capsys)  # parts 0 and 2
    assert rc == 0, se
    gone = store / "parts/model=rm-a/prompt=worst/candidates=texts/part.parquet"
    gone.unlink()
    out = tmp_path / "tidy.csv"
    rc, so, se = run(["results", store, "--out", out], capsys)
    assert one_line_error(rc, se), se
    assert "2 of 3 parts" in se and "prompt=best/candidates=texts (not computed)" in se, se
    assert "prompt=worst/candidates=texts (part.parquet missing)" in se and "--allow-missing" in se, se
    assert not out.exists()
    rc, so, se = run(["results", store, "--out", out, "--allow-missing"], capsys)
    assert rc == 0, se
    assert set(pd.read_csv(out)["prompt"]) == {PROMPTS["greatest"]}
    [warning] = [ln for ln in se.splitlines() if ln.strip()]
    assert "warning" in warning and "prompt=best" in warning and "prompt=worst" in warning, se


def test_results_help_names_allow_missing_and_its_default(capsys):
    from rmfast.cli import main

    with pytest.raises(SystemExit):
        main(["results", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--allow-missing" in text and "default off: refuse" in text


def test_real_prompts_and_candidate_files_plan(shared_data, tmp_path, capsys):
    """The papers' inputs as a sweep: 54 prompts from paper_b_prompts.yaml × EloEverything × a lexicon (plan only)."""
    import yaml

    prompts = shared_data / "prompts" / "paper_b_prompts.yaml"
    elo = sorted((shared_data / "eloeverything").glob("*.csv"))
    nouns = shared_data / "lexicons" / "big2_nouns.csv"
    if not (prompts.exists() and elo and nouns.exists()):
        pytest.skip("shared prompts / EloEverything / lexicons absent")
    cfg = tmp_path / "paper_b.yaml"
    cfg.write_text(yaml.safe_dump({
        "out": "store",
        "models": ["smollm2-135m-instruct", {"model": "smollm2-135m-instruct", "name": "smollm2-rm", "random_head_seed": 0}],
        "prompts": str(prompts),
        "candidates": {"elo": {"file": str(elo[0]), "column": "name"},
                       "nouns": {"file": str(nouns), "column": "token_decoded"},
                       "words": {"vocabulary": {"exclude_special": True, "wordlike": True, "dedup": True}}},
    }))
    rc, so, se = run(["sweep", cfg, "--dry-run"], capsys)
    assert rc == 0, se
    assert "324 parts, 0 done" in so and so.count("todo") == 324  # 2 models × 54 prompts × 3 sets
    assert "prompt=best_ever_one/candidates=elo" in so and not (tmp_path / "store").exists()
    from rmfast.sweep import load_config

    c = load_config(cfg)
    assert len(c.prompts) == 54 and len(c.candidates[0].texts.texts) == 7530


def test_help_example_config_is_valid(tmp_path, capsys):
    """The example config `rmfast sweep --help` shows parses with the sweep's own parser, and README.md
    shows the same one."""
    import textwrap

    from rmfast.cli import main
    from rmfast.sweep import load_config

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = capsys.readouterr().out.split("example config", 1)[1].split("\n", 1)[1]
    example = textwrap.dedent(text).strip() + "\n"
    (tmp_path / "sweep.yaml").write_text(example)
    pd.DataFrame({"name": TEXTS}).to_csv(tmp_path / "items.csv", index=False)  # the file set it names
    cfg = load_config(tmp_path / "sweep.yaml")
    assert [m.name for m in cfg.models] == ["SmolLM2-135M-Instruct", "skywork-1b"]  # the name rmfast scan records
    assert cfg.models[1].dtype == "float32" and cfg.models[0].batch_size == "auto"
    assert set(cfg.prompts) == {"greatest", "worst"} and cfg.out == tmp_path.resolve() / "results" / "greatest"
    assert [c.name for c in cfg.candidates] == ["vocab", "words", "items"]
    assert list(cfg.candidates[2].texts.texts) == TEXTS
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert textwrap.indent(example, "  ") in readme


def test_a_model_whose_tokenizer_or_chat_template_changed_is_scored_again(models_dir, tmp_path, capsys, monkeypatch):
    """A folder model's chat template edited between runs (its weights as they were): the finished parts were
    scored with the old template, so they are scored again, not kept beside new parts on the new one. A hub id's
    finished parts are kept only for the cache's commit they were scored at."""
    import json
    import shutil

    from rmfast.loading import sources
    from rmfast.sweep.config import load_config
    from rmfast.sweep.runner import model_content

    folder = tmp_path / "rm-t"
    shutil.copytree(models_dir / "rm-a", folder)
    shutil.copy(models_dir / "prompts.yaml", tmp_path / "prompts.yaml")
    cfg = write_cfg(tmp_path, "tmpl.yaml", models=["./rm-t"], prompts={"g": PROMPTS["greatest"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    template = lambda: json.loads(next(store.glob("parts/**/part.parquet.json")).read_text())["scan"]["template"]  # noqa: E731
    old = template()
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "rm-t: its files changed since 1 finished part(s) were written" in se, se
    assert template()["prefix_ids"] != old["prefix_ids"]  # the part now holds the new template's scores
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    assert "files changed" not in capsys.readouterr().err  # unchanged since: kept
    m = load_config(cfg).models[0]
    monkeypatch.setattr(m, "model", "acme/tiny-rm")
    monkeypatch.setattr(sources, "hub_folder", lambda spec: (tmp_path, "c0ffee"))
    assert model_content(m) == {"revision": "c0ffee"}


def test_a_folder_model_edited_in_place_is_scored_again(models_dir, tmp_path, smol_tokenizer, capsys):
    """Finished parts are kept only for the weights they were scored from: a folder model re-saved in place
    with other weights (same shapes, same names, same config) gets its parts scored again, not reused; an
    untouched model's parts are reused."""
    import shutil

    folder = tmp_path / "rm-edit"
    shutil.copytree(models_dir / "rm-a", folder)
    shutil.copytree(models_dir / "rm-b", tmp_path / "rm-b")
    shutil.copy(models_dir / "prompts.yaml", tmp_path / "prompts.yaml")
    cfg = write_cfg(tmp_path, "edit.yaml", models=["./rm-edit", "./rm-b"], prompts={"g": PROMPTS["greatest"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:50"}}})
    store = tmp_path / "store"
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    before = load_results(store).set_index(["model", "token_id"])["score"]
    untouched = {p: p.stat().st_mtime_ns for p in part_files(store) if "rm-b" in str(p)}

    m = T.tiny("llama", "classifier", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id, seed=7)
    m.save_pretrained(folder)  # the same folder, the same shapes: other weights
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    assert "rm-edit: its files changed since 1 finished part(s) were written" in se
    after = load_results(store).set_index(["model", "token_id"])["score"]
    assert not np.allclose(after.loc["rm-edit"], before.loc["rm-edit"])  # scored again from the new weights
    assert after.loc["rm-b"].equals(before.loc["rm-b"])
    assert {p: p.stat().st_mtime_ns for p in part_files(store) if "rm-b" in str(p)} == untouched  # reused as is
    rc, so, se = run(["sweep", cfg, "--out", tmp_path / "fresh", "--no-progress"], capsys)
    assert rc == 0, se
    fresh = load_results(tmp_path / "fresh").set_index(["model", "token_id"])["score"]
    assert after.loc["rm-edit"].equals(fresh.loc["rm-edit"])  # exactly what a fresh sweep of the new weights gives


def test_every_table_of_a_sweep_says_what_score_is(models_dir, tmp_path, capsys):
    """Issue 51 item 5: a part's Parquet and the store's export (`results --out`, Parquet or CSV) say what `score`
    is, per model where the models' heads differ (a reward head and a causal LM's logprob head here)."""
    from rmfast.io import read_provenance
    from rmfast.scoring.plan import score_meaning

    cfg = write_cfg(models_dir, "meaning.yaml", models=["./rm-a", {"model": "./lm-c", "head": "logprob"}],
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:40"}}})
    store = tmp_path / "store"
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0, se
    want = {"rm-a": score_meaning("score"), "lm-c": score_meaning("logprob")}
    for f in part_files(store):
        part = f.with_name("part.parquet")
        assert read_provenance(part)["score_meaning"] in want.values(), part
    assert run(["results", store, "--out", tmp_path / "tidy.parquet"], capsys)[0] == 0
    assert read_provenance(tmp_path / "tidy.parquet")["score_meaning"] == want
    assert run(["results", store, "--out", tmp_path / "tidy.csv"], capsys)[0] == 0
    csv = pd.read_csv(tmp_path / "tidy.csv")
    assert (csv["score_meaning"] == csv["model"].map(want)).all()


def test_a_part_whose_model_changed_is_stale_wherever_it_is_read(models_dir, tmp_path, capsys):
    """Issue 50 item 7: after a part's re-score was refused (its folder's new chat template fails the template
    check), a dry run listed it as done and `rmfast results --out` exported the old template's rows, exit 0. A part
    whose model changed is not done for any reader until it is scored again."""
    import json
    import shutil

    folder = tmp_path / "rm-s"
    shutil.copytree(models_dir / "rm-a", folder)
    cfg = write_cfg(tmp_path, "stale.yaml", models=["./rm-s"], prompts={"g": PROMPTS["greatest"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    tc = json.loads((folder / "tokenizer_config.json").read_text())  # a template that never renders the response
    tc["chat_template"] = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}\n{% endif %}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 2, se  # the re-score is refused
    rc, so, se = run(["sweep", cfg, "--out", store, "--dry-run"], capsys)
    assert rc == 0 and "1 parts, 0 done" in so and "todo" in so and "stale" in so, so
    rc, so, se = run(["results", store, "--out", tmp_path / "t.parquet"], capsys)
    assert rc == 2 and "stale: its model's files changed" in se and not (tmp_path / "t.parquet").exists(), se
    rc, so, se = run(["results", store], capsys)  # the listing names it too (it said only "done 0")
    assert rc == 0 and "stale: parts/model=rm-s" in so and "scores it again" in so, so
    with pytest.warns(UserWarning, match=r"1 of 1 parts of .* are missing: .*left out of these results"):
        assert load_results(store).empty  # (it returned what was there without a word: a walkthrough's subset)


def test_lens_on_a_causal_lm_is_refused_before_the_store(models_dir, tmp_path, capsys):
    """lens: true on a model whose head will be logprob (a causal LM with no random_head_seed) was refused only after
    the store was written and the model loaded; now before either, from the model's files. A seeded score head (or a
    reward model) runs."""
    from rmfast.loading.loader import causal_lm_only

    assert causal_lm_only(str(models_dir / "lm-c")) is True and causal_lm_only(str(models_dir / "rm-a")) is False
    assert causal_lm_only("someone/not-a-local-model") is None and causal_lm_only("smollm2-135m-instruct") is True
    cfg = write_cfg(models_dir, "lens-lm.yaml", models=[{"model": "./lm-c", "name": "lm-c", "lens": True}],
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    rc, _, err = run(["sweep", cfg, "--out", tmp_path / "s", "--no-progress"], capsys)
    assert one_line_error(rc, err) and "model lm-c: the lens reads a score head" in err and "random_head_seed: N" in err
    assert not (tmp_path / "s").exists()
    cfg = write_cfg(models_dir, "lens-lm-seeded.yaml", prompts={"g": "hi"},
                    models=[{"model": "./lm-c", "name": "lm-c", "lens": True, "random_head_seed": 0}],
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    rc, _, err = run(["sweep", cfg, "--out", tmp_path / "s2", "--no-progress"], capsys)
    assert rc == 0, err


def test_a_problem_met_once_the_model_loads_names_the_config_key(models_dir, tmp_path, capsys, monkeypatch):
    """A token id range past the vocabulary, or a head the model lacks, passed the config check and then stopped
    the run naming CLI flags (--token-ids, --head) a sweep has not got: now the file, the model, the candidates and
    the options as the config's keys. The duplicate model name's line no longer ends in a colon. (A folder model's
    ids are checked before any part, from its config.json; the load-time check is what an alias, a GGUF file or a
    hub id meets, reached here with the early one off.)"""
    from rmfast.sweep import runner

    cfg = write_cfg(models_dir, "past-vocab.yaml", prompts={"g": "hi"}, models=["./rm-a"],
                    candidates={"v": {"vocabulary": {"token_ids": "49100:60000"}}})
    rc, _, err = run(["sweep", cfg, "--out", tmp_path / "s0", "--dry-run"], capsys)
    assert one_line_error(rc, err) and "candidates.v.token_ids: id 59999 is outside rm-a's vocabulary" in err, err
    monkeypatch.setattr(runner, "_check_ids_fit", lambda cfg, m: None)
    rc, _, err = run(["sweep", cfg, "--out", tmp_path / "s", "--no-progress"], capsys)
    assert one_line_error(rc, err), err
    assert "past-vocab.yaml: models[0] (rm-a) × candidates.v: token_ids range 49100:60000 is outside" in err, err
    assert "--token-ids" not in err
    cfg = write_cfg(models_dir, "dup.yaml", models=["./rm-a", {"model": "./rm-b", "name": "rm-a"}])
    rc, _, err = run(["sweep", cfg, "--out", tmp_path / "s2", "--dry-run"], capsys)
    assert one_line_error(rc, err) and "give each model a distinct name (e.g. {model: " in err, err


def test_a_store_moved_with_its_inputs_keeps_its_parts(models_dir, tmp_path, smol_tokenizer, capsys):
    """A project folder (config, model folder, candidate and ids files, store) moved or copied elsewhere: the
    config now names other paths, the same contents. The rerun keeps every finished part (it used to refuse the
    store as another config, and --force scored every part again); a dry run counts them done first. A part of a
    model whose files at the new place hold other weights is scored again; a candidate file with other content
    is another config."""
    import shutil

    a = tmp_path / "a"
    a.mkdir()
    shutil.copytree(models_dir / "rm-a", a / "rm-a")
    shutil.copytree(models_dir / "rm-b", a / "rm-b")
    (a / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    (a / "ids.txt").write_text("3\n5\n8\n13\n21\n")
    write_cfg(a, "moved.yaml", models=["./rm-a", "./rm-b"], prompts={"g": PROMPTS["greatest"]},
              candidates={"ids": {"vocabulary": {"token_ids": "ids.txt"}}, "texts": "texts.txt"}, out="store")
    assert run(["sweep", a / "moved.yaml", "--no-progress"], capsys)[0] == 0
    before = load_results(a / "store")
    b = tmp_path / "b"
    shutil.move(a, b)
    stamps = {p.relative_to(b): p.stat().st_mtime_ns for p in (b / "store").glob("parts/*/*/*/part.parquet")}
    rc, so, se = run(["sweep", b / "moved.yaml", "--dry-run"], capsys)
    assert rc == 0 and "4 parts, 4 done (moved store)" in so, so + se
    rc, so, se = run(["sweep", b / "moved.yaml", "--no-progress"], capsys)
    assert rc == 0 and "4 finished part(s) kept" in se and "4 already done" in se, se
    assert {p.relative_to(b): p.stat().st_mtime_ns for p in (b / "store").glob("parts/*/*/*/part.parquet")} == stamps
    pd.testing.assert_frame_equal(load_results(b / "store"), before)
    assert json.loads((b / "store" / "store.json").read_text())["config"]["models"][0]["model"] == str((b / "rm-a").resolve())
    write_cfg(b, "moved.yaml", models=["./rm-b", "./rm-a"], prompts={"g": PROMPTS["greatest"]},  # another order
              candidates={"texts": "texts.txt", "ids": {"vocabulary": {"token_ids": "ids.txt"}}}, out="store")
    rc, so, se = run(["sweep", b / "moved.yaml", "--no-progress"], capsys)
    assert rc == 0 and "4 already done" in se, se

    c = tmp_path / "c"  # moved again, and one model's folder now holds other weights
    shutil.copytree(b, c)
    m = T.tiny("llama", "classifier", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id, seed=9)
    m.save_pretrained(c / "rm-a")
    rc, so, se = run(["sweep", c / "moved.yaml", "--no-progress"], capsys)
    assert rc == 0 and "rm-a: its files changed since 2 finished part(s) were written" in se, se
    after = load_results(c / "store").set_index(["model", "candidates", "text"])["score"].sort_index()
    was = before.set_index(["model", "candidates", "text"])["score"].sort_index()
    assert after.loc["rm-b"].equals(was.loc["rm-b"]) and not np.allclose(after.loc["rm-a"], was.loc["rm-a"])

    (c / "texts.txt").write_text("\n".join(TEXTS[:3]) + "\n")  # other content: another config, not a move
    shutil.copytree(c, tmp_path / "d")
    rc, so, se = run(["sweep", tmp_path / "d" / "moved.yaml", "--no-progress"], capsys)
    assert one_line_error(rc, se) and "holds results of a different config" in se
    rc, so, se = run(["sweep", tmp_path / "d" / "moved.yaml", "--no-progress", "--force"], capsys)
    assert rc == 0 and "2 already done" in se, se  # --force: the ids parts are carried, the texts parts scored


def test_dtype_auto_is_one_dtype_per_model_in_a_store(models_dir, tmp_path, capsys, monkeypatch):
    """``dtype: auto`` resolves per machine (bf16 on CUDA; on a CPU by a measurement), so a sweep resumed or sharded
    on another kind of machine kept its fp32 parts and scored the rest in bf16 under the same keys: one model, two
    dtypes, silently. Now the store pins what auto became: the finished parts' dtype, else the first loader's."""
    import json
    import shutil

    from rmfast import cpu

    shutil.copytree(models_dir / "rm-a", tmp_path / "rm-a")
    cfg = write_cfg(tmp_path, "auto.yaml", defaults={"dtype": "auto", "device": "cpu"}, models=["./rm-a"],
                    prompts={"g": PROMPTS["greatest"], "b": PROMPTS["best"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:40"}}})
    machine = {"dtype": "float32"}  # what this "machine" measures auto to be
    monkeypatch.setattr(cpu, "choose_cpu_dtype", lambda config=None, cache=None: cpu.DtypeChoice(
        machine["dtype"], "flags", f"the test's machine takes {machine['dtype']}", "test CPU", "test"))
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    first = load_results(store)
    assert list(json.loads((store / "dtypes.json").read_text()).values()) == ["float32"]
    # one part lost (as if its writer died before it landed), then the sweep resumed on a machine that takes bf16
    lost = sorted(store.glob("parts/*/prompt=b*/*/part.parquet.json"))[0]
    lost.unlink()
    machine["dtype"] = "bfloat16"
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "rm-a: dtype auto is float32 in this store: its 1 finished part(s) were scored in it" in se, se
    man = json.loads(lost.read_text())
    assert man["scan"]["dtype"] == "float32" and "dtype auto is float32" in man["dtype_auto"]
    assert man["scan"]["decisions"]["dtype"]["reason"] == "auto: " + man["dtype_auto"]
    again = load_results(store)
    pd.testing.assert_frame_equal(again, first)  # the same bits as the part first scored
    # no finished part yet (another writer pinned it while loading): the pin holds on this machine too
    for f in store.glob("parts/*/*/*/part.parquet.json"):
        f.unlink()
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "pinned by the writer that loaded it first" in se, se
    pd.testing.assert_frame_equal(load_results(store), first)
    # a store an earlier rmfast mixed: its reader says so
    f = sorted(store.glob("parts/*/*/*/part.parquet.json"))[0]
    man = json.loads(f.read_text())
    man["scan"]["dtype"] = "bfloat16"
    f.write_text(json.dumps(man))
    with pytest.warns(UserWarning, match=r"rm-a's parts were scored in different dtypes \(1 in bfloat16, 1 in float32\)"):
        load_results(store)


def test_a_sweep_whose_store_another_config_adopts_stops_writing_there(models_dir, tmp_path, capsys, monkeypatch):
    """Sweep A ran while sweep B adopted the same store with --force: A went on writing its parts (prompts B's config
    does not have) and its own index into B's store, and `rmfast analyze STORE` then read them. Now A stops at its
    next part with one line, and writes nothing more there."""
    import json

    from rmfast.sweep import runner

    cfg = write_cfg(models_dir, "adopted.yaml", models=["./rm-a"], candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    store = tmp_path / "store"
    real, calls = runner._PartRunner._one, []

    def one_then_adopted(self, lm, m, p):
        real(self, lm, m, p)
        calls.append(p)
        if len(calls) == 1:  # B's --force, between A's parts
            info = json.loads((store / "store.json").read_text())
            (store / "store.json").write_text(json.dumps({**info, "config_hash": "b" * 20, "config_file": "b.yaml"}))

    monkeypatch.setattr(runner._PartRunner, "_one", one_then_adopted)
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert one_line_error(rc, se) and "was adopted by another config (b.yaml) while this sweep ran" in se, se
    assert len(calls) == 1 and len(part_files(store)) == 1


def test_analyze_reads_a_store_as_its_configs_finished_parts(models_dir, tmp_path, capsys):
    """`rmfast analyze X STORE` (or STORE/parts) globbed every part file under it, so parts another config had left
    there (a --force, a sweep that wrote on after one) were analysed as this store's. Now a store given as its
    folder or its parts/ folder reads as load_results does: the config's finished parts only."""
    import shutil

    cfg = write_cfg(models_dir, "analyzed.yaml", models=["./rm-a"], prompts={"g": PROMPTS["greatest"], "b": PROMPTS["best"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:30"}}})
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    part = next(store.glob("parts/*/prompt=b*/*"))
    foreign = part.parent.parent / "prompt=worst" / part.name  # a part of another config, left in the folder
    shutil.copytree(part, foreign)
    (foreign / "part.parquet.json").write_text((foreign / "part.parquet.json").read_text().replace(
        PROMPTS["best"], PROMPTS["worst"]))
    for where in (store, store / "parts"):
        rc, so, se = run(["analyze", "distributions", where], capsys)
        assert rc == 0, se
        assert PROMPTS["greatest"] in so and PROMPTS["best"] in so and PROMPTS["worst"] not in so, so


def test_force_leaves_a_part_another_sweep_is_computing(tmp_path):
    """--force removed every part folder its new config does not have, the one another running sweep was computing
    included (its lock held): that sweep then recreated it and wrote a part of a config the store no longer had.
    Now such a part is left to its writer (which stops before writing it); a later --force removes it."""
    from filelock import FileLock

    from rmfast.sweep.store import Store

    st = Store(tmp_path / "s")
    for rel in ("parts/model=m/prompt=a/candidates=c", "parts/model=m/prompt=b/candidates=c"):
        (st.root / rel).mkdir(parents=True)
    busy = "parts/model=m/prompt=b/candidates=c"
    with FileLock(str(st.root / busy / ".part.lock")):  # another sweep computes it
        assert st.remove_stale(set()) == ["parts/model=m/prompt=a/candidates=c"]
        assert (st.root / busy).is_dir()
    assert st.remove_stale(set()) == [busy] and not (st.root / busy).exists()


def test_a_finished_parts_leftover_checkpoint_is_removed_by_the_rerun(models_dir, tmp_path, capsys):
    """A kill between a part's write and its checkpoint's removal left the checkpoint beside the finished part for
    good (a rerun skips finished parts). The rerun removes it now, holding the part's lock."""
    cfg = write_cfg(models_dir, "leftover.yaml", models=["./rm-a"], prompts={"g": PROMPTS["greatest"]},
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:20"}}})
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    ck = part_files(store)[0].parent / "part.partial.npz"
    ck.write_bytes(b"left by a kill")
    rc, so, se = run(["sweep", cfg, "--out", store, "--no-progress"], capsys)
    assert rc == 0 and "1 already done" in se and not ck.exists()


def test_trajectory_of_a_store_reads_its_fresh_parts_by_each_checkpoints_own_step(models_dir, tmp_path, capsys):
    """A loading/GCG probe: `analyze trajectory STORE/parts` read every Parquet under the folder (a part scored from
    weights since replaced included, with no note), and took the step from the FIRST step-like part of a name, so a
    run named after its SFT start (`r-step9`) put every checkpoint at step 9 (correlation 1.0, every change 0)."""
    import shutil

    from rmfast.analysis.data.scans import load_scans

    for name in ("rm-a", "rm-b"):
        shutil.copytree(models_dir / name, tmp_path / name)
    cfg = write_cfg(tmp_path, "traj.yaml", prompts={"g": PROMPTS["greatest"]},
                    models=[{"model": "./rm-a", "name": "r-step9-checkpoint-5"},
                            {"model": "./rm-b", "name": "r-step9-checkpoint-20"}],
                    candidates={"vocab": {"vocabulary": {"token_ids": "0:40"}}})
    store = tmp_path / "store"
    assert run(["sweep", cfg, "--out", store, "--no-progress"], capsys)[0] == 0
    out = tmp_path / "traj"
    rc, _, err = run(["analyze", "trajectory", store / "parts", "--out", out], capsys)
    assert rc == 0, err
    corr = pd.read_csv(out / "trajectory_final_corr.csv")
    assert sorted(corr["step"]) == [5, 20] and set(corr["run"].str.split(" | ", regex=False).str[0]) == {"r-step9"}, corr
    # checkpoint 5's weights replaced (a retrained run in the same output_dir): its part is stale, not read
    shutil.copy(tmp_path / "rm-b" / "model.safetensors", tmp_path / "rm-a" / "model.safetensors")
    with pytest.warns(UserWarning, match="1 of 2 parts"):
        rc, _, err = run(["analyze", "trajectory", store / "parts", "--out", tmp_path / "traj2"], capsys)
    assert rc == 0, err
    assert sorted(pd.read_csv(tmp_path / "traj2" / "trajectory_final_corr.csv")["step"]) == [20]
    with pytest.raises(Exception, match="is a sweep store: give its folder alone"):
        load_scans([store / "parts"])  # the Parquet reader never reads a store's files behind its back
    part = next(store.glob("parts/model=r-step9-checkpoint-5/*/*"))  # a recheck: a part's folder or file did
    for inside in (part, part / "part.parquet", part.parents[1]):
        rc, _, err = run(["analyze", "trajectory", inside, "--out", tmp_path / "traj3"], capsys)
        assert one_line_error(rc, err) and "is a sweep store" in err, (inside, err)
    (tmp_path / "scans").mkdir()  # an unrelated store.json beside plain scans is not a store
    shutil.copy(next(store.glob("parts/model=r-step9-checkpoint-20/*/*/part.parquet")), tmp_path / "scans" / "a.parquet")
    shutil.copy(next(store.glob("parts/model=r-step9-checkpoint-20/*/*/part.parquet.json")),
                tmp_path / "scans" / "a.parquet.json")
    (tmp_path / "scans" / "store.json").write_text("{}")
    assert len(load_scans([tmp_path / "scans"])) == 40
