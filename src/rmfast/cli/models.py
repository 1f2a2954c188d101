"""``rmfast models``: the known reward models (:mod:`rmfast.loading.registry`) and how far rmfast covers each."""

from __future__ import annotations

import json

from ..errors import UserError
from ..loading.registry import BASES, MODELS, find, short_revision

#: the table's revision where the registry pins none (no recorded commit: loading takes the cache's refs/main)
UNPINNED = "unpinned"


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list the known reward models: alias, hub id, pinned revision (or "
                                             "unpinned), whether it is in the local HF cache, architecture, head, status",
                              description="The papers' ten reward models and RewardBench 2's open leaders. Any alias "
                                          "(or hub id) works wherever a model is named, from the local Hugging Face "
                                          "cache, and with `rmfast bench --random-init ALIAS`.")
    p.add_argument("name", nargs="?", default=None, help="one model's details: alias or hub id (default: the table)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table: the registry's models, then the embedded ones (each row's \"kind\"); default: the table")
    p.set_defaults(func=run)


def entry(m) -> dict:
    """One model as the JSON output gives it: every registry field, the computed counts and the status."""
    from ..loading.sources import cache_state
    from ..loading.support import coverage  # imports torch: not for `rmfast --help`

    cov = coverage(m)
    return {"alias": m.alias, "kind": "registry", "hub_id": m.hub_id, "revision": m.revision, "cached": cache_state(m),
            "source": m.source, "base": m.base,
            "base_hub_id": BASES[m.base].hub_id, "model_type": m.model_type, "hf_class": m.hf_class, "head": m.head,
            "score_read": m.score_read, "vocab_size": m.vocab_size, "params": m.n_params,
            "params_published_b": m.params_b, "template": m.template, "replica_test": m.replica_test,
            "fast_arch": cov.arch, "fast_head": cov.head, "status": cov.text(m), "config": m.config()}


def table(rows: list[dict]) -> str:
    """The ``rmfast models`` table: one line per model, the columns split on spaces."""
    cols = [("alias", "alias"), ("hub id", "hub_id"), ("revision", "revision"), ("cached", "cached"),
            ("arch", "model_type"), ("head", "head"), ("vocab", "vocab_size"), ("params", "params"),
            ("status", "status")]
    # no pinned commit is said in words: a "-" read as "pinned, not shown"; an unpinned alias loads the cache's main
    fmt = {"vocab_size": lambda v: f"{v:,}", "params": lambda v: f"{v / 1e9:.2f}B",
           "revision": lambda v: short_revision(v) or UNPINNED, "cached": lambda v: v.replace(" ", "-")}
    cells = [[fmt.get(k, str)(r[k]) for _, k in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line([h for h, _ in cols]), line(["-" * w for w in widths])] + [line(c) for c in cells])


def embedded_entry(e) -> dict:
    """An embedded model (offline, from a pip package) as ``rmfast models NAME`` gives it."""
    import importlib.metadata

    try:
        installed = bool(importlib.metadata.distribution(e.package))
    except importlib.metadata.PackageNotFoundError:
        installed = False
    return {"alias": e.alias, "kind": "embedded", "name": e.display_name, "package": e.package, "installed": installed,
            "install": e.install, "template": e.default_template or "its chat template", "about": e.doc}


def embedded_table() -> str:
    """The embedded models under the registry's table: the models that run offline, from pip packages."""
    from ..loading.sources import EMBEDDED, install_hint

    rows = [(embedded_entry(e), e) for e in EMBEDDED.values()]
    lines = ["", "embedded (offline, GGUF from a pip package; a causal LM: a score head with --random-head-seed):"]
    lines += [f"  {r['alias']:<24} {r['name']:<28} {'installed' if r['installed'] else 'not installed: ' + install_hint(e)}"
              for r, e in rows]
    return "\n".join(lines)


def run(args) -> int:
    if args.name is not None:
        from ..loading.sources import embedded

        m = find(args.name)
        if m is None and (e := embedded(args.name)) is not None:
            d = embedded_entry(e)
            print(json.dumps(d, indent=1) if args.json else "\n".join(f"{k:>18}: {v}" for k, v in d.items()))
            return 0
        if m is None:
            raise UserError(f"no known reward model '{args.name}': `rmfast models` lists them (alias or hub id) and "
                            "the embedded models")
        e = entry(m)
        if args.json:
            print(json.dumps(e, indent=1))
        else:
            for k, v in e.items():
                v = UNPINNED if k == "revision" and v is None else v
                print(f"{k:>18}: {json.dumps(v) if isinstance(v, dict) else v}")
        return 0
    rows = [entry(m) for m in MODELS.values()]
    if args.json:  # the embedded models too, as the table lists them ("kind" tells the two apart)
        from ..loading.sources import EMBEDDED

        print(json.dumps(rows + [embedded_entry(e) for e in EMBEDDED.values()], indent=1))
        return 0
    print(table(rows) + "\n" + embedded_table())
    return 0
