"""What a job scores: the vocabulary's ids, or texts of any length read from files.

**The vocabulary as candidates** (:func:`select_ids`, :func:`vocab_ids`): which ids exist, which a user
asked for, and the papers' views. One id list feeds every token scan: a range, a file, explicit ids; minus
special tokens; the word-like and de-duplication views.

**Text candidates** (:func:`rmfast.scoring.candidate_files.read_candidates`, :func:`tokenize_in_context`): responses
of any length, read from files and tokenized in context. :func:`rmfast.scoring.pipeline.score_texts` scores them, the text
counterpart of :func:`rmfast.scoring.pipeline.scan`. Each text is placed in the assistant turn and tokenized exactly as ``apply_chat_template(tokenize=True)`` tokenizes the whole
conversation (:func:`rmfast.template.response_ids`); the ids between the template's prefix and
suffix are the response. Rows are grouped by response length (no padding ever) and go through the
same shared-prompt :class:`~rmfast.fast.engine.Engine` as token scans, or through the plain-HF path for
architectures off the fast path.

Compatibility mode ``compat="decode-retokenize"`` reproduces the published pipeline's decode round
trip: the vocabulary is decoded id by id (``tokenizer.decode([id])``) and each string is put into
the conversation, which is re-tokenized as a whole; the score is that of the whole re-tokenized
sequence, whatever ids it holds. Default mode scores the id itself (token scans) and refuses a text
that merges with the template around it; compat mode scores such rows anyway (plain-HF path).

``compat="authors"`` reproduces the published scoring loop itself (paper A's
``generate_reward_model_scores.py``), all three of its quirks: (a) the decode round trip above;
(b) the conversation rendered as TEXT (``apply_chat_template(tokenize=False)``) and re-tokenized
with the tokenizer's special tokens, so a BOS already in the rendered template gets a second one;
(c) batches of ``batch_size`` consecutive candidates padded together with the tokenizer's pad token
(its padding side) and read by the model's own pooling, which finds "the last token that is not
``config.pad_token_id``": where the config's pad differs from the tokenizer's, the shorter rows of a
batch are read at a pad position. :func:`authors_batches` builds those batches; the plain-HF
:func:`rmfast.scoring.hf_path.authors_scores` scores one.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..dims import text_config
from ..errors import UserError, UserNote
from ..io import file_sha256
from ..user_files import read_text


# --------------------------------------------------------------------------------------------
# the vocabulary: ids, views


def vocab_size(model, tokenizer) -> int:
    """Ids that both the tokenizer and the embedding matrix know: 0 .. n-1."""
    if not hasattr(model, "get_input_embeddings") or tokenizer is None or not hasattr(tokenizer, "__len__"):
        got = f"a {type(model).__name__} and {'no tokenizer' if tokenizer is None else 'a ' + type(tokenizer).__name__}"
        raise UserError(f"give the model, then its tokenizer (got {got}): rmfast.scan(lm.model, lm.tokenizer, ...) with "
                        "lm = rmfast.load(...)")
    n_emb = model.get_input_embeddings().weight.shape[0]
    return min(len(tokenizer), n_emb)


def vocab_sha256(tokenizer) -> str:
    """A content hash of the tokenizer's vocabulary: every (piece, id), sorted by id (added tokens included).
    Two tokenizer folders with the same vocabulary (a reward model and its base model) hash alike, so
    their token ids mean the same strings; the manifests record it (``vocab_sha256``) and the states
    join compares it (:func:`rmfast.analysis.representations.similarity.align`), not the folders' paths.

    >>> class Tok:
    ...     def get_vocab(self): return {"a": 0, "b": 1}
    >>> vocab_sha256(Tok()) == vocab_sha256(Tok()), len(vocab_sha256(Tok()))
    (True, 64)
    """
    import hashlib
    import json

    try:  # kept per tokenizer while its vocabulary keeps its size (0.3 s a scan for a 128k vocabulary otherwise)
        n, hit = len(tokenizer), _VOCAB_SHA.get(tokenizer)
    except TypeError:  # no len(), or not weak-referenceable: hashed every time
        n, hit = None, None
    if hit is not None and hit[0] == n:
        return hit[1]
    pairs = sorted(((int(i), str(t)) for t, i in tokenizer.get_vocab().items()))
    digest = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
    if n is not None:
        _VOCAB_SHA[tokenizer] = (n, digest)
    return digest


_VOCAB_SHA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (vocabulary size, digest)


def special_ids(tokenizer) -> set[int]:
    """Special, reserved and added tokens (what --exclude-special drops)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids


def range_bounds(spec: str, n_vocab: int | None = None) -> tuple[int, int | None]:
    """``A:B`` -> (A, B), an omitted A being 0 and an omitted B ``n_vocab``; a ValueError, worded for the user,
    where it is no range of integers or an empty one (checked before any model is loaded, where the vocabulary
    is not yet known: ``n_vocab`` None).

    >>> range_bounds("5:9"), range_bounds(":9"), range_bounds("5:", 100)
    ((5, 9), (0, 9), (5, 100))
    >>> range_bounds("5:5")
    Traceback (most recent call last):
    ValueError: range 5:5 is empty: A:B is half-open and needs A < B (e.g. 5:6)
    """
    a, _, b = spec.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else n_vocab
    except ValueError:
        raise ValueError(f"{spec!r} is not a range A:B of integers nor an existing file") from None
    if lo < 0 or (hi is not None and hi < 0):
        raise ValueError(f"range {spec} has a negative id; ids are 0 up to the vocabulary's size")
    if hi is not None and hi <= lo:
        raise ValueError(f"range {lo}:{hi} is empty: A:B is half-open and needs A < B "
                         f"(e.g. {f'{hi}:{lo}' if hi < lo else f'{lo}:{lo + 1}'})")
    return lo, hi


def _as_id(v, i: int) -> int:
    """The ``i``-th id of an iterable as a Python int: an integer (int, NumPy's, a 0-d integer tensor) or a float
    that is one (3.0, as a float column holds ids); anything else is a UserError, never truncated (1.5 is not id 1).

    >>> _as_id(np.int32(7), 0), _as_id(3.0, 1)
    (7, 3)
    """
    f = math.nan  # a bool is no id, though Python counts it an int
    if not isinstance(v, (bool, np.bool_)):
        try:
            return operator.index(v)
        except TypeError:
            try:
                f = float(v)
            except (TypeError, ValueError):
                pass
    if f.is_integer():
        return int(f)
    raise UserError(f"token_ids[{i}] = {v!r} is not a token id: give integers")


def read_ids_file(spec: str) -> tuple[list[int], list[str]]:
    """A token-ids file's ids (one integer per line; blank lines and # comments skipped) and, per id, where it
    stands ("FILE:LINE: ", for a message); a UserError naming the line that is no integer."""
    vals, where = [], []
    for ln, line in enumerate(read_text(Path(spec), "--token-ids file").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            vals.append(int(s))
        except ValueError:
            raise UserError(f"{spec}:{ln}: {s[:30]!r} is not a token id (one integer per line)") from None
        where.append(f"{spec}:{ln}: ")
    return vals, where


def parse_token_ids(spec, n_vocab: int) -> np.ndarray:
    """``A:B`` (half-open range), a file with one id per line, or an iterable of ints -> sorted unique ids."""
    if spec is None:
        return np.arange(n_vocab, dtype=np.int64)
    if isinstance(spec, (int, np.integer)) or getattr(spec, "ndim", None) == 0:  # one id (a 0-d array or tensor too)
        raise UserError(f"--token-ids {int(spec)}: give a range 'A:B', a file of ids, or a list of ids ([{int(spec)}] "
                        "for this one)")
    if isinstance(spec, str):
        if ":" in spec and not os.path.exists(spec):
            try:
                lo, hi = range_bounds(spec, n_vocab)
            except ValueError as e:
                raise UserError(f"--token-ids {e}") from None
            if not (0 <= lo < hi <= n_vocab):
                raise UserError(f"--token-ids range {lo}:{hi} is outside the vocabulary 0:{n_vocab}")
            return np.arange(lo, hi, dtype=np.int64)
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--token-ids {spec!r}: no such file (give a file with one id per line, or a range A:B)")
        vals, where = read_ids_file(spec)
        if not vals:
            raise UserError(f"--token-ids file {spec} holds no ids")
    else:
        integral = isinstance(spec, np.ndarray) and spec.dtype.kind in "iu"  # the common form, checked at once
        vals = spec.ravel().tolist() if integral else [_as_id(v, i) for i, v in enumerate(spec)]
        where = [""] * len(vals)
    bad = [i for i, v in enumerate(vals) if not 0 <= v < n_vocab]  # Python ints: no int64 overflow before the check
    if bad:
        v = vals[bad[0]]
        shown = v if abs(v) < 10**30 else f"of {abs(v).bit_length()} bits"
        raise UserError(f"{where[bad[0]]}token id {shown} is outside the vocabulary 0:{n_vocab} ({len(bad)} such ids): "
                        f"give ids from 0 to {n_vocab - 1}")
    ids, counts = np.unique(np.array(vals, dtype=np.int64), return_counts=True)
    if (counts > 1).any():  # said, as repeated text candidates are: a file of 7 ids that scores 5 is not silent
        rep = ids[counts > 1]
        shown = ", ".join(map(str, rep[:5])) + (" …" if rep.size > 5 else "")
        warnings.warn(UserNote(f"rmfast: {spec if isinstance(spec, str) else '--token-ids'}: {int((counts - 1).sum())} "
                               f"repeated id(s) scored once ({shown})"), stacklevel=2)
    return ids


def select_ids(model, tokenizer, token_ids=None, *, exclude_special: bool = False, wordlike: bool = False,
               dedup: bool = False) -> tuple[np.ndarray, int, dict]:
    """Candidate ids of a model's vocabulary view (sorted, unique), the vocabulary size they were
    checked against, and what each filter dropped (:func:`vocab_ids`)."""
    n_vocab = vocab_size(model, tokenizer)
    ids, report = vocab_ids(tokenizer, n_vocab, token_ids=token_ids, exclude_special=exclude_special,
                            wordlike=wordlike, dedup=dedup)
    return ids, n_vocab, report


def decoded(tokenizer, ids) -> list[str]:
    """Each id decoded alone, as a user sees it (special tokens kept, no clean-up): what
    ``tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)``
    returns. A fast tokenizer whose decoding is transformers' own goes straight to its Rust ``decode_batch``
    (the same call per id that transformers' ``_decode`` makes, without its per-id Python conversions: a whole
    128,256-token vocabulary took 1.7 s through ``batch_decode`` on a 2-core EPYC and 0.3 s this way).
    """
    rows = [[i] for i in (ids.tolist() if hasattr(ids, "tolist") else map(int, ids))]  # Python ints (numpy's: slow)
    if _plain_fast_decode(tokenizer):
        return tokenizer.backend_tokenizer.decode_batch(rows, skip_special_tokens=False)
    return tokenizer.batch_decode(rows, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def id_labels(tokenizer, ids) -> tuple[list[str], list[str]]:
    """Each id's raw vocabulary piece (``convert_ids_to_tokens``; "" where it has none) and its text
    (:func:`decoded`): a token scan's ``tokens`` and ``texts`` columns.

    >>> from transformers import PreTrainedTokenizerFast
    >>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    >>> t = Tokenizer(models.WordLevel({"a": 0, "Ġb": 1, "[UNK]": 2}, unk_token="[UNK]"))
    >>> t.pre_tokenizer, t.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
    >>> id_labels(PreTrainedTokenizerFast(tokenizer_object=t), [1, 0])
    (['Ġb', 'a'], [' b', 'a'])
    """
    ids = ids.tolist() if hasattr(ids, "tolist") else list(map(int, ids))
    tokens = [t if isinstance(t, str) else "" for t in tokenizer.convert_ids_to_tokens(ids)]
    return tokens, decoded(tokenizer, ids)


class HostWork:
    """A token scan's host-only work on its ids (the vocabulary's hash, each id's piece and text). With ``overlap``
    (the plan's "host_overlap": on a GPU) the hash, pieces and texts run on a host thread from :meth:`start` on, which the
    scan calls once its first batch is on the device: the GPU is then busy and the scan's host thread waits in a
    sync with the GIL released. Started before, beside the prompt's pass, the thread held the GIL while the pass
    launched its kernels and slowed it by the whole of its own time (a launch-bound pass hands the GIL over on each
    kernel and waits a switch interval to get it back: 0.55 s of set-up for a 69-token prompt on the H100, 2026-11-27).
    Whatever is asked for before the thread has it runs in turn (a text scan takes the hash in turn).
    Each result is the same either way; an error in the thread is raised where its result is taken.

    >>> class Tok:
    ...     def get_vocab(self): return {"a": 0, "b": 1}
    ...     def convert_ids_to_tokens(self, ids): return ["ab"[i] for i in ids]
    ...     def batch_decode(self, rows, **kw): return ["ab"[r[0]] for r in rows]
    >>> w = HostWork(Tok(), [1, 0], overlap=True)
    >>> w.vocab_sha256() == vocab_sha256(Tok())  # in turn: asked for before start()
    True
    >>> w.start(); w.labels()
    (['b', 'a'], ['b', 'a'])
    """

    def __init__(self, tokenizer, ids, overlap: bool):
        # result -> how it is made (one table: the thread's order, and the fallback in turn)
        self._work = {"sha": lambda: vocab_sha256(tokenizer), "labels": lambda: id_labels(tokenizer, ids)}
        self.waited_s: dict[str, float] = {}  # result -> seconds its caller waited for it (in turn: all its time)
        self._out: dict = {}
        self._overlap = overlap
        self._thread = None

    def start(self) -> None:
        """The work not yet done, on a host thread (with ``overlap``; once; else nothing)."""
        import threading

        if self._overlap and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rmfast-host-work", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        for name, fn in list(self._work.items()):
            if name in self._out:  # taken in turn before the thread started
                continue
            try:
                self._out[name] = (fn(), None)
            except BaseException as e:  # raised in the caller's thread, where the result is taken
                self._out[name] = (None, e)
                return

    def _take(self, name: str):
        import time

        fn, t0 = self._work[name], time.perf_counter()
        if self._thread is None:  # in turn (no overlap, or asked for before start)
            if name not in self._out:
                self._out[name] = (fn(), None)
        else:
            while name not in self._out and self._thread.is_alive():
                self._thread.join(0.01)
            if name not in self._out:  # the thread stopped at an earlier error
                return fn()
        self.waited_s[name] = round(time.perf_counter() - t0, 3)
        value, err = self._out[name]
        if err is not None:
            raise err
        return value

    def vocab_sha256(self) -> str:
        """:func:`vocab_sha256` of the tokenizer."""
        return self._take("sha")

    def labels(self) -> tuple[list[str], list[str]]:
        """:func:`id_labels` of the ids."""
        return self._take("labels")


def _plain_fast_decode(tokenizer) -> bool:
    """Whether ``tokenizer`` decodes as transformers' fast tokenizer does, unchanged: its ``_decode``, ``decode`` and
    ``batch_decode`` are the library's own (a subclass that rewrites the text keeps its own path)."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or not hasattr(tokenizer, "backend_tokenizer"):
        return False
    cls = type(tokenizer)
    return all(getattr(cls, m, None) is getattr(PreTrainedTokenizerFast, m, None) for m in ("_decode", "decode", "batch_decode"))


def is_wordlike(text: str) -> bool:
    """Letters only, after stripping the leading-space marker (one leading space once decoded).

    >>> [is_wordlike(t) for t in [" love", "love", "Ünïcödé", " 42", "don't", "  two", ""]]
    [True, True, True, False, False, False, False]
    """
    s = text[1:] if text.startswith(" ") else text
    return bool(s) and s.isalpha()


def ids_asked(token_ids, n: int = 0):
    """The ids a job was asked for, as its manifest records them: ``all``, the range ``A:B``, a file (path and
    sha256) or, for ids given in code, their count ``n``.

    >>> ids_asked(None), ids_asked("0:100"), ids_asked([3, 1], 2)
    ('all', '0:100', '2 ids given')
    """
    if token_ids is None:
        return "all"
    if isinstance(token_ids, str):
        p = Path(token_ids)
        return {"file": str(p.resolve()), "sha256": file_sha256(p)} if p.is_file() else token_ids
    return f"{n} ids given"


def vocab_ids(tokenizer, n_vocab: int, *, token_ids=None, exclude_special: bool = False, wordlike: bool = False,
              dedup: bool = False) -> tuple[np.ndarray, dict]:
    """Vocabulary ids of a view, ascending, and a report of what each filter dropped.

    Args:
        tokenizer, n_vocab: the model's tokenizer and the ids both it and the embeddings know.
        token_ids: start from a subset (range "A:B", a file, or ids; default all).
        exclude_special: drop special, reserved and added tokens.
        wordlike: keep tokens that decode to letters only after stripping one leading space (the
            decoded leading-space marker: GPT-2's "Ġ", SentencePiece's "▁").
        dedup: the papers' de-duplication: decode the (remaining) ids and drop EVERY id whose string
            occurs more than once among them (exact decoded text; byte-fallback pieces that all decode
            to "\\ufffd" go this way).
    """
    ids = parse_token_ids(token_ids, n_vocab)
    report = {"token_ids": ids_asked(token_ids, int(ids.size)), "n_start": int(ids.size), "exclude_special": exclude_special,
              "wordlike": wordlike, "dedup": dedup}
    if exclude_special:
        sp = np.fromiter(special_ids(tokenizer), dtype=np.int64)
        keep = ~np.isin(ids, sp)
        report["dropped_special"] = int((~keep).sum())
        ids = ids[keep]
    texts = decoded(tokenizer, ids) if (wordlike or dedup) and ids.size else []
    if wordlike:
        keep = np.array([is_wordlike(t) for t in texts], dtype=bool)
        report["dropped_not_wordlike"] = int((~keep).sum())
        ids = ids[keep]
        texts = [t for t, k in zip(texts, keep) if k]
    if dedup:
        counts = Counter(texts)
        keep = np.array([counts[t] == 1 for t in texts], dtype=bool)
        report["dropped_duplicate_text"] = int((~keep).sum())
        report["duplicate_strings"] = sum(1 for c in counts.values() if c > 1)
        ids = ids[keep]
    report["n_ids"] = int(ids.size)
    if ids.size == 0:
        if report["n_start"] == 0:
            raise UserError("no candidate ids to score: --token-ids selects none (an empty view); give a non-empty range, "
                        "file or list")
        dropped = [f"{flag} dropped {report[k]}" for flag, k in (("--exclude-special", "dropped_special"),
                   ("--wordlike", "dropped_not_wordlike"), ("--dedup", "dropped_duplicate_text")) if report.get(k)]
        raise UserError(f"no candidate ids left to score: the view is empty (of the {report['n_start']} ids asked, "
                        f"{', '.join(dropped)}); drop a filter or give other --token-ids")
    return ids, report


# --------------------------------------------------------------------------------------------
# text candidates: read from files, tokenized in context


DEFAULT_MAX_TOKENS = 256  # response tokens per candidate; --max-tokens raises it
from .options import COMPAT_MODES  # noqa: E402  (its one definition)
#: rows padded together per reward model in the published scoring loop (paper A's config/reward_models.yaml);
#: ``--compat authors`` with ``--batch-size auto`` uses these, and AUTHORS_BATCH_SIZE for any other model.

# --------------------------------------------------------------------------------------------
# tokenization in context


@dataclass
class Row:
    ids: list[int]  # response ids (between the prefix and the suffix)
    template: object = None  # None: the shared template; else a per-row Template (compat rows that do not split)


def _compat_row(tmpl, full: list[int], head: str) -> Row:
    """A decode-retokenize row: the whole re-tokenized conversation, split where it can be."""
    from ..template import Template, common_prefix_len

    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    if tuple(full[:P]) == tmpl.prefix_ids and (not S or tuple(full[len(full) - S:]) == tmpl.suffix_ids) and len(full) > P + S:
        return Row(full[P:len(full) - S])
    if S and full == [*tmpl.prefix_ids, *tmpl.suffix_ids]:
        # the template renders the response as nothing (a <think> block it drops): the end of turn is the row, the
        # sequence unchanged (the log-prob head scored the ids after the end of turn too)
        k = max(1, tmpl.n_continuation)
        return Row(full[P:P + k], Template(prefix_ids=tmpl.prefix_ids, suffix_ids=tuple(full[P + k:]), n_continuation=0,
                                           prompt=tmpl.prompt, system=tmpl.system, kind=tmpl.kind, format=tmpl.format,
                                           history=tmpl.history))
    # The response merged with its surroundings (e.g. "\t" after the header's "\n"): score the
    # whole sequence on the plain-HF path, split where it leaves the template's prefix and where
    # the template's suffix starts. Score head: final position of the whole sequence. Logprob
    # head: every token from the split up to the end of the end-of-turn continuation.
    p = common_prefix_len([list(tmpl.prefix_ids), full])
    has_suffix = bool(S) and len(full) - S > p and tuple(full[len(full) - S:]) == tmpl.suffix_ids
    e = len(full) - S if has_suffix else len(full)
    p = max(1, min(p, e - 1))
    t = Template(prefix_ids=tuple(full[:p]), suffix_ids=tuple(full[e:]),
                 n_continuation=tmpl.n_continuation if has_suffix else 0, prompt=tmpl.prompt,
                 system=tmpl.system, kind=tmpl.kind, format=tmpl.format, history=tmpl.history)
    return Row(full[p:e], t)


def _not_its_own(tokenizer, tmpl, text: str) -> str:
    """Why a response has no ids of its own in context, in words: the template renders it as nothing (a <think>
    block it drops), or it merges with the template's ids around it."""
    from ..template import renderer

    _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
    if list(render([text])[0]) == [*tmpl.prefix_ids, *tmpl.suffix_ids]:
        return "is rendered as nothing by the chat template (it drops the text), so there is no response to score"
    return "merges with the template around it when tokenized in context, so its ids are not its own"


def tokenize_in_context(tokenizer, tmpl, texts: list[str], *, compat: str | None = None, head: str = "score") -> list[Row]:
    """Response ids of each text as the chat template tokenizes it in context (linear in the texts)."""
    from ..template import renderer, responses_ids

    if compat is None:
        rows = []
        for i, (t, ids) in enumerate(zip(texts, responses_ids(tokenizer, tmpl, texts))):  # one tokenizer batch
            if ids is None:
                raise MergesWithTemplate(f"candidate {i + 1} {t[:40]!r} {_not_its_own(tokenizer, tmpl, t)}; drop it, or "
                                         "score the whole re-tokenized conversation with --compat decode-retokenize")
            rows.append(Row(ids))
        return rows
    _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
    return [_compat_row(tmpl, ids, head) for ids in render(list(texts))]  # authors rows: the same response ids


def tokenize_rows(tokenizer, rows, tmpls, *, compat: str | None = None, head: str = "score",
                  long_ok: bool = False) -> list[Row | None]:
    """:func:`tokenize_in_context` of a job's rows, ``(conversation number, text, i, j)`` each (response j of
    input conversation i), a conversation's texts in one batch; a text that merges with the template around
    it is named by response and conversation (its conversation's texts re-tried one by one to find it)."""
    by_conv: dict = {}
    for k, (ci, *_) in enumerate(rows):
        by_conv.setdefault(ci, []).append(k)
    got: list = [None] * len(rows)
    for ci, ks in by_conv.items():
        try:
            batch = tokenize_in_context(tokenizer, tmpls[ci], [rows[k][1] for k in ks], compat=compat, head=head)
        except UserError:
            batch = [_one_row(tokenizer, rows[k], tmpls, compat, head, long_ok) for k in ks]  # raises, naming it
        for k, row in zip(ks, batch):
            got[k] = row
    return got


def _one_row(tokenizer, r, tmpls, compat: str | None, head: str, long_ok: bool = False) -> Row | None:
    from ..template import RENDER_CHARS

    ci, text, i, j = r
    try:
        (row,) = tokenize_in_context(tokenizer, tmpls[ci], [text], compat=compat, head=head)
    except MergesWithTemplate:
        raise UserError(f"response {j} of conversation {i} ({text[:40]!r}) {_not_its_own(tokenizer, tmpls[ci], text)}; "
                        "drop it, or score the whole re-tokenized conversation with compat='decode-retokenize'") from None
    except UserError as e:  # the template's renderer refused it (its size bound): named, never called a merge
        if len(text) > RENDER_CHARS:
            if long_ok:
                return None
            raise TooLong(f"response {j} of conversation {i} is {len(text):,} characters: over the chat template "
                          f"renderer's limit of {RENDER_CHARS:,} (and far past the model's positions); shorten it") from None
        raise UserError(f"response {j} of conversation {i}: {e.cli_message()}") from None
    return row


# --------------------------------------------------------------------------------------------
# the authors' scoring loop (compat="authors")


def render_text(tokenizer, tmpl, response: str) -> str:
    """The conversation as TEXT, as the published loop renders it (``apply_chat_template(tokenize=False)``,
    no generation prompt; a plain format filled in). Re-tokenizing it adds the tokenizer's specials.

    Example:
        >>> render_text(tok, tmpl, "love")  # doctest: +SKIP
        '<|im_start|>system\\n...<|im_start|>assistant\\nlove<|im_end|>\\n'
    """
    from ..template import is_plain_format

    fmt = tmpl.format
    if fmt is not None and is_plain_format(fmt):
        return fmt.replace("{system}", tmpl.system or "").replace("{prompt}", tmpl.prompt).replace("{response}", response)
    messages = ([{"role": "system", "content": tmpl.system}] if tmpl.system is not None else []) + [
        {"role": "user", "content": tmpl.prompt}, {"role": "assistant", "content": response}]
    return tokenizer.apply_chat_template(messages, chat_template=fmt, tokenize=False)



def tokenizer_order(tokenizer) -> dict[int, int]:
    """Position of each id in the published loop's vocabulary order (``sorted(get_vocab().items(), by id)``)."""
    return {i: k for k, i in enumerate(sorted(set(int(v) for v in tokenizer.get_vocab().values())))}



def ids_digest(rows: list[Row]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(np.asarray(r.ids, dtype=np.int64).tobytes())
        h.update(b"|" if r.template is None else b"#" + np.asarray(r.template.prefix_ids, dtype=np.int64).tobytes())
    return h.hexdigest()


class MergesWithTemplate(UserError):
    """A text whose ids, tokenized in context, are not its own (it merges with the template around it)."""


class TooLong(UserError):
    """A sequence longer than the model's positions (or a scorer's ``max_tokens``): a UserError that a caller who
    must not stop on one input (the GRPO adapter) can tell from the rest."""


def max_positions(model) -> int | None:
    """The model's context length (``max_position_embeddings`` of its text config), None if it has none."""
    n = getattr(text_config(model.config), "max_position_embeddings", None)
    return None if n is None else int(n)


def max_response_len(model, tmpl) -> int | None:
    n = max_positions(model)
    return None if n is None else n - len(tmpl.prefix_ids) - len(tmpl.suffix_ids)


def check_embedded(model, *id_lists, what: str = "the prompt's tokens") -> None:
    """UserError where the prompt side's (or template's) ids go past the model's embedding rows: a tokenizer that is
    not the model's (its ids reach past the vocabulary the model was built with). It had been an IndexError traceback
    from inside the embedding, after the forward started.

    >>> import torch
    >>> m = torch.nn.Module(); m.get_input_embeddings = lambda: torch.nn.Embedding(10, 2)
    >>> check_embedded(m, [1, 2], [9])
    >>> check_embedded(m, [1, 12])
    Traceback (most recent call last):
    rmfast.errors.UserError: the prompt's tokens go up to id 12, but the model embeds only ids 0..9: the tokenizer is not this model's (give the model's own, or the model it belongs to)
    """
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    n = getattr(emb, "num_embeddings", None)
    top = max((int(i) for ids in id_lists for i in ids), default=-1)
    if n is not None and top >= n:
        raise UserError(f"{what} go up to id {top}, but the model embeds only ids 0..{n - 1}: the tokenizer "
                        "is not this model's (give the model's own, or the model it belongs to)")


def check_context(model, n_prefix: int, n_response: int = 1, n_suffix: int = 0) -> None:
    """UserError unless prompt side + response + suffix fit the model's positions.

    A longer sequence would be scored silently past the positions the model was trained on (or
    fail inside attention); scan, text scans, logprobs, GCG, implicit and sweeps all call this.

    >>> from types import SimpleNamespace
    >>> m = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    >>> check_context(m, 500, 1, 5)
    >>> check_context(m, 4031, 1, 5)
    Traceback (most recent call last):
    rmfast.scoring.candidates.TooLong: the sequence is 4031 prompt + 1 response + 5 suffix = 4037 tokens, over the model's 512 positions (max_position_embeddings): shorten prompt, system or template
    """
    limit = max_positions(model)
    total = n_prefix + n_response + n_suffix
    if limit is not None and total > limit:
        raise TooLong(f"the sequence is {n_prefix} prompt + {n_response} response + {n_suffix} suffix = {total} tokens, "
                        f"over the model's {limit} positions (max_position_embeddings): shorten --prompt, --system "
                        "or --template")
