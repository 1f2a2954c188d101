"""rmfast command line. Parses arguments, prints messages, sets exit codes; owns no logic.

Exit codes: 0 success, 2 bad input (one-line message, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from pathlib import Path

from . import __version__
from .errors import UserError

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_PROMPT = "What, in one word, is the greatest thing ever?"


def _slug(s: str, n: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()[:n] or "x"


def _unescape_plain(template: str) -> str:
    """A plain format typed in a shell carries a literal backslash-n: make it a newline (not in Jinja)."""
    if "{response}" in template and "{%" not in template and "{{" not in template:
        return template.replace("\\n", "\n").replace("\\t", "\t")
    return template


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"hub id, local folder, .gguf file or embedded alias (default: {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="auto", help="auto|bfloat16|float16|float32 (default auto: bf16 on CPU, the model's on CUDA)")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (default off)")
    p.add_argument("--cache-dir", default=None, help="where converted GGUF models are cached (default $RMFAST_CACHE or ~/.cache/rmfast)")


def _add_template_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the user turn (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--template", default=None,
                   help="Jinja chat template, or a plain format like 'User: {prompt}\\nAssistant: {response}' (default: the model's chat template)")
    p.add_argument("--system", default=None, help="system message (default: the template's own default)")


def _load(args, random_head_seed=None):
    from .load import load

    return load(args.model, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code,
                cache_dir=args.cache_dir, random_head_seed=random_head_seed)


def _print_table(df, title: str) -> None:
    import pandas as pd

    view = pd.DataFrame({
        "rank": df["rank"],
        "token_id": df["token_id"],
        "text": [repr(t) for t in df["text"]],
        "score": [f"{s:.4f}" for s in df["score"]],
    })
    print(f"\n{title}")
    print(view.to_string(index=False))


def cmd_scan(args) -> int:
    from .io import check_output
    from .scan import scan
    from .sweep import cmd_scan_extended, scan_needs_extension

    if scan_needs_extension(args):  # text candidates, vocabulary views, --compat, --device-map, torchrun
        return cmd_scan_extended(args)
    if args.top < 0:
        raise UserError("--top must be >= 0")
    lm = _load(args)
    out = args.out or os.path.join("results", f"{_slug(lm.source.get('name') or args.model)}__{_slug(args.prompt)}.parquet")
    out = check_output(out, args.overwrite)  # refuse before the work, not after
    template = _unescape_plain(args.template) if args.template is not None else lm.default_template
    ck = Path(str(out) + ".partial.npz")
    res = scan(
        lm.model, lm.tokenizer, args.prompt,
        head=args.head, head_index=args.head_index, template=template, system=args.system,
        token_ids=args.token_ids, exclude_special=args.exclude_special, batch_size=args.batch_size,
        engine=args.engine, progress=not args.no_progress, checkpoint=ck, model_info=lm.source, compile=args.compile,
    )
    res.to_parquet(out, overwrite=args.overwrite)
    m = res.manifest
    if args.top:
        _print_table(res.top(args.top), f"top {args.top} ({m['head']} head)")
        _print_table(res.bottom(args.top), f"bottom {args.top}")
    print(f"\n{m['n_candidates']} candidates in {m['scan_s']:.1f} s ({m['candidates_per_s']} cand/s; "
          f"{m['engine']} engine{' (compiled)' if m.get('compiled') else ''}, {m['dtype']}, {m['device']}, batch {m['batch_size']}); total {m['wall_s']:.1f} s")
    print(f"wrote {out} and {out}.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rmfast", description="Exhaustive, exact, fast reward-model scanning.")
    ap.add_argument("--version", action="version", version=f"rmfast {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("scan", help="score every vocabulary token as a one-token response")
    _add_model_args(p)
    _add_template_args(p)
    p.add_argument("--out", default=None, help="output Parquet (default results/<model>__<prompt>.parquet); manifest at <out>.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (default: refuse)")
    p.add_argument("--head", default="auto", choices=["auto", "score", "logprob"],
                   help="auto (default): score for classifiers, logprob for causal LMs")
    p.add_argument("--head-index", type=int, default=0, help="output of a multi-output score head (default 0)")
    p.add_argument("--token-ids", default=None, help="subset: a range A:B or a file with one id per line (default: all)")
    p.add_argument("--exclude-special", action="store_true", help="drop special/added tokens (default: score them)")
    p.add_argument("--batch-size", default="auto", help="rows per batch, or auto (default)")
    p.add_argument("--engine", default="auto", choices=["auto", "fast", "reference"], help="default auto")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the CPU decoder layer: auto (default: for big CPU jobs), on, off")
    p.add_argument("--top", type=int, default=20, help="rows in the printed top/bottom tables (default 20)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--candidates", default=None, metavar="FILE",
                   help="score response texts instead of token ids: one per line, or a CSV/TSV/Parquet column (--column)")
    p.add_argument("--column", default=None, help="the --candidates table's column holding the texts")
    p.add_argument("--compat", default=None, choices=["decode-retokenize"],
                   help="the papers' pipeline: decode ids to text and re-tokenize the whole conversation (default off)")
    p.add_argument("--max-tokens", type=int, default=None, help="longest text candidate in tokens (default 256)")
    p.add_argument("--wordlike", action="store_true", help="vocabulary view: tokens that are letters only (after the leading space)")
    p.add_argument("--dedup", action="store_true", help="vocabulary view: drop ids whose decoded text occurs more than once")
    p.add_argument("--device-map", default=None, help="e.g. auto: spread a large model over the GPUs (accelerate; plain-HF path)")
    p.set_defaults(func=cmd_scan)

    for register in _extensions():
        register(sub)
    return ap


def _extensions():
    """Subcommands that live with their own layer (analysis, bench, ...); absent ones are skipped."""
    regs = []
    for mod in ("rmfast.bench", "rmfast.analysis.cli", "rmfast.logprobs", "rmfast.implicit", "rmfast.gcg", "rmfast.sweep"):
        try:
            m = __import__(mod, fromlist=["register"])
        except ImportError:
            continue
        if hasattr(m, "register"):
            regs.append(m.register)
    return regs


def _quiet() -> None:
    warnings.formatwarning = lambda msg, cat, *a, **k: f"{msg}\n"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:
        pass


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    _quiet()
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"rmfast: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rmfast: interrupted; rerun the same command to resume from the checkpoint", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
