"""Inputs of the analysis layer: scan frames, Parquet + manifests, EloEverything CSVs,
metadata, lexicons, the shared-vocabulary join — each against a known answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy")

from rmfast.analysis import (Ledger, load_afinn, load_dictionary, load_eloeverything,
                             load_frequencies, load_human_scores, load_model_metadata,
                             load_scans, match_metadata, select, shared_vocabulary,
                             validate_scans)
from rmfast.analysis.data.framing import framing_map, parse_framing_args
from rmfast.analysis.data.lexicons import match_dictionary
from rmfast.errors import UserError


def _scan(model, prompt, texts, scores, ids=None):
    return pd.DataFrame({"model": model, "prompt": prompt,
                         "token_id": ids if ids is not None else range(len(texts)),
                         "text": texts, "score": scores})


def _write_parquet(path: Path, model: str, prompt: str, texts, scores):
    df = pd.DataFrame({"token_id": np.arange(len(texts), dtype="int64"),
                       "token": [f"tok{i}" for i in range(len(texts))], "text": texts,
                       "score": np.asarray(scores, dtype="float64")})
    df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
    df.to_parquet(path)
    Path(str(path) + ".json").write_text(json.dumps(
        {"model": {"name": model, "dtype": "bf16"}, "prompt": prompt}))


# ---------------------------------------------------------------- scans
def test_validate_adds_rank_and_reports_dropped_rows():
    df = pd.DataFrame({"model": ["m"] * 4, "prompt": "p", "text": list("abcd"),
                       "score": [1.0, np.nan, np.inf, 3.0]})
    led = Ledger()
    out = validate_scans(df, ledger=led)
    assert out["text"].tolist() == ["a", "d"]
    assert out["rank"].tolist() == [2, 1]
    assert out["token_id"].isna().all()
    assert led.total() == 2
    assert led.frame()["reason"].str.contains("not finite").all()


def test_validate_rejects_missing_columns_with_one_line_message():
    with pytest.raises(UserError, match=r"lack column\(s\) \['score'\]"):
        validate_scans(pd.DataFrame({"model": ["m"], "prompt": ["p"], "text": ["a"]}))
    with pytest.raises(UserError, match="token_id must hold integers"):
        validate_scans(pd.DataFrame({"model": ["m"], "prompt": ["p"], "text": ["a"],
                                     "score": [1.0], "token_id": ["x"]}))


def test_select_names_missing_models():
    df = validate_scans(_scan("a", "p", list("xy"), [1.0, 2.0]))
    with pytest.raises(UserError, match=r"model\(s\) \['zz'\] not in the scan results; available: \['a'\]"):
        select(df, models=["zz"])


def test_load_scans_builds_tidy_frame_from_parquet_and_manifests(tmp_path):
    _write_parquet(tmp_path / "a.parquet", "org/A", "Best?", ["x", "y", "z"], [0.1, 0.3, 0.2])
    sub = tmp_path / "more"
    sub.mkdir()
    _write_parquet(sub / "b.parquet", "org/B", "Best?", ["x", "y"], [1.0, -1.0])
    df = load_scans([tmp_path])  # a folder is searched recursively
    assert list(df.columns[:6]) == ["model", "prompt", "token_id", "text", "score", "rank"]
    assert "token" in df.columns
    assert sorted(df["model"].unique()) == ["org/A", "org/B"]
    a = df[df["model"] == "org/A"].set_index("text")
    assert a.loc["y", "rank"] == 1 and a.loc["x", "rank"] == 3
    assert str(df["token_id"].dtype) == "Int64"
    same = load_scans([tmp_path / "a.parquet"])
    assert len(same) == 3


def test_load_scans_errors(tmp_path):
    _write_parquet(tmp_path / "a.parquet", "A", "p", ["x"], [0.0])
    Path(str(tmp_path / "a.parquet") + ".json").unlink()
    with pytest.raises(UserError, match="has no manifest a.parquet.json"):
        load_scans([tmp_path / "a.parquet"])
    with pytest.raises(UserError, match="does not exist"):
        load_scans([tmp_path / "nope.parquet"])
    _write_parquet(tmp_path / "b.parquet", "B", "p", ["x"], [0.0])
    with pytest.raises(UserError, match="same scan was given twice"):
        load_scans([tmp_path / "b.parquet", tmp_path / "b.parquet"])
    from rmfast.io import write_result  # rmfast score's output, given to an analysis: named as what it is

    write_result(tmp_path / "pairs.scores.parquet", pd.DataFrame({"prompt": ["Hi"], "response": ["Yo"], "score": [0.5]}),
                 {"model": {"name": "m"}, "input": {"path": "pairs.csv"}, "score_position": "final position"})
    with pytest.raises(UserError, match=r"is rmfast score's output \(a table of scored pairs\), not a scan"):
        load_scans([tmp_path / "pairs.scores.parquet"])


def _manifest_set(path, **fields):
    p = Path(str(path) + ".json")
    m = json.loads(p.read_text())
    m.update(fields)
    p.write_text(json.dumps(m))


def test_load_scans_names_apart_scans_of_one_model_that_differ_in_a_setting(tmp_path):
    """An fp32 and a bf16 scan (or a score and a log-prob one) of one model and prompt are two columns to compare;
    the same settings over overlapping ids are refused, naming both files."""
    for name, dtype in (("f32", "float32"), ("bf", "bfloat16")):
        _write_parquet(tmp_path / f"{name}.parquet", "M", "p", ["x", "y"], [0.0, 1.0])
        _manifest_set(tmp_path / f"{name}.parquet", dtype=dtype, head="score")
    df = load_scans([tmp_path / "f32.parquet", tmp_path / "bf.parquet"])
    assert sorted(df["model"].unique()) == ["M [bfloat16]", "M [float32]"]
    assert "_file" not in df.columns
    _write_parquet(tmp_path / "lp.parquet", "M", "p", ["x", "y"], [0.0, 1.0])
    _manifest_set(tmp_path / "lp.parquet", dtype="float32", head="logprob", head_index=0)
    df = load_scans([tmp_path / "f32.parquet", tmp_path / "lp.parquet"])
    assert sorted(df["model"].unique()) == ["M [logprob]", "M [score]"]
    _write_parquet(tmp_path / "f32b.parquet", "M", "p", ["x"], [0.0])
    _manifest_set(tmp_path / "f32b.parquet", dtype="float32", head="score")
    # a subset beside the whole (a quick --token-ids scan beside the vocabulary's): which one to drop is said
    with pytest.raises(UserError, match=r"f32b\.parquet's 1 ids are all in .*f32\.parquet \(scans of the same model, "
                                        r"prompt, head, dtype and template\): give only one of them"):
        load_scans([tmp_path / "f32.parquet", tmp_path / "f32b.parquet"])
    _write_parquet(tmp_path / "f32c.parquet", "M", "p", ["y", "z", "w"], [0.0, 2.0, 1.0])
    pd.read_parquet(tmp_path / "f32c.parquet").assign(token_id=[1, 2, 3]).to_parquet(tmp_path / "f32c.parquet")
    _manifest_set(tmp_path / "f32c.parquet", dtype="float32", head="score")
    with pytest.raises(UserError, match=r"1 ids repeat across .*f32\.parquet, .*f32c\.parquet \(.*overlapping\); give "
                                        r"scans of disjoint ids"):
        load_scans([tmp_path / "f32.parquet", tmp_path / "f32c.parquet"])
    with pytest.raises(UserError, match=r"ids repeat in .*f32\.parquet: the same scan was given twice"):
        load_scans([tmp_path / "f32.parquet", tmp_path / "f32.parquet"])


def test_load_scans_takes_only_a_parquet_with_its_own_manifest(tmp_path):
    """The pair rule (io.write_pair): a manifest from another write of the file is refused."""
    from rmfast.io import write_pair

    df = pd.DataFrame({"token_id": [1, 2], "token": ["x", "y"], "text": ["x", "y"], "score": [1.0, -1.0],
                       "rank": [1, 2]})
    p = tmp_path / "a.parquet"
    first = write_pair(p, df, {"model": {"name": "org/A"}, "prompt": "Best?"})
    assert list(load_scans([p])["model"].unique()) == ["org/A"]
    write_pair(p, df, {"model": {"name": "org/A"}, "prompt": "Best?"})
    Path(str(p) + ".json").write_text(json.dumps(first))  # the old write's manifest beside the new Parquet
    with pytest.raises(UserError, match="from different writes"):
        load_scans([p])


# ---------------------------------------------------------------- EloEverything format
def _write_elo(folder: Path, prompt_stem: str, names, elo, models: dict):
    df = pd.DataFrame({"elo_rank": np.arange(1, len(names) + 1), "elo_score": elo,
                       "name": names, "elo_matches": 10, **models})
    df.to_csv(folder / f"{prompt_stem}.csv", index=False)


def test_load_eloeverything_tidy_and_human(tmp_path):
    _write_elo(tmp_path, "What, in one word, is the best thing ever", ["Love", "War", "Tea"],
               [1600, 1200, 1400], {"org/A": [3.0, 1.0, 2.0], "org/B": [0.5, 0.1, 0.2]})
    data = load_eloeverything(tmp_path)
    assert set(data.scans["prompt"]) == {"What, in one word, is the best thing ever?"}
    assert len(data.scans) == 6 and data.scans["token_id"].isna().all()
    assert data.human.set_index("text")["human_score"].to_dict() == {
        "Love": 1600, "War": 1200, "Tea": 1400}
    a = data.scans[data.scans["model"] == "org/A"].set_index("text")
    assert a["rank"].to_dict() == {"Love": 1, "War": 3, "Tea": 2}


def test_load_human_scores_columns(tmp_path):
    (tmp_path / "h.csv").write_text("item,rating\nA,1\nB,x\n")
    h = load_human_scores(tmp_path / "h.csv", item_column="item", score_column="rating")
    assert h["text"].tolist() == ["A", "B"] and np.isnan(h["human_score"].iloc[1])
    with pytest.raises(UserError, match="lacks column"):
        load_human_scores(tmp_path / "h.csv")


# ---------------------------------------------------------------- metadata
def test_metadata_yaml_and_csv_formats(tmp_path):
    (tmp_path / "m.yaml").write_text(
        "- name: org/Foo-Gemma-2B\n  nickname: F-Gem\n  base_model: Gemma\n  base_version: '2'\n"
        "  size: 2B\n  reward_bench_rank: 7\n  params: {torch_dtype: bfloat16}\n")
    y = load_model_metadata(tmp_path / "m.yaml")
    assert y.loc[0, ["nickname", "developer", "base", "base_family"]].tolist() == [
        "F-Gem", "org", "Gemma 2", "Gemma"]
    assert y.loc[0, "params_b"] == 2.0 and y.loc[0, "leaderboard_rank"] == 7
    (tmp_path / "m.csv").write_text(
        "RewardBench Rank,Model ID,Developer,Model Name,Base Model,Parameters (B)\n"
        "3,B-Lla,dev,Bar-Llama-8B,Llama 3.1,8\n")
    c = load_model_metadata(tmp_path / "m.csv")
    matched, unmatched = match_metadata(["someorg/Bar-Llama-8B", "x/Other"], c)
    assert matched.loc["someorg/Bar-Llama-8B", "nickname"] == "B-Lla"
    assert matched.loc["someorg/Bar-Llama-8B", "base_family"] == "Llama"
    assert unmatched == ["x/Other"]


# ---------------------------------------------------------------- lexicons
def test_afinn_reader(tmp_path):
    (tmp_path / "a.txt").write_text("Good\t3\ncan't stand\t-3\n")
    a = load_afinn(tmp_path / "a.txt")
    assert a.values.tolist() == [["good", 3], ["can't stand", -3]]
    (tmp_path / "bad.txt").write_text("good 3\n")
    with pytest.raises(UserError, match="line 1"):
        load_afinn(tmp_path / "bad.txt")


def test_bnc_reader_sums_forms_and_skips_lemma_totals(tmp_path):
    text = ("\tWord\tPoS\t\tFreq\tRa\tDisp\n"
            "\tlove\tNoC\t%\t150\t99\t0.92\n\t@\t@\tlove\t148\t99\t0.92\n"
            "\t@\t@\tloves\t1\t66\t0.87\n"
            "\tlove\tVerb\t%\t150\t99\t0.91\n\t@\t@\tlove\t86\t99\t0.91\n"
            "\tthe\tDet\t:\t61847\t100\t0.98\n"
            "\tgood*\tNoC\t:\t25#\t100\t0.94\n"
            "\tfurther*\tAdj\t[see far]\n")
    (tmp_path / "bnc.txt").write_bytes(text.encode("latin-1"))
    f = load_frequencies(tmp_path / "bnc.txt").set_index("word")["frequency"]
    assert f.to_dict() == {"good": 25.0, "love": 234.0, "loves": 1.0, "the": 61847.0}


def test_generic_frequency_csv(tmp_path):
    (tmp_path / "f.csv").write_text("word,freq\nLove,10\nlove,5\nwar,2\n")
    f = load_frequencies(tmp_path / "f.csv").set_index("word")["frequency"]
    assert f.to_dict() == {"love": 15.0, "war": 2.0}


def test_dictionary_formats(tmp_path):
    (tmp_path / "long.csv").write_text('"Category","token_decoded"\n"Agency","skill"\n'
                                       '"Communion","care"\n')
    (tmp_path / "wide.dicx").write_text("DicTerm,Care_Virtue,Care_Vice\nkind,X,\nharm,,X\r\n")
    (tmp_path / "wide.csv").write_text('"DicTerm","Agency","Communion"\n"able","X",NA\n'
                                       '"warm",NA,"X"\n')
    (tmp_path / "liwc.dic").write_text("%\n1\tposemo\n2\tnegemo\n%\nhapp*\t1\nsad\t2\nbittersweet\t1 2\n")
    assert load_dictionary(tmp_path / "long.csv")[["term", "category"]].values.tolist() == [
        ["skill", "Agency"], ["care", "Communion"]]
    assert sorted(load_dictionary(tmp_path / "wide.dicx")[["term", "category"]].values.tolist()) == [
        ["harm", "Care_Vice"], ["kind", "Care_Virtue"]]
    assert sorted(load_dictionary(tmp_path / "wide.csv")[["term", "category"]].values.tolist()) == [
        ["able", "Agency"], ["warm", "Communion"]]
    dic = load_dictionary(tmp_path / "liwc.dic")
    assert sorted(dic[["term", "category", "wildcard"]].values.tolist()) == [
        ["bittersweet", "negemo", False], ["bittersweet", "posemo", False],
        ["happ", "posemo", True], ["sad", "negemo", False]]
    hits = match_dictionary(pd.Series([" Happy", "happiness", "sad", "glad"]), dic)
    assert sorted(hits.values.tolist()) == [["happiness", "posemo"], ["happy", "posemo"],
                                            ["sad", "negemo"]]


# ---------------------------------------------------------------- shared vocabulary
def test_text_join_applies_papers_dedup_rule_and_reports_counts():
    a = _scan("A", "p", ["x", "y", "y", "z", "\ufffd", "\ufffd"], [1, 2, 3, 4, 5, 6])
    b = _scan("B", "p", ["x", "y", "z", "w"], [4, 3, 2, 1])
    led = Ledger()
    sv = shared_vocabulary(validate_scans(pd.concat([a, b])), "p", ledger=led)
    assert sorted(sv.wide.index) == ["x", "z"]  # y duplicated in A: dropped everywhere
    c = sv.counts.set_index("model")
    assert c.loc["A"].tolist() == [6, 4, 0, 2]  # rows, duplicated, not_shared, shared
    assert c.loc["B"].tolist() == [4, 0, 2, 2]
    fr = led.frame()
    assert fr.loc[fr["step"] == "dedupe", "rows"].sum() == 4
    assert fr.loc[fr["step"] == "intersect", "rows"].sum() == 2


def test_id_join_is_stricter_than_text_join():
    a = _scan("A", "p", ["x", "y", "z"], [1.0, 2.0, 3.0], ids=[1, 2, 3])
    b = _scan("B", "p", ["x", "y", "z"], [3.0, 2.0, 1.0], ids=[1, 2, 30])
    df = validate_scans(pd.concat([a, b]))
    assert len(shared_vocabulary(df, "p", on="text").wide) == 3
    assert sorted(shared_vocabulary(df, "p", on="id").text) == ["x", "y"]
    text_only = validate_scans(pd.concat([a, b]).drop(columns="token_id"))
    with pytest.raises(UserError, match="use the text join"):
        shared_vocabulary(text_only, "p", on="id")


def test_framing_guess_and_override():
    fm = framing_map(["What is the worst thing?", "What is the most good thing?", "Huh?"],
                     parse_framing_args(["Huh?=negative"]))
    assert fm == {"What is the worst thing?": "negative",
                  "What is the most good thing?": "positive", "Huh?": "negative"}
    with pytest.raises(UserError, match="positive' or 'negative"):
        framing_map(["a"], {"a": "neutral"})


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, rmfast.analysis, rmfast.cli.analyze, rmfast.analysis.report; "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'statsmodels', 'sklearn') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_analysis_extra_installs_the_lexicon_packages():
    # `analyze sentiment` without --afinn reads the afinn package and `--frequencies wordfreq`
    # the wordfreq package; `pip install rmfast[analysis]` must bring both.
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extra = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower()
             for r in meta["project"]["optional-dependencies"]["analysis"]}
    assert {"afinn", "wordfreq"} <= extra


def test_optional_afinn_package():
    pytest.importorskip("afinn")
    a = load_afinn(None).set_index("word")["valence"]
    assert a["good"] == 3 and len(a) == 2477  # the package's copy of AFINN-111


def test_optional_wordfreq_frequencies():
    pytest.importorskip("wordfreq")
    f = load_frequencies("wordfreq", words=["The", "love", "qzxqzxq"]).set_index("word")["frequency"]
    assert list(f.index) == ["love", "the"] and f["the"] > f["love"] > 0


def test_manifest_model_name_fallbacks(tmp_path):
    _write_parquet(tmp_path / "a.parquet", "x", "Best?", ["x"], [0.0])
    Path(str(tmp_path / "a.parquet") + ".json").write_text(json.dumps(
        {"model": {"name": None, "alias": "smollm2", "path": "/m.gguf"}, "prompt": "Best?"}))
    assert load_scans([tmp_path / "a.parquet"])["model"].tolist() == ["smollm2"]
    Path(str(tmp_path / "a.parquet") + ".json").write_text(json.dumps({"model": {}, "prompt": "p"}))
    with pytest.raises(UserError, match="lacks model.name/prompt"):
        load_scans([tmp_path / "a.parquet"])


def test_reads_what_rmfast_scan_writes(tmp_path):
    scan = pytest.importorskip("rmfast.scoring.pipeline")
    res = scan.ScanResult(np.arange(4), np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32),
                          ["▁a", "▁b", "c", "d"], [" a", " b", "c", "d"],
                          {"model": {"type": "folder", "name": "tiny-rm"}, "prompt": "Best?"})
    res.to_parquet(tmp_path / "s.parquet")
    df = load_scans([tmp_path / "s.parquet"])
    assert df["model"].unique().tolist() == ["tiny-rm"] and df["prompt"].unique().tolist() == ["Best?"]
    assert df.set_index("text")["rank"].to_dict() == {" a": 3, " b": 1, "c": 4, "d": 1}


def test_a_sweeps_prompt_names_stand_for_their_prompts(tmp_path, capsys):
    """`analyze best-worst STORE --best greatest`: a sweep part's prompt name (its manifest's prompt_name, the
    store's folder name) is taken for the prompt; the full text still works, and an unknown name is refused."""
    from rmfast.cli import main

    words = ["love", "war", "joy", "pain", "hope", "fear"]
    for name, prompt, sign in (("greatest", "What is the greatest thing?", 1.0), ("worst", "What is the worst thing?", -1.0)):
        _write_parquet(tmp_path / f"{name}.parquet", "M", prompt, words, sign * np.arange(6.0))
        _manifest_set(tmp_path / f"{name}.parquet", prompt_name=name)
    assert set(load_scans([tmp_path])["prompt_name"]) == {"greatest", "worst"}
    for best in ("greatest", "What is the greatest thing?"):
        assert main(["analyze", "best-worst", str(tmp_path), "--best", best, "--worst", "worst",
                     "--out", str(tmp_path / "bw.csv"), "--overwrite"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["analyze", "best-worst", str(tmp_path), "--best", "nope", "--out", str(tmp_path / "x.csv")]) == 2
    assert "'nope' is not a prompt of these scans" in capsys.readouterr().err


def test_a_file_that_is_not_a_result_is_named_as_what_it_is(tmp_path):
    """A scan's manifest, a GCG result, a CSV or a checkpoint given where a scan belongs (explore, analyze, report):
    each was "X has no manifest X.json beside it: ... give a file an rmfast job wrote", wrong advice for a GCG JSON
    an rmfast job did write. Each now says what the file is and what to give."""
    _write_parquet(tmp_path / "a.parquet", "A", "p", ["x"], [0.0])
    (tmp_path / "g.json").write_text(json.dumps({"best_ids": [1, 2], "best_score": 0.5}))
    (tmp_path / "t.csv").write_text("text\nx\n")
    (tmp_path / "o.json").write_text("{}")
    (tmp_path / "s.parquet.partial.npz").write_bytes(b"x")
    for name, said in [("a.parquet.json", r"is the manifest of a.parquet; give .*a.parquet itself"),
                       ("g.json", r"is a GCG search's result \(JSON\), not a table of scores"),
                       ("t.csv", r"is a text table \(.csv\), not a result"),
                       ("o.json", r"is a JSON file, not a result table"),
                       ("s.parquet.partial.npz", r"is the checkpoint of a job in progress")]:
        with pytest.raises(UserError, match=said):
            load_scans([tmp_path / name])
