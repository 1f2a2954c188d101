"""The reward lens and the layer × layer similarity maps in the report and the explorer (issue 24 §6).

Tiny scans with lens columns and states folders (``rmfast.states.write_states``); every number the
report or the page shows is checked against what ``analysis.lens`` and ``analysis.similarity`` compute
on the same files, and both omit the panels, without an error, where there is nothing to show.
"""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy")

from rmfast.analysis.representations.lens import lens
from rmfast.analysis.representations.views import (_similarity_html, heat_matrix, lens_by_scan, lens_payload, pick_layers,
                                             similarity_from_csv, similarity_panels, states_beside)
from rmfast.analysis.render.report_html import table_html
from rmfast.analysis.data.scans import load_scans
from rmfast.analysis.representations.similarity import MEASURES, similarity
from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.explore import build_explorer, render_html, unpack
from rmfast.io import write_result
from rmfast.states import write_states

N = 120
# model b first: its fewer lens columns come first in the loaded frame, so depth order must be restored;
# "last": the lens's name of the last layer (lens_last), whose state is stored as last_prenorm
MODELS = {"org/rm-b": ["0", "1", "last"], "org/rm-a": ["0", "1", "2", "3", "last"]}
STATES = {m: [l.replace("last", "last_prenorm") for l in ls] for m, ls in MODELS.items()}  # the folders' names
SIM_COLS = ["layer_a", "layer_b", "n", *MEASURES, "rv_null_mean"]


def _write(folder: Path, *, states: bool = True, lens_cols: bool = True) -> list[Path]:
    """One scan per model (prompt "Best?"): scores, lens columns, and a states folder beside it."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    base = rng.normal(size=(N, 6))
    texts = [f"w{i}" for i in range(N)]
    paths = []
    for k, (model, layers) in enumerate(MODELS.items()):
        h, hs = base, {}
        for name in layers:
            h = np.tanh(h @ rng.normal(size=(6, 6)) / 2 + 0.5 * base)  # (N, 6)
            hs[name] = h.astype("float32")
        score = hs["last"][:, 0].astype(np.float64)
        df = pd.DataFrame({"token_id": np.arange(N), "token": texts, "text": texts, "score": score})
        if lens_cols:
            for name in layers:
                df[f"lens_{name}"] = hs[name][:, 0] if name != "last" else score
            df.loc[3, f"lens_{layers[1]}"] = np.nan  # a row a gated head re-gated: the lens drops it
        df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
        path = folder / f"s{k}.parquet"
        write_result(path, df, {"model": {"name": model}, "prompt": "Best?"})
        if states:
            write_states(path.with_suffix(".states"), np.arange(N)[::-1].copy(), {l.replace("last", "last_prenorm"): v[::-1] for l, v in hs.items()},
                         scan={"model": model})
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def scans_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("reps")
    _write(d)
    return d


def _own_lens(path: Path, k: int = 10):
    """The lens of one scan file, as ``rmfast analyze lens`` computes it."""
    return lens(pd.read_parquet(path), k=k)


# ---------------------------------------------------------------- what is found and computed
def test_lens_by_scan_is_each_scans_own_lens(scans_dir):
    got = {m: res for m, _, res in lens_by_scan(load_scans([scans_dir]))}
    assert set(got) == set(MODELS)
    for k, model in enumerate(MODELS):
        want = _own_lens(scans_dir / f"s{k}.parquet")
        assert got[model].layers["layer"].tolist() == MODELS[model]  # depth order, only the scan's own layers
        pd.testing.assert_frame_equal(got[model].layers, want.layers)
        pd.testing.assert_frame_equal(got[model].entry, want.entry)
    assert lens_by_scan(load_scans([scans_dir]).filter(regex="^(?!lens_)")) == []


def test_states_beside_and_the_sampled_maps(scans_dir):
    found = states_beside([scans_dir])
    assert found == {m: scans_dir / f"s{k}.states" for k, m in enumerate(MODELS)}
    assert states_beside([scans_dir / "s0.parquet", scans_dir / "s0.states"]) == {"org/rm-b": scans_dir / "s0.states"}
    assert pick_layers(MODELS["org/rm-a"], 3) == ["0", "2", "last"] and pick_layers(["0", "1"], None) == ["0", "1"]
    panels, notes = similarity_panels(found, max_layers=3, max_rows=50, seed=0)
    assert notes == [] and len(panels) == 1
    p = panels[0]
    assert (p.a, p.b, p.layers_a, p.layers_b, p.all_a, p.all_b) == ("org/rm-b", "org/rm-a", ["0", "1", "last_prenorm"],
                                                                      ["0", "2", "last_prenorm"], 3, 5)
    want = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", layers_a=["0", "1", "last_prenorm"],
                      layers_b=["0", "2", "last_prenorm"], bootstrap=0, permutations=0, max_rows=50)
    pd.testing.assert_frame_equal(p.pairs, want.pairs)
    assert (p.pairs["n"] == 50).all() and any("50 of the 120 shared candidates" in n for n in p.notes)
    # the sample is seeded and a subset: all rows give other numbers, the same seed the same ones
    full = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", layers_a=["0", "1", "last_prenorm"],
                      layers_b=["0", "2", "last_prenorm"], bootstrap=0, permutations=0)
    assert (full.pairs["n"] == N).all() and not np.allclose(full.pairs["rv2"], p.pairs["rv2"])
    # one set alone: its own layers against each other, the diagonal 1
    (self_map,), _ = similarity_panels({"a": scans_dir / "s1.states"}, max_layers=None, max_rows=None)
    la, lb, v = heat_matrix(self_map.pairs, "cka")
    assert la == lb == STATES["org/rm-a"] and np.allclose(np.diag(v), 1.0)
    with pytest.raises(UserError, match="at least 4"):
        similarity(scans_dir / "s0.states", scans_dir / "s1.states", bootstrap=0, permutations=0, max_rows=3)


def test_a_pair_that_shares_no_candidates_is_left_out_alone(scans_dir, tmp_path):
    """Three state sets, one of other candidates: its two pairs are left out, each named with its folders in a note,
    and the pair that joins is still shown, in the report and the explorer alike (before, the report hid every pair
    and the explorer made no page: a walkthrough's finds)."""
    rng = np.random.default_rng(3)
    other = tmp_path / "other.states"
    write_states(other, np.arange(N, 2 * N), {"last_prenorm": rng.normal(size=(N, 6)).astype("float32")})
    found = {**states_beside([scans_dir]), "org/other": other}
    panels, notes = similarity_panels(found, max_layers=3, max_rows=None)
    assert [(p.a, p.b) for p in panels] == [("org/rm-b", "org/rm-a")]
    assert len(notes) == 2 and all("not compared" in n and str(other) in n and "share no candidates" in n for n in notes)
    html = "".join(_similarity_html(SimpleNamespace(states=found, similarity_csv=None, states_layers=3,
                                                    states_rows=None)))
    assert "org/rm-b × org/rm-a" in html and html.count("not compared") == 2


def test_similarity_csv_panel(scans_dir, tmp_path, capsys):
    out = tmp_path / "sim.csv"
    assert main(["analyze", "similarity", str(scans_dir / "s0.parquet"), str(scans_dir / "s1.parquet"),
                 "--bootstrap", "0", "--permutations", "0", "--out", str(out)]) == 0
    p = similarity_from_csv(out)
    want = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", bootstrap=0, permutations=0).pairs
    assert p.layers_a == STATES["org/rm-b"] and p.layers_b == STATES["org/rm-a"]
    np.testing.assert_allclose(heat_matrix(p.pairs, "rv2")[2], heat_matrix(want, "rv2")[2], rtol=1e-12)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="lacks column"):
        similarity_from_csv(tmp_path / "bad.csv")
    with pytest.raises(UserError, match="no such"):
        similarity_from_csv(tmp_path / "nope.csv")


# ---------------------------------------------------------------- the report
def _section(page: str) -> str:
    return page[page.index('<h2 id="representations"'):]


def test_report_shows_the_lens_and_the_maps(scans_dir):
    from rmfast.analysis.report import build_report

    page = build_report(load_scans([scans_dir]), states=states_beside([scans_dir]), n_perm=10,
                        states_layers=3, states_rows=60)
    sec = _section(page)
    for k, model in enumerate(MODELS):  # the lens tables are rmfast analyze lens's, number for number
        assert table_html(_own_lens(scans_dir / f"s{k}.parquet").layers, max_rows=200) in sec
    want = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", layers_a=["0", "1", "last_prenorm"],
                      layers_b=["0", "2", "last_prenorm"], bootstrap=0, permutations=0, max_rows=60)
    assert table_html(want.pairs[SIM_COLS], max_rows=100) in sec
    assert "3 of 3 layers of org/rm-b × 3 of 5 of org/rm-a" in sec and "60 of the 120 shared candidates" in sec
    assert sec.count("<img") == 3  # two lens figures, one pair of heatmaps
    assert '<a href="#representations">' in page


def test_report_bad_csv_keeps_the_lens(scans_dir, tmp_path):
    from rmfast.analysis.report import build_report

    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    sec = _section(build_report(load_scans([scans_dir]), similarity_csv=tmp_path / "bad.csv", n_perm=10))
    assert "Not shown: " in sec and "lacks column(s)" in sec and sec.count("<img") == 2
    # the row with a NaN lens value: counted beside its scan's table, as rmfast analyze lens says
    assert sec.count("1 rows left out: a NaN score or lens value") == 2


def test_report_without_lens_or_states_has_no_section(tmp_path):
    from rmfast.analysis.report import build_report

    _write(tmp_path, states=False, lens_cols=False)
    page = build_report(load_scans([tmp_path]), states=states_beside([tmp_path]), n_perm=10)
    assert states_beside([tmp_path]) == {} and 'id="representations"' not in page and "Not run: failed" not in page


def test_report_lens_only_and_matplotlib_missing(tmp_path, monkeypatch):
    from rmfast.analysis.data import deps
    from rmfast.analysis.report import build_report

    _write(tmp_path, states=False)
    page = build_report(load_scans([tmp_path]), n_perm=10)
    sec = _section(page)
    assert sec.count("<img") == 2 and "No states folder beside these scans" in sec

    def no_mpl(module, feature):
        if module.startswith("matplotlib"):
            raise UserError(f"{feature} needs the Python package 'matplotlib'; install it with: pip install x")
        return importlib.import_module(module)
    monkeypatch.setattr(deps, "require", no_mpl)
    sec = _section(build_report(load_scans([tmp_path]), n_perm=10))
    assert sec.count("No figure: plotting needs the Python package &#x27;matplotlib&#x27;") == 2 and "<img" not in sec
    assert "Traceback" not in sec and table_html(_own_lens(tmp_path / "s0.parquet").layers, max_rows=200) in sec


def test_report_cli_finds_the_states_and_takes_a_csv(scans_dir, tmp_path, capsys):
    out, csv = tmp_path / "r.html", tmp_path / "sim.csv"
    similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", bootstrap=0, permutations=0).pairs.to_csv(
        csv, index=False)
    assert main(["report", str(scans_dir), "--similarity", str(csv), "--out", str(out), "--n-perm", "10",
                 "--states-layers", "0", "--no-progress"]) == 0
    sec = _section(out.read_text(encoding="utf-8"))
    assert "3 of 3 layers of org/rm-b × 5 of 5 of org/rm-a" in sec and f"{csv} (A × B)" in sec
    assert sec.count("<img") == 4
    capsys.readouterr()
    assert main(["report", str(scans_dir), "--similarity", str(tmp_path / "nope.csv"),
                 "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--similarity" in err and "no such file" in err


# ---------------------------------------------------------------- the explorer
def test_explorer_header_holds_the_analyses_numbers(scans_dir):
    data = build_explorer(load_scans([scans_dir]), pairs=False, states=states_beside([scans_dir]),
                          states_layers=None, states_rows=None)
    back = unpack(render_html(data))
    assert back.lens == data.lens and back.similarity == data.similarity
    assert [(x["model"], x["column"]) for x in back.lens] == [(m, k) for k, m in enumerate(MODELS)]
    for k, x in enumerate(back.lens):
        want = lens_payload(_own_lens(scans_dir / f"s{k}.parquet"))
        assert {key: x[key] for key in want} == want
    (s,) = back.similarity
    want = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", bootstrap=0, permutations=0).pairs
    assert s["layers_a"] == STATES["org/rm-b"] and s["layers_b"] == STATES["org/rm-a"] and s["n"] == N
    for m in MEASURES:
        np.testing.assert_array_equal(np.array(s["measures"][m], dtype=float), heat_matrix(want, m)[2])


def test_explorer_without_lens_or_states(tmp_path, capsys):
    _write(tmp_path, states=False, lens_cols=False)
    data = build_explorer(load_scans([tmp_path]), pairs=False, states=states_beside([tmp_path]))
    assert data.lens == [] and data.similarity == []
    out = tmp_path / "e.html"
    assert main(["explore", str(tmp_path), "--out", str(out)]) == 0
    back = unpack(out.read_text(encoding="utf-8"))
    assert back.lens == [] and back.similarity == []


def test_explorer_cli_finds_the_states(scans_dir, tmp_path):
    out = tmp_path / "e.html"
    assert main(["explore", str(scans_dir), "--out", str(out), "--states-layers", "2"]) == 0
    (s,) = unpack(out.read_text(encoding="utf-8")).similarity
    assert s["layers_a"] == ["0", "last_prenorm"] and s["layers_b"] == ["0", "last_prenorm"] and len(s["measures"]) == 4


def test_explorer_panel_in_the_browser(scans_dir, tmp_path):
    from test_explore import _browser, _open

    pw, browser = _browser()
    try:
        data = build_explorer(load_scans([scans_dir]), pairs=False, states=states_beside([scans_dir]))
        path = tmp_path / "e.html"
        path.write_text(render_html(data), encoding="utf-8")
        page, errors = _open(browser, path)
        assert page.locator("#reps").is_visible()
        for k in range(len(MODELS)):  # the lens table, as rmfast analyze lens computes it (3 decimals)
            page.locator("#lens-col").select_option(str(k))
            want = _own_lens(scans_dir / f"s{k}.parquet").layers
            rows = [r.split("\t") for r in page.locator("#lens-tab tbody").inner_text().strip().split("\n")]
            assert [r[0] for r in rows] == want["layer"].tolist()
            shown = np.array([[np.nan if c == "—" else float(c) for c in r[1:]] for r in rows])
            np.testing.assert_allclose(shown, want[["spearman", "top_k_overlap", "bottom_k_overlap"]].to_numpy(),
                                       atol=5e-4)
        want = similarity(scans_dir / "s0.parquet", scans_dir / "s1.parquet", bootstrap=0, permutations=0).pairs
        for m in ("cka", "rv2"):
            page.locator("#sim-measure").select_option(m)
            cells = page.locator("#sim-tab tbody td").evaluate_all("(tds) => tds.map((td) => +td.dataset.v)")
            np.testing.assert_array_equal(np.reshape(cells, (3, 5)), heat_matrix(want, m)[2])
            assert re.match(r"\d\.\d\d$", page.locator("#sim-tab tbody td").first.inner_text())
        assert errors == []
        # a page with nothing to show keeps the panel hidden
        plain = build_explorer(load_scans([scans_dir]).filter(regex="^(?!lens_)"), pairs=False)
        path2 = tmp_path / "plain.html"
        path2.write_text(render_html(plain), encoding="utf-8")
        page2, errors2 = _open(browser, path2)
        assert not page2.locator("#reps").is_visible() and errors2 == []
    finally:
        browser.close()
        pw.stop()


def test_a_layer_constant_but_for_one_rounded_row_is_undefined():
    """Layer 0's lens is one state read through the head in batches: a GEMM may round one row's last bit by its
    place in the batch (a walkthrough saw 1 row of 1,500 one ulp off). Its Spearman ranked that rounding (0.015,
    overlaps 0.0) where it is undefined; a real layer next to it keeps its numbers."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    score = rng.normal(size=300).astype(np.float32)
    l0 = np.full(300, 1.0932901, dtype=np.float32)
    l0[137] = np.nextafter(l0[137], np.float32(2))  # one ulp up
    df = pd.DataFrame({"token_id": np.arange(300), "score": score, "lens_0": l0,
                       "lens_1": (score + rng.normal(size=300)).astype(np.float32), "lens_last": score})
    res = lens(df)
    t = res.layers.set_index("layer")
    assert np.isnan(t.loc["0", "spearman"]) and np.isnan(t.loc["0", "top_k_overlap"])
    assert 0.3 < t.loc["1", "spearman"] < 0.95 and t.loc["last", "spearman"] == 1.0
    assert "0" not in set(res.entry["first_layer"].dropna())
