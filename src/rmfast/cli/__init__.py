"""rmfast command line: the top floor. Parses arguments, prints messages, sets exit codes; owns no logic.

One module per subcommand, each with ``register(subparsers)`` and the function it runs; the
library (everything outside this package) never imports it.

Exit codes: 0 success, 2 bad input (one-line message, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import sys

from ..version import __version__
from ..errors import UserError
from . import analyze, bench, common, explore, gcg, implicit, logprobs, models, reproduce, scan, score, sweep

COMMANDS = (scan, score, logprobs, implicit, gcg, sweep, analyze, bench, models, reproduce, explore)


def build_parser() -> argparse.ArgumentParser:
    ap = common.Parser(prog="rmfast", description="Exhaustive, exact, fast reward-model scanning.")
    ap.add_argument("--version", action="version", version=f"rmfast {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=common.Parser)
    sub.required = True
    for cmd in COMMANDS:
        cmd.register(sub)
    return ap


#: Write failures that are the machine's state, not a bug: the disk or quota is full, the filesystem is
#: read-only, permission is denied. Met in the middle of any command's writes, they are one line.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def run(func, args) -> int:
    """Run a command: a UserError (or a full disk, read-only or forbidden write) is one line on stderr
    and exit 2; Ctrl-C is 130."""
    common.quiet()
    try:
        return int(func(args) or 0)
    except UserError as e:
        print(f"rmfast: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        where = f": {e.filename}" if e.filename else ""
        print(f"rmfast: error: {e.strerror}{where} (free space, fix the permissions, or choose another path)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rmfast: interrupted; rerun the same command to resume from the checkpoint", file=sys.stderr)
        return 130


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UserError as e:  # an unknown option or a bad value (common.Parser)
        print(f"rmfast: error: {e}", file=sys.stderr)
        return e.exit_code
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
