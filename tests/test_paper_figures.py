"""The papers' figures as a reader sees them (issue 36): each has a title naming what it shows,
labelled axes, a key, and the paper's own layout. Checked on the figure objects (planted data),
and by file name on the published data (skipped when it is absent)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("scipy.stats")

from rmfast.analysis.paper_b.plots import BASE_COLOURS, fig1_figure, fig4a_figure, fig4b_figure
from rmfast.analysis.paper_a.plots import pvalue_heatmap, rank_gap_bars, tau_heatmap

from conftest import SHARED_DATA


def _texts(fig) -> list[str]:
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        out += [t.get_text() for t in leg.get_texts()] + [leg.get_title().get_text()]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    return out


def _medians(rng) -> pd.DataFrame:
    rows = []
    for m in range(6):
        base = "Gemma" if m < 3 else "Llama"
        for p in range(4):
            fr = "positive" if p < 2 else "negative"
            for cat in ("Agency", "Communion"):
                shift = (50 if fr == "negative" else 0) + (5 if (cat == "Agency") == (base == "Gemma") else 0)
                rows.append((f"m{m}", base, f"p{p}", fr, cat, 100 + shift + rng.normal(0, 3)))
    return pd.DataFrame(rows, columns=["model", "group", "prompt", "framing", "category", "median_rank"])


def _tests(med) -> pd.DataFrame:
    keys = med[["framing", "category"]].drop_duplicates()
    return keys.assign(p_bonferroni=[0.0004, 0.2, 0.03, 0.004][: len(keys)], correction="Bonferroni ×4")


def test_fig1_marks_the_papers_test_names_the_dictionary_and_shares_y_per_framing_row():
    med = _medians(np.random.default_rng(0))
    fig = fig1_figure(med, _tests(med), fig_id="1", dictionary="Big Two", n_words=263)
    texts = _texts(fig)
    assert any("Fig. 1" in t and "Big Two" in t for t in texts)  # dictionary in the title
    marks = [t for t in texts if "p(Bonf.)" in t]
    assert len(marks) == 4 and any(t.startswith("***") for t in marks) and any(t.startswith("ns") for t in marks)
    axes = np.array(fig.axes[:4]).reshape(2, 2)
    for row in axes:  # one y-range per framing row, inverted (rank 1 at the top)
        assert row[0].get_ylim() == row[1].get_ylim() and row[0].get_ylim()[0] > row[0].get_ylim()[1]
    assert axes[0, 0].get_ylim() != axes[1, 0].get_ylim()  # rows differ: the framings' ranks differ
    assert any("1 = best of 263" in t for t in texts)
    assert any("Bonferroni ×4" in t for t in texts)
    # the test's statistic, direction and n (issue 52 §5): 6 models × 2 prompts per panel
    assert any("Welch t of Llama − Gemma over the 12 model × prompt rows per panel" in t for t in texts)
    from matplotlib.colors import to_rgb

    dots = [c.get_facecolor()[0][:3] for ax in fig.axes for c in ax.collections
            if len(c.get_offsets()) and len(c.get_facecolor())]
    for base in ("Gemma", "Llama"):  # the Okabe-Ito colour-blind-safe pair
        assert any(np.allclose(d, to_rgb(BASE_COLOURS[base])) for d in dots), base


def _fig4_tables():
    rows = []
    for run, size, src, method, steps in (("uf_13", 13, "uf", "BT", (1000, 2000)),
                                          ("uf_27", 27, "uf", "BT", (1000, 2000)),
                                          ("sky_80k", 77, "skywork", "BT", (1000, 2000, 3000)),
                                          ("grm_80k", 550, "uf+skywork", "GRM", (1,))):
        for step in steps:
            for base in ("Gemma", "Llama", "Qwen"):
                for cat in ("Agency", "Communion"):
                    rows.append((run, size, src, method, step, base, cat,
                                 600 + 50 * ((cat == "Agency") == (base == "Gemma")) + step / 100))
    cat = pd.DataFrame(rows, columns=["run", "data_size", "data_source", "method", "step", "base",
                                      "category", "median_rank"])
    from rmfast.analysis.paper_b.reproduce import fig4_shape

    shape = fig4_shape(cat)
    shape["same_as"] = shape["run"].map({"uf_27": "uf_13"})
    final = shape.sort_values("step").groupby("run", as_index=False).last()
    return cat, final


def test_fig4a_draws_one_run_gemma_vs_llama_and_fig4b_names_the_duplicate_runs():
    cat, final = _fig4_tables()
    a = fig4a_figure(cat, "sky_80k", "Skywork, 77k pairs", 1365)
    lines = [ln for ax in a.axes for ln in ax.get_lines()]
    assert len(lines) == 4  # 2 categories × Gemma, Llama: no Qwen, no other run
    assert all(len(ln.get_xdata()) == 3 for ln in lines)
    assert any("Fig. 4a" in t for t in _texts(a)) and any("training step" in t for t in _texts(a))
    b = fig4b_figure(final, {"uf_27": "uf_13"}, 1365)
    texts = _texts(b)
    assert any("Fig. 4b" in t and "uf_27 is the same file as uf_13" in t for t in texts)
    assert sum(t == "uf_13=uf_27" for t in texts) == 2  # one label per category panel
    assert any("log scale" in t for t in texts) and any("GRM" in t for t in texts)


def test_paper_a_heatmaps_have_labelled_colour_keys_and_no_diagonal():
    names = ["Human (ELO)", "A", "B", "C"]
    tau = pd.DataFrame(np.eye(4) + 0.3 * (1 - np.eye(4)), index=names, columns=names)
    fig = tau_heatmap(tau, {}, "Paper A Fig. A5a: Kendall tau", 7530)
    cbar = [ax for ax in fig.axes if ax.get_ylabel().startswith("Kendall τ-b")]
    assert cbar and "7,530 items" in cbar[0].get_ylabel()
    assert not any(t.get_text() == "1.00" for t in fig.axes[0].texts)  # the diagonal is blank
    pv = pd.DataFrame(np.full((4, 4), 1e-5), index=names, columns=names)
    pv.iloc[1, 2] = pv.iloc[2, 1] = 0.2
    fig = pvalue_heatmap(pv, "Significance of the Kendall tau", 7530)
    texts = _texts(fig)
    assert "***: p < 0.001" in texts and "ns: p ≥ 0.05" in texts  # the colour key
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert len(cells) == 6 and sum(c.startswith("ns") for c in cells) == 1  # each pair once


def test_rank_gap_bars_explain_their_two_colours():
    d = pd.DataFrame({"prompt": "P?", "direction": ["humans rank higher"] * 2 + ["models rank higher"] * 2,
                      "position": [1, 2, 1, 2], "text": list("abcd"), "rank_diff": [90.0, 80.0, -70.0, -60.0]})
    texts = _texts(rank_gap_bars(d, ["P?"], "Paper A Fig. 5B", 100))
    assert any(t.startswith("humans rank higher") for t in texts)
    assert any(t.startswith("models rank higher") for t in texts)
    assert any("ranks among 100 items" in t for t in texts)


@pytest.mark.skipif(not (SHARED_DATA / "iclr2026" / "reward_model_training").is_dir(),
                    reason="shared data absent")
def test_published_fig4_is_drawn_as_4a_and_4b(tmp_path):
    from rmfast.analysis.paper_b.reproduce import _fig4

    found = {f["id"]: f for f in _fig4(SHARED_DATA / "iclr2026", tmp_path)}
    assert found["B-fig4a"]["files"][0] == "B_fig4a.png" and found["B-fig4b"]["files"][0] == "B_fig4b.png"
    assert not (tmp_path / "B_fig4_categories.png").exists()
    for f in ("B_fig4a.png", "B_fig4b.png"):
        assert (tmp_path / f).stat().st_size > 20_000
