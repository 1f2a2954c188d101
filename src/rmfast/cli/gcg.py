"""``rmfast gcg``: multi-token responses that maximize or minimize the reward (Greedy Coordinate Gradient)."""

from __future__ import annotations

import argparse
import shlex
import sys
import os
from pathlib import Path

from ..errors import UserError
from ..io import check_output, slug
from ..locks import output_lock
from . import common
from .common import template_arg


def _can_plot() -> bool:
    """The trajectory PNG needs matplotlib (the analysis extra); without it, one note and no plot."""
    from ..analysis.data.deps import plots_available

    return plots_available("the trajectory plot")


def register(subparsers) -> None:
    from ..gcg import GCGConfig

    d = GCGConfig()
    p = subparsers.add_parser("gcg", help="search multi-token responses that maximize/minimize the reward (Greedy Coordinate Gradient)")
    common.add_model_args(p)
    common.add_template_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--maximize", action="store_true", help="maximize the reward (default)")
    g.add_argument("--minimize", action="store_true", help="minimize the reward")
    p.add_argument("--length", type=common.positive_int, default=None,
                   help=f"response tokens (default {d.length}; an --init text's own token count sets it instead)")
    p.add_argument("--steps", type=common.positive_int, default=d.steps, help=f"steps per restart (default {d.steps})")
    p.add_argument("--search-width", type=common.positive_int, default=d.search_width, help=f"candidates per step (default {d.search_width})")
    p.add_argument("--topk", type=common.positive_int, default=d.topk, help=f"gradient substitutions per position (default {d.topk})")
    p.add_argument("--n-replace", type=common.positive_int, default=d.n_replace, help=f"positions changed per candidate (default {d.n_replace})")
    p.add_argument("--buffer-size", type=common.positive_int, default=d.buffer_size, help=f"best sequences kept (default {d.buffer_size})")
    p.add_argument("--patience", type=common.positive_int, default=d.patience, help=f"steps without improvement that end a restart (default {d.patience})")
    p.add_argument("--restarts", type=common.positive_int, default=d.restarts, help=f"independent restarts (default {d.restarts})")
    p.add_argument("--seed", type=common.nonneg_int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--init", default=None, help="initial response text (default: random allowed tokens)")
    p.add_argument("--init-string", action="append", default=None, metavar="TEXT",
                   help="one of several initial responses of one token length (repeatable): restart 0 starts from "
                        "the best of them (default: none)")
    p.add_argument("--init-strings", default=None, metavar="FILE", help="initial responses, one per line (as --init-string)")
    p.add_argument("--greedy-candidates", action="store_true",
                   help="the study fork's candidates: the --search-width best (position, token) pairs of the gradient, "
                        "one swap each (default: random draws from per-position top-k)")
    p.add_argument("--distance-penalty", type=float, default=d.distance_penalty, metavar="W",
                   help="add W x embedding distance to each swap's gradient score (the fork: 4.5; default 0: off)")
    p.add_argument("--compat", default=None, choices=["authors"],
                   help="authors: the fork's gradient, of (reward - 30)^2 in both directions, its sign bug included "
                        "(default off)")
    p.add_argument("--allow-non-ascii", action="store_true", help="allow tokens that are not printable ASCII (default off)")
    p.add_argument("--allow-special", action="store_true", help="allow special/added tokens (default off)")
    p.add_argument("--no-retokenize-filter", action="store_true",
                   help="keep candidates whose text re-encodes to other ids (default: drop them)")
    common.add_plan_args(p, batch_what="candidates per evaluation batch")
    # the older names of --batch-size and --engine (engine -> fast, full -> hf)
    p.add_argument("--eval-batch-size", dest="batch_size", help=argparse.SUPPRESS)
    p.add_argument("--evaluator", dest="engine", type=lambda v: {"engine": "fast", "full": "hf"}.get(v, v),
                   help=argparse.SUPPRESS)
    p.add_argument("--baseline", default=None, choices=["random"],
                   help="random: after the search, score as many uniformly random responses of the same length "
                        "(same allowed tokens and filter) and print the best beside GCG's (default: none)")
    p.add_argument("--random-head-seed", type=common.nonneg_int, default=None,
                   help="load a causal LM as a classifier with a random score head of this seed (default: off)")
    p.add_argument("--out", default=None, help="output JSON (default results/gcg__<model>__<prompt>__<max|min>.json); plot beside it (.png)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (default: refuse)")
    p.add_argument("--no-plot", action="store_true", help="skip the trajectory PNG")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar (the one-line notes stay: resuming, the run's estimate, the baseline)")
    p.set_defaults(func=run)


def _init_strings(args) -> list[str] | None:
    """--init-string values and --init-strings FILE lines (blank lines skipped), or None."""
    from ..scoring.candidate_files import read_candidates

    texts = list(args.init_string or [])
    if args.init_strings is not None:
        texts += read_candidates(args.init_strings, fmt="lines").texts
    return texts or None


def run(args) -> int:
    from .. import gcg as job
    from ..gcg import GCGConfig

    inits = _init_strings(args)
    if args.length is not None and (args.init is not None or inits):
        raise UserError(f"--length {args.length} and --init{'-string(s)' if inits else ''} both set the response "
                        "length (the initial text's tokens are the length); drop --length")
    cfg = GCGConfig(
        length=GCGConfig.length if args.length is None else args.length, steps=args.steps, search_width=args.search_width, topk=args.topk,
        n_replace=args.n_replace, buffer_size=args.buffer_size, patience=args.patience, restarts=args.restarts,
        seed=args.seed, maximize=not args.minimize, allow_non_ascii=args.allow_non_ascii,
        allow_special=args.allow_special, retokenize_filter=not args.no_retokenize_filter, init=args.init,
        batch_size=args.batch_size, head=args.head, head_index=args.head_index,
        template=template_arg(args), system=args.system, engine=args.engine, compile=args.compile,
        attention=args.attention, kernels=args.kernels, projections=args.projections,
        init_strings=inits, greedy=args.greedy_candidates, distance_penalty=args.distance_penalty,
        compat=args.compat,
    )
    cfg.validate()  # refuse bad settings before loading anything
    direction = "max" if cfg.maximize else "min"
    out = args.out or common.default_output(f"gcg__{slug(args.model)}", args.prompt, f"__{direction}.json")
    ck = Path(f"{out}.partial.npz")  # the search's last step boundary: the same command goes on from it
    again = _interrupted_before(out, ck)  # the output an interrupted run of it wrote is replaced, as it said
    out = check_output(out, args.overwrite or again, suffix=".json")  # (--out x.png: the plot replaced the JSON)
    png = None if args.no_plot or not _can_plot() else check_output(Path(out).with_suffix(".png"), args.overwrite or again)
    with output_lock(out):  # a second search for the same --out stops at once (it and its checkpoint are this one's)
        check_output(out, args.overwrite or again, suffix=".json")  # again, holding the lock: one just finished
        return _search(args, cfg, out, ck, png, again)


def _search(args, cfg, out, ck: Path, png, again: bool) -> int:
    """The search itself, holding ``out``'s lock: load, run (resuming from ``ck``), write ``out`` and its plot."""
    from .. import gcg as job

    lm = common.load_model(args, random_head_seed=args.random_head_seed)
    if cfg.template is None and lm.default_template is not None:
        cfg.template = lm.default_template
    try:
        res = job.run(lm.model, lm.tokenizer, args.prompt, cfg, progress=not args.no_progress, model_info=lm.source,
                      checkpoint=ck, keep_checkpoint=True, notes=True)
    except job.GCGInterrupted as stop:  # Ctrl-C: the search so far is written, and how to go on from it said
        stop.result.to_json(out, overwrite=True)  # `out` was checked before the load
        _report(stop.result)
        print(f"rmfast: gcg: interrupted after {sum(r['steps_run'] for r in stop.result.restarts)} step(s); wrote the "
              f"best so far to {out} (\"interrupted\": true). The same command goes on from {ck} (the search's last "
              f"step boundary) and ends as an uninterrupted run would; or start a new search from the best with --init "
              f"{shlex.quote(stop.result.best_text)} --overwrite", file=sys.stderr)
        return 130
    if args.baseline == "random":
        try:
            res.baseline = _random_baseline(lm, args.prompt, cfg, res)
        except KeyboardInterrupt:  # the search is done: written, and the rerun scores only the baseline
            res.baseline = {"method": "random", "interrupted": True}
            res.to_json(out, overwrite=True)  # `out` was checked before the load
            print(f"rmfast: gcg: interrupted in the random baseline; the search is finished and written to {out} "
                  f"(its baseline \"interrupted\": true). The same command scores the baseline, taking the search "
                  f"from {ck}", file=sys.stderr)
            return 130
    res.to_json(out, overwrite=args.overwrite or again)  # checked before the load
    ck.unlink(missing_ok=True)  # only now: the result is in place
    plot = res.plot(png) if png is not None else None
    _report(res)
    print(f"wrote {out}" + (f" and {plot}" if plot else ""))
    return 0


def _interrupted_before(out: str, ck: Path) -> bool:
    """Whether ``out`` is what an interrupted run of this search wrote (its JSON says so, and its checkpoint is
    there): the rerun that goes on from the checkpoint replaces it without --overwrite."""
    import json

    try:
        if not (ck.is_file() and Path(out).is_file()):
            return False
        d = json.loads(Path(out).read_text())
        return d.get("interrupted") is True or (d.get("baseline") or {}).get("interrupted") is True
    except (OSError, ValueError, AttributeError):
        return False


def _random_baseline(lm, prompt: str, cfg, res) -> dict:
    """The best of as many random responses (the search's length, allowed tokens and filter) as the
    search evaluated: what the same budget finds without the gradient."""
    import dataclasses
    import sys
    import time

    from ..gcg import random_search

    n, length = res.n_evaluated, res.manifest["length"]
    print(f"rmfast: gcg: baseline: scoring {n} random {length}-token responses (as many as the search evaluated)",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    rcfg = dataclasses.replace(cfg, length=length, init=None, init_strings=None)
    rnd = random_search(lm.model, lm.tokenizer, prompt, rcfg, n)
    return {"method": "random", "n_evaluated": rnd.n_evaluated, "best_ids": list(rnd.best_ids), "best_text": rnd.best_text,
            "best_score": rnd.best_score, "wall_s": round(time.perf_counter() - t0, 3)}


def _text_exact(res) -> bool:
    """Whether the best text renders back to the best ids (every best of a run with the retokenization filter does)."""
    best = next((r for r in res.restarts if list(r.get("best_ids") or []) == list(res.best_ids)), None)
    return best is None or best.get("best_text_exact", True)


def _report(res) -> None:
    """The result in a few lines: the start, the best, the baseline (if any) and the time."""
    m, t = res.manifest, res.timing
    start = next((r for r in res.restarts if r["trajectory"] == res.trajectory), res.restarts[0])
    print(f"\nGCG {m['direction']} ({m['head']} head, {m['length']} tokens, {m['engine']} engine, {m['dtype']}, {m['device']})")
    print(f"start score     {res.trajectory[0]:.6f}  {start['init_text']!r}")
    print(f"best score      {res.best_score:.6f}")
    print(f"reference score {res.best_score_reference:.6f}  (plain-HF forward of the same ids)")
    print(f"best text       {res.best_text!r}")
    if not _text_exact(res):  # --no-retokenize-filter: the text renders to other ids than the ones scored
        print("                (this text re-tokenizes to other ids: the scores are those of the ids below, and the "
              "text scored afresh, or given to --init, is another response)")
    print(f"best ids        {res.best_ids}")
    print(f"start -> best   {res.trajectory[0]:.4f} -> {res.trajectory[-1]:.4f} in {len(res.trajectory) - 1} steps; "
          f"{res.n_evaluated} evaluated, {res.n_rejected_retokenize} rejected by the retokenization filter"
          + (f", {res.n_nonfinite} scored NaN/inf (never the best)" if res.n_nonfinite else ""))
    if res.baseline:
        b = res.baseline
        print(f"random search   {b['best_score']:.6f}  {b['best_text']!r}  (best of {b['n_evaluated']} random responses: "
              f"the same number of evaluations, {b['wall_s']:.1f} s)")
    print(f"time            {time_line(t, bool(m.get('resumed')))}")


def time_line(t: dict, resumed: bool) -> str:
    """The search's time in parts that add up: set-up, the steps (gradient, filter and evaluation inside them), the
    evaluation of each restart's start, and the rest (the reference score, the result). The steps' parts had been
    given beside the whole evaluation, the starts' included, and summed past the steps' time."""
    steps = sum(t.get("step_s") or [])
    in_steps = t.get("evaluate_in_steps_s", t["evaluate_s"])
    probe = f" (a one-off padding measurement {t['pad_probe_s']:.1f} s inside these)" if t.get("pad_probe_s") else ""
    split = (f"{t['per_step_s']} s/step: gradient {t['gradient_s']:.1f} s, filter {t['sample_filter_s']:.1f} s, "
             f"evaluation {in_steps:.1f} s") if t.get("steps") else "none finished"  # (interrupted in the first)
    if resumed:  # the counters hold every run's steps, the wall this process's: no sum to give
        return (f"{t['wall_s']:.1f} s in this process (it went on from a checkpoint); {t['steps']} steps in all runs "
                f"({split}){probe}")
    start = max(t["evaluate_s"] - in_steps, 0.0)
    cut = t.get("unfinished_step_s") or 0.0  # the step Ctrl-C stopped (its gradient and filter are in the split's too)
    rest = max(t["wall_s"] - t["setup_s"] - steps - cut - start, 0.0)
    unfinished = f", the step Ctrl-C stopped {cut:.1f} s" if cut else ""
    return (f"{t['wall_s']:.1f} s total: set-up {t['setup_s']:.1f} s, {t['steps']} steps {steps:.1f} s ({split}){unfinished}, "
            f"the start's evaluation {start:.1f} s, the reference score and the rest {rest:.1f} s{probe}")
