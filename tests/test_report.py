"""The HTML report: every section runs on inputs that allow it, the file is self-contained
(plots as base64 PNG, no external resources), written atomically, and sections whose
inputs are missing say why instead of failing."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")
pytest.importorskip("statsmodels")

from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.analysis.report import build_report, table_html, visible, write_report

BEST, WORST = "What, in one word, is the best thing ever?", "What, in one word, is the worst thing ever?"
POS = ["love", "joy", "hope", "kind", "peace", "good", "great", "happy"]
NEG = ["war", "hate", "pain", "evil", "death", "bad", "awful", "sad"]
AGENCY = ["skill", "power", "drive", "effort", "ambition", "talent"]
COMMUNION = ["care", "warmth", "trust", "friend", "family", "help"]


def _inputs(tmp: Path):
    rng = np.random.default_rng(0)
    words = POS + NEG + AGENCY + COMMUNION
    texts = [" " + w for w in words] + words + [f"tok{i}" for i in range(120)] + ["\ufffd", "\ufffd", "\n"]
    models = ["org/Alpha-Gemma-2B", "org/Beta-Gemma-27B", "lab/Gamma-Llama-8B", "lab/Delta-Llama-3B"]
    frames = []
    for m in models:
        for prompt, sign in ((BEST, 1.0), (WORST, -1.0)):
            val = np.array([1.0 + POS.index(t.strip()) % 5 if t.strip() in POS
                            else -1.0 - NEG.index(t.strip()) % 5 if t.strip() in NEG else 0.0
                            for t in texts])
            score = sign * val + rng.normal(0, 1, len(texts)) + (5 if "Gemma" in m else -2)
            frames.append(pd.DataFrame({"model": m, "prompt": prompt,
                                        "token_id": np.arange(len(texts)), "text": texts,
                                        "score": score}))
    scans = pd.concat(frames, ignore_index=True)
    (tmp / "afinn.txt").write_text("".join(f"{w}\t{1 + i % 5}\n" for i, w in enumerate(POS))
                                   + "".join(f"{w}\t{-1 - i % 5}\n" for i, w in enumerate(NEG)))
    (tmp / "freq.csv").write_text("word,frequency\n" + "".join(
        f"{w},{rng.uniform(1, 500):.1f}\n" for w in words))
    (tmp / "big2.csv").write_text("Category,token_decoded\n" + "".join(
        f"Agency,{w}\n" for w in AGENCY) + "".join(f"Communion,{w}\n" for w in COMMUNION))
    (tmp / "meta.csv").write_text(
        "RewardBench Rank,Model ID,Developer,Model Name,Base Model,Parameters (B)\n"
        "1,A-Gem,org,Alpha-Gemma-2B,Gemma 2,2\n2,B-Gem,org,Beta-Gemma-27B,Gemma 2,27\n"
        "3,G-Lla,lab,Gamma-Llama-8B,Llama 3,8\n4,D-Lla,lab,Delta-Llama-3B,Llama 3.2,3\n")
    human = pd.DataFrame({"text": words, "human_score": np.linspace(1700, 1000, len(words))})
    return scans, human


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(d) for d in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def test_full_report_is_self_contained(tmp_path):
    scans, human = _inputs(tmp_path)
    html = build_report(scans, human=human, metadata=tmp_path / "meta.csv",
                        afinn=tmp_path / "afinn.txt", frequencies=tmp_path / "freq.csv",
                        dictionaries=[tmp_path / "big2.csv"], n_perm=200, k=5)
    assert "Not run" not in html, re.findall(r"Not run: [^<]*", html)
    assert "not fitted" not in html
    for section in ("distributions", "agreement", "human", "sentiment", "exposure",
                    "best-worst", "categories-big2.csv", "extremes"):
        assert f'id="{section}"' in html
    imgs = _images(html)
    assert len(imgs) >= 12 and all(i.startswith(b"\x89PNG") for i in imgs)
    assert not re.search(r'(src|href)="(?!data:|#)', html)  # nothing external
    assert "A-Gem" in html and "D-Lla" in html  # metadata nicknames used
    assert "␣love" in html  # leading spaces made visible
    assert "Rows left out" in html  # the dedupe of the two U+FFFD tokens is reported
    out = write_report(tmp_path / "r.html", html)
    assert out.read_text(encoding="utf-8") == html
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_report_lists_sections_it_cannot_run(tmp_path):
    scans, _ = _inputs(tmp_path)
    one = scans[scans["prompt"] == BEST]
    html = build_report(one, n_perm=50, k=3)
    assert "Not run: no human scores given" in html
    assert "needs a negatively framed" in html
    assert 'id="distributions"' in html and len(_images(html)) >= 2


def test_report_defaults_to_the_installed_lexicons(tmp_path):
    """No --afinn / --frequencies: the afinn package's AFINN-111 and wordfreq's list, said in the section."""
    pytest.importorskip("afinn")
    pytest.importorskip("wordfreq")
    scans, _ = _inputs(tmp_path)
    html = build_report(scans, n_perm=50, k=3)
    assert "Lexicon: AFINN-111 from the <code>afinn</code> package" in html
    assert "Frequencies: the <code>wordfreq</code> package" in html
    # the exposure section controls for valence with the same default lexicon, as `rmfast analyze exposure` does
    assert "Valence: AFINN-111 from the <code>afinn</code> package" in html
    assert "valence not controlled for" not in html
    assert "no AFINN lexicon given" not in html and "no word-frequency list given" not in html


def test_a_failing_section_does_not_end_the_report(tmp_path, monkeypatch, capsys):
    """An unexpected error in one analysis is that section's reason (and one stderr line); the rest run."""
    import rmfast.analysis.report as R

    def boom(sec, x):
        raise ZeroDivisionError("planted")

    specs = R._section_specs
    monkeypatch.setattr(R, "_section_specs", lambda x: [(k, t, i, boom if k == "agreement" else fn)
                                                       for k, t, i, fn in specs(x)])
    scans, _ = _inputs(tmp_path)
    html = build_report(scans, n_perm=50, k=3, afinn=tmp_path / "afinn.txt")
    assert "failed: ZeroDivisionError: planted" in html
    assert 'id="distributions"' in html and 'id="sentiment"' in html and "valence" in html
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report section" in err[0] and "planted" in err[0]


def test_report_cli_and_atomic_write(tmp_path, monkeypatch):
    scans, _ = _inputs(tmp_path)
    d = tmp_path / "scans"
    d.mkdir()
    import json

    for (m, p), g in scans.groupby(["model", "prompt"]):
        f = d / f"{m.replace('/', '_')}_{'best' if p == BEST else 'worst'}.parquet"
        g.drop(columns=["model", "prompt"]).to_parquet(f)
        Path(str(f) + ".json").write_text(json.dumps({"model": {"name": m}, "prompt": p}))
    out = tmp_path / "report.html"
    out.write_text("old")
    assert main(["report", str(d), "--metadata", str(tmp_path / "meta.csv"), "--out", str(out),
                 "--n-perm", "50", "--k", "3", "--overwrite"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(UserError, match="does not exist"):
        write_report(tmp_path / "no" / "r.html", "x")


def test_table_and_token_rendering():
    assert visible("  a b ") == "␣␣a b␣" and visible("\n") == "\\n" and visible("") == "∅"
    html = table_html(pd.DataFrame({"text": ["<b>", " x"], "score": [1.23456, np.nan]}))
    assert "&lt;b&gt;" in html and "␣x" in html and "1.235" in html


def _write_scan_files(scans: pd.DataFrame, folder: Path) -> list[Path]:
    import json

    folder.mkdir(exist_ok=True)
    files = []
    for (m, p), g in scans.groupby(["model", "prompt"]):
        f = folder / f"{m.replace('/', '_')}_{'best' if p == BEST else 'worst'}.parquet"
        g.drop(columns=["model", "prompt"]).to_parquet(f)
        Path(str(f) + ".json").write_text(json.dumps({"model": {"name": m}, "prompt": p}))
        files.append(f)
    return files


def test_report_with_two_models_and_with_one(tmp_path, capsys):
    # Below 3 models there is no MDS map (and below 4 no RSA): the report says so in one line
    # per part instead of ending in a KeyError; one model: the agreement section says why not.
    scans, human = _inputs(tmp_path)
    two = scans[scans["model"].isin(["org/Alpha-Gemma-2B", "lab/Gamma-Llama-8B"])]
    html = build_report(two, human=human, metadata=tmp_path / "meta.csv",
                        afinn=tmp_path / "afinn.txt", frequencies=tmp_path / "freq.csv",
                        dictionaries=[tmp_path / "big2.csv"], n_perm=50, k=3)
    skips = re.findall(r'<p class="skip">([^<]*)', html)
    assert skips.count("No MDS map for this prompt: MDS needs at least 3 models, this prompt "
                       "has 2") == 2
    assert [s for s in skips if s.startswith("Not run:")] == [
        "Not run: RSA: 2 models with metadata; needs at least 4"]
    assert len(_images(html)) >= 10  # every section still drew its figures
    one = scans[scans["model"] == "org/Alpha-Gemma-2B"]
    html = build_report(one, human=human, n_perm=50, k=3)
    assert "Not run: no prompt has two models sharing at least 3 scored strings" in html
    # the user's command line: two scan files, no other input
    files = _write_scan_files(two[two["prompt"] == BEST], tmp_path / "scans")
    assert len(files) == 2
    assert main(["report", *map(str, files), "--out", str(tmp_path / "r.html"),
                 "--n-perm", "50"]) == 0
    out = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No MDS map for this prompt: MDS needs at least 3 models, this prompt has 2" in out
    assert "Not run: no model metadata given (--metadata FILE)" in out
    # a section skipped for a UserError: the CLI's report names the flags, a Python caller's the keyword arguments
    assert "Not run: no human scores given (--eloeverything DIR or --human CSV)" in out
    html = build_report(two[two["prompt"] == BEST], n_perm=50, k=3)
    assert "Not run: no human scores given (eloeverything DIR or human CSV)" in html


def _ten_models(scans: pd.DataFrame) -> pd.DataFrame:
    """The four models' scans repeated under ten long, real-looking model names."""
    names = ["nicolinho/QRM-Gemma-2-27B", "Skywork/Skywork-Reward-Gemma-2-27B-v0.2",
             "Skywork/Skywork-Reward-Gemma-2-27B", "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2",
             "nicolinho/QRM-Llama3.1-8B", "LxzGordon/URM-LLaMa-3.1-8B",
             "Ray2333/GRM-Llama3-8B-rewardmodel-ft", "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft",
             "RLHFlow/ArmoRM-Llama3-8B-v0.1", "Ray2333/GRM-gemma2-2B-rewardmodel-ft"]
    rng = np.random.default_rng(3)
    base = scans[scans["model"] == scans["model"].iloc[0]]
    return pd.concat([base.assign(model=m, score=base["score"] + rng.normal(0, 0.3 + 0.2 * (i % 3),
                                                                          len(base)))
                      for i, m in enumerate(names)], ignore_index=True)


def test_figures_fit_a_1280px_window(tmp_path):
    # Ten models with long names: the agreement panel was 1,584 px wide and the rank
    # trajectories 1,523 px, wider than the 1,280 px column (a horizontal scrollbar at 1,400 px).
    import io

    from PIL import Image

    scans, human = _inputs(tmp_path)
    html = build_report(_ten_models(scans), human=human, n_perm=20, k=3)
    assert "img{max-width:100%;height:auto}" in html  # and images scale down below that
    sizes = [Image.open(io.BytesIO(png)).size for png in _images(html)]
    assert len(sizes) >= 8
    assert max(w for w, _ in sizes) <= 1220, sizes


def test_mds_labels_do_not_overlap_each_other_or_the_points():
    from matplotlib.text import Text

    from rmfast.analysis.render.plots import Styles, mds_map

    models = ["org/Alpha-Gemma-2B", "org/Beta-Gemma-27B", "lab/Gamma-Llama-8B",
              "lab/Delta-Llama-3B", "x/Epsilon-Qwen-7B", "x/Zeta-Qwen-72B", "y/Eta-Mistral-7B",
              "y/Theta-Other-1B"]
    xy = np.array([[0, 0], [0.001, 0.001], [0.002, -0.001], [0.5, 0.2], [0.51, 0.21],
                   [-0.4, 0.3], [-0.41, 0.29], [0.0, 0.002]])  # three tight clusters
    mds = pd.DataFrame({"prompt": "p", "model": models, "x": xy[:, 0], "y": xy[:, 1],
                        "stress1": 0.1})
    fig = mds_map(mds, Styles.build(models), "MDS")
    fig.savefig(__import__("io").BytesIO(), format="png")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text, not its leader
    assert len(boxes) == len(models)
    frame = ax.get_window_extent(renderer)
    marker = np.sqrt(90) / 2 * fig.dpi / 72  # the markers' radius in pixels
    points = ax.transData.transform(xy)
    for i, b in enumerate(boxes):
        assert frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
        assert not any(b.overlaps(o) for o in boxes[i + 1:]), ax.texts[i].get_text()
        for px, py in points:
            assert not (b.x0 - marker < px < b.x1 + marker and b.y0 - marker < py < b.y1 + marker)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(b.overlaps(legend) for b in boxes)


def test_report_announces_each_section_on_stderr(tmp_path, capsys):
    # `rmfast report` was silent for ~20 s; now each section says it is running (one line per
    # section when stderr is not a terminal, a tqdm bar when it is); --no-progress: silent.
    scans, _ = _inputs(tmp_path)
    one = scans[scans["prompt"] == BEST]
    build_report(one, n_perm=20, k=3)
    assert capsys.readouterr().err == ""
    build_report(one, n_perm=20, k=3, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "rmfast: report 1/7: Score distributions"
    assert lines[-1] == "rmfast: report 7/7: Top and bottom 3 per model × prompt"
    assert len(lines) == 7
    files = _write_scan_files(one, tmp_path / "scans")
    out = str(tmp_path / "r.html")
    assert main(["report", *map(str, files), "--out", out, "--n-perm", "20"]) == 0
    err = capsys.readouterr().err
    assert "rmfast: report 2/7: Agreement between models" in err and "rmfast: wrote" in err
    assert main(["report", *map(str, files), "--out", out, "--n-perm", "20", "--no-progress", "--overwrite"]) == 0
    assert "rmfast: report" not in capsys.readouterr().err


def test_rows_left_out_for_a_missing_score_are_in_the_page(tmp_path):
    """Scan rows whose score is NaN are left out before any analysis: the page says so, with the count per model ×
    prompt (it said so on stderr only, and the agreement section then blamed the join for the missing strings)."""
    import json

    rng = np.random.default_rng(0)
    d = tmp_path / "scans"
    d.mkdir()
    words = [f"w{i}" for i in range(60)]
    for m in ("org/a", "org/b", "org/c"):
        s = rng.normal(size=len(words))
        if m == "org/b":
            s[:7] = np.nan
        f = d / f"{m.replace('/', '_')}.parquet"
        pd.DataFrame({"token_id": np.arange(len(words)), "text": words, "score": s}).to_parquet(f)
        Path(str(f) + ".json").write_text(json.dumps({"model": {"name": m}, "prompt": BEST}))
    out = tmp_path / "r.html"
    assert main(["report", str(d), "--out", str(out), "--n-perm", "20", "--no-progress"]) == 0
    page = out.read_text(encoding="utf-8")
    head = page[:page.index("<nav>")]
    assert "Left out before any analysis" in head and "Rows left out: 7" in head and "not finite" in head
    assert "3 models" in head and "1 prompt;" in head


def test_characters_missing_from_the_font_are_one_line_naming_them():
    """matplotlib warns once per character its font lacks (a vocabulary's CJK tokens: a screenful); to_png
    turns them into one line naming the characters, and lets every other warning through."""
    import warnings

    from rmfast.analysis.render.plots import new_figure, to_png

    fig = new_figure(3, 2)
    ax = fig.add_subplot()
    ax.set_title("\u5024 \u732b \u5024 ok")  # two CJK characters the default font lacks, one twice
    draw = fig.savefig

    def savefig(*a, **k):  # another warning raised while drawing
        warnings.warn("an unrelated warning", RuntimeWarning)
        return draw(*a, **k)

    fig.savefig = savefig
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png = to_png(fig)
    assert png.startswith(b"\x89PNG")
    texts = [str(w.message) for w in caught]
    assert not any(t.startswith("Glyph") for t in texts), texts
    ours = [t for t in texts if "not in its font" in t]
    assert len(ours) == 1 and "2 character(s)" in ours[0] and "\u5024" in ours[0] and "\u732b" in ours[0], texts
    assert "an unrelated warning" in texts
