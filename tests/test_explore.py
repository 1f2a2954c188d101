"""The explorer (rmfast explore): the packing round-trips, the join, the CLI, the report's link, and the page in
a real browser (Playwright driving Chromium; skipped with one line where there is none)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.explore import (build_explorer, category_masks, is_special, load_inputs, render_html,
                            shift_ranks, unpack)
from rmfast.io import write_result

WORDS = ["love", "war", "peace", "freedom", "justice", "kindness", "courage", "truth", "hope", "power",
         "money", "family", "honor", "duty", "fear", "care", "fairness", "loyalty", "purity", "harm"]
DICT = pd.DataFrame({"term": ["love", "kind", "courage", "power", "care"], "category": ["C", "C", "A", "A", "C"],
                     "wildcard": [False, True, False, False, False]})


def _vocab(n: int, seed: int) -> list[str]:
    """n distinct decoded strings: words with and without a leading space, pieces, specials, a repeated one."""
    rng = np.random.default_rng(seed)
    out = ["<|im_end|>", "<pad>", "\ufffd", "\ufffd", " 42", "\n"]  # "\ufffd" twice: dropped by the text rule
    out += [(" " if k % 2 else "") + w for k, w in enumerate(WORDS)] + [" Kindly", " CARE"]
    while len(out) < n:
        out.append("".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 7))) + str(len(out)))
    return out[:n]


def _scan(model: str, prompt: str, texts: list[str], ids, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    score = rng.normal(size=len(texts)).astype(np.float32)
    score[: len(texts) // 10] = np.round(score[: len(texts) // 10], 1)  # some ties
    df = pd.DataFrame({"model": model, "prompt": prompt, "token_id": pd.array(ids, dtype="Int64"),
                       "token": [t.replace(" ", "Ġ") for t in texts], "text": texts, "score": score})
    df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
    return df


def _two_tokenizers(n: int = 300) -> pd.DataFrame:
    """Model a (3 prompts) and model b (2 prompts, another tokenizer: other ids, a vocabulary 40 tokens smaller,
    plus 10 strings of its own)."""
    va = _vocab(n, 0)
    vb = va[: n - 40] + [f"bonly{k}" for k in range(10)]
    frames = [_scan("org/rm-a", p, va, range(n), s) for s, p in enumerate(["Best?", "Worst?", "Doctor best?"])]
    frames += [_scan("org/rm-b", p, vb, range(1000, 1000 + len(vb)), 10 + s) for s, p in enumerate(["Best?", "Worst?"])]
    return pd.concat(frames, ignore_index=True)


def _cell(data, col: int, text: str):
    k = data.texts.index(text)
    return data.scores[col, k], data.ranks[col, k]


# ---------------------------------------------------------------- packing and the join
def test_round_trip_text_join():
    df = _two_tokenizers()
    data = build_explorer(df, dictionaries=[("toy", DICT)], title="t")
    back = unpack(render_html(data))
    assert back.join == data.join == "text"
    assert back.texts == data.texts
    for name in ("scores", "ranks", "ids", "flags", "cats"):
        np.testing.assert_array_equal(getattr(back, name), getattr(data, name))
    assert back.columns == data.columns and back.categories == data.categories and back.pairs == data.pairs
    # Every input row that survives the papers' de-duplication is in its column with its own score, ranked
    # among the rows the column shows (issue 37: the file's ranks counted the dropped rows); nothing else is there.
    cols = {(c["model"], c["prompt"]): k for k, c in enumerate(back.columns)}
    assert len(cols) == 5 and [c["label"] for c in back.columns] == list("ABCDE")
    kept = df[~df.duplicated(["model", "prompt", "text"], keep=False)]
    for (m, p), g in kept.groupby(["model", "prompt"]):
        k = cols[(m, p)]
        idx = [back.texts.index(t) for t in g["text"]]
        np.testing.assert_array_equal(back.scores[k, idx], g["score"].to_numpy(np.float32))
        np.testing.assert_array_equal(back.ranks[k, idx], g["score"].rank(ascending=False, method="min").to_numpy())
        assert int((~np.isnan(back.scores[k])).sum()) == len(g)
        group = back.id_groups.index(m)
        np.testing.assert_array_equal(back.ids[group, idx], g["token_id"].to_numpy("int64"))
    assert "\ufffd" not in back.texts and back.columns[0]["duplicated"] == 2
    # unmatched: a's 40 tokens b lacks, b's 10 of its own
    assert [c["unmatched"] for c in back.columns] == [40, 40, 40, 10, 10]
    assert len(back.texts) == 300 - 2 + 10


def test_token_scans_joined_on_text_because_of_text_sets_say_so():
    """A store of token scans and text sets joined everything on decoded text (auto), dropping the token scans' rows
    whose text repeats, without a word on why; the note names the text candidates and the way to join on id."""
    from rmfast.explore import join_columns

    tok = pd.DataFrame({"model": "a", "prompt": "p", "token_id": [1, 2, 3], "text": ["x", "x", "y"], "score": [1.0, 2, 3]})
    items = pd.DataFrame({"model": "a", "prompt": "q", "token_id": [None, None], "text": ["an item", "y"],
                          "score": [0.5, 0.7]})
    notes = []
    join, *_ = join_columns(pd.concat([tok, items], ignore_index=True), notes=notes)
    assert join == "text" and any("2 rows are text candidates" in n and "join them on the id" in n for n in notes), notes
    notes = []
    assert join_columns(tok, notes=notes)[0] == "id" and not any("text candidates" in n for n in notes)


def test_round_trip_id_join_and_flags():
    n = 200
    v = _vocab(n, 1)
    df = pd.concat([_scan("rm", "Best?", v, range(n), 1), _scan("rm", "Worst?", v[:150], range(150), 2)])
    data = build_explorer(df)
    back = unpack(render_html(data, compress=False))
    assert back.join == "id" and back.id_groups == ["all"]
    np.testing.assert_array_equal(back.ids[0], np.arange(n))
    assert back.texts == v  # the id join keeps repeated strings (each id is its own row)
    assert [c["unmatched"] for c in back.columns] == [50, 0]
    assert np.isnan(back.scores[1, 150:]).all() and (back.ranks[1, 150:] == 0).all()
    flags = dict(zip(back.texts, back.flags))
    assert flags["<|im_end|>"] == 2 and flags["<pad>"] == 2 and flags["love"] == 1 and flags[" war"] == 1
    assert flags[" 42"] == 0 and flags["\n"] == 0


def test_pair_statistics_are_the_analyses_own():
    from scipy.stats import kendalltau, spearmanr

    from rmfast.analysis import agreement, rbo

    df = _two_tokenizers()
    data = build_explorer(df)
    a, b = 0, 3  # org/rm-a Best? vs org/rm-b Best?
    p = next(x for x in data.pairs if (x["a"], x["b"]) == (a, b))
    both = ~np.isnan(data.scores[a]) & ~np.isnan(data.scores[b])
    rows = sorted(np.flatnonzero(both), key=lambda i: data.texts[i])  # RBO breaks ties by row order: text order
    x, y = data.scores[a][rows].astype(float), data.scores[b][rows].astype(float)
    assert p["n_shared"] == both.sum() == 300 - 2 - 40
    assert p["kendall_tau_b"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
    assert p["rbo"] == pytest.approx(rbo(x, y), abs=1e-12)
    assert p["spearman_rho"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    v = _vocab(500, 3)  # full columns: Spearman from the ranks computed once per column
    full = build_explorer(pd.concat([_scan("rm", q, v, range(500), s) for s, q in enumerate("abc")]))
    for q in full.pairs:
        sa, sb = full.scores[q["a"]].astype(float), full.scores[q["b"]].astype(float)
        assert q["spearman_rho"] == pytest.approx(spearmanr(sa, sb).statistic, abs=1e-12)
        assert q["kendall_tau_b"] == pytest.approx(kendalltau(sa, sb).statistic, abs=1e-12)
    # the agreement analysis on the same prompt's shared vocabulary gives the same tau
    ag = agreement(df[df["prompt"] == "Best?"], n_perm=0).pairs.iloc[0]
    assert ag["n_shared"] == p["n_shared"]
    assert ag["kendall_tau_b"] == pytest.approx(p["kendall_tau_b"], abs=1e-9)
    assert ag["rbo"] == pytest.approx(p["rbo"], abs=1e-9)


def test_categories_and_special_shapes():
    masks, names = category_masks([" Love", "kindness", " CARE", "war", "Courage"], [("toy", DICT)])
    assert names == ["toy: C", "toy: A"]
    assert masks.tolist() == [1, 1, 1, 0, 2]
    assert is_special("<|endoftext|>") and is_special("<start_of_turn>") and is_special("[CLS]")
    assert not is_special("<0xFF>") and not is_special("<p>") and not is_special("ĠLove")


def test_shift_ranks_rerank_on_the_shared_rows():
    s = np.array([[4, 3, 2, 1, np.nan], [1, np.nan, 2, 4, 3]], dtype=np.float32)
    d = shift_ranks(s, 0, 1)  # shared rows 0, 2, 3: ranks under a 1, 2, 3; under b 3, 2, 1
    assert np.isnan(d[[1, 4]]).all() and d[[0, 2, 3]].tolist() == [-2, 0, 2]


def test_bad_inputs_are_one_line_errors():
    df = _two_tokenizers(60)
    with pytest.raises(UserError, match="one tokenizer"):
        build_explorer(df, join="id")
    with pytest.raises(UserError, match="join rule"):
        build_explorer(df, join="bogus")
    many = pd.DataFrame({"term": [f"w{k}" for k in range(40)], "category": [f"c{k}" for k in range(40)],
                         "wildcard": False})
    with pytest.raises(UserError, match="more than 32"):
        build_explorer(df, dictionaries=[("big", many)])
    with pytest.raises(UserError, match="not an rmfast explorer"):
        unpack("<html></html>")


# ---------------------------------------------------------------- inputs, CLI, report link
def _write_scans(df: pd.DataFrame, folder: Path) -> list[Path]:
    paths = []
    for k, ((m, p), g) in enumerate(df.groupby(["model", "prompt"], sort=False)):
        path = folder / f"scan{k}.parquet"
        write_result(path, g.drop(columns=["model", "prompt"]).reset_index(drop=True),
                     {"model": {"name": m}, "prompt": p})
        paths.append(path)
    return paths


def test_cli_writes_the_page(tmp_path, capsys):
    df = _two_tokenizers(80)
    paths = _write_scans(df, tmp_path)
    out = tmp_path / "explorer.html"
    dic = tmp_path / "toy.csv"
    DICT.rename(columns={"term": "word"})[["category", "word"]].to_csv(dic, index=False)
    assert main(["explore", *map(str, paths), "--out", str(out), "--dictionary", str(dic)]) == 0
    err = capsys.readouterr().err
    assert "joined on decoded text" in err and "not in every column" in err
    back = unpack(out.read_text(encoding="utf-8"))
    assert len(back.columns) == 5 and back.categories == ["toy: C", "toy: A"]
    page = out.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page and "<link" not in page  # nothing external
    # an existing output is refused; a missing input is one line
    assert main(["explore", str(paths[0]), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["explore", str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    # the same dictionary twice: its categories once (the filter listed each twice); a page under .parquet: refused
    assert main(["explore", *map(str, paths), "--out", str(tmp_path / "d.html"), "--dictionary", str(dic),
                 "--dictionary", str(dic)]) == 0
    assert unpack((tmp_path / "d.html").read_text(encoding="utf-8")).categories == ["toy: C", "toy: A"]
    capsys.readouterr()
    assert main(["explore", str(paths[0]), "--out", str(tmp_path / "page.parquet")]) == 2
    err = capsys.readouterr().err
    assert "writes an HTML page; give a path ending in .html" in err and not (tmp_path / "page.parquet").exists()


def test_reads_a_sweep_store(tmp_path):
    from rmfast.sweep.store import PartRef, Store

    st = Store(tmp_path / "store")
    parts = [PartRef("rm", "rm", n, n, p, "vocab", "vocab", key=f"k{n}") for n, p in [("best", "Best?"), ("worst", "Worst?")]]
    st.create("cfg", {"models": ["rm"]}, parts)
    v = _vocab(50, 2)
    for s, part in enumerate(parts):
        g = _scan("rm", part.prompt, v, range(50), s).drop(columns=["model", "prompt"]).assign(n_tokens=1)
        st.write_part(part, g, {"model": {"name": "rm"}, "prompt": part.prompt})
    df, source = load_inputs([tmp_path / "store"])
    data = build_explorer(df, source=source)
    assert source.startswith("sweep store") and data.join == "id" and len(data.columns) == 2
    with pytest.raises(UserError, match="give it alone"):
        load_inputs([tmp_path / "store", tmp_path / "store"])


def test_report_links_the_explorer_beside_it(tmp_path):
    from rmfast.analysis.report import build_report, explorer_beside

    assert explorer_beside(tmp_path / "report.html") is None
    (tmp_path / "report.explorer.html").write_text("x")
    assert explorer_beside(tmp_path / "report.html") == "report.explorer.html"
    df = _two_tokenizers(60)
    page = build_report(df[df["model"] == "org/rm-a"], explorer="report.explorer.html", n_perm=0)
    assert '<a href="report.explorer.html">' in page
    assert '<a href="report.explorer.html">' not in build_report(df[df["model"] == "org/rm-a"], n_perm=0)


def test_page_prints_every_score_with_three_decimals(tmp_path):
    """The page's score format, "-6.000" beside "-6.026" (never "-6"): its script run under node with a stub
    document (no browser needed; it stops at the missing data block, as a page without data does)."""
    from importlib import resources

    node = shutil.which("node") or pytest.skip("node not installed (the browser test checks the page)")
    values = [-6.0, -6.026, 0.5, 12.3456, -0.02, 1234.5, 3e-05, float("nan")]
    script = tmp_path / "fmt.js"
    script.write_text("globalThis.window = {};\n"
                      "globalThis.document = {getElementById: () => ({textContent: '', dataset: {}})};\n"
                      + resources.files("rmfast").joinpath("explorer", "explorer.js").read_text(encoding="utf-8")
                      + f"\nconsole.log(JSON.stringify({json.dumps(values)}.map(window.rmx.fmtScore)));\n")
    out = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["-6.000", "-6.026", "0.500", "12.346", "-0.020", "1234.500", "0.000", ""]


def test_page_shows_invisible_characters_as_the_report_does(tmp_path):
    """A token of an NBSP, a zero-width space, an ideographic space or a line separator is escaped on the page as
    the report's visible() escapes it (it was a blank cell); spaces inside and around a token as before."""
    from importlib import resources

    from rmfast.analysis.render.report_html import visible

    node = shutil.which("node") or pytest.skip("node not installed (the browser test checks the page)")
    toks = ["\u00a0", "\u200b", "\u3000", "\u2028", " a b ", "x\ty\n", "\x07", "é ✓", "∅", ""]
    script = tmp_path / "vis.js"
    script.write_text("globalThis.window = {};\n"
                      "globalThis.document = {getElementById: () => ({textContent: '', dataset: {}})};\n"
                      + resources.files("rmfast").joinpath("explorer", "explorer.js").read_text(encoding="utf-8")
                      + f"\nconsole.log(JSON.stringify({json.dumps(toks)}.map(window.rmx.visible)));\n", encoding="utf-8")
    out = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=60, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [visible(t) for t in toks]


# ---------------------------------------------------------------- the page in a real browser
def _browser():
    """A Chromium that Playwright can drive, or a skip (one line) saying what is missing."""
    sync = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install 'rmfast[browser]')")
    exe = os.environ.get("RMFAST_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    pw = sync.sync_playwright().start()
    try:
        return pw, pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
    except Exception as exc:
        pw.stop()
        pytest.skip(f"no browser for Playwright ({str(exc).splitlines()[0][:120]}); install chromium")


@pytest.fixture(scope="module")
def browser():
    pw, b = _browser()
    yield b
    b.close()
    pw.stop()


def _open(browser, path: Path, width: int = 1280):
    page = browser.new_page(viewport={"width": width, "height": 800})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_function("window.rmx && (window.rmx.ready || window.rmx.error)", timeout=60_000)
    assert page.evaluate("rmx.error || null") is None and errors == []
    return page, errors


def test_page_in_the_browser(browser, tmp_path):
    df = _two_tokenizers(2000)
    data = build_explorer(df, dictionaries=[("toy", DICT)], title="explorer test")
    path = tmp_path / "explorer.html"
    path.write_text(render_html(data), encoding="utf-8")
    page, errors = _open(browser, path)
    n = data.n_rows
    assert page.evaluate("rmx.state.nView") == n
    assert page.locator("#summary").inner_text().startswith(f"{n:,} tokens × 5 columns")
    assert page.locator("#rows .row").count() < 100  # virtual scrolling: only the visible rows are in the DOM
    # default sort: column A, best first
    shown = page.evaluate("rmx.shownTexts()")
    best_a = [data.texts[i] for i in np.argsort(data.ranks[0] + (data.ranks[0] == 0) * 10**9, kind="stable")]
    assert shown[:10] == best_a[:10]

    # search: a substring, case-insensitive, over text and id
    page.locator("#q").press_sequentially("LOVE")
    want = [t for t in data.texts if "love" in t.lower()]
    assert sorted(page.evaluate("rmx.rows()")) == sorted(data.texts.index(t) for t in want)
    assert page.locator("#status").inner_text().startswith(f"{len(want)} of {n:,} rows")
    assert np.isfinite(page.evaluate("rmx.state.lastSearchMs"))
    page.locator("#q").fill("/^ ?(war|peace)$/")
    assert sorted(page.evaluate("rmx.shownTexts()")) == sorted(t for t in data.texts if t.strip() in ("war", "peace"))
    page.locator("#q").fill("1003")  # an id of model b
    assert data.texts[page.evaluate("rmx.rows()")[0]] in set(df.loc[df["token_id"] == 1003, "text"])
    page.locator("#q").fill("/[/")
    assert "regex" in page.locator("#status").inner_text()
    page.locator("#q").fill("")

    # sort by column D (model b, Best?): best first, then worst first
    page.locator("#thead .hcell[data-key=c3]").click()
    d_order = np.argsort(np.where(data.ranks[3] == 0, 10**9, data.ranks[3]), kind="stable")
    assert page.evaluate("rmx.shownTexts()")[:5] == [data.texts[i] for i in d_order[:5]]
    page.locator("#thead .hcell[data-key=c3]").click()
    present = d_order[: int((data.ranks[3] > 0).sum())]
    assert page.evaluate("rmx.shownTexts()")[0] == data.texts[present[-1]]

    # filters: word-like, special, category, rank range (counts as Python computes them)
    page.locator("#f-word").check()
    assert page.evaluate("rmx.state.nView") == int((data.flags & 1).sum())
    page.locator("#f-word").uncheck()
    page.locator("#f-special").select_option("only")
    assert page.evaluate("rmx.state.nView") == int((data.flags & 2 > 0).sum()) == 2
    page.locator("#f-special").select_option("all")
    page.locator("#f-cat").select_option(label="toy: C")
    assert page.evaluate("rmx.state.nView") == int((data.cats & 1).sum())
    page.locator("#f-cat").select_option("")
    page.locator("#f-rcol").select_option("1")
    page.locator("#f-rmin").fill("10")
    page.locator("#f-rmax").fill("30")
    assert page.evaluate("rmx.state.nView") == int(((data.ranks[1] >= 10) & (data.ranks[1] <= 30)).sum())
    page.locator("#f-rmin").fill("")
    page.locator("#f-rmax").fill("")

    # the shift view: A -> D; tau/RBO as Python computed them; the page's rank change equals shift_ranks
    page.locator("#s-on").check()
    page.locator("#s-b").select_option("3")
    p = next(x for x in data.pairs if (x["a"], x["b"]) == (0, 3))
    stats = page.locator("#s-table").inner_text()
    assert f"{p['kendall_tau_b']:.4f}" in stats and f"{p['rbo']:.4f}" in stats and f"{p['n_shared']:,}" in stats
    js = np.array([np.nan if v is None else v for v in page.evaluate("rmx.shiftDelta()")], dtype=float)
    np.testing.assert_array_equal(js, shift_ranks(data.scores, 0, 3))
    top_riser = data.texts[int(np.nanargmax(js))]
    assert page.locator("#s-up li").first.inner_text().startswith(page.evaluate("(t) => rmx.visible(t)", top_riser))
    page.locator("#thead .hcell[data-key=shift]").click()
    assert page.evaluate("rmx.state.view[0]") == int(np.nanargmax(js))

    # selecting a token marks it in every column's histogram
    page.locator("#rows .row").nth(2).click()
    sel = page.evaluate("rmx.state.selected")
    assert page.locator("#sel-body .big").inner_text() == page.evaluate("(t) => rmx.visible(t)", data.texts[sel])
    assert page.locator("#hists canvas").count() == 5
    caps = page.locator("#hists .cap span").all_inner_texts()
    assert sum(c == "absent" for c in caps) == int(np.isnan(data.scores[:, sel]).sum())
    # scores with 3 decimals, in the captions as in the table
    assert all(re.match(r"-?\d+\.\d{3} · #", c) for c in caps if c != "absent"), caps
    assert page.evaluate("[-6, -6.026].map(rmx.fmtScore)") == ["-6.000", "-6.026"]
    page.screenshot(path=str(tmp_path / "explorer.png"))
    assert (tmp_path / "explorer.png").stat().st_size > 10_000 and errors == []


def test_a_zero_row_scan_is_named_not_left_out_silently(tmp_path, capsys):
    """A scan with no rows has no column to show: explore says so in a note (it was left out without a word)."""
    df = _two_tokenizers(80)
    paths = _write_scans(df, tmp_path)
    empty = tmp_path / "empty.parquet"
    write_result(empty, df.drop(columns=["model", "prompt"]).iloc[:0], {"model": {"name": "org/rm-c"}, "prompt": "Best?"})
    out = tmp_path / "explorer.html"
    assert main(["explore", *map(str, paths), str(empty), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "empty.parquet: a scan with no rows (org/rm-c, 'Best?') left out" in err, err
    assert any("a scan with no rows" in n for n in unpack(out.read_text(encoding="utf-8")).notes)  # on the page too


def test_search_is_as_typed_and_ranks_count_the_rows_ranked(browser, tmp_path):
    """The search box is not trimmed: " love" finds the word-start token only, a whitespace token can be found, and
    "␣love" (what the grid shows) is " love". A histogram's "#rank / N" counts the rows ranked: a column's
    duplicated strings are left out of both."""
    df = pd.DataFrame({"model": "m", "prompt": "What is best?", "text": [" love", "love", "lovely", "   ", "x", "x"],
                       "score": [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]})
    data = build_explorer(df, pairs=False)
    path = tmp_path / "search.html"
    path.write_text(render_html(data), encoding="utf-8")
    page, _ = _open(browser, path)
    found = lambda q: sorted(data.texts[i] for i in page.evaluate("(q) => (rmx.search(q), rmx.rows())", q))  # noqa: E731
    assert found(" love") == found("␣love") == [" love"] and found("   ") == ["   "]
    assert len(found("")) == 4  # the two "x" rows: a repeated string, dropped (the papers' rule)
    page.evaluate("rmx.sortBy('c0')")  # column A is sorted best first already: one more is worst first
    page.locator("#rows .row").nth(0).click()
    assert page.locator("#hists .cap span").all_inner_texts()[0] == "0.000 · #4 / 4"  # was "#4 / 6"

