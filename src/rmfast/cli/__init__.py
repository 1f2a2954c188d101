"""rmfast command line: the top floor. Parses arguments, prints messages, sets exit codes; owns no logic.

One module per subcommand, each with ``register(subparsers)`` and the function it runs; the
library (everything outside this package) never imports it.

Exit codes: 0 success, 2 bad input (one-line message, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from ..version import __version__
from ..errors import UserError
from . import analyze, bench, common, explore, gcg, implicit, logprobs, models, reproduce, scan, score, serve, sweep

COMMANDS = (scan, score, logprobs, implicit, gcg, sweep, serve, analyze, bench, models, reproduce, explore)


def build_parser() -> argparse.ArgumentParser:
    ap = common.Parser(prog="rmfast", description="Exhaustive, exact, fast reward-model scanning.")
    ap.add_argument("--version", action="version", version=f"rmfast {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=common.Parser)
    sub.required = True
    for cmd in COMMANDS:
        cmd.register(sub)
    return ap


run = common.run_command  # the name tests and scripts use


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UserError as e:  # an unknown option or a bad value (common.Parser)
        print(f"rmfast: error: {e.cli_message()}", file=sys.stderr)
        return e.exit_code
    return common.run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
