"""Blank similarity rows say why (issue 37 item 14): ``--states 0`` keeps layer 0, which at the scored
position is the embedding of the template's last token, the same in every row, so its CKA/RV are 0/0. Each
undefined row names the layer and the reason (column ``undefined``), and the note says it once, with why
layer 0 does not vary; the same for the models × models table of three or more sets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cli_run import run
from rmfast.analysis.representations.representation_rsa import representation_agreement
from rmfast.analysis.representations.similarity import similarity
from rmfast.states import write_states

PROMPTS = ("What, in one word, is the greatest thing ever?", "What, in one word, is the worst thing ever?")


def test_only_layer_0_names_the_layers_and_why(tmp_path):
    """Both sets hold layer 0 alone (``--states 0``): no pair has a defined measure, and still the layers and
    the reason are named (the note used to say only that 'every pair holds a layer that is constant')."""
    rng = np.random.default_rng(0)
    a = write_states(tmp_path / "a.states", np.arange(50), {"0": np.ones((50, 4), "float32")})
    b = write_states(tmp_path / "b.states", np.arange(50), {"0": np.full((50, 4), 3.0, "float32"),
                                                          "1": rng.normal(size=(50, 4)).astype("float32")})
    res = similarity(a, b, bootstrap=0, permutations=0)
    t = res.pairs.set_index(["layer_a", "layer_b"])["undefined"]
    assert t.to_dict() == {("0", "0"): "A 0 (constant across candidates); B 0 (constant across candidates)",
                           ("0", "1"): "A 0 (constant across candidates)"}
    note = next(n for n in res.notes if "undefined" in n)
    assert "A 0 (constant across candidates), B 0 (constant across candidates)" in note, note
    assert "layer 0 is the input embedding at the scored position, the template's last token in every row" in note
    same = similarity(b, b, layers_a="1", layers_b="1", bootstrap=0, permutations=0)
    assert same.pairs["undefined"].tolist() == [""] and not any("undefined" in n for n in same.notes)


def test_nan_states_are_named_with_their_count(tmp_path):
    import warnings

    x = np.random.default_rng(1).normal(size=(40, 3)).astype("float32")
    x[5, 1] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the writer's own warning (tested in test_states)
        a = write_states(tmp_path / "a.states", np.arange(40), {"last_prenorm": x})
    res = similarity(a, a, bootstrap=0, permutations=0)
    assert res.pairs["undefined"].tolist() == ["A last_prenorm (1 NaN/inf values); B last_prenorm (1 NaN/inf values)"]


def test_three_sets_at_layer_0_say_why(tmp_path):
    rng = np.random.default_rng(2)
    sets = {m: write_states(tmp_path / m, np.arange(30), {"0": np.full((30, 4), k, "float32"),
                                                          "1": rng.normal(size=(30, 4)).astype("float32")})
            for k, m in enumerate("abc")}
    res = representation_agreement(sets, layer="0", n_perm=9)
    assert res.pairs["undefined"].tolist() == ["a (constant across candidates); b (constant across candidates)",
                                               "a (constant across candidates); c (constant across candidates)",
                                               "b (constant across candidates); c (constant across candidates)"]
    note = next(n for n in res.notes if "undefined" in n)
    assert note.startswith("3 of 3 model pairs have undefined measures (NaN) at layer 0") and "input embedding" in note
    fine = representation_agreement(sets, layer="1", n_perm=9)
    assert (fine.pairs["undefined"] == "").all() and not any("undefined" in n for n in fine.notes)


def test_scans_with_states_0_say_why_in_the_table_and_the_note(tiny_dir, tmp_path, capsys):
    """The issue's case, end to end: two scans with --states 0, then analyze similarity."""
    scans = []
    for k, prompt in enumerate(PROMPTS):
        scans.append(tmp_path / f"s{k}.parquet")
        rc, _, se = run(["scan", tiny_dir, "--prompt", prompt, "--token-ids", "0:100", "--dtype", "float32",
                         "--states", "0", "--no-progress", "--top", "0", "--out", scans[-1]], capsys)
        assert rc == 0, se
    rc, _, se = run(["analyze", "similarity", *scans, "--bootstrap", "0", "--permutations", "0", "--no-progress",
                     "--out", tmp_path / "sim.csv"], capsys)
    assert rc == 0, se
    t = pd.read_csv(tmp_path / "sim.csv", dtype={"layer_a": str, "layer_b": str})
    assert t[["cka", "rv2"]].isna().all().all()
    assert t["undefined"].tolist() == ["A 0 (constant across candidates); B 0 (constant across candidates)"]
    assert "layer 0 is the input embedding at the scored position" in se and "A 0 (constant across" in se, se
    # the report's similarity table says it beside the blank row (a column shown when some row is undefined)
    pytest.importorskip("scipy")
    from rmfast.analysis.report import build_report
    from rmfast.analysis.representations.views import states_beside
    from rmfast.analysis.data.scans import load_scans

    page = build_report(load_scans([tmp_path]), states=states_beside([tmp_path]), n_perm=10)
    sec = page[page.index('<h2 id="representations"'):]
    assert ">undefined</th>" in sec and "A 0 (constant across candidates); B 0 (constant across candidates)" in sec
    assert "layer 0 is the input embedding at the scored position" in sec
