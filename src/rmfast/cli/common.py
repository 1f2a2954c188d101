"""What every subcommand shares: model and template options, loading, tables, messages.

Only the CLI imports this package; the library below it never does.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys
import warnings
from pathlib import Path

from ..errors import UserError, missing_package, read_by_cli
from ..io import forget_on_interrupt, on_interrupt
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
        dhelp = ("auto|bfloat16|float16|float32 (default auto: on CPU bf16 only where this CPU multiplies it clearly "
                 "faster than fp32 (measured once, cached), else fp32; on CUDA the model's dtype)")
    else:
        rest = [d for d in ("bfloat16", "float16", "float32", "auto") if d != dtype_default]
        dhelp = f"{dtype_default} (default: one forward pass, exact)|" + "|".join(rest)
    p.add_argument("--dtype", default=dtype_default, help=dhelp)
    p.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (default off)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="load pickled weights (pytorch_model.bin) when a folder has no safetensors; unpickling can "
                        "run code (default off: refused)")
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


def add_plan_args(p: argparse.ArgumentParser, *, batch_what: str | None = None) -> None:
    """The scoring options (:class:`rmfast.scoring.options.ScoringOptions`), one name, one default and one doc on
    every command: generated from the options' fields."""
    from ..scoring.options import add_arguments

    add_arguments(p, batch_what=batch_what)


def add_states_view_args(p: argparse.ArgumentParser) -> None:
    """The report's and the explorer's representation views: a similarity CSV, and the caps on what is
    computed from the states folders beside the scans (docs/representations.md, part 6)."""
    p.add_argument("--similarity", metavar="CSV", help="a CSV of 'rmfast analyze similarity --out' to show as "
                   "layer × layer heatmaps (besides the states folders found beside the scans)")
    p.add_argument("--states-layers", type=nonneg_int, default=6, metavar="N",
                   help="states folders beside the scans: compare at most N layers per set, evenly spaced "
                   "(default 6; 0: all)")
    p.add_argument("--states-rows", type=nonneg_int, default=4096, metavar="N",
                   help="states folders beside the scans: at most N shared candidates, a seeded sample "
                   "(default 4096; 0: all)")


def default_output(stem: str, prompt: str, tail: str) -> str:
    """``results/<stem>__<the prompt's slug><tail>``: the default --out of scan, logprobs and gcg. A slug is cut at
    ~40 characters, so two prompts can share one; where that file holds another prompt's result, this prompt's
    name gets a hash of the prompt (the other's "already exists; pass --overwrite" would have destroyed it).

    >>> default_output("rm", "What, in one word, is the greatest thing ever?", ".parquet")
    'results/rm__what-in-one-word-is-the-greatest-thing.parquet'
    """
    import hashlib

    from ..io import slug

    base = os.path.join("results", f"{stem}__{slug(prompt)}{tail}")
    other = _recorded_prompt(base)
    if other is None or other == prompt:
        return base
    return os.path.join("results", f"{stem}__{slug(prompt)}-{hashlib.sha256(prompt.encode()).hexdigest()[:8]}{tail}")


def _recorded_prompt(path: str) -> str | None:
    """The prompt a result at ``path`` was made for (a GCG JSON's manifest, a Parquet's manifest beside it);
    None where there is none or it cannot be read."""
    import json

    try:
        if path.endswith(".json"):  # GCG's result: its prompt in its manifest
            return (json.loads(Path(path).read_text(encoding="utf-8")).get("manifest") or {}).get("prompt")
        return json.loads(Path(path + ".json").read_text(encoding="utf-8")).get("prompt")
    except (OSError, ValueError, AttributeError):
        return None


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
    """The model named by the arguments (:func:`rmfast.loading.loader.load`, or over devices with --device-map:
    :func:`rmfast.loading.spread.load_spread`, only then)."""
    _check_head_before_load(args, random_head_seed)
    if kw.get("device_map") is None:
        from ..loading.loader import load

        kw.pop("device_map", None)
    else:
        from ..loading.spread import load_spread as load

    lm = load(args.model, dtype=args.dtype, device=kw.pop("device", args.device),
              trust_remote_code=args.trust_remote_code, cache_dir=args.cache_dir,
              random_head_seed=random_head_seed, allow_pickle=getattr(args, "allow_pickle", False), **kw)
    if random_head_seed is not None and lm.source.get("random_head_seed") is None and lm.kind == "classifier":
        print(f"rmfast: note: --random-head-seed {random_head_seed} is not used: {args.model} is a reward model with "
              "its own trained head, which is what is scored", file=sys.stderr)
    return lm


def _check_head_before_load(args, random_head_seed) -> None:
    """A --head score or --lens that a causal LM (no --random-head-seed) cannot give, refused before the load where the
    model's files tell (:func:`rmfast.loading.sources.predicted_kind`): the plan refuses the same after it, minutes
    later for an 8B model. Other specs (a hub id) are left to the plan."""
    from ..loading.sources import predicted_kind
    from ..scoring.decisions import LENS_NEEDS_SCORE, score_on_lm

    if random_head_seed is not None or predicted_kind(args.model) != "causal_lm":
        return
    head = getattr(args, "head", "auto")
    if head == "score":
        raise UserError(score_on_lm(args.model))
    if getattr(args, "lens", False):
        raise UserError(LENS_NEEDS_SCORE.format(head="logprob" if head == "auto" else head))


def print_tables(res, k: int, *, bottom: bool = True, title: str | None = None) -> None:
    """The top (and bottom) k rows of a result: rank, token id, text (repr), n_tokens, score."""
    import pandas as pd

    from ..scoring.results import random_head_seed

    seed = random_head_seed(res.manifest)
    n = len(res.scores)
    # a table never repeats the other's rows: all n once where n <= k, the bottom's last n - k where n < 2k
    top_k, bottom_k = min(k, n), min(k, max(n - k, 0))
    which = f"all {n}, best first" if top_k == n else f"top {top_k}"
    head = title or (f"{which} (RANDOM score head, seed {seed}: not a reward model's ranking)" if seed is not None
                     else f"{which} ({res.manifest.get('head')} head)")
    tables = [(head, res.top(top_k))] + ([(f"bottom {bottom_k}", res.bottom(bottom_k))] if bottom and bottom_k else [])
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
    if res.manifest.get("score_meaning"):  # what the number is, under the numbers
        print(f"score: {res.manifest['score_meaning']}")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are a UserError (one line, exit 2, no usage block), naming the
    --help to read: ``main`` reports them like every other bad input."""

    def error(self, message: str):
        from ..errors import UserError

        message = re.sub(r"^argument (\S+): must be", r"\1 must be", message)  # "--k must be an integer >= 1"
        raise UserError(f"{message} (see {self.prog} --help)")


def int_at_least(lo: int):
    """An argparse ``type=``: an integer >= ``lo``, else a one-line error naming the bound.

    >>> positive_int("3"), nonneg_int("0")
    (3, 0)
    >>> positive_int("-5")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 1 (got '-5')
    """
    def parse(text: str) -> int:
        try:
            n = int(text)
        except (TypeError, ValueError):
            n = None
        if n is None or n < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo} (got {text!r})")
        return n

    parse.__name__ = f"integer >= {lo}"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)

#: --threads is at most this many times the CPUs this process may use (more only slows torch down, and
#: a huge count fails deep in the OpenMP runtime: "failed to map segment")
THREADS_PER_CPU = 4


def thread_count(text: str) -> int:
    """An argparse ``type=``: a torch thread count, 1 .. THREADS_PER_CPU x the CPUs this process may use.

    >>> thread_count("1")
    1
    """
    import os

    n = positive_int(text)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > THREADS_PER_CPU * cpus:
        raise argparse.ArgumentTypeError(f"must be at most {THREADS_PER_CPU * cpus} ({THREADS_PER_CPU} x the {cpus} "
                                         f"CPUs this process may use; got {text!r})")
    return n


def fraction(text: str) -> float:
    """An argparse ``type=``: a number in (0, 1].

    >>> fraction("0.6")
    0.6
    """
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0.0 < x <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1] (got {text!r})")
    return x


def int_list(text: str) -> str:
    """An argparse ``type=``: a comma list of positive integers (kept as the text the callee parses).

    >>> int_list("64,128")
    '64,128'
    """
    for part in text.split(","):
        positive_int(part.strip())
    return text


def quiet() -> None:
    """One-line warnings, no tokenizer-fork chatter, transformers' logging at errors only."""
    # a UserNote (rmfast.errors) names the CLI's options here, as a UserError's line does
    warnings.formatwarning = lambda msg, cat, *a, **k: f"{msg.cli_message() if hasattr(msg, 'cli_message') else msg}\n"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:
        pass


#: Write failures that are the machine's state, not a bug: the disk or quota is full, the filesystem is
#: read-only, permission is denied. Met in the middle of any command's writes, they are one line.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def check_out_is_no_input(args) -> None:
    """``--out`` naming a file or folder another argument names (an input scan, a dictionary, a data folder) is
    refused before any work, with --overwrite too: the output would replace what the command reads (an analysis
    wrote its CSV over the scan it read, under the scan's name)."""
    out = getattr(args, "out", None)
    if not out or not os.path.exists(out):
        return
    for name, value in vars(args).items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if name != "out" and isinstance(v, (str, os.PathLike)) and os.path.exists(v) and os.path.samefile(v, out):
                flag = "input" if name in ("inputs", "input", "scans", "config", "store") else f"--{name.replace('_', '-')}"
                raise UserError(f"--out {out} is the {flag} this command reads; writing it would replace that input: "
                                "choose another --out")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``docker stop``, a scheduler's preemption), taken as Ctrl-C is: a job saves what it has
    done and says how to resume; exit 143."""


def _on_sigterm(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises :class:`Terminated` in the main thread while a command runs (a server installs its own)."""
    try:
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (a test's, an embedding's): as before
        yield
        return
    try:
        yield
    finally:  # put back only its own: a drained server ignores a second signal, to the process's very end
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, old)


def _write_fix(e: OSError, args) -> str:
    """What to do about a write the machine refused: a size limit's fix; the cache's setting where the file was
    in the rmfast cache (a read-only or full cache said "choose another path" and named no setting)."""
    if e.errno == errno.EFBIG:
        return "raise the limit on a file's size (`ulimit -f`) or choose another file system"
    flag = "--cache-dir" if getattr(args, "cache_dir", None) else "RMFAST_CACHE (or --cache-dir)"
    cache = getattr(args, "cache_dir", None) or os.environ.get("RMFAST_CACHE") or Path.home() / ".cache" / "rmfast"
    cache = Path(os.path.abspath(os.path.expanduser(cache)))
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    if e.filename and Path(os.path.abspath(os.fsdecode(e.filename))).is_relative_to(cache):
        return f"it is in the rmfast cache {cache}: {'free space there, or ' if full else ''}set {flag} to a writable folder"
    return "free space, or choose another path" if full else "fix the permissions, or choose another path"


def require_serve(what: str, ray: bool, modules=("fastapi", "uvicorn")) -> None:
    """The server's packages, or one line naming the extra that installs them all: ``serve-ray`` where Ray Serve runs
    it (that extra holds the serve extra: one install, not two in turn), else ``serve``."""
    import importlib

    try:
        for m in modules:
            importlib.import_module(m)
    except ImportError as e:
        if missing_package(e) is None:  # installed but broken: its own error
            raise
        extra = "serve-ray" if ray else "serve"
        raise UserError(f"{what} needs the {extra} extra: pip install 'rmfast[{extra}]'") from None


def run_command(func, args) -> int:
    """Run a command: a UserError (or a full disk, read-only or forbidden write) is one line on stderr
    and exit 2; Ctrl-C is 130, SIGTERM 143 (each after the job saved what it can resume from)."""
    before = warnings.formatwarning  # the CLI's one-line form is for this command's warnings only
    try:
        with _sigterm_as_interrupt(), read_by_cli():  # read_by_cli: the library's messages name the flags
            quiet()  # (inside: a Ctrl-C while transformers imports is the one line below, not a traceback)
            forget_on_interrupt()
            check_out_is_no_input(args)
            rc = int(func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then the BrokenPipeError below
        return rc
    except BrokenPipeError:  # `rmfast models | head`: the reader has what it wanted; no traceback at exit
        try:  # what is left in stdout's buffer goes nowhere, instead of failing again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor (captured): nothing to flush at exit
            pass
        return 141  # 128 + SIGPIPE, as a shell reports a writer whose reader closed the pipe
    except UserError as e:
        print(f"rmfast: error: {e.cli_message()}", file=sys.stderr)
        return e.exit_code
    except ImportError as e:  # an optional package met where no check named it first: one line naming its extra
        cmd = getattr(args, "command", None)
        what = " ".join(str(w) for w in (cmd, getattr(args, "name", None) if cmd == "analyze" else None) if w)
        err = missing_package(e, f"rmfast {what}" if what else "this command")
        if err is None:
            raise
        print(f"rmfast: error: {err.cli_message()}", file=sys.stderr)
        return err.exit_code
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        where = f": {e.filename}" if e.filename else ""
        rerun = on_interrupt()  # a checkpoint save that found the disk full: the last save is kept
        print(f"rmfast: error: {e.strerror}{where} ({_write_fix(e, args)}{'; then ' + rerun if rerun else ''})",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        rerun = on_interrupt()  # said by the job that can resume (a scan's checkpoint, a sweep's store), if any
        what = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        print(f"rmfast: {what}{'; ' + rerun if rerun else ''}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        warnings.formatwarning = before
