"""`rmfast ...` under torchrun with a fault on rank 0 (tests/test_dist.py): FAIL_WRITE=1 makes rank 0's write of the
merged output fail as a full disk does (ENOSPC)."""
import errno
import os
import sys


def _full(self, *a, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


if __name__ == "__main__":  # run by torchrun, never on import (pytest collects doctests from this folder)
    from rmfast.cli import main
    from rmfast.scoring import results

    if os.environ.get("RANK") == "0" and os.environ.get("FAIL_WRITE") == "1":
        results.ScanResult.to_parquet = _full
        results.TextScanResult.to_parquet = _full
    sys.exit(main(sys.argv[1:]))
