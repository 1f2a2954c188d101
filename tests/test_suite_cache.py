"""The suite's own rmfast cache (issue 50 item 2): a test run neither reads nor changes the verdicts an earlier run
or another job left in the user's cache; only the expensive model conversions are shared (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from rmfast.loading.sources import cache_root


def test_the_suite_has_its_own_cpu_verdicts_and_shares_the_conversions():
    user = Path.home() / ".cache" / "rmfast"
    root = cache_root()
    assert os.environ.get("RMFAST_CACHE") and root.resolve() != user.resolve()
    assert not (root / "cpu").exists() or not (root / "cpu").is_symlink()  # GEMM and padding verdicts: this run's
    for shared in ("converted", "gguf"):  # a minute and more each to rebuild: the user's own
        if (root / shared).exists():
            assert (root / shared).is_symlink()
