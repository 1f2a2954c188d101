"""The explorer: every scored token of several scans in one self-contained HTML page.

``rmfast explore results/*.parquet --out explorer.html`` (or a sweep store folder) joins the
scans into one table, one row per token and one column per (model, prompt), packs it into a
compact binary block and writes a single HTML file that works offline from disk (no server, no
external URL): search by substring or /regex/ over token text and id, sort by any column,
filters (word-like, special tokens, dictionary categories, rank ranges), a "shift" view between
two columns and a histogram of each column with the selected token marked. The page itself is
package data (``rmfast/explorer/explorer.{html,css,js}``, plain JS, no library).

The join: when every row has a token id and each id decodes to one text in every scan (one
tokenizer), rows are joined on the id. Otherwise (different tokenizers, text candidates) they
are joined on the decoded text by the papers' rule (:func:`rmfast.analysis.data.shared_vocab.dedupe_text`:
a string occurring more than once in a scan is dropped there, all copies), as the agreement
analyses do, but as an outer join: a token missing from a column shows there as empty, and each
column counts its *unmatched* rows (present in it, absent from some other column).

The embedded block (base64 of gzip of)::

    b"RMX1" | u32 header length | header JSON (utf-8) | zero padding to 8 bytes | arrays

The header holds the metadata, the token texts and, per array, its dtype, offset (from the start
of the arrays) and length. Arrays (little-endian): ``scores`` float32 [C·N] (column-major, NaN =
absent), ``ranks`` int32 [C·N] (the scan's rank, 1 = best; 0 = absent), ``ids`` int32 [G·N] (one
row of token ids per id group, -1 = none), ``flags`` uint8 [N] (bit 0 word-like, bit 1 special)
and ``cats`` uint32 [N] (bit k: in dictionary category k), each stored as byte planes (the first
byte of every element, then the second...), which gzip compresses better. :func:`unpack` reads it back.

Pair statistics (Kendall tau-b, Spearman rho, RBO p = 0.9) are computed here, on the rows both
columns have, with the analyses' own functions; the page computes only the rank shift.

Example:
    >>> import pandas as pd
    >>> d = pd.DataFrame({"model": "m", "prompt": ["best", "best", "worst", "worst"],
    ...                   "token_id": [1, 2, 1, 2], "text": [" love", " war", " love", " war"],
    ...                   "score": [2.0, -1.0, -3.0, 0.5]})
    >>> data = build_explorer(d, pairs=False)  # pairs=True (the default) adds Kendall tau / RBO (scipy)
    >>> data.join, data.texts, data.ranks.tolist()
    ('id', [' love', ' war'], [[1, 2], [2, 1]])
    >>> unpack(render_html(data)).ranks.tolist()
    [[1, 2], [2, 1]]
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
import struct
from dataclasses import dataclass, field
from importlib import resources
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import UserError
from .io import atomic_write
from .version import __version__
from .scoring.candidates import is_wordlike

MAGIC = b"RMX1"
JOIN_RULES = ("auto", "id", "text")
MAX_CATEGORIES = 32  # one uint32 bit mask per row
WORDLIKE, SPECIAL = 1, 2  # bits of ``flags``
RBO_P = 0.9
# Special tokens: the scan files do not record the tokenizer's list, so they are recognised by shape
# (the raw piece): <|...|> markers, <name> markers of the common tokenizers (<pad>, <eos>, <unused12>,
# <start_of_turn>, <repo_name>...), [CLS]-style markers. Byte pieces (<0x0A>) and HTML tags are not.
_SPECIAL = re.compile(
    r"^(<\|[^|<>]*\|>|\[(?:CLS|SEP|PAD|MASK|UNK|BOS|EOS|multimodal)\]"
    r"|</?(?:s|pad|unk|eos|bos|mask|cls|sep|eot|eom|unused\d+|extra_id_\d+|reserved\w*"
    r"|[a-z]+_[a-z_0-9]+|reponame|filename|jupyter_\w+|empty_output)>)$", re.IGNORECASE)


def is_special(piece: str) -> bool:
    """A raw vocabulary piece shaped like a special/control token (see ``_SPECIAL``).

    >>> [is_special(p) for p in ["<|im_end|>", "<pad>", "<unused12>", "<start_of_turn>", "<0x0A>", "<div>", "Ġlove"]]
    [True, True, True, True, False, False, False]
    """
    return bool(_SPECIAL.match(str(piece)))


@dataclass
class ExplorerData:
    """What the page shows (N rows, C columns, G id groups).

    columns: per column: key, model, prompt, label, rows (scored), duplicated (dropped by the text
        rule), unmatched (rows absent from some other column), id_group.
    texts: N decoded strings. ids: (G, N) int32, -1 = none; id_groups: G names (models, or "all").
    scores: (C, N) float32, NaN = absent. ranks: (C, N) int32 (the scan's rank), 0 = absent.
    flags: (N,) uint8 (bit 0 word-like, bit 1 special). cats: (N,) uint32; categories: names.
    pairs: per pair a < b of columns: a, b, n_shared, kendall_tau_b, spearman_rho, rbo.
    lens: per column with lens values (a scan run with --lens): column, model, prompt and
        :func:`rmfast.analysis.representations.views.lens_payload`.
    similarity: per layer × layer map of hidden states (:func:`~rmfast.analysis.representations.views.similarity_payload`).
    """

    join: str
    columns: list[dict]
    texts: list[str]
    ids: np.ndarray
    id_groups: list[str]
    scores: np.ndarray
    ranks: np.ndarray
    flags: np.ndarray
    cats: np.ndarray
    categories: list[str] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lens: list[dict] = field(default_factory=list)
    similarity: list[dict] = field(default_factory=list)
    title: str = "rmfast explorer"
    source: str = ""

    @property
    def n_rows(self) -> int:
        return len(self.texts)


# ---------------------------------------------------------------- inputs
def load_inputs(paths, ledger=None) -> tuple[pd.DataFrame, str]:
    """The tidy scan frame of scan Parquet files / folders of them, or of one sweep store folder
    (:func:`rmfast.sweep.store.read_scans`), and where its scores come from. Rows left out (a NaN score: a scan
    whose model overflowed) are recorded in ``ledger`` (:class:`rmfast.analysis.data.ledger.Ledger`), for the
    caller to say so.
    """
    from .analysis.data.scans import SOURCE_ATTR
    from .sweep.store import read_scans

    df = read_scans(paths, ledger=ledger)
    return df, df.attrs[SOURCE_ATTR]


def _column_keys(df: pd.DataFrame) -> pd.Series:
    """One column per model × prompt (× candidate set, when the inputs hold several for a pair: a token scan
    and an item scan of one model and prompt are two columns, never one with each string's copies dropped)."""
    key = df["model"].astype(str) + "\u241f" + df["prompt"].astype(str)
    if "candidates" in df.columns and df.groupby(key)["candidates"].nunique().max() > 1:
        key = key + "\u241f" + df["candidates"].astype(str)
    return key


def _one_tokenizer(df: pd.DataFrame) -> bool:
    """Whether all models' ids mean the same: each id decodes to one text everywhere, and every two
    models share at least half of the smaller one's ids (disjoint id ranges are different tokenizers)."""
    if df.drop_duplicates(["token_id", "text"])["token_id"].duplicated().any():
        return False
    ids = [set(g.astype("int64")) for _, g in df.groupby("model", sort=False)["token_id"]]
    return all(len(a & b) >= 0.5 * min(len(a), len(b)) for k, a in enumerate(ids) for b in ids[k + 1:])


def _choose_join(df: pd.DataFrame, join: str, notes: list | None = None) -> str:
    """The join rule asked for, or auto's (on id where every row has one in one tokenizer); auto's text join of token
    scans because text candidates came with them is said (a token scan's rows were de-duplicated by text unasked)."""
    if join not in JOIN_RULES:
        raise UserError(f"unknown join rule {join!r}; use one of {JOIN_RULES}")
    ids_ok = df["token_id"].notna().all()
    if join == "id" and not ids_ok:
        raise UserError("join on token id needs token ids, but some rows are text candidates; use --join text")
    one_tokenizer = ids_ok and _one_tokenizer(df)
    if join == "id" and not one_tokenizer:
        raise UserError("join on token id needs one tokenizer, but an id decodes to different texts in "
                        "different scans; use --join text (or auto)")
    has_ids = df["token_id"].notna()
    if join == "auto" and not ids_ok and has_ids.any() and notes is not None:  # several tokenizers: text, as the papers
        notes.append(f"token scans joined on decoded text, not on the token id: {int((~has_ids).sum()):,} rows are "
                     "text candidates (no id); explore the token scans on their own to join them on the id")
    return join if join != "auto" else ("id" if one_tokenizer else "text")


# ---------------------------------------------------------------- the join
def join_columns(df: pd.DataFrame, join: str = "auto", notes: list | None = None):
    """One row per token, one column per model × prompt.

    Returns (join, columns, texts, ids (G, N), id_groups, scores (C, N), ranks (C, N)).

    >>> d = pd.DataFrame({"model": ["a", "a", "b", "b"], "prompt": "p", "token_id": [1, 2, 7, 8],
    ...                   "text": ["x", "y", "x", "z"], "score": [1.0, 2.0, 3.0, 4.0]})
    >>> j, cols, texts, ids, groups, scores, ranks = join_columns(d)
    >>> j, texts, ids.tolist(), [c["unmatched"] for c in cols]
    ('text', ['x', 'y', 'z'], [[1, 2, -1], [7, -1, 8]], [1, 1])
    """
    from .analysis.data.ledger import Ledger
    from .analysis.data.scans import validate_scans
    from .analysis.data.shared_vocab import dedupe_text

    left_out = Ledger()
    df = validate_scans(df, ledger=left_out)
    if notes is not None:
        notes.extend(left_out.summary())
    join = _choose_join(df, join, notes)
    df = df.assign(_col=_column_keys(df))
    col_keys = list(pd.unique(df["_col"]))
    rows = df.groupby("_col", sort=False).size()
    if join == "text":
        ledger = Ledger()
        df = dedupe_text(df.assign(model=df["_col"]), ledger).assign(model=df["model"])
        if notes is not None and ledger.total():
            notes.append(f"{ledger.total():,} rows dropped: decoded string occurs more than once within "
                         "a scan (the papers' de-duplication rule)")
        # a column's ranks are over the rows it shows: the file's own ranks counted the dropped rows too
        df = df.assign(rank=df.groupby("_col", sort=False)["score"].rank(ascending=False, method="min")
                       .astype("int64"))
        codes, uniq = pd.factorize(df["text"], sort=False)
        texts = [str(t) for t in uniq]
    else:
        codes, uniq = pd.factorize(df["token_id"].astype("int64"), sort=True)
        first = df.drop_duplicates("token_id").set_index("token_id")["text"]
        texts = [str(t) for t in first.reindex(uniq).tolist()]
    n, c = len(texts), len(col_keys)
    ci = pd.Index(col_keys).get_indexer(df["_col"])
    scores = np.full((c, n), np.nan, dtype=np.float32)
    ranks = np.zeros((c, n), dtype=np.int32)
    scores[ci, codes] = df["score"].to_numpy(np.float32)
    ranks[ci, codes] = df["rank"].to_numpy(np.int64).astype(np.int32)
    models = list(pd.unique(df["model"]))
    id_groups = models if join == "text" else ["all"]
    ids = np.full((len(id_groups), n), -1, dtype=np.int32)
    has = df["token_id"].notna().to_numpy()
    gi = pd.Index(id_groups).get_indexer(df["model"]) if join == "text" else np.zeros(len(df), int)
    ids[gi[has], codes[has]] = df["token_id"].to_numpy("float64")[has].astype(np.int32)
    present = ~np.isnan(scores)
    in_all = present.all(axis=0)
    kept = df.groupby("_col", sort=False).size()
    first_rows = df.drop_duplicates("_col").set_index("_col")
    columns = []
    for k, key in enumerate(col_keys):
        model, prompt = first_rows.loc[key, "model"], first_rows.loc[key, "prompt"]
        cand = first_rows.loc[key, "candidates"] if key.count("\u241f") == 2 else None
        columns.append({"key": key, "model": str(model), "prompt": str(prompt),
                        "candidates": None if cand is None else str(cand),
                        "label": chr(65 + k) if k < 26 else f"C{k + 1}", "rows": int(rows[key]),
                        "duplicated": int(rows[key] - kept.get(key, 0)),
                        "unmatched": int((present[k] & ~in_all).sum()),
                        "id_group": id_groups.index(str(model)) if join == "text" else 0})
    return join, columns, texts, ids, id_groups, scores, ranks


# ---------------------------------------------------------------- flags, categories, pair statistics
def token_flags(texts, pieces=None) -> np.ndarray:
    """Per row: bit 0 word-like (:func:`rmfast.scoring.candidates.is_wordlike`), bit 1 special (:func:`is_special`).

    >>> token_flags([" love", "<|im_end|>", "42"]).tolist()
    [1, 2, 0]
    """
    pieces = texts if pieces is None else pieces
    word = np.fromiter((is_wordlike(t) for t in texts), dtype=bool, count=len(texts))
    spec = np.fromiter((is_special(p) for p in pieces), dtype=bool, count=len(texts))
    return (word * WORDLIKE | spec * SPECIAL).astype(np.uint8)


def category_masks(texts, dictionaries) -> tuple[np.ndarray, list[str]]:
    """Per row a bit mask of the dictionary categories its text belongs to (stripped, lower-cased,
    wildcards as the category analysis matches them), and the category names ("file: category").

    >>> dic = pd.DataFrame({"term": ["kind", "brav"], "category": ["C", "A"], "wildcard": [False, True]})
    >>> masks, names = category_masks([" Kind", "brave", "x"], [("big2", dic)])
    >>> masks.tolist(), names
    ([1, 2, 0], ['big2: C', 'big2: A'])
    """
    from .analysis.data.lexicons import load_dictionary, match_dictionary, normalize_word

    words = pd.Series([normalize_word(t) for t in texts])
    masks = np.zeros(len(texts), dtype=np.uint32)
    names: list[str] = []
    seen: set = set()
    for item in dictionaries:
        if not isinstance(item, tuple):  # a file given twice: its categories once (they were listed twice)
            if (where := Path(item).resolve()) in seen:
                continue
            seen.add(where)
        name, dic = item if isinstance(item, tuple) else (Path(item).stem, load_dictionary(item))
        hits = match_dictionary(words, dic)
        for cat in pd.unique(dic["category"]):
            if len(names) == MAX_CATEGORIES:
                raise UserError(f"more than {MAX_CATEGORIES} dictionary categories; give fewer --dictionary files")
            member = words.isin(set(hits.loc[hits["category"] == cat, "word"])).to_numpy()
            masks[member] |= np.uint32(1 << len(names))
            names.append(f"{name}: {cat}")
    return masks, names


def pair_stats(scores: np.ndarray, texts=None, rbo_p: float = RBO_P) -> list[dict]:
    """Kendall tau-b, Spearman rho and RBO of every pair of columns, on the rows both have.

    RBO breaks ties by the rows' order; with ``texts`` the rows are taken in text order, as the
    agreement analysis takes its shared vocabulary, so the two give the same value. Needs scipy
    (the ``analysis`` extra); tests/test_explore.py checks the values against scipy and the agreement
    analysis.
    """
    from .analysis.data.deps import require
    from .analysis.stats.rbo import rbo

    st = require("scipy.stats", "explore's pair statistics (--no-pair-stats leaves them out)")
    by_text = np.array(sorted(range(len(texts)), key=texts.__getitem__), dtype=np.int64) if texts is not None else None
    full = ~np.isnan(scores).any(axis=1)  # columns with every row: their ranks serve every pair (Spearman)
    ranked = {c: st.rankdata(scores[c][by_text] if by_text is not None else scores[c]) for c in np.flatnonzero(full)}
    out = []
    for a in range(len(scores)):
        for b in range(a + 1, len(scores)):
            both = ~np.isnan(scores[a]) & ~np.isnan(scores[b])
            rows = np.flatnonzero(both) if by_text is None else by_text[both[by_text]]
            x, y = scores[a][rows].astype(np.float64), scores[b][rows].astype(np.float64)
            row = {"a": a, "b": b, "n_shared": int(both.sum()), "kendall_tau_b": None,
                   "spearman_rho": None, "rbo": None}
            if row["n_shared"] >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
                row["kendall_tau_b"] = float(st.kendalltau(x, y, variant="b").statistic)
                row["spearman_rho"] = float(np.corrcoef(ranked[a], ranked[b])[0, 1] if full[a] and full[b]
                                            else st.spearmanr(x, y).statistic)
                row["rbo"] = rbo(x, y, p=rbo_p)
            out.append(row)
    return out


def shift_ranks(scores: np.ndarray, a: int, b: int) -> np.ndarray:
    """Rank change from column a to b, as the page's shift view shows it: both columns re-ranked
    on the rows they share (1 = best, ties share the best rank), then rank_a − rank_b (positive:
    ranked higher under b); NaN where a row is missing from either.

    >>> shift_ranks(np.array([[3, 2, 1], [1, 2, 3]], dtype=np.float32), 0, 1).tolist()
    [-2.0, 0.0, 2.0]
    """
    both = ~np.isnan(scores[a]) & ~np.isnan(scores[b])
    out = np.full(scores.shape[1], np.nan)
    ra = pd.Series(scores[a][both]).rank(ascending=False, method="min").to_numpy()
    rb = pd.Series(scores[b][both]).rank(ascending=False, method="min").to_numpy()
    out[both] = ra - rb
    return out


# ---------------------------------------------------------------- building, packing, rendering
def build_explorer(df: pd.DataFrame, *, dictionaries=(), join: str = "auto", pairs: bool = True,
                   title: str = "rmfast explorer", source: str = "", states=None, similarity_csv=None,
                   states_layers: int | None = 6, states_rows: int | None = 4096, k: int = 10) -> ExplorerData:
    """Join the scans, flag the tokens, match the dictionaries, compute the pair statistics.

    ``dictionaries``: paths (CSV, .dicx, LIWC .dic; see :func:`rmfast.analysis.load_dictionary`) or
    (name, frame) tuples. ``pairs=False`` skips the pair statistics (they need scipy). The
    representations panel, as the report's section (:mod:`rmfast.analysis.representations.views`): the lens of
    every column whose scan has lens columns (top/bottom ``k``); ``states`` (label -> states folder) compared
    pairwise on at most ``states_layers`` layers and ``states_rows`` candidates, and ``similarity_csv``.
    """
    notes: list[str] = []
    join, columns, texts, ids, groups, scores, ranks = join_columns(df, join, notes)
    pieces = texts
    if join == "id" and "token" in df.columns and df["token"].notna().all():
        piece = df.drop_duplicates("token_id").set_index("token_id")["token"]
        pieces = piece.reindex(ids[0].astype("int64")).astype(str).tolist()
    cats, names = category_masks(texts, dictionaries)
    lens, sims = _representations(df, columns, states, similarity_csv, states_layers, states_rows, k, notes)
    return ExplorerData(join=join, columns=columns, texts=texts, ids=ids, id_groups=groups, scores=scores,
                        ranks=ranks, flags=token_flags(texts, pieces), cats=cats, categories=names,
                        pairs=pair_stats(scores, texts) if pairs and len(columns) > 1 else [], notes=notes,
                        title=title, source=source, lens=lens, similarity=sims)


def _representations(df, columns, states, similarity_csv, layers, rows, k, notes) -> tuple[list, list]:
    """The lens of each column with lens values, and the similarity maps (the page's representations panel)."""
    from .analysis.representations.lens import lens_columns
    from .analysis.representations.views import (lens_by_scan, lens_payload, similarity_from_csv, similarity_panels,
                                           similarity_payload)
    from .analysis.data.scans import validate_scans

    col = {(c["model"], c["prompt"]): i for i, c in reversed(list(enumerate(columns)))}  # the first column
    found = lens_by_scan(validate_scans(df), k) if lens_columns(df) else []
    lens = [{"column": col[(m, p)], "model": m, "prompt": p, **lens_payload(res)}
            for m, p, res in found if (m, p) in col]
    panels, more = similarity_panels(states or {}, max_layers=layers, max_rows=rows)
    if similarity_csv is not None:
        panels.append(similarity_from_csv(similarity_csv))
    notes.extend(more)
    return lens, [similarity_payload(p) for p in panels]


_ARRAYS = (("scores", "float32"), ("ranks", "int32"), ("ids", "int32"), ("flags", "uint8"), ("cats", "uint32"))


def pack(data: ExplorerData, compress: bool = True) -> bytes:
    """The binary block the page decodes (module docstring), gzip-compressed unless ``compress=False``."""
    arrays, specs, offset = [], [], 0
    for name, dtype in _ARRAYS:
        a = np.ascontiguousarray(getattr(data, name), dtype=np.dtype(dtype).newbyteorder("<")).reshape(-1)
        # byte planes (all first bytes, then all second bytes...): gzip finds the runs in ranks' and ids'
        # high bytes and in the scores' exponents (-1.9 MB at 262,144 x 6)
        raw = a.view(np.uint8).reshape(-1, a.itemsize).T.tobytes()
        raw += b"\0" * (-len(raw) % 8)
        specs.append({"name": name, "dtype": dtype, "offset": offset, "length": int(getattr(data, name).size)})
        arrays.append(raw)
        offset += len(raw)
    header = {"version": __version__, "n": data.n_rows, "join": data.join, "columns": data.columns,
              "id_groups": data.id_groups, "categories": data.categories, "pairs": data.pairs,
              "notes": data.notes, "title": data.title, "source": data.source, "rbo_p": RBO_P,
              "lens": data.lens, "similarity": data.similarity,
              "arrays": specs, "texts": data.texts}
    head = json.dumps(header, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    start = 8 + len(head)
    blob = MAGIC + struct.pack("<I", len(head)) + head + b"\0" * (-start % 8) + b"".join(arrays)
    return gzip.compress(blob, compresslevel=6, mtime=0) if compress else blob


def unpack(page_or_blob) -> ExplorerData:
    """Read back what :func:`pack` / :func:`render_html` wrote (an HTML page, or the block's bytes)."""
    blob = page_or_blob
    if isinstance(blob, str):
        m = re.search(r'<script id="rmx-data" type="application/octet-stream" data-gzip="(\d)">([^<]*)</script>', blob)
        if not m:
            raise UserError("not an rmfast explorer page (no embedded data block)")
        blob = base64.b64decode(m.group(2))
    if blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    if blob[:4] != MAGIC:
        raise UserError("not an rmfast explorer data block (bad magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen + (-(8 + hlen) % 8)
    arr = {}
    for s in header["arrays"]:
        dt = np.dtype(s["dtype"]).newbyteorder("<")
        planes = np.frombuffer(blob, dtype=np.uint8, count=s["length"] * dt.itemsize, offset=base + s["offset"])
        arr[s["name"]] = planes.reshape(dt.itemsize, s["length"]).T.copy().view(dt).reshape(-1)
    n, c, g = header["n"], len(header["columns"]), len(header["id_groups"])
    return ExplorerData(join=header["join"], columns=header["columns"], texts=header["texts"],
                        ids=arr["ids"].reshape(g, n), id_groups=header["id_groups"],
                        scores=arr["scores"].reshape(c, n), ranks=arr["ranks"].reshape(c, n),
                        flags=arr["flags"], cats=arr["cats"], categories=header["categories"],
                        pairs=header["pairs"], notes=header["notes"], title=header["title"],
                        source=header["source"], lens=header.get("lens", []),
                        similarity=header.get("similarity", []))


def _asset(name: str) -> str:
    return resources.files("rmfast").joinpath("explorer", name).read_text(encoding="utf-8")


def render_html(data: ExplorerData, compress: bool = True) -> str:
    """The page: template + CSS + JS + the base64 data block, one self-contained file."""
    b64 = base64.b64encode(pack(data, compress)).decode("ascii")
    page = _asset("explorer.html")
    # The template's markers are replaced once each, data last (it is the only large part).
    page = page.replace("__TITLE__", html.escape(data.title).replace("__", "_&#95;"))
    for marker, value in (("/*__CSS__*/", _asset("explorer.css")),
                          ("/*__JS__*/", _asset("explorer.js").replace("</script", "<\\/script"))):
        page = page.replace(marker, value, 1)
    return page.replace("__DATA__", f'<script id="rmx-data" type="application/octet-stream" '
                                    f'data-gzip="{int(compress)}">{b64}</script>', 1)


def write_explorer(path: str | PathLike, page: str) -> Path:
    """Write the page atomically (temporary file beside it, then rename)."""
    return atomic_write(Path(path), lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
