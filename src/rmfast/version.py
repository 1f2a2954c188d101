"""The package version, in a module any layer can import (the versions every manifest records:
:func:`rmfast.cpu.versions`)."""

from functools import lru_cache

__version__ = "0.1.0"


@lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The git commit rmfast runs from, ``-dirty`` where tracked files differ from it (a source checkout, as
    ``make`` installs it), or None (an installed wheel, no git): a benchmark row or manifest names the code
    behind its numbers, not only the version, which does not change between commits."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
