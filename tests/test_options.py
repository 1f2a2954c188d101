"""rmfast.scoring.options: one options value (ScoringOptions), frozen and validated, whose fields are the CLI's
flags and the README's options table (the decisions made from it: test_plan.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rmfast.errors import UserError
from rmfast.scoring.options import ScoringOptions, flag, option_fields

ROOT = Path(__file__).resolve().parents[1]


def test_options_are_one_frozen_validated_value():
    o = ScoringOptions(engine="reference", batch_size="64", compile=False)
    assert (o.engine, o.batch_size, o.compile) == ("hf", 64, "off")  # canonical values
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.engine = "fast"
    assert o.replace(head="score").head == "score" and o.head == "auto"
    for bad in ({"head": "reward"}, {"engine": "turbo"}, {"compile": "maybe"}, {"batch_size": 0},
                {"attention": "flashy"}, {"kernels": "cuda"}, {"compat": "papers"}, {"head_index": -1},
                {"projections": "both"}):
        with pytest.raises(UserError):
            ScoringOptions(**bad)
    with pytest.raises(TypeError, match="not a scoring option: enigne"):
        ScoringOptions.of(None, enigne="hf")


def test_option_lists_agree_with_the_kernels_forms():
    """options.py names the attention forms without importing torch (the CLI's help); they are ops' forms."""
    from rmfast.fast import ops
    from rmfast.scoring import options

    assert options.ATTENTION_FORMS == ops.ATTENTION_FORMS


@pytest.mark.parametrize("command", ["scan", "gcg", "score"])
def test_cli_flags_are_generated_from_the_options(command):
    """Each command's scoring flags are the options' fields: same name, default and doc."""
    from rmfast.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    actions = {a.option_strings[0]: a for a in sub.choices[command]._actions if a.option_strings}
    for f in option_fields():
        a = actions[flag(f.name)]
        assert a.default == f.default, f.name
        assert f.metadata["doc"][:40] in a.help or f.name == "batch_size", f.name
        assert f"(default {f.default})" in a.help, f.name


def test_readme_options_table_lists_every_option_with_its_default():
    """The README's options table has a row per option, its default the field's."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\| `(--[a-z-]+)` \| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    backend = (ROOT / "docs" / "backend.md").read_text()
    for f in dataclasses.fields(ScoringOptions):
        if f.metadata["api_only"]:  # a Python caller's option (RewardScorer): documented with the backend
            assert f"`{f.name}" in backend, f"docs/backend.md does not document {f.name}"
            continue
        assert flag(f.name) in rows, f"README options table has no row for {flag(f.name)}"
        want = "off" if f.default is None else str(f.default) if isinstance(f.default, int) else f"`{f.default}`"
        assert rows[flag(f.name)] == want, (f.name, rows[flag(f.name)])


def test_gcg_carries_every_scoring_flag_to_its_plan():
    """`rmfast gcg` has every scoring flag (generated from the options): its config must carry each one to the plan,
    or a flag would be accepted and ignored (--projections was, until its field was added)."""
    import argparse

    from rmfast.cli import build_parser
    from rmfast.cli.gcg import run
    from rmfast.gcg import GCGConfig

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    gcg_flags = {a.dest for a in sub.choices["gcg"]._actions if a.option_strings}
    src = Path(run.__code__.co_filename).read_text()
    for f in option_fields():
        assert f.name in gcg_flags, f.name
        assert f"args.{f.name}" in src, f"rmfast gcg does not pass --{f.name} to its config"
        other = next((c for c in f.metadata["choices"] or () if c != f.default), None)
        if other is None:  # a free value (batch size, head index): one that is not the default
            other = 7 if f.name in ("batch_size", "head_index") else None
        if other is None:
            continue
        assert getattr(GCGConfig(**{f.name: other}).scoring(), f.name) == getattr(ScoringOptions(**{f.name: other}),
                                                                                 f.name), f.name
