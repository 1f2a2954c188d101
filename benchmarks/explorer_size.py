"""Page weight, load time and search time of the explorer (``rmfast explore``) at full size.

Synthetic scans (the figures depend on the sizes, not on the scores): 262,144 tokens (Gemma's vocabulary)
× 6 columns, BPE-like texts (1-10 letters, half with a leading space, some capitalised, digits,
punctuation). Two layouts: ``id`` (one tokenizer: 2 models × 3 prompts, joined on the token id) and
``text`` (two tokenizers, 3 prompts each, 90% of the strings shared: the decoded-text join, ids per model).
For each: the Python build time, the page's bytes, then in Chromium (Playwright, the system's chromium)
the load time (``performance.now()`` when the page is ready: from navigation start, decoding and indexing
included; best and median of ``--loads``), and the time of one update (filter + sort + render, measured
in the page with ``performance.now()``; median, min and max of ``--repeats``) for several searches, a
sort and a switch of the shift view. The machine's load average is in the row: on a shared machine
the timings are upper bounds.

    PYTHONPATH=src python benchmarks/explorer_size.py [--rows 262144] [--out benchmarks/out]

Writes ``explorer_size_<layout>.json`` (one row each: machine, versions, figures) into ``--out`` and prints
them. Needs playwright (``pip install 'rmfast[browser]'``) and chromium (``RMFAST_CHROMIUM`` or on PATH).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

QUERIES = ["e", "love", "freedom", "1234", "/^ ?[A-Z][a-z]+$/", "/ing$/", "zzzqx"]


def synthetic_vocab(n: int, seed: int) -> list[str]:
    """n distinct BPE-like decoded strings."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    p = np.linspace(2.0, 0.2, len(letters)); p /= p.sum()
    out, seen = [], set()
    while len(out) < n:
        k = int(rng.integers(1, 11))
        s = "".join(rng.choice(letters, size=k, p=p))
        r = rng.random()
        s = s.capitalize() if r < 0.2 else (str(rng.integers(0, 10000)) if r < 0.25 else
                                            (s + rng.choice(list(".,;!?-")) if r < 0.3 else s))
        s = (" " + s) if rng.random() < 0.5 else s
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def scans(n: int, layout: str) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    prompts = ["What, in one word, is the greatest thing ever?", "What, in one word, is the worst thing ever?",
               "I am a doctor. What, in one word, is the greatest thing ever?"]
    va = synthetic_vocab(n, 1)
    if layout == "id":
        models = [("org/rm-one", va, np.arange(n)), ("org/rm-two", va, np.arange(n))]
    else:
        vb = va[: int(0.9 * n)] + synthetic_vocab(n, 2)[: n - int(0.9 * n)]
        vb = list(dict.fromkeys(vb))
        models = [("org/rm-one", va, np.arange(n)), ("other/rm-two", vb, rng.permutation(len(vb)))]
    frames = []
    for m, texts, ids in models:
        base = rng.normal(size=len(texts))
        for p in prompts:
            score = (base + 0.5 * rng.normal(size=len(texts))).astype(np.float32)
            df = pd.DataFrame({"model": m, "prompt": p, "token_id": ids, "text": texts, "score": score})
            df["rank"] = df["score"].rank(ascending=False, method="min").astype("int64")
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def browser_figures(path: Path, loads: int, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    exe = os.environ.get("RMFAST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        load_ms, page = [], None
        for _ in range(loads):
            if page is not None:
                page.close()
            page = b.new_page(viewport={"width": 1920, "height": 1000})
            page.goto(path.as_uri(), timeout=120_000)
            page.wait_for_function("window.rmx && (rmx.ready || rmx.error)", timeout=120_000, polling=20)
            assert page.evaluate("rmx.error || null") is None
            load_ms.append(page.evaluate("rmx.loadMs"))
        search = {}
        for q in QUERIES:
            times = []
            for _ in range(repeats):  # from an empty box, as a user starts typing
                page.evaluate("rmx.search('')")
                times.append(page.evaluate("(q) => rmx.search(q)", q))
            search[q] = {"ms_median": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
                         "rows": page.evaluate("rmx.state.nView")}
        page.evaluate("rmx.search('')")
        sort_first = page.evaluate("() => { const t = performance.now(); rmx.sortBy('c3'); return performance.now() - t; }")
        sort_again = page.evaluate("() => { const t = performance.now(); rmx.sortBy('c3'); return performance.now() - t; }")
        sort_text = page.evaluate("() => { const t = performance.now(); rmx.sortBy('text'); return performance.now() - t; }")
        shift = page.evaluate("""() => { const s = document.getElementById('s-b'); s.value = '4';
            const t = performance.now(); s.dispatchEvent(new Event('input')); return performance.now() - t; }""")
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : null")
        version = b.version
        b.close()
    return {"browser": f"chromium {version}", "load_ms_best": min(load_ms), "load_ms_median": statistics.median(load_ms),
            "load_ms_all": load_ms, "search": search,
            "search_ms_median_worst_query": max(v["ms_median"] for v in search.values()),
            "search_ms_max": max(v["ms_max"] for v in search.values()),
            "sort_column_first_ms": sort_first, "sort_column_again_ms": sort_again, "sort_text_first_ms": sort_text,
            "shift_switch_ms": shift, "js_heap_mb": None if heap is None else heap / 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=262_144, help="tokens per scan (default 262144)")
    ap.add_argument("--layouts", default="id,text", help="comma list of id,text (default both)")
    ap.add_argument("--loads", type=int, default=3, help="page loads timed (default 3)")
    ap.add_argument("--repeats", type=int, default=7, help="timings of each search (default 7)")
    ap.add_argument("--out", default="benchmarks/out", help="folder for the JSON rows (default benchmarks/out)")
    args = ap.parse_args(argv)
    import torch

    from rmfast.bench.machine import loadavg, machine_info
    from rmfast.explore import build_explorer, render_html
    from rmfast.version import __version__

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for layout in args.layouts.split(","):
        df = scans(args.rows, layout)
        machine = machine_info(torch.device("cpu"))
        t0 = time.perf_counter()
        data = build_explorer(df, title=f"explorer benchmark ({layout} join)")
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        page = render_html(data)
        render_s = time.perf_counter() - t0
        raw = len(render_html(data, compress=False).encode("utf-8"))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "explorer.html"
            path.write_text(page, encoding="utf-8")
            size = path.stat().st_size
            figures = browser_figures(path, args.loads, args.repeats)
        row = {"benchmark": "explorer_size", "layout": layout, "join": data.join, "rows": data.n_rows,
               "columns": len(data.columns), "id_groups": len(data.id_groups), "page_bytes": size,
               "page_mb": round(size / 1e6, 2), "page_bytes_uncompressed_block": raw,
               "build_s": round(build_s, 2), "render_s": round(render_s, 2), **figures,
               "rmfast": __version__, "pandas": pd.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
               "machine": machine, "loadavg_end": loadavg(),
               "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        (out / f"explorer_size_{layout}.json").write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
        print(json.dumps({k: row[k] for k in ("layout", "rows", "columns", "page_mb", "build_s", "load_ms_best",
                                              "load_ms_median", "search_ms_median_worst_query", "search_ms_max", "sort_column_first_ms",
                                              "sort_text_first_ms", "shift_switch_ms", "js_heap_mb")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
