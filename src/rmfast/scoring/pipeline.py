"""The one scan pipeline: candidates in, scores out, through one resumable batching loop.

What is scored is an input (:class:`Selection`): vocabulary ids (a range, a file, the papers'
views), response texts, or the papers' decode-retokenize round trip. :func:`run_scan` picks the
entry point for it; :func:`scan` (token ids) and :func:`score_texts` (texts) turn it into
*groups* of equal-length rows, and :func:`score_groups` runs every group through the same loop:
fixed batches, out-of-memory back-off (:func:`oom_batches`), a checkpoint that a rerun resumes
from, a progress bar, timing. The CLI, sweeps, torchrun shards and GCG's evaluator all come
through here.

Example:
    >>> import rmfast  # doctest: +SKIP
    >>> lm = rmfast.load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = run_scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?",
    ...                Selection(token_ids="0:500", wordlike=True))  # doctest: +SKIP
    >>> res.top(3)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .text_checks import check_lengths, check_texts, texts_manifest
from .candidates import (COMPAT_MODES, DEFAULT_MAX_TOKENS, HostWork, check_context, check_embedded, ids_digest, max_response_len, select_ids,
                         tokenize_in_context, vocab_sha256)
from ..cpu import say_choice
from ..errors import UserError
from .batching import Group, count_nonfinite, drop_checkpoint, score_groups, warn_constant
from .decisions import decide
from .model_mode import scoring_mode
from .compat import (authors_batch_size, authors_diagnostics, authors_groups, authors_manifest, authors_plan,
                     check_authors)
from .audit import DEFAULT_AUDIT_N, DEFAULT_AUDIT_SEED, LOW_PRECISION, audit_bf16
from .options import ScoringOptions
from .plan import ScoringPlan, finish_manifest, lens_names, plan_scoring, run_fields, run_key
from ..states import ByLayer
from ..states import DTYPES, StatesWriter, parse_layers
from .states_stream import BackgroundWriter
from .results import ScanResult, TextScanResult
from ..template import Template, build_template

# --------------------------------------------------------------------------------------------
# hidden states and the reward lens, from the scan's own forward


@dataclass
class StatesRequest:
    """Which hidden states a scan keeps, and where they go (docs/representations.md).

    Attributes:
        layers: "0,8,last_prenorm", "all", or a list of names (:func:`rmfast.states.parse_layers`).
        dtype: "float32", "bfloat16" or "float16"; None (default): the model's dtype.
        folder: write a states folder there (``<out stem>.states``), streaming and resumable with
            the scan's checkpoint; None: no files.
        sink: ``sink(keys, {name: (b, d) tensor})`` per batch (keys: (b,) token ids, or row numbers
            of a text scan), in the order batches are scored; a resumed scan hands it only the rows
            it scores itself. Either or both of folder and sink.
        overwrite: replace an existing folder.
        background: write the folder's shards in a thread while the next batches compute (default;
            :class:`rmfast.scoring.states_stream.BackgroundWriter`); False: in the scan's thread (the reference).
        row_keys: text scans: the key stored for the job's row r is ``row_keys[r]`` (set by :func:`run_scan`
            for a share of the candidates: their rows in the whole scan, so the ranks' states join).
    """

    layers: object = "last_prenorm"
    dtype: str | None = None
    folder: str | os.PathLike | None = None
    sink: Callable | None = None
    overwrite: bool = False
    row_keys: np.ndarray | None = None
    background: bool = True


class _StatesOut:
    """What :func:`score_groups` feeds: the writer (if a folder) and the sink (if any)."""

    def __init__(self, req: StatesRequest, layers: list[str], dtype: str, key: str, job: str):
        self.req, self.layers, self.dtype = req, layers, getattr(torch, dtype)
        self.key_map = req.row_keys if key == "row" else None
        self.writer = (StatesWriter(req.folder, layers, dtype, key, job, overwrite=req.overwrite)
                       if req.folder is not None else None)
        if self.writer is not None and req.background:
            self.writer = BackgroundWriter(self.writer)

    def prepare(self, done):
        return done if self.writer is None else self.writer.prepare(done)

    def add(self, rows, keys, states):
        if self.key_map is not None:
            keys = np.asarray(self.key_map, dtype=np.int64)[np.asarray(keys)]
        if self.writer is not None:
            self.writer.add(rows, keys, states)
        if self.req.sink is not None:
            self.req.sink(np.asarray(keys), ByLayer({l: states[l].to(self.dtype) for l in self.layers}))

    def flush(self):
        if self.writer is not None:
            self.writer.flush()

    def drain(self):
        if isinstance(self.writer, BackgroundWriter):
            self.writer.drain()


def _states_setup(req: StatesRequest | None, lens: bool, plan: ScoringPlan, key: str, job: str):
    """(layer names or None, the states output or None) for a job; UserErrors before any work."""
    plan.check_states(lens, req is not None)
    if req is None:
        return None, None
    dtype = req.dtype or str(next(plan.model.parameters()).dtype).replace("torch.", "")
    if dtype not in DTYPES:
        raise UserError(f"--states-dtype {dtype}: give one of {', '.join(DTYPES)}")
    layers = parse_layers(req.layers, plan.n_layers)
    return layers, _StatesOut(req, layers, dtype, key, job)


def _finish_states(res, out: _StatesOut | None, tokenizer, keep: bool, lens, n_layers: int):
    """Record states and lens in the result; write the states manifest unless the caller will
    (``keep``: the CLI, once the scan Parquet is written: :func:`finish_states`)."""
    if lens is not None:
        res.columns.update({f"lens_{n}": lens[:, i] for i, n in enumerate(lens_names(n_layers))})
        res.manifest["lens"] = {"layers": lens_names(n_layers), "columns": "lens_<layer>",
                                "what": "the row head through the final norm at each residual-stream index"}
    res.states_writer = None
    if out is None:
        return res
    m = res.manifest
    res.manifest["states"] = {"layers": out.layers, "dtype": str(out.dtype).replace("torch.", ""),
                              "folder": None if out.writer is None else out.writer.folder.name}
    if isinstance(out.writer, BackgroundWriter):  # how long the scan waited on the disk (drained by score_groups)
        res.manifest["states"]["writer"] = out.writer.stats()
    res.states_scan = {k: m.get(k) for k in ("model", "prompt", "head", "head_index", "dtype", "engine", "device")}
    res.states_scan["tokenizer"] = getattr(tokenizer, "name_or_path", None)
    res.states_scan["vocab_sha256"] = m.get("vocab_sha256")  # what the states join compares (not the path)
    res.states_writer = out.writer
    if out.writer is not None and not keep:
        finish_states(res)
    return res


def finish_states(res):
    """Write the states manifest and move the folder into place (after the scan's own output). The manifest
    names its scan (:func:`rmfast.states.tie.scan_tie`: the write id of the Parquet just written, model, prompt,
    candidate count), which every reader checks (:func:`rmfast.states.open_states`)."""
    from ..states.tie import scan_tie

    if getattr(res, "states_writer", None) is not None:
        res.states_writer.finish({**res.states_scan, **scan_tie(res.manifest)})
        res.states_writer = None
    return res


# --------------------------------------------------------------------------------------------
# token scans


def scan(
    model,
    tokenizer,
    prompt: str,
    *,
    head: str = "auto",
    head_index: int = 0,
    template: str | Template | None = None,
    system: str | None = None,
    token_ids=None,
    exclude_special: bool = False,
    wordlike: bool = False,
    dedup: bool = False,
    batch_size: int | str = "auto",
    engine: str = "auto",
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    model_info: dict | None = None,
    compile: str | bool = "auto",
    keep_checkpoint: bool = False,
    states: StatesRequest | None = None,
    lens: bool = False,
    options: ScoringOptions | None = None,
) -> ScanResult:
    """Score candidate token ids as the one-token assistant response to ``prompt``.

    Args:
        model: an HF model (``…ForSequenceClassification``, a custom reward model, or a causal LM), in any mode:
            the call scores in eval mode with autocast off, and the model's own mode is back after it
            (:func:`rmfast.scoring.model_mode.scoring_mode`).
        tokenizer: its tokenizer.
        prompt: the user turn.
        head: "auto" (default: "score" for classifiers, "logprob" for causal LMs), "score" or "logprob".
        head_index: which output of a multi-output score head (default 0).
        template: None (the tokenizer's chat template), a Jinja template, a plain format such as
            ``"User: {prompt}\\nAssistant: {response}"``, or a prepared :class:`Template`.
        system: system message (default None: the template's own default, if any).
        token_ids: None (every id of the vocabulary, default), a range "A:B", a file path, or ids.
        exclude_special: drop special / added tokens (default False: they are scored too).
        wordlike, dedup: the papers' vocabulary views (:func:`rmfast.scoring.candidates.vocab_ids`; default off).
        batch_size: "auto" (default) or rows per batch. On CUDA out-of-memory the batch is halved and retried.
        engine: "auto" (default: the shared-prompt engine where the architecture is supported, else
            the plain-HF path with a warning), "fast" or "hf" (the plain-HF path; "reference": its old name).
        progress: show a progress bar with candidates/s (default True).
        checkpoint: optional path; finished batches are saved there (atomically) and a rerun with
            the same settings resumes from it, bit-identically.
        model_info: provenance for the manifest (the loader's ``source``); default: config name.
        compile: "auto" (default: the compiled layer on the CPU kinds where it was measured to pay,
            :data:`rmfast.scoring.plan.COMPILE_CPU_KINDS`, else eager; the same for every job, so a token's
            score never depends on the job's size), "on" (torch.compile the CPU decoder layer: a one-off compile of seconds;
            see :mod:`rmfast.scoring.plan`) or "off".
        keep_checkpoint: leave the checkpoint for the caller to remove once the output is written
            (:func:`drop_checkpoint`; the CLI does this); default False removes it on return.
        states: keep each candidate's hidden states from this same forward (:class:`StatesRequest`).
        lens: add the reward lens, ``lens_<layer>`` columns (score head only).
        options: the scoring options as one value (:class:`rmfast.scoring.options.ScoringOptions`); the keyword
            options above that differ from their defaults are applied on top of it.

    Returns:
        ScanResult with scores for the selected ids, ascending by id.

    Example:
        >>> from rmfast import load, scan  # doctest: +SKIP
        >>> lm = load("smollm2-135m-instruct")  # doctest: +SKIP
        >>> res = scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?", token_ids="0:500")  # doctest: +SKIP
        >>> res.top(3)  # doctest: +SKIP
    """
    ids, n_vocab, view = select_ids(model, tokenizer, token_ids, exclude_special=exclude_special, wordlike=wordlike,
                                    dedup=dedup)
    opts = ScoringOptions.of_changed(options, head=head, head_index=head_index, batch_size=batch_size, engine=engine, compile=compile)
    res = score_ids(model, tokenizer, prompt, ids, opts, template=template, system=system, progress=progress,
                    checkpoint=checkpoint, model_info=model_info, keep_checkpoint=keep_checkpoint, vocab_size=n_vocab,
                    states=states, lens=lens)
    res.manifest["exclude_special"] = exclude_special
    if wordlike or dedup:
        res.manifest["vocab_view"] = view
    return res


def score_ids(model, tokenizer, prompt: str, ids: np.ndarray, options: ScoringOptions | None = None, *,
              template=None, system: str | None = None, progress: bool = True, checkpoint=None,
              model_info: dict | None = None, keep_checkpoint: bool = False, vocab_size: int | None = None,
              states: StatesRequest | None = None, lens: bool = False, job: str = "scan", **option_kw) -> ScanResult:
    """Score vocabulary ids already selected (:func:`rmfast.scoring.candidates.select_ids`), one token each: the
    body of :func:`scan` (same options, passed whole as ``options``; ``option_kw``: the keyword form), called
    once per job by :func:`run_scan`. ``job``: the plan's job kind (a sweep part says "sweep")."""
    t0 = time.perf_counter()
    options = ScoringOptions.of(options, **option_kw)
    tmpl = template if isinstance(template, Template) else build_template(tokenizer, prompt, template=template, system=system)
    check_context(model, len(tmpl.prefix_ids), 1, len(tmpl.suffix_ids))
    check_embedded(model, tmpl.prefix_ids, tmpl.suffix_ids)  # (the candidates: select_ids checks them)
    decided = decide(model, options, job, template=tmpl, response_tokens=1, stacklevel=4)
    host = HostWork(tokenizer, ids, decided.host_overlap)  # the hash, pieces, texts: beside the scan, from its first batch
    t_plan = time.perf_counter()
    plan = plan_scoring(model, tmpl, options, job=job, decided=decided)
    plan_s = time.perf_counter() - t_plan  # the engine's set-up and the prompt's pass: most of setup_s
    plan.one_batch_of_its_own(ids.size, plan.rows_per_batch(1))  # before the manifest, which says fixed_shapes
    manifest = plan.manifest(prompt, model_info)
    # the vocabulary's hash is not in the run key (RUN_FIELDS): taken after the scan, from the host thread that
    # made it beside the scan (a 128k vocabulary's hash was ~0.3 s of the scan's set-up, waited for before it)
    manifest.update({"vocab_size": vocab_size, "n_candidates": int(ids.size)})
    layers, st_out = _states_setup(states, lens, plan, "token_id", run_key(manifest))

    def score(rows, b):  # rows of the job -> their (len(rows),) scores (or Scored), in batches of b rows
        return plan.score(torch.from_numpy(ids[rows])[:, None], b, states=layers, lens=lens, on_launched=host.start)

    group = Group(np.arange(ids.size), plan.rows_per_batch(1), score)
    say_choice(model)  # the work starts: every check of the input is behind us
    t_scan = time.perf_counter()
    with scoring_mode(model):  # eval mode and no caller's autocast for the whole job (each batch's own is then cheap)
        scores, timing = score_groups([group], ids, key=run_key(manifest), checkpoint=checkpoint,
                                      device=plan.device, progress=progress, desc="scan",
                                      status="compiling the CPU layer (one-off)" if plan.compile else None,
                                      keep_checkpoint=keep_checkpoint, job=run_fields(manifest), states_out=st_out,
                                      lens_k=plan.n_layers + 1 if lens else 0, extra=(extra := {}))
    manifest["n_nonfinite"] = count_nonfinite(scores, ids, "token ids", dtype=manifest.get("dtype"))
    warn_constant(scores, "token ids")
    manifest["vocab_sha256"] = host.vocab_sha256()
    tokens, texts = host.labels()
    timing["setup_s"], timing["labels_wait_s"] = round(t_scan - t0, 3), host.waited_s["labels"]  # after the scan
    timing["plan_s"] = round(plan_s, 3)
    # the decisions as they ran (a compile that failed falls back to the eager layer and its attention form)
    finish_manifest(manifest, t0, plan=plan, options=options, timing=timing, batch_size=group.batch_size,
                    compiled=bool(plan.eng is not None and plan.eng.compile), tokens_per_row=plan.tokens_per_row(1))
    res = _finish_states(ScanResult(ids, scores, tokens, texts, manifest), st_out, tokenizer, keep_checkpoint,
                         extra.get("lens"), plan.n_layers)
    return res if keep_checkpoint else drop_checkpoint(res, checkpoint)


# --------------------------------------------------------------------------------------------
# text candidates


def _text_groups(rows, plan: ScoringPlan, layers=None, lens: bool = False) -> list[Group]:
    """One group per response length on the shared template; one per row that did not split (it
    carries its own template and runs the plain-HF path)."""
    by_shape: dict = {}
    for i, r in enumerate(rows):
        by_shape.setdefault((len(r.ids), None) if r.template is None else (len(r.ids), i), []).append(i)
    groups = []
    for (n, odd), idx in sorted(by_shape.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
        row_t = None if odd is None else rows[odd].template

        def score(sel, b, row_t=row_t):
            return plan.score([rows[j].ids for j in sel], b, row_t, states=layers, lens=lens)

        groups.append(Group(np.asarray(idx, dtype=np.int64), plan.rows_per_batch(n, row_t), score))
    return groups






def score_texts(
    model,
    tokenizer,
    prompt: str,
    texts,
    options: ScoringOptions | None = None,
    *,
    template=None,
    system: str | None = None,
    progress: bool = True,
    model_info: dict | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    checkpoint: str | os.PathLike | None = None,
    source_ids=None,
    candidates_info: dict | None = None,
    keep_checkpoint: bool = False,
    states: StatesRequest | None = None,
    lens: bool = False,
    job: str = "texts",
    **option_kw,
) -> TextScanResult:
    """Score response texts (any number of tokens) as the assistant's answer to ``prompt``.

    Args:
        model, tokenizer: an HF reward model / causal LM (scored in eval mode, autocast off, as :func:`scan`) and its
            tokenizer.
        prompt: the user turn.
        texts: the candidates (strings). Exact duplicates are scored once (and reported).
        options: the scoring options, whole (:class:`rmfast.scoring.options.ScoringOptions`); ``option_kw``
            their keyword form (head, head_index, batch_size, engine, compile, compat, ...), applied on top.
        template, system, progress, checkpoint, keep_checkpoint: as for :func:`scan` (batch_size "auto" is chosen
            per response length; compile "auto" also needs few distinct lengths: each is one compiled graph).
        compat (an option): None (default: exact in-context ids; a text that merges with the template is an
            error), "decode-retokenize" (score whatever the re-tokenized conversation holds) or
            "authors" (the published loop, all its quirks: decode round trip, a second BOS, batches
            of ``batch_size`` padded together and read by the model's own pooling; ``batch_size``
            "auto" is the papers' size for their models, else 32; plain-HF path, score head only;
            ``manifest["compat_authors"]`` counts the double BOS and pad reads).
        model_info: provenance for the manifest (the loader's ``source``).
        max_tokens: longest response accepted, in tokens (default 256; also bounded by the
            model's position limit). A longer candidate is a UserError naming it.
        source_ids: vocabulary ids the texts came from (kept as ``token_id``; decode-retokenize scans).
        candidates_info: where the texts came from (file, column, sha256), for the manifest.
        states, lens: as for :func:`scan`; states are keyed by row (the result's row order).

    Returns:
        TextScanResult in input order (after de-duplication).
    """
    t0 = time.perf_counter()
    options = ScoringOptions.of(options, **option_kw)
    compat, batch_size = options.compat, options.batch_size
    texts, source_ids = check_texts(texts, source_ids, compat)
    tmpl = template if isinstance(template, Template) else build_template(tokenizer, prompt, template=template, system=system)
    check_context(model, len(tmpl.prefix_ids), 1, len(tmpl.suffix_ids))  # the prompt alone; each text below
    check_embedded(model, tmpl.prefix_ids, tmpl.suffix_ids)
    authors = compat == "authors"
    # Texts of many lengths would pad every length's batch to full size: their batches are as long as
    # the texts (a text's fp32 score may then differ in the last bits between jobs; docs/determinism.md):
    # the "texts" job's rule (rmfast.scoring.decisions.RAGGED_JOBS). --compat authors: the plain-HF path.
    plan = plan_scoring(model, tmpl, options, job=job, stacklevel=4)
    head = plan.head
    if authors:
        check_authors(head, options.engine)
    rows = tokenize_in_context(tokenizer, tmpl, texts, compat=compat, head=head)
    limit = check_lengths(rows, texts, model, tmpl, max_tokens)
    n_tok = np.array([len(r.ids) for r in rows], dtype=np.int64)
    n_odd = sum(r.template is not None for r in rows)
    manifest = plan.manifest(prompt, model_info)
    manifest.update(texts_manifest(rows, compat, source_ids, candidates_info, limit), vocab_sha256=vocab_sha256(tokenizer))
    if authors:
        bs_a, bs_from = authors_batch_size(batch_size, manifest["model"].get("name"))
        convs, where = authors_plan(tokenizer, tmpl, texts, source_ids, bs_a)
        manifest["compat_authors"] = authors_manifest(authors_diagnostics(model, tokenizer, convs, where), bs_a, bs_from,
                                                       source_ids)
    elif n_odd:
        warnings.warn(f"rmfast: {n_odd} candidate(s) merge with the template when re-tokenized; they are scored "
                      "as whole sequences on the plain Hugging Face path", stacklevel=2)
    if authors and (states is not None or lens):
        raise UserError("--states/--lens read the scan's own forward; --compat authors runs the published loop "
                        "(padded batches): not supported together")
    digest = ids_digest(rows)[:16]
    layers, st_out = _states_setup(states, lens, plan, "row", run_key(manifest) + digest)
    groups = (authors_groups(model, tokenizer, convs, where, options.head_index, plan.rows_run) if authors
              else _text_groups(rows, plan, layers, lens))
    compiled = bool(plan.eng is not None and plan.eng.compile)
    say_choice(model)
    with scoring_mode(model):
        scores, timing = score_groups(groups, np.arange(len(rows), dtype=np.int64), key=run_key(manifest) + digest,
                                      checkpoint=checkpoint, device=plan.device, progress=progress, desc="texts",
                                      keep_checkpoint=keep_checkpoint, job={**run_fields(manifest),
                                                                            "candidates": digest},
                                      states_out=st_out, lens_k=plan.n_layers + 1 if lens else 0, extra=(extra := {}))
    labels, what = (source_ids, "token ids") if source_ids is not None else (texts, "texts")
    manifest["n_nonfinite"] = count_nonfinite(scores, labels, what, dtype=manifest.get("dtype"))
    warn_constant(scores, what)
    finish_manifest(manifest, t0, plan=plan, options=options, timing=timing, batch_size=batch_size, compiled=compiled)
    res = TextScanResult(texts, scores, n_tok, [list(map(int, r.ids)) for r in rows], manifest, source_ids)
    res = _finish_states(res, st_out, tokenizer, keep_checkpoint, extra.get("lens"), plan.n_layers)
    return res if keep_checkpoint else drop_checkpoint(res, checkpoint)



def decode_retokenize_scan(model, tokenizer, prompt: str, ids, options: ScoringOptions | None = None,
                           **kw) -> TextScanResult:
    """The papers' vocabulary pipeline: ``tokenizer.decode([id])`` for each id, then score each string
    with the whole conversation re-tokenized (``compat="decode-retokenize"``, the default here, or
    ``compat="authors"``: their whole loop). Keyed by ``token_id``."""
    ids = np.asarray(ids, dtype=np.int64)
    texts = [tokenizer.decode([int(i)]) for i in ids]
    options = ScoringOptions.of(options, **{k: kw.pop(k) for k in list(kw) if k in ScoringOptions.__dataclass_fields__})
    if options.compat is None:
        options = options.replace(compat="decode-retokenize")
    return score_texts(model, tokenizer, prompt, texts, options, source_ids=ids, **kw)


# --------------------------------------------------------------------------------------------
# one entry point for every kind of candidate


@dataclass
class Selection:
    """What a scan scores. Vocabulary ids (default: all of them) unless ``texts`` is given.

    Attributes:
        token_ids: None (all), a range "A:B", a file of ids, or ids (vocabulary scans).
        exclude_special, wordlike, dedup: vocabulary views (:func:`rmfast.scoring.candidates.vocab_ids`).
        texts: response texts to score instead of vocabulary ids.
        texts_info: where the texts came from (file, column, sha256), for the manifest.
        compat: None, "decode-retokenize" (the papers' decode round trip) or "authors" (their whole
            scoring loop: :func:`score_texts`); vocabulary and texts alike.
        max_tokens: longest text candidate in tokens (default 256).
    """

    token_ids: object = None
    exclude_special: bool = False
    wordlike: bool = False
    dedup: bool = False
    texts: list[str] | None = None
    texts_info: dict | None = None
    compat: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS

    def check(self) -> None:
        if self.texts is not None:
            clash = [o for o, v in (("--token-ids", self.token_ids), ("--exclude-special", self.exclude_special),
                                    ("--wordlike", self.wordlike), ("--dedup", self.dedup)) if v]
            if clash:
                raise UserError(f"{clash[0]} selects vocabulary ids; it cannot be combined with --candidates (a file of texts)")
        if self.compat is not None and self.compat not in COMPAT_MODES:
            raise UserError(f"unknown --compat {self.compat!r}; use {', '.join(COMPAT_MODES)}")
        if self.max_tokens is None or int(self.max_tokens) < 1:
            raise UserError("--max-tokens must be a positive integer")

    def tag(self) -> str:
        """What distinguishes this selection in a default output name ('' for a plain vocabulary scan): its parts in
        words (the ids' range or file, the views, the compat mode; a texts file's name and column), at most 40
        characters, ending in a short hash of the whole selection where words alone could name two selections alike
        (a part cut off, a file's name that another folder's file shares). A subset's default name had been the
        whole vocabulary's, and cut names had collided.

        >>> Selection(token_ids="0:50").tag(), Selection(wordlike=True, compat="authors").tag(), Selection().tag()
        ('ids-0-50', 'wordlike-compat-authors', '')
        """
        from ..io import slug

        compat = {"authors": "compat-authors", "decode-retokenize": "decode-retokenize"}.get(self.compat or "", "")
        if self.texts_info and self.texts_info.get("path"):
            words, id_file = [Path(self.texts_info["path"]).stem, str(self.texts_info.get("column") or ""), compat], False
            exact = [str(Path(self.texts_info["path"]).resolve()), self.texts_info.get("column"), self.compat]
        else:
            words = [_ids_tag(self.token_ids)] + [name for name, on in (("no-special", self.exclude_special),
                                                                      ("wordlike", self.wordlike), ("dedup", self.dedup))
                                                  if on] + [compat]
            ids = self.token_ids
            id_file = isinstance(ids, str) and os.path.isfile(ids)
            exact = [str(Path(ids).resolve()) if id_file else _ids_tag(ids), self.exclude_special, self.wordlike,
                     self.dedup, self.compat]
        if not any(words):
            return ""
        full = slug("-".join(w for w in words if w), 1000)
        if len(full) <= 40 and not (self.texts_info or id_file):
            return full
        return f"{slug(full, 33)}-{hashlib.sha256(repr(exact).encode()).hexdigest()[:6]}"


def _ids_tag(token_ids) -> str:
    """--token-ids in a default output name: the range ("ids-0-50"; open ends as 0 and the vocabulary's end), the
    file's name, or the count of ids given.

    >>> _ids_tag("0:50"), _ids_tag(" :50"), _ids_tag("picked.txt"), _ids_tag([3, 4, 9]), _ids_tag(None)
    ('ids-0-50', 'ids-0-50', 'picked', '3-ids', '')
    """
    if token_ids is None:
        return ""
    if isinstance(token_ids, str):
        if ":" in token_ids and not os.path.exists(token_ids):
            lo, _, hi = token_ids.strip().partition(":")
            lo, hi = lo.strip().lstrip("0") or "0", hi.strip()
            return f"ids-{lo}-{(hi.lstrip('0') or '0') if hi else 'end'}"
        return Path(token_ids).stem
    return f"{len(list(token_ids))}-ids"


def run_scan(model, tokenizer, prompt: str, selection: Selection | None = None, options: ScoringOptions | None = None,
             *, rows=None, audit: int = DEFAULT_AUDIT_N, audit_seed: int = DEFAULT_AUDIT_SEED, **kw):
    """Score ``selection`` (default: the whole vocabulary) with :func:`score_ids` or :func:`score_texts`.

    ``options``: the scoring options, whole (:class:`rmfast.scoring.options.ScoringOptions`; the selection's
    ``compat`` is its own); ``kw``: the job's other arguments (template, system, progress, checkpoint,
    keep_checkpoint, model_info, states, lens, job; as for :func:`scan`) and, in the older keyword form,
    options (head, engine, ...) applied on top of ``options``.
    ``rows``: optional callable ``n -> positions`` taking this process's share of the candidates
    (:meth:`rmfast.sweep.dist.Dist.mine`).
    ``audit``: a bf16/fp16 scan rescores this many of its rows (seeded by ``audit_seed``) in fp32
    and records the agreement in ``manifest["bf16_audit"]`` (:mod:`rmfast.scoring.audit`; default 512,
    0: no audit). Returns (result, positions of its rows in the whole selection).
    """
    sel = selection or Selection()
    sel.check()
    names = set(ScoringOptions.__dataclass_fields__)
    options = ScoringOptions.of(options, **{k: v for k, v in kw.items() if k in names}).replace(compat=sel.compat)
    kw = {k: v for k, v in kw.items() if k not in names}
    authors_texts = sel.compat == "authors" and sel.texts is not None
    if authors_texts and rows is not None:
        raise UserError("--compat authors pads texts in file-order batches, which a split over processes would change; "
                        "run it in one process (vocabulary scans split exactly)")
    if sel.texts is not None:
        order = rows(len(sel.texts)) if rows else np.arange(len(sel.texts))
        _share_states(kw, rows, order)
        texts = [sel.texts[i] for i in order]
        res = score_texts(model, tokenizer, prompt, texts, options, max_tokens=sel.max_tokens,
                          candidates_info=sel.texts_info, **kw)
    else:
        ids, n_vocab, view = select_ids(model, tokenizer, sel.token_ids, exclude_special=sel.exclude_special,
                                        wordlike=sel.wordlike, dedup=sel.dedup)
        order = rows(ids.size) if rows else np.arange(ids.size)
        _share_states(kw, rows, order)
        if sel.compat:
            res = decode_retokenize_scan(model, tokenizer, prompt, ids[order], options, max_tokens=sel.max_tokens, **kw)
        else:
            res = score_ids(model, tokenizer, prompt, ids[order], options, vocab_size=n_vocab, **kw)
            res.manifest["exclude_special"] = sel.exclude_special
        res.manifest["vocab_view"] = view
    # The audit is decided here: only a bf16/fp16 job with --audit N > 0 has one. A subset of texts re-batches them
    # (other padding), so an authors text scan is not audited.
    if audit > 0 and not authors_texts and next(model.parameters()).dtype in LOW_PRECISION:
        a = audit_bf16(model, res.scores, _rescorer(res, tokenizer, prompt, sel, options, kw), n=audit, seed=audit_seed,
                       what="ids" if sel.texts is None else "texts", job_s=res.manifest.get("scan_s"))
        if a is not None:
            res.manifest["bf16_audit"] = a
    return res, order


def _share_states(options: dict, rows, order) -> None:
    """A share of the candidates (``rows``): its text rows' states are keyed by their rows in the whole scan."""
    if rows is not None and options.get("states") is not None:
        options["states"] = dataclasses.replace(options["states"], row_keys=order)


def _rescorer(res, tokenizer, prompt: str, sel: Selection, options: ScoringOptions, kw: dict):
    """``rescore(fp32_model, rows)``: those rows of ``res`` scored again the same way, by another model
    (the audit's fp32 copy), with the job's options: the plan's "audit" job (eager: its rule), its rows in one
    batch, no checkpoint, no progress bar."""
    m = res.manifest
    opts = options.replace(head=m["head"], engine=m["engine"])
    if "compat_authors" in m:  # the same published batches (a vocabulary subset is padded as in the full run)
        opts = opts.replace(batch_size=m["compat_authors"]["batch_size"])
    args = {"progress": False, "template": kw.get("template"), "system": kw.get("system"), "job": "audit"}

    def rescore(m32, rows):
        o = opts if "compat_authors" in m else opts.replace(batch_size=len(rows))  # one batch: nothing to pad
        if isinstance(res, ScanResult):
            return score_ids(m32, tokenizer, prompt, res.token_ids[rows], o, **args).scores
        if res.source_ids is not None:
            return decode_retokenize_scan(m32, tokenizer, prompt, res.source_ids[rows], o, max_tokens=sel.max_tokens,
                                          **args).scores
        return score_texts(m32, tokenizer, prompt, [res.texts[i] for i in rows], o, max_tokens=sel.max_tokens,
                           **args).scores

    return rescore
