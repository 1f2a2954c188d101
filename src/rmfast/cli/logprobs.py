"""``rmfast logprobs``: next-token log-probability of every vocabulary token (one forward pass)."""

from __future__ import annotations

from ..errors import UserError
from ..io import check_output, slug
from . import common


def register(sub) -> None:
    p = sub.add_parser("logprobs", help="next-token log-probability of every vocabulary token (one forward pass)",
                       description="Log-probability of every vocabulary token as the first response token: the chat "
                       "template + generation prompt for instruction-tuned models, the raw prompt (or --template) for "
                       "base models. Same output format as scan; the full response log-probability with end-of-turn "
                       "is 'rmfast scan --head logprob'.")
    common.add_model_args(p, dtype_default="float32")  # one forward pass is cheap: exact by default
    p.add_argument("--prompt", default="What, in one word, is the greatest thing ever?", help="the user turn")
    p.add_argument("--template", default=None,
                   help="plain prompt side such as 'User: {prompt}\\nAssistant:' (\\n and \\t are unescaped; a '{response}' slot is allowed: the "
                   "ids before it are used), or a Jinja chat template (default: the chat template + generation prompt; "
                   "the raw prompt for base models)")
    p.add_argument("--system", default=None, help="system message (default: the template's own default)")
    p.add_argument("--token-ids", default=None, help="subset: a range A:B or a file with one id per line (default: all)")
    p.add_argument("--exclude-special", action="store_true", help="drop special/added tokens from the output")
    p.add_argument("--out", default=None, help="output Parquet (default results/<model>__<prompt>__logprobs.parquet)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output (default: refuse)")
    p.add_argument("--top", type=common.nonneg_int, default=20, help="rows in the printed top table (default 20; 0 = none)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..logprobs import logprobs

    if args.out:
        check_output(args.out, args.overwrite, suffix=".parquet")  # before loading anything
    lm = common.load_model(args)
    if lm.kind != "causal_lm":
        raise UserError(f"{args.model} is a {lm.kind}, not a causal language model; logprobs needs an LM head")
    out = args.out or common.default_output(slug(lm.source.get('name') or args.model), args.prompt, "__logprobs.parquet")
    out = check_output(out, args.overwrite, suffix=".parquet")
    res = logprobs(lm.model, lm.tokenizer, args.prompt, template=common.template_arg(args), system=args.system,
                   token_ids=args.token_ids, exclude_special=args.exclude_special, model_info=lm.source)
    res.to_parquet(out, overwrite=args.overwrite)
    m = res.manifest
    if args.top:
        common.print_tables(res, args.top, bottom=False,
                            title=f"top {args.top} next-token log-probabilities ({m['template']['kind']})")
    print(f"\n{m['n_candidates']} candidates from one forward pass over {len(m['template']['prefix_ids'])} prompt tokens "
          f"({m['dtype']}, {m['device']}) in {m['wall_s']:.1f} s")
    print(f"wrote {out} and {out}.json")
    return 0
