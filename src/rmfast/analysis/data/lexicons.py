"""Word lists the analyses join to: AFINN valence, word frequencies, category dictionaries.

Decoded tokens are matched to lexicon entries by :func:`normalize_word` (surrounding
whitespace stripped, lower-cased): " Love", "love" and "LOVE" all match "love".
Paper A's R script matched on ``tolower(token_decoded)`` alone (:func:`paper_word`), so a
space-prefixed token (" love", the common form in BPE vocabularies) matched nothing; and it
joined the BNC list per lemma and part of speech (:func:`load_bnc_rows`). Those are the
``method="paper"`` joins of :mod:`..paper_a.sentiment` and :mod:`..paper_a.exposure`.

Formats read (inspect your file if a parser complains):

* AFINN: ``word<TAB>integer valence`` (−5..+5), UTF-8; the ``afinn`` package's copy of
  AFINN-111 is used when no file is given and the package is installed.
* Frequencies: the BNC lemma list (``bnc_1_1_all_alpha.txt``: Latin-1, tab-separated
  ``<tab>Word<tab>PoS<tab>flag<tab>Freq<tab>Ra<tab>Disp``, where ``@ @ form`` rows are the
  forms of the lemma above; frequencies per million), any two-column word/frequency
  CSV/TSV, or ``"wordfreq"`` (the optional ``wordfreq`` package, English, per million).
* Dictionaries: long CSV (a ``category`` column and a term column), wide CSV/``.dicx``
  (a term column and one column per category marked with anything but NA/empty), or
  LIWC ``.dic`` (``%``-delimited category block, then ``term<TAB>ids``); a trailing
  ``*`` on a term matches any word with that prefix.
"""

from __future__ import annotations

import csv
import io
import re
from os import PathLike
from pathlib import Path

import pandas as pd

from ...errors import UserError
from ...user_files import read_text
from . import deps


def normalize_word(text) -> str:
    """Matching key of a decoded token or lexicon entry: stripped and lower-cased.

    >>> normalize_word("  Love\\n")
    'love'
    """
    return str(text).strip().lower()


def paper_word(text) -> str:
    """Paper A's matching key: lower-cased only (R's ``tolower``), whitespace kept.

    >>> paper_word(" Love"), paper_word("LOVE")
    (' love', 'love')
    """
    return str(text).lower()


def _exists(path) -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p} does not exist; give the path of the word list")
    return p


# ---------------------------------------------------------------- AFINN valence
def load_afinn(path: str | PathLike | None = None) -> pd.DataFrame:
    """AFINN valences as columns word (normalised), valence (int).

    ``path=None`` uses the ``afinn`` package's AFINN-111 when it is installed.

    >>> load_afinn("../shared/data/lexicons/AFINN-111.txt").shape
    (2477, 2)
    """
    if path is None:
        try:
            import importlib.resources as resources

            ref = resources.files("afinn").joinpath("data/AFINN-111.txt")
            text = ref.read_text(encoding="utf-8")
        except (ImportError, ModuleNotFoundError, FileNotFoundError):
            raise UserError("no AFINN file given and the 'afinn' package is not installed: pip install "
                            "'rmfast[analysis]' (it holds AFINN-111), or pass --afinn PATH/AFINN-111.txt") from None
        where = "afinn package AFINN-111"
    else:
        p = _exists(path)
        text = read_text(p, "AFINN file")
        where = p.name
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        word, sep, val = line.rpartition("\t")
        try:
            rows.append((normalize_word(word), int(val)))
        except ValueError:
            raise UserError(f"{where} line {i}: expected 'word<TAB>integer', got {line!r}") from None
        if not sep:
            raise UserError(f"{where} line {i}: expected 'word<TAB>integer', got {line!r}")
    df = pd.DataFrame(rows, columns=["word", "valence"])
    return df.drop_duplicates("word", keep="first").reset_index(drop=True)


# ---------------------------------------------------------------- word frequencies
def _parse_bnc(text: str) -> pd.DataFrame:
    rows = []
    for line in text.splitlines()[1:]:
        f = line.lstrip("\t").split("\t")
        if len(f) < 4:
            continue
        word, _pos, flag = f[0], f[1], f[2]
        freq = f[3].rstrip("#").strip()
        if word == "@":
            form = flag
        elif flag == ":":
            form = word
        else:  # "%": lemma total; its forms follow on "@" lines
            continue
        form = re.sub(r"\s*\(.*\)$", "", form).rstrip("*").strip()
        try:
            rows.append((normalize_word(form), float(freq)))
        except ValueError:
            continue
    return pd.DataFrame(rows, columns=["word", "frequency"])


def load_bnc_rows(path: str | PathLike) -> pd.DataFrame:
    """The BNC lemma list as paper A's R script read it (``read.delim``, header row, columns
    by position): one row per line, word = the ``Word`` column as written (a lemma, or "@" on
    the lines listing its forms), pos, frequency = ``as.numeric(Freq)`` (NaN where R gives NA:
    a "98#" flagged value, a missing field). Lemma rows carry the lemma's total over its forms,
    one row per part of speech: "love" is a noun row and a verb row.

    >>> b = load_bnc_rows("../shared/data/lexicons/bnc_1_1_all_alpha.txt")
    >>> b[b["word"] == "love"][["pos", "frequency"]].values.tolist()
    [['NoC', 150.0], ['Verb', 150.0]]
    """
    p = _exists(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0].split("\t") if lines else []
    if "Word" not in header or "Freq" not in header:
        raise UserError(f"{p.name}: not the BNC list format (a header with Word and Freq)")
    iw, ip, iff = header.index("Word"), header.index("PoS"), header.index("Freq")
    rows = []
    for ln in lines[1:]:
        f = ln.split("\t")  # read.delim fills short lines with NA: fields by position
        field = (lambda i: f[i] if i < len(f) else None)
        rows.append((field(iw), field(ip), field(iff)))
    df = pd.DataFrame(rows, columns=["word", "pos", "freq_text"])
    df.loc[df["word"] == "NA", "word"] = None  # R reads the string NA as missing
    # as.numeric(): a number, possibly padded by blanks; anything else ("98#") is NA
    num = df["freq_text"].fillna("").str.strip()
    ok = num.str.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
    df["frequency"] = pd.to_numeric(num.where(ok), errors="coerce")
    return df[["word", "pos", "frequency"]]


def load_frequencies(source: str | PathLike, words=None) -> pd.DataFrame:
    """Word frequencies (per million) as columns word, frequency; forms summed over PoS.

    ``source`` is a BNC list, a two-column word/frequency CSV/TSV, or ``"wordfreq"``
    (then ``words`` lists the words to look up).

    >>> f = load_frequencies("../shared/data/lexicons/bnc_1_1_all_alpha.txt")
    >>> float(f.set_index("word").loc["love", "frequency"])
    234.0
    """
    if str(source) == "wordfreq":
        wf = deps.require("wordfreq", "frequencies from wordfreq")
        words = sorted({normalize_word(w) for w in (words or [])})
        freq = [wf.word_frequency(w, "en") * 1e6 for w in words]
        df = pd.DataFrame({"word": words, "frequency": freq})
        return df[df["frequency"] > 0].reset_index(drop=True)
    p = _exists(source)
    raw = p.read_bytes()
    if b"\x00" in raw:
        raise UserError(f"frequency list {p} is binary, not text; give the BNC list or word,frequency rows")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    first = text.splitlines()[0] if text else ""
    if "Word" in first and "PoS" in first and "Freq" in first:
        df = _parse_bnc(text)
    else:
        dialect = "excel-tab" if "\t" in first else "excel"
        try:
            rows = list(csv.reader(io.StringIO(text), dialect=dialect))
        except csv.Error as e:
            raise UserError(f"{p.name}: not a well-formed word,frequency list ({e}); fix the file") from None
        if rows and len(rows[0]) >= 2:
            try:
                float(rows[0][1])
            except ValueError:
                rows = rows[1:]  # header
        try:
            df = pd.DataFrame([(normalize_word(r[0]), float(r[1])) for r in rows if len(r) >= 2],
                              columns=["word", "frequency"])
        except ValueError:
            raise UserError(f"{p.name}: expected two columns word,frequency (or the BNC "
                            "list format)") from None
    if df.empty:
        raise UserError(f"{p.name}: no word frequencies read; expected the BNC list or "
                        "word,frequency rows")
    df = df.groupby("word", as_index=False)["frequency"].sum()
    return df


# ---------------------------------------------------------------- category dictionaries
def _marked(v) -> bool:
    return not (pd.isna(v) or str(v).strip() in ("", "0", "NA", "False", "false"))


#: what marks a term in a wide dictionary's category column (lower-cased): MFD 2.0's and the Big Two's "X", a 1, a yes
WIDE_MARKS = frozenset({"x", "1", "1.0", "true", "yes", "y", "*"})


def _check_marks(wide: pd.DataFrame, where: str) -> None:
    """A wide dictionary's category columns hold marks; one holding labels (several values: "A", "B") is a long
    dictionary whose category column has another name, which read as wide made every word one category named
    after its header."""
    for c in wide.columns[1:]:
        values = {str(v).strip() for v in wide[c] if _marked(v)}
        labels = sorted(v for v in values if v.lower() not in WIDE_MARKS)
        if labels:
            raise UserError(f"dictionary {where}: column {c!r} holds labels ({', '.join(map(repr, labels[:3]))}), not "
                            "the marks (X, 1) of a wide dictionary's category columns; a long dictionary names its "
                            f"columns term (or word) and category: rename {c!r} to category")


def _parse_dic(text: str, where: str) -> pd.DataFrame:
    lines = text.splitlines()
    marks = [i for i, ln in enumerate(lines) if ln.strip() == "%"]
    if len(marks) < 2:
        raise UserError(f"{where}: a LIWC .dic file starts with a '%'-delimited category block")
    cats = {}
    for ln in lines[marks[0] + 1:marks[1]]:
        parts = ln.split()
        if len(parts) >= 2:
            cats[parts[0]] = " ".join(parts[1:])
    rows = []
    for ln in lines[marks[1] + 1:]:
        if not ln.strip():
            continue
        parts = ln.split("\t") if "\t" in ln else ln.split()
        term, ids = parts[0], " ".join(parts[1:]).split()
        for i in ids:
            if i not in cats:
                raise UserError(f"{where}: term {term!r} uses category id {i} not in the header")
            rows.append((term, cats[i]))
    return pd.DataFrame(rows, columns=["term", "category"])


def load_dictionary(path: str | PathLike) -> pd.DataFrame:
    """A category dictionary as long rows: term (normalised), category, wildcard.

    >>> d = load_dictionary("../shared/data/lexicons/big2_nouns.csv")
    >>> d["category"].value_counts().to_dict()
    {'Communion': 159, 'Agency': 104}
    """
    p = _exists(path)
    text = p.read_text(encoding="utf-8-sig", errors="replace")
    if "\x00" in text:
        raise UserError(f"dictionary {p} is binary, not text; give a CSV, .dicx or LIWC .dic")
    if p.suffix.lower() == ".dic":
        df = _parse_dic(text, p.name)
    else:
        try:
            wide = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise UserError(f"dictionary {p} is not a well-formed CSV ({msg[:160]}); fix the file") from None
        lower = {c.lower().strip(): c for c in wide.columns}
        if "category" in lower and len(wide.columns) >= 2:
            cat = lower["category"]
            term = next((lower[k] for k in ("term", "word", "dicterm", "token_decoded")
                         if k in lower), [c for c in wide.columns if c != cat][0])
            df = wide[[term, cat]].rename(columns={term: "term", cat: "category"})
        elif len(wide.columns) >= 2:
            term = wide.columns[0]
            _check_marks(wide, p.name)
            df = wide.melt(id_vars=[term], var_name="category", value_name="mark")
            df = df[df["mark"].map(_marked)].rename(columns={term: "term"})[["term", "category"]]
        else:
            raise UserError(f"{p.name}: expected a long (term, category) or wide (term + one "
                            "column per category) dictionary, or a LIWC .dic")
    n_rows = len(df)
    df = df.dropna()
    df["term"] = df["term"].map(normalize_word)
    df["wildcard"] = df["term"].str.endswith("*")
    df["term"] = df["term"].str.rstrip("*")
    df = df[df["term"] != ""]
    n_blank = n_rows - len(df)
    n_kept = len(df)
    df = df.drop_duplicates(["term", "category"]).reset_index(drop=True)
    if df.empty:
        raise UserError(f"{p.name}: no dictionary terms read")
    notes = []
    if n_blank:
        notes.append(f"dictionary {p.name}: {n_blank} row(s) without a term or a category left out")
    if n_kept > len(df):
        notes.append(f"dictionary {p.name}: {n_kept - len(df)} repeated term-category row(s) counted once")
    df.attrs["notes"] = notes  # read by dictionary_notes()
    return df


def as_dictionary(dictionary) -> pd.DataFrame:
    """A dictionary path (:func:`load_dictionary`) or frame (term, category[, wildcard]) as the frame
    :func:`match_dictionary` reads: terms normalised, a wildcard column; its notes kept in ``attrs``.

    >>> as_dictionary(pd.DataFrame({"term": [" Kind"], "category": ["C"]})).values.tolist()
    [['kind', 'C', False]]
    """
    dic = dictionary if isinstance(dictionary, pd.DataFrame) else load_dictionary(dictionary)
    notes = list(dic.attrs.get("notes", ()))
    if "wildcard" not in dic.columns:
        dic = dic.assign(wildcard=False)
    dic = dic.assign(term=dic["term"].map(normalize_word))
    dic.attrs["notes"] = notes
    return dic


def dictionary_notes(dic: pd.DataFrame) -> list[str]:
    """What reading the dictionary left out or combined, and its terms filed under several categories
    (a word matching one counts in each).

    >>> dic = pd.DataFrame({"term": ["kind", "kind", "bold"], "category": ["C", "A", "A"], "wildcard": False})
    >>> dictionary_notes(dic)
    ["1 dictionary term(s) are in two or more categories (e.g. 'kind': A, C); a word matching one counts in each"]
    """
    notes = list(dic.attrs.get("notes", ()))
    cats = dic.groupby(["term", "wildcard"])["category"].unique()
    multi = cats[cats.map(len) > 1]
    if len(multi):
        (term, _), first = next(iter(multi.items()))
        notes.append(f"{len(multi)} dictionary term(s) are in two or more categories (e.g. {term!r}: "
                     f"{', '.join(sorted(map(str, first)))}); a word matching one counts in each")
    return notes


def match_dictionary(words: pd.Series, dictionary: pd.DataFrame) -> pd.DataFrame:
    """Categories of each word: exact term matches plus wildcard prefix matches.

    Returns columns word, category (a word may fall in several categories).

    >>> dic = pd.DataFrame({"term": ["kind", "brav"], "category": ["C", "A"],
    ...                     "wildcard": [False, True]})
    >>> match_dictionary(pd.Series(["kind", "brave", "x"]), dic).values.tolist()
    [['kind', 'C'], ['brave', 'A']]
    """
    uniq = pd.Series(pd.unique(words.map(normalize_word)), name="word")
    exact = dictionary[~dictionary["wildcard"]]
    out = [uniq.to_frame().merge(exact.rename(columns={"term": "word"})[["word", "category"]],
                                 on="word")]
    for term, cat in dictionary.loc[dictionary["wildcard"], ["term", "category"]].itertuples(
            index=False):
        hit = uniq[uniq.str.startswith(term)]
        if len(hit):
            out.append(pd.DataFrame({"word": hit.to_numpy(), "category": cat}))
    res = pd.concat(out, ignore_index=True).drop_duplicates().reset_index(drop=True)
    return res[["word", "category"]]


__all__ = ["normalize_word", "paper_word", "load_afinn", "load_frequencies", "load_bnc_rows",
           "load_dictionary", "as_dictionary", "dictionary_notes", "match_dictionary"]
