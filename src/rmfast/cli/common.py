"""What every subcommand shares: model and template options, loading, tables, messages.

Only the CLI imports this package; the library below it never does.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from ..template import unescape

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_PROMPT = "What, in one word, is the greatest thing ever?"


def add_model_args(p: argparse.ArgumentParser, *, dtype_default: str = "auto", positional: bool = True) -> None:
    """MODEL (unless ``positional=False``: a command that names its models otherwise), --dtype, --device,
    --trust-remote-code, --cache-dir."""
    if positional:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                       help=f"hub id, local folder, .gguf file or embedded alias (default: {DEFAULT_MODEL})")
    if dtype_default == "auto":
        dhelp = "auto|bfloat16|float16|float32 (default auto: bf16 on CPU, the model's on CUDA)"
    else:
        rest = [d for d in ("bfloat16", "float16", "float32", "auto") if d != dtype_default]
        dhelp = f"{dtype_default} (default: one forward pass, exact)|" + "|".join(rest)
    p.add_argument("--dtype", default=dtype_default, help=dhelp)
    p.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (default off)")
    p.add_argument("--cache-dir", default=None,
                   help="where converted GGUF models are cached (default $RMFAST_CACHE or ~/.cache/rmfast)")


def add_template_args(p: argparse.ArgumentParser) -> None:
    """--prompt, --template, --system."""
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the user turn (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--template", default=None,
                   help="Jinja chat template, or a plain format like 'User: {prompt}\\nAssistant: {response}' "
                        "(\\n and \\t are unescaped; default: the model's chat template)")
    p.add_argument("--system", default=None, help="system message (default: the template's own default)")


def add_output_args(p: argparse.ArgumentParser, default: str) -> None:
    """--out, --overwrite."""
    p.add_argument("--out", default=None, help=f"output file (default {default})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (default: refuse)")


def template_arg(args, lm=None):
    """The --template option as the library takes it: unescaped; else the loaded model's default,
    said in one line (a base model without a chat template gets a plain format)."""
    t = unescape(getattr(args, "template", None))
    if t is None and lm is not None and lm.default_template is not None:
        print(f"rmfast: note: {args.model} has no chat template; using --template {lm.default_template!r} "
              "(pass --template to choose another)", file=sys.stderr)
        return lm.default_template
    return t


def load_model(args, random_head_seed=None, **kw):
    """The model named by the arguments (:func:`rmfast.loader.load`, or over devices with --device-map)."""
    from ..dist import load_model as load

    return load(args.model, dtype=args.dtype, device=kw.pop("device", args.device),
                trust_remote_code=args.trust_remote_code, cache_dir=args.cache_dir,
                random_head_seed=random_head_seed, **kw)


def print_tables(res, k: int, *, bottom: bool = True, title: str | None = None) -> None:
    """The top (and bottom) k rows of a result: rank, token id, text (repr), n_tokens, score."""
    import pandas as pd

    head = title or f"top {k} ({res.manifest.get('head')} head)"
    tables = [(head, res.top(k))] + ([(f"bottom {k}", res.bottom(k))] if bottom else [])
    for name, df in tables:
        cols = {"rank": df["rank"]}
        if "token_id" in df:
            cols["token_id"] = df["token_id"]
        cols["text"] = [repr(t) for t in df["text"]]
        if "n_tokens" in df:
            cols["n_tokens"] = df["n_tokens"]
        cols["score"] = [f"{s:.4f}" for s in df["score"]]
        print(f"\n{name}")
        print(pd.DataFrame(cols).to_string(index=False))


def check_top(k: int) -> None:
    from ..errors import UserError

    if k < 0:
        raise UserError("--top must be >= 0")


def quiet() -> None:
    """One-line warnings, no tokenizer-fork chatter, transformers' logging at errors only."""
    warnings.formatwarning = lambda msg, cat, *a, **k: f"{msg}\n"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:
        pass
