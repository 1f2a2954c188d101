"""``scan``: score every vocabulary token (or a subset) as a one-token response.

One entry point, :func:`scan`, on an already-loaded HF model and tokenizer, returning a
:class:`ScanResult`. The CLI (``rmfast scan``) is a thin wrapper that loads the model first.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .engine import MAX_BLOCKDIAG_EXTRA, Engine
from .errors import UserError
from .io import manifest_path, write_result
from .models.arch import arch_spec
from .reference import reference_scores
from .template import Template, build_template


@dataclass
class ScanResult:
    """Scores of candidate token ids, with everything needed to reproduce them.

    Attributes:
        token_ids: (N,) int64 candidate ids, ascending.
        scores: (N,) float32 rewards (score head) or log-probabilities (logprob head).
        tokens: raw vocabulary pieces (``convert_ids_to_tokens``).
        texts: decoded strings (``decode([id])``).
        manifest: model, prompt, template ids, head, dtype, device, versions, timing.

    Example:
        >>> res = scan(model, tok, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
        >>> res.top(5)  # doctest: +SKIP
    """

    token_ids: np.ndarray
    scores: np.ndarray
    tokens: list[str]
    texts: list[str]
    manifest: dict = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return float(self.manifest.get("wall_s", float("nan")))

    @property
    def candidates_per_s(self) -> float:
        return float(self.manifest.get("candidates_per_s", float("nan")))

    def to_pandas(self):
        """DataFrame: token_id (int64), token, text, score (float32), rank (1 = highest; ties share the best rank)."""
        import pandas as pd

        df = pd.DataFrame(
            {
                "token_id": self.token_ids.astype(np.int64),
                "token": self.tokens,
                "text": self.texts,
                "score": self.scores.astype(np.float32),
            }
        )
        df["rank"] = df["score"].rank(ascending=False, method="min").astype(np.int64)
        return df

    def top(self, k: int = 20):
        """The k highest-scoring rows, best first."""
        return self.to_pandas().sort_values(["rank", "token_id"]).head(k).reset_index(drop=True)

    def bottom(self, k: int = 20):
        """The k lowest-scoring rows, worst first."""
        return self.to_pandas().sort_values(["rank", "token_id"], ascending=[False, True]).head(k).reset_index(drop=True)

    def to_parquet(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``path`` (Parquet) and ``path.json`` (manifest), each atomically."""
        return write_result(path, self.to_pandas(), self.manifest, overwrite)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike) -> "ScanResult":
        import pandas as pd

        df = pd.read_parquet(path).sort_values("token_id")
        mp = manifest_path(path)
        manifest = json.loads(mp.read_text()) if mp.exists() else {}
        return cls(
            df["token_id"].to_numpy(np.int64),
            df["score"].to_numpy(np.float32),
            df["token"].tolist(),
            df["text"].tolist(),
            manifest,
        )


def default_head(model) -> str:
    """'score' for classifiers / reward models, 'logprob' for causal LMs."""
    names = " ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
    if isinstance(getattr(model, "score", None), torch.nn.Module) or "SequenceClassification" in names or "Reward" in names:
        return "score"
    if hasattr(model, "lm_head") or "CausalLM" in names:
        return "logprob"
    return "score"


def vocab_size(model, tokenizer) -> int:
    """Ids that both the tokenizer and the embedding matrix know: 0 .. n-1."""
    n_emb = model.get_input_embeddings().weight.shape[0]
    return min(len(tokenizer), n_emb)


def special_ids(tokenizer) -> set[int]:
    """Special, reserved and added tokens (what --exclude-special drops)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids


def parse_token_ids(spec, n_vocab: int) -> np.ndarray:
    """``A:B`` (half-open range), a file with one id per line, or an iterable of ints -> sorted unique ids."""
    if spec is None:
        return np.arange(n_vocab, dtype=np.int64)
    if isinstance(spec, str):
        if ":" in spec and not os.path.exists(spec):
            a, _, b = spec.partition(":")
            try:
                lo = int(a) if a.strip() else 0
                hi = int(b) if b.strip() else n_vocab
            except ValueError:
                raise UserError(f"--token-ids {spec!r} is not a range A:B of integers nor an existing file") from None
            if not (0 <= lo < hi <= n_vocab):
                raise UserError(f"--token-ids range {lo}:{hi} is outside the vocabulary 0:{n_vocab}")
            return np.arange(lo, hi, dtype=np.int64)
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--token-ids {spec!r}: no such file (give a file with one id per line, or a range A:B)")
        vals = []
        for ln, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                vals.append(int(s))
            except ValueError:
                raise UserError(f"{spec}:{ln}: {s[:30]!r} is not a token id (one integer per line)") from None
        if not vals:
            raise UserError(f"--token-ids file {spec} holds no ids")
        ids = np.array(vals, dtype=np.int64)
    else:
        ids = np.asarray(list(spec), dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= n_vocab)]
    if bad.size:
        raise UserError(f"token id {int(bad[0])} is outside the vocabulary 0:{n_vocab} ({bad.size} such ids)")
    return np.unique(ids)


CHECKPOINT_EVERY_S = 30.0  # how often a long scan saves finished batches


def select_ids(model, tokenizer, token_ids, exclude_special: bool) -> tuple[np.ndarray, int]:
    """Candidate ids (sorted, unique) and the vocabulary size they were checked against."""
    n_vocab = vocab_size(model, tokenizer)
    ids = parse_token_ids(token_ids, n_vocab)
    if exclude_special:
        sp = special_ids(tokenizer)
        ids = ids[~np.isin(ids, np.fromiter(sp, dtype=np.int64, count=len(sp)))]
    if ids.size == 0:
        raise UserError("no candidate ids left to score (check --token-ids / --exclude-special)")
    return ids, n_vocab


def auto_batch_size(device: torch.device, tokens_per_row: int) -> int:
    """CPU: ~4k tokens per batch keeps GEMMs large and activations in cache. CUDA: start big; OOM halves it."""
    if device.type == "cuda":
        return max(64, min(16384, 131072 // max(1, tokens_per_row)))
    return max(32, min(2048, 4096 // max(1, tokens_per_row)))


#: "auto" compiles the CPU layer when a job is at least this many FLOPs (≈15 s of eager work on a
#: 2-core CPU; the one-off compile costs ~5–12 s, ~3 s once inductor's on-disk cache is warm).
COMPILE_MIN_FLOPS = 1e13


def layer_params(model) -> int:
    """Parameters of the decoder layers' projections (q, k, v, o, MLP): 2× this = FLOPs per token."""
    spec = arch_spec(model)
    if spec is None:
        return 0
    mods = [m for L in spec.layers for m in (L.q_proj, L.k_proj, L.v_proj, L.o_proj, L.mlp)]
    return sum(p.numel() for m in mods for p in m.parameters())


def resolve_compile(compile, model, n_tokens: int, engine: Engine | None = None) -> bool:
    """"auto" (default) -> compile on CPU for jobs of >= COMPILE_MIN_FLOPS; "on"/"off" or a bool.

    With ``engine``, "auto" also declines when its block-diagonal prompt attention would add more
    than MAX_BLOCKDIAG_EXTRA of a layer's FLOPs (long prompts on many heads).
    ``RMFAST_COMPILE=0`` turns "auto" off (e.g. where no C++ compiler is installed).
    """
    if isinstance(compile, bool):
        return compile
    if compile not in ("auto", "on", "off"):
        raise UserError(f"unknown --compile {compile!r}; use auto, on or off")
    if compile != "auto":
        return compile == "on"
    if os.environ.get("RMFAST_COMPILE", "1") == "0":
        return False
    device = next(model.parameters()).device
    if engine is not None and engine.blockdiag_overhead() > MAX_BLOCKDIAG_EXTRA:
        return False
    return device.type == "cpu" and 2.0 * layer_params(model) * n_tokens >= COMPILE_MIN_FLOPS


def oom_batches(n: int, bs: int, device: torch.device, score, on_oom=None):
    """Score rows 0..n-1 in batches: yields (lo, hi, out, bs) with ``out = score(lo, hi, bs)``.

    On out-of-memory the batch is halved (``on_oom(new_bs)`` is told) and the same rows retried;
    at one row the error propagates. Shared by scan, text candidates and GCG's evaluator.
    """
    lo = 0
    while lo < n:
        hi = min(n, lo + bs)
        try:
            out = score(lo, hi, bs)
        except torch.OutOfMemoryError:
            if bs == 1:
                raise
            bs = max(1, bs // 2)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if on_oom is not None:
                on_oom(bs)
            continue
        yield lo, hi, out, bs
        lo = hi


def even_batch(n: int, bs: int) -> int:
    """The batch size <= bs that splits n rows into equal batches (the last short by < the batch count).

    The compiled engine pads a short final batch to its compiled shape; equal batches waste nothing.
    """
    if n <= 0 or bs <= 0:
        return bs
    k = -(-n // bs)  # batches needed
    return -(-n // k)


def _versions() -> dict:
    import transformers

    return {
        "rmfast": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def _run_key(manifest: dict) -> str:
    keep = {k: manifest[k] for k in ("model", "prompt", "template", "head", "head_index", "dtype", "engine") if k in manifest}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_head(model, head: str, head_index: int) -> str:
    """Validate the head options; "auto" -> "score" for classifiers, "logprob" for causal LMs."""
    if head == "auto":
        head = default_head(model)
    if head not in ("score", "logprob"):
        raise UserError(f"unknown head {head!r}; use score or logprob")
    if head == "logprob" and not hasattr(model, "lm_head"):
        raise UserError("--head logprob needs a causal language model; this model has no LM head (use --head score)")
    if head == "score" and head_index < 0:
        raise UserError("--head-index must be >= 0")
    return head


def resolve_engine(model, head: str, head_index: int, engine: str) -> str:
    """"auto" -> "fast" where the architecture is on the fast path, else "reference" with a warning."""
    spec = arch_spec(model)
    if engine == "auto":
        engine = "fast" if spec is not None and (head != "score" or spec.score_head is not None) else "reference"
        if engine == "reference":
            warnings.warn(
                f"rmfast: architecture {getattr(model.config, 'model_type', '?')!r} is not on the fast path; "
                "using the plain Hugging Face path (correct, slower)",
                stacklevel=3,
            )
    elif engine not in ("fast", "reference"):
        raise UserError(f"unknown engine {engine!r}; use auto, fast or reference")
    if head == "score" and spec is not None and spec.score_head is not None and head_index >= spec.score_head.out_features:
        raise UserError(f"--head-index {head_index} is out of range: the score head has {spec.score_head.out_features} outputs")
    return engine


def base_manifest(model, tmpl: Template, prompt: str, *, head: str, head_index: int, engine: str, model_info=None) -> dict:
    """The manifest fields every scoring job records (model, prompt, template ids, head, dtype, device)."""
    p = next(model.parameters())
    return {
        "rmfast_version": __version__,
        "model": model_info or {"name": getattr(model.config, "name_or_path", None) or type(model).__name__},
        "architecture": (getattr(model.config, "architectures", None) or [type(model).__name__])[0],
        "prompt": prompt,
        "template": tmpl.manifest(),
        "head": head,
        "head_index": head_index,
        "dtype": str(p.dtype).replace("torch.", ""),
        "device": str(p.device),
        "engine": engine,
        "score_position": "final position of prefix + response + suffix (never 'last non-pad')",
    }


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
    batch_size: int | str = "auto",
    engine: str = "auto",
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    model_info: dict | None = None,
    compile: str | bool = "auto",
) -> ScanResult:
    """Score candidate token ids as the one-token assistant response to ``prompt``.

    Args:
        model: an HF model (``…ForSequenceClassification``, a custom reward model, or a causal LM), eval mode.
        tokenizer: its tokenizer.
        prompt: the user turn.
        head: "auto" (default: "score" for classifiers, "logprob" for causal LMs), "score" or "logprob".
        head_index: which output of a multi-output score head (default 0).
        template: None (the tokenizer's chat template), a Jinja template, a plain format such as
            ``"User: {prompt}\\nAssistant: {response}"``, or a prepared :class:`Template`.
        system: system message (default None: the template's own default, if any).
        token_ids: None (every id of the vocabulary, default), a range "A:B", a file path, or ids.
        exclude_special: drop special / added tokens (default False: they are scored too).
        batch_size: "auto" (default) or rows per batch. On CUDA out-of-memory the batch is halved and retried.
        engine: "auto" (default: the shared-prompt engine where the architecture is supported, else
            the plain-HF path with a warning), "fast" or "reference".
        progress: show a progress bar with candidates/s (default True).
        checkpoint: optional path; finished batches are saved there (atomically, every ~30 s) and a
            rerun with the same settings resumes from it. Removed when the scan completes.
        model_info: provenance for the manifest (the loader's ``source``); default: config name.
        compile: "auto" (default: on CPU, compile the decoder layer with torch.compile when the job is
            big enough to repay the one-off compile, see :data:`COMPILE_MIN_FLOPS`), "on" or "off".

    Returns:
        ScanResult with scores for the selected ids, ascending by id.

    Example:
        >>> from rmfast import load, scan  # doctest: +SKIP
        >>> lm = load("smollm2-135m-instruct")  # doctest: +SKIP
        >>> res = scan(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?", token_ids="0:500")  # doctest: +SKIP
        >>> res.top(3)  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    tmpl = template if isinstance(template, Template) else build_template(tokenizer, prompt, template=template, system=system)
    head = resolve_head(model, head, head_index)
    ids, n_vocab = select_ids(model, tokenizer, token_ids, exclude_special)
    engine = resolve_engine(model, head, head_index, engine)
    device = next(model.parameters()).device
    manifest = base_manifest(model, tmpl, prompt, head=head, head_index=head_index, engine=engine, model_info=model_info)
    manifest.update({"vocab_size": n_vocab, "n_candidates": int(ids.size), "exclude_special": exclude_special})

    scores = np.full(ids.size, np.nan, dtype=np.float32)
    key = _run_key(manifest)
    ck = Path(checkpoint) if checkpoint else None
    if ck is not None and ck.exists():
        try:
            z = np.load(ck, allow_pickle=False)
            if str(z["key"]) == key and np.array_equal(z["ids"], ids):
                scores = z["scores"].astype(np.float32)
        except Exception:
            pass  # an unreadable checkpoint is ignored, not trusted
    todo = np.flatnonzero(np.isnan(scores))

    eng = None
    if engine == "fast":
        eng = Engine(model, tmpl, head=head, head_index=head_index)
        eng.compile = resolve_compile(compile, model, todo.size * eng.tokens_per_row(1), eng) and eng.can_compile(warn=True)
    tpr = eng.tokens_per_row(1) if eng is not None else len(tmpl.prefix_ids) + 1 + len(tmpl.suffix_ids)
    bs = even_batch(todo.size, auto_batch_size(device, tpr)) if batch_size == "auto" else int(batch_size)
    if bs < 1:
        raise UserError("--batch-size must be a positive integer or auto")
    bar = tqdm(total=ids.size, initial=ids.size - todo.size, unit="cand", desc="scan", disable=not progress, dynamic_ncols=True)
    t_scan = time.perf_counter()
    last_ck = time.perf_counter()
    first_batch_s = None
    if eng is not None and eng.compile and todo.size:
        bar.set_postfix_str("compiling the CPU layer (one-off)")

    def score(lo, hi, b):
        cand = torch.from_numpy(ids[todo[lo:hi]])[:, None]  # (b, 1)
        if eng is not None:
            return eng.score(cand).float().cpu().numpy()
        return reference_scores(model, tmpl, cand.tolist(), head=head, head_index=head_index, batch_size=b).numpy()

    done = False
    try:
        for lo, hi, out, bs in oom_batches(todo.size, bs, device, score, lambda b: bar.set_postfix_str(f"OOM: batch -> {b}")):
            scores[todo[lo:hi]] = out
            done = True
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - t_scan
                bar.set_postfix_str("")
            bar.update(hi - lo)
            if ck is not None and time.perf_counter() - last_ck > CHECKPOINT_EVERY_S:
                _save_checkpoint(ck, key, ids, scores)
                last_ck = time.perf_counter()
    except BaseException:
        # Interrupted (Ctrl-C, a kill that Python sees, an error): keep what is done for the rerun.
        if ck is not None and done:
            _save_checkpoint(ck, key, ids, scores)
        raise
    bar.close()
    scan_s = time.perf_counter() - t_scan

    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    tokens = [t if isinstance(t, str) else "" for t in tokens]
    texts = tokenizer.batch_decode([[int(t)] for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    wall = time.perf_counter() - t0
    manifest.update(
        {
            "batch_size": bs,
            "compiled": bool(eng is not None and eng.compile),
            "first_batch_s": round(first_batch_s, 3) if first_batch_s is not None else None,
            "wall_s": round(wall, 3),
            "scan_s": round(scan_s, 3),
            "candidates_per_s": round(todo.size / scan_s, 2) if scan_s > 0 else None,
            "resumed_candidates": int(ids.size - todo.size),
            "versions": _versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    if ck is not None and ck.exists():
        ck.unlink()
    return ScanResult(ids, scores, tokens, texts, manifest)


def _save_checkpoint(path: Path, key: str, ids: np.ndarray, scores: np.ndarray) -> None:
    from .io import _atomic

    def w(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, key=np.array(key), ids=ids, scores=scores)

    _atomic(path, w)
