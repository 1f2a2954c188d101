"""Where the papers' data lives (the folder holding ``eloeverything/``, ``iclr2026/`` and ``lexicons/``): one rule for
``rmfast reproduce`` and ``rmfast implicit --demo``. The data is not in the wheel: it comes with the papers' published
files, laid out as the README's ``rmfast reproduce`` entry says; a checkout finds it beside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import UserError

#: the environment variable naming the folder
ENV = "RMFAST_SHARED_DATA"


def candidates() -> list[Path]:
    """The folders tried, in order: ``$RMFAST_SHARED_DATA``; ``../shared/data`` and ``shared/data`` from the working
    directory; ``../shared/data`` beside this checkout's repository (a source checkout only: in an installed wheel
    that path is inside the environment and means nothing)."""
    env = os.environ.get(ENV)
    out = [Path(env)] if env else []
    out += [Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    repo = Path(__file__).resolve().parents[4]  # src/rmfast/analysis/data/shared.py -> the checkout
    if (repo / "pyproject.toml").is_file():
        out.append(repo.parent / "shared" / "data")
    return list(dict.fromkeys(out))


def shared_data_dir(what: str = "--data DIR") -> Path:
    """The first of :func:`candidates` that is a folder, else one UserError naming the ones tried and the way out
    (``what``: the option that gives the folder). ``$RMFAST_SHARED_DATA`` set to a missing folder is refused, not
    passed over."""
    env = os.environ.get(ENV)
    if env and not Path(env).is_dir():
        raise UserError(f"${ENV}={env} is not a folder; set it to the folder holding eloeverything/ and iclr2026/")
    tried = candidates()
    for c in tried:
        if c.is_dir():
            return c
    raise UserError(f"the papers' data folder (holding eloeverything/ and iclr2026/) was not found in "
                    f"{', '.join(str(c) for c in tried)}; pass {what} or set ${ENV} (the data is not part of the "
                    "package: the papers' published files, laid out as the README's `rmfast reproduce` entry says)")
