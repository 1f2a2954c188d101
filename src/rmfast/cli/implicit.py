"""``rmfast implicit``: implicit reward (log ratio, MWLR) between two LMs over their shared strings."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError
from ..io import check_output, slug, write_csv
from ..template import unescape
from . import common


def _side(spec: str, args):
    """A loaded model, or a ScanResult when ``spec`` is a logprobs Parquet file."""
    from ..scoring.results import ScanResult

    if spec.lower().endswith(".parquet.json"):
        raise UserError(f"{spec} is a manifest; give the logprobs .parquet beside it ({spec[:-5]})")
    if spec.lower().endswith(".parquet"):
        if not Path(spec).is_file():
            raise UserError(f"{spec}: no such file")
        try:
            return ScanResult.from_parquet(spec)
        except (OSError, ValueError) as e:  # pyarrow's errors for a damaged file are OSError / ArrowInvalid
            raise UserError(f"cannot read {spec} as a logprobs Parquet ({str(e).splitlines()[0][:160]}); "
                            "rewrite it with 'rmfast logprobs'") from None
        except KeyError as e:  # a text-candidate or decode-retokenize scan: rows of texts, not one per token
            raise UserError(f"{spec} is not a token scan (no {e.args[0]!r} column: a scan of texts, --candidates or "
                            "--compat); implicit reads one log-prob per vocabulary token: rmfast logprobs MODEL "
                            "--out FILE") from None
    lm = common.load_model(argparse.Namespace(model=spec, dtype=args.dtype, device=args.device,
                                  trust_remote_code=args.trust_remote_code, cache_dir=args.cache_dir,
                                  allow_pickle=args.allow_pickle))
    if lm.kind != "causal_lm":
        raise UserError(f"{spec} is a {lm.kind}, not a causal language model; implicit needs two LMs")
    return lm


def _sides(args):
    """Models a and b (or their logprobs files), refusing what would be ignored or meaningless: the same one on both
    sides (an all-zero table), a model's prompt-side options for a file (made with its own, in its manifest)."""
    from ..scoring.results import ScanResult

    same = (Path(args.model_a).resolve() == Path(args.model_b).resolve() if Path(args.model_a).exists() else
            args.model_a == args.model_b)
    if same and (args.model_a.lower().endswith(".parquet") or (args.template_a, args.system_a) == (args.template_b,
                                                                                                   args.system_b)):
        # (one model under two prompt sides is a comparison: chat template against the raw prompt)
        raise UserError(f"--model-a and --model-b are both {args.model_a}, with one prompt side: every log ratio would "
                        "be 0; give two models, or two prompt sides (--template-a/-b)")
    a, b = _side(args.model_a, args), _side(args.model_b, args)
    for x, s in ((a, "a"), (b, "b")):
        given = [f"--{o}-{s}" for o in ("template", "system") if getattr(args, f"{o}_{s}") is not None]
        if isinstance(x, ScanResult) and given:
            raise UserError(f"{given[0]} applies to a model; model {s} is a logprobs file, made with its own prompt side "
                            f"(in its manifest): drop {given[0]}, or give the model")
    return a, b


def _demo_fixed(args) -> None:
    """--demo runs a fixed comparison (the embedded pair, words, max per word, the chat template for a): an option that
    would change it is refused (they had been ignored without a word)."""
    fixed = [f"--{k.replace('_', '-')}" for k in ("model_a", "model_b", "prompt", "template_a", "system_a", "system_b")
             if getattr(args, k, None) is not None]
    fixed += [f"--{k}" for k, demo in (("join", "word"), ("agg", "max")) if getattr(args, k) not in (None, demo)]
    fixed += ["--exclude-special"] if args.exclude_special else []
    if fixed:
        raise UserError(f"--demo compares the embedded pair on words, as documented; {fixed[0]} would change that: drop "
                        "it, or run the comparison without --demo")


def _prompts(args, read_prompts) -> dict | None:
    """The --prompts-yaml prompts (id: text), narrowed to the --prompt-id ones; None for one --prompt."""
    if args.prompts_yaml and args.prompt:
        raise UserError("give --prompt or --prompts-yaml, not both")
    if args.prompt_id and not args.prompts_yaml:
        raise UserError("--prompt-id picks prompts of a --prompts-yaml file; add --prompts-yaml FILE (or drop "
                        "--prompt-id and give --prompt)")
    prompts = read_prompts(args.prompts_yaml) if args.prompts_yaml else None
    if prompts is not None and args.prompt_id:
        missing = [p for p in args.prompt_id if p not in prompts]
        if missing:
            raise UserError(f"prompt id(s) {missing} not in {args.prompts_yaml}")
        prompts = {k: prompts[k] for k in args.prompt_id}
    return prompts


def run(args) -> int:
    from ..analysis.data.lexicons import load_dictionary
    from ..implicit import (DEMO_TEMPLATE_B, agency_communion_demo, dictionary_summary, implicit, implicit_sweep,
                            read_prompts, summary_text)
    from ..scoring.results import ScanResult

    if args.demo:
        _demo_fixed(args)
        r = agency_communion_demo(prompts_yaml=args.prompts_yaml, dictionary=args.dictionary, prompt_ids=args.prompt_id,
                                  out=args.out, overwrite=args.overwrite, cache_dir=args.cache_dir,
                                  template_b=_tmpl(args.template_b) or DEMO_TEMPLATE_B, progress=not args.no_progress,
                                  dtype=args.dtype, device=args.device)  # (they had been ignored: fp32 on the CPU)
        print(r["text"])
        print(f"\nwrote {args.out}, {args.out}.json and {args.out}.categories.csv" if args.out else
              "\n(nothing written: --out FILE.parquet keeps the table, its manifest and the category medians)")
        return 0
    args.join, args.agg = args.join or "text", args.agg or "max"
    if not args.model_a or not args.model_b:
        raise UserError("give --model-a and --model-b (models, or logprobs Parquet files), or --demo")
    prompts = _prompts(args, read_prompts)
    if args.dictionary and args.join != "word":
        raise UserError("--dictionary matches words: add --join word (so 'Love' and ' love' both count as 'love')")
    dic = load_dictionary(args.dictionary) if args.dictionary else None
    if args.out:
        check_output(args.out, args.overwrite, suffix=".parquet")  # before loading the models
    a, b = _sides(args)
    files = [x for x in (a, b) if isinstance(x, ScanResult)]
    if files and prompts is not None:
        raise UserError("a logprobs Parquet input holds one prompt; use --prompt (or compute both sides from models)")
    prompt = args.prompt
    for f in files:
        if prompt is not None and f.manifest.get("prompt") not in (None, prompt):
            raise UserError(f"--prompt {prompt!r} is not the prompt of the logprobs Parquet input "
                            f"({f.manifest['prompt']!r}); both sides must answer the same prompt")
    if prompts is None and prompt is None:
        prompt = files[0].manifest.get("prompt") if files else None
        if prompt is None:
            prompt = "What, in one word, is the greatest thing ever?"
    names = [slug((x.manifest.get("model") or {}).get("name", "a") if isinstance(x, ScanResult)
                   else (x.source.get("name") or s), 24) for x, s in ((a, args.model_a), (b, args.model_b))]
    tag = slug(Path(args.prompts_yaml).stem) if prompts is not None else slug(prompt)
    out = args.out or f"results/implicit__{names[0]}__{names[1]}__{tag}.parquet"
    out = check_output(out, args.overwrite, suffix=".parquet")
    kw = dict(template_a=_tmpl(args.template_a), template_b=_tmpl(args.template_b), system_a=args.system_a,
              system_b=args.system_b, join=args.join, agg=args.agg, exclude_special=args.exclude_special)
    if prompts is not None:
        res = implicit_sweep(a, b, prompts, progress=not args.no_progress, **kw)
    else:
        res = implicit(a, b, prompt, **kw)
    summ = None
    if dic is not None:
        summ = dictionary_summary(res.table, dic, name_a=res.manifest["model_a"], name_b=res.manifest["model_b"],
                                  prompt=prompt)
        res.manifest["dictionary"] = {"path": str(args.dictionary), "tests": summ["tests"].to_dict("records")}
    res.to_parquet(out, overwrite=args.overwrite)
    m = res.manifest
    print(f"a = {m['model_a']} ({m['a']['template']['kind']}), b = {m['model_b']} ({m['b']['template']['kind']}); "
          f"join on {args.join}, {args.agg} per key")
    cts = [m["counts"]] if isinstance(m["counts"], dict) else m["counts"]
    c = cts[0]
    print(f"shared {c['shared']} {'strings' if args.join == 'text' else 'words'}"
          f"{' (first prompt)' if len(cts) > 1 else ''}; a: {_counts_of(c, 'a')}; b: {_counts_of(c, 'b')}")
    if args.top and prompts is None:
        cols = ["text", "logp_a", "logp_b", "log_ratio", "mwlr"]
        for by in ("log_ratio", "mwlr"):
            for title, df in ((f"top {args.top} by {by} (a over b)", res.top(args.top, by)),
                              (f"bottom {args.top} by {by} (b over a)", res.bottom(args.top, by))):
                view = df[cols].assign(text=df["text"].map(repr)).round(4)
                print(f"\n{title}\n{view.to_string(index=False)}")
    if summ is not None:
        print("\n" + summary_text(summ))
        write_csv(Path(str(out) + ".categories.csv"), summ["summary"])
    print(f"\nwrote {out} and {out}.json" + (f" and {out}.categories.csv" if summ is not None else ""))
    return 0


def _tmpl(t):
    from ..logprobs import RAW

    return RAW if t == "raw" else None if t is None else unescape(t)  # raw: the raw prompt, chat template or not


def _counts_of(c: dict, side: str) -> str:
    """One model's counts, every token accounted for: keys, tokens collapsed into them, and those left out (byte pieces
    decoding to U+FFFD, NaN/inf log-probs, whitespace-only words); then the keys the other model lacks."""
    out = [f"{c.get(f'{k}_{side}', 0)} {what}" for k, what in (("unreadable", "unreadable byte pieces"),
                                                             ("nonfinite", "NaN/inf"), ("blank", "blank"))
           if c.get(f"{k}_{side}")]
    return (f"{c[f'tokens_{side}']} tokens -> {c[f'strings_{side}']} keys ({c[f'collapsed_{side}']} collapsed"
            + "".join(f", {o}" for o in out) + f"), {c[f'dropped_{side}']} dropped")


def register(sub) -> None:
    p = sub.add_parser("implicit", help="implicit reward (log ratio, MWLR) between two LMs over their shared strings",
                       description="Per shared string t: log p_a(t) - log p_b(t) (DPO-style implicit reward) and "
                       "MWLR = 1/2 (p_a + p_b)(log p_a - log p_b), from each model's next-token distribution of the "
                       "first response token. Different tokenizers are joined on decoded strings (highest log-prob "
                       "per string).")
    p.add_argument("--model-a", help="model a: alias, folder, .gguf, hub id, or a logprobs .parquet")
    p.add_argument("--model-b", help="model b (the reference of the ratio)")
    p.add_argument("--prompt", default=None, help="the user turn (default: the paper's greatest-thing prompt)")
    p.add_argument("--prompts-yaml", default=None, help="sweep: a YAML mapping id: prompt (e.g. paper_b_prompts.yaml)")
    p.add_argument("--prompt-id", action="append", help="with --prompts-yaml: only these ids (repeatable)")
    for s in ("a", "b"):
        p.add_argument(f"--template-{s}", default=None,
                       help=f"model {s}'s prompt side: 'User: {{prompt}}\\nAssistant:' (\\n unescaped), a Jinja template, or 'raw' "
                       "(default: chat template + generation prompt; the raw prompt for base models)")
        p.add_argument(f"--system-{s}", default=None, help=f"system message for model {s}")
    p.add_argument("--join", default=None, choices=("text", "word"),  # rmfast.implicit.JOINS (tests/test_new_user.py)
                   help="text (default): exact decoded strings; word: stripped, lower-cased (dictionary analyses)")
    p.add_argument("--agg", default=None, choices=("max", "logsumexp"),  # rmfast.implicit.AGGS
                   help="several tokens with one key: max (default, the highest log-prob) or logsumexp")
    p.add_argument("--exclude-special", action="store_true", help="drop special/added tokens before the join")
    p.add_argument("--dictionary", default=None, help="category dictionary (e.g. big2_nouns.csv): median rank per "
                   "category of log p_a, log p_b, log ratio, MWLR (use with --join word)")
    p.add_argument("--demo", action="store_true", help="Big Two agency vs communion on the embedded pair "
                   "(SmolLM2-135M-Instruct vs Gemma 3 270M, all 54 Paper B prompts unless --prompt-id)")
    p.add_argument("--out", default=None, help="output Parquet (default results/implicit__<a>__<b>__<prompt>.parquet; "
                   "--demo writes only with --out)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (default: refuse)")
    p.add_argument("--top", type=common.nonneg_int, default=10, help="rows in the printed tables (single prompt; default 10)")
    p.add_argument("--no-progress", action="store_true", help="no per-prompt progress lines")
    common.add_model_args(p, dtype_default="float32", positional=False)  # one forward pass per model: exact
    p.set_defaults(func=run)
