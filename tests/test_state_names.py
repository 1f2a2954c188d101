"""The two states at the end of the stack have names nobody mistakes (issue 37 item 13): ``last_prenorm``
(the residual stream before the final norm) and ``last_normed`` (what the head reads, HF's
``hidden_states[-1]``). The old ``last`` is still read: as input it is ``last_prenorm`` with a warning
naming both, and a states folder written with it reads as ``last_prenorm``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from cli_run import run
from rmfast.states import FORMAT, open_states, parse_layers, write_states

PROMPT = "What, in one word, is the greatest thing ever?"
NOTE = r"layer 'last' is read as 'last_prenorm'.*before the final norm.*hidden_states\[-1\]\) is 'last_normed'"


def _quiet(fn, *a):
    """``fn(*a)``, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*a)


def test_old_last_is_last_prenorm_with_a_note():
    with pytest.warns(UserWarning, match=NOTE):
        assert parse_layers("0,last", 4) == ["0", "last_prenorm"]
    with pytest.warns(UserWarning, match=NOTE):
        assert parse_layers(["last", "8"], None) == ["last_prenorm", "8"]  # names only: canonical too
    with pytest.warns(UserWarning, match=NOTE):
        assert parse_layers("last,last_prenorm", 4) == ["last_prenorm"]  # one layer
    assert _quiet(parse_layers, "all", 2) == ["0", "1", "last_prenorm", "last_normed"]
    assert _quiet(parse_layers, "last_normed,last_prenorm,1", 2) == ["1", "last_prenorm", "last_normed"]


def test_the_states_help_says_which_is_which(capsys):
    from rmfast.cli import main

    with pytest.raises(SystemExit):
        main(["scan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "last_prenorm (after the last layer, BEFORE the final norm: not in HF's tuple)" in text
    assert "last_normed (after the final norm: what the head reads, HF's hidden_states[-1])" in text
    assert "The old name last means last_prenorm" in text


def _old_folder(folder, x, y):
    """A states folder exactly as rmfast wrote it before the rename: layer ``last``, tensor ``layer.last``."""
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"key": torch.arange(len(x)), "layer.0": torch.from_numpy(y), "layer.last": torch.from_numpy(x)},
              str(folder / "shard-00000.safetensors"), metadata={"format": FORMAT, "run_id": "old"})
    man = {"format": FORMAT, "layers": ["0", "last"], "dtype": "float32", "hidden_size": x.shape[1],
           "key": "token_id", "n": len(x), "shards": [{"file": "shard-00000.safetensors", "rows": len(x)}],
           "run_id": "old", "n_nonfinite": {"0": 0, "last": 7}, "scan": {"model": "old-rm"}}
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder


def test_an_old_states_folder_with_last_still_reads(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 5)).astype("float32"), rng.normal(size=(40, 5)).astype("float32")
    old = _quiet(_old_folder, tmp_path / "old.states", x, y)
    s = _quiet(open_states, old)
    assert s.layers == ["0", "last_prenorm"] and s.stored_name("last_prenorm") == "last"
    rows = np.array([3, 0, 39])
    np.testing.assert_array_equal(_quiet(s.take, "last_prenorm", rows), x[rows])
    np.testing.assert_array_equal(_quiet(s.take, "last", rows), x[rows])  # the old name, as stored
    assert s.n_nonfinite("last_prenorm") == 7 and s.n_nonfinite("0") == 0  # its count, under its stored name
    # a new folder of the same candidates: the two join on the canonical names
    new = _quiet(write_states, tmp_path / "new.states", np.arange(40), {"0": y, "last_prenorm": x})
    assert open_states(new).layers == ["0", "last_prenorm"]
    from rmfast.analysis.representations.similarity import similarity

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = similarity(old, new, bootstrap=0, permutations=0)
    pairs = res.pairs.set_index(["layer_a", "layer_b"])
    assert list(pairs.index) == [("0", "0"), ("0", "last_prenorm"), ("last_prenorm", "0"),
                                 ("last_prenorm", "last_prenorm")]
    assert pairs.loc[("last_prenorm", "last_prenorm"), "rv"] == pytest.approx(1.0)
    # the CLI with the old name: noted, and the table says the new one
    with pytest.warns(UserWarning, match=NOTE):
        rc, _, se = run(["analyze", "similarity", old, new, "--layers-a", "last", "--layers-b", "last",
                         "--bootstrap", "0", "--permutations", "0", "--out", tmp_path / "sim.csv"], capsys)
    assert rc == 0, se
    t = pd.read_csv(tmp_path / "sim.csv")
    assert (t["layer_a"].tolist(), t["layer_b"].tolist()) == (["last_prenorm"], ["last_prenorm"])
    # three sets at one layer (the default, last_prenorm), an old one among them
    third = write_states(tmp_path / "third.states", np.arange(40), {"last_prenorm": x + y},
                         scan={"model": "third-rm"})
    write_states(new, np.arange(40), {"0": y, "last_prenorm": x}, scan={"model": "new-rm"})
    rc, so, se = run(["analyze", "similarity", old, new, third], capsys)
    assert rc == 0 and "last_prenorm" in so, se


def test_a_folder_naming_one_layer_twice_is_refused(tmp_path):
    from rmfast.errors import UserError

    x = np.zeros((4, 3), "float32")
    with pytest.raises(UserError, match="one layer"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_states(tmp_path / "w.states", np.arange(4), {"last": x, "last_prenorm": x})
    folder = write_states(tmp_path / "s.states", np.arange(4), {"0": x, "last_prenorm": x + 1})
    man = json.loads((folder / "manifest.json").read_text())
    man["layers"] = ["last", "last_prenorm"]
    (folder / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(UserError, match="layers must be distinct"):
        open_states(folder)


def test_scan_stores_last_prenorm_and_last_normed_is_hf_final_hidden_state(tiny_dir, tmp_path, capsys):
    """A new scan's folder names the state before the final norm last_prenorm (manifest and tensors), and its
    last_normed is HF's own hidden_states[-1] (output_hidden_states=True) at the final position (fp32)."""
    from rmfast import load
    from rmfast.scoring.hf_path import final_norm_module
    from rmfast.states.format import read_header as _read_header
    from rmfast.template import build_template

    out = tmp_path / "s.parquet"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*'last'")  # the new names: no note
        rc, _, se = run(["scan", tiny_dir, "--prompt", PROMPT, "--dtype", "float32", "--token-ids", "0:64",
                         "--states", "last_normed,last_prenorm", "--no-progress", "--top", "0", "--out", out], capsys)
    assert rc == 0, se
    st = open_states(out)
    assert st.layers == ["last_prenorm", "last_normed"] == st.manifest["layers"]
    assert json.loads((tmp_path / "s.states" / "manifest.json").read_text())["layers"] == st.layers
    header, _ = _read_header(st.shards[0].file)
    assert {k for k in header if k.startswith("layer.")} == {"layer.last_prenorm", "layer.last_normed"}

    lm = load(str(tiny_dir), dtype="float32", device="cpu")
    tmpl = build_template(lm.tokenizer, PROMPT)
    seqs = torch.tensor([tmpl.sequence([int(k)]) for k in st.keys])  # (64, L): one token per candidate
    pre = []
    hook = final_norm_module(lm.model).register_forward_pre_hook(lambda m, a: pre.append(a[0]))
    try:
        with torch.no_grad():
            hs = lm.model(input_ids=seqs, output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    every = np.arange(st.n)
    final, before = hs[-1][:, -1].numpy(), pre[-1][:, -1].numpy()  # (64, d) each
    np.testing.assert_allclose(st.take("last_normed", every), final, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st.take("last_prenorm", every), before, rtol=1e-4, atol=1e-5)
    assert not np.allclose(st.take("last_prenorm", every), final, rtol=1e-2, atol=1e-2)  # not the same state
