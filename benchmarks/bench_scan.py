#!/usr/bin/env python
"""rmfast vs plain-HF baselines and the GEMM peak, in one process: same as ``rmfast bench``.

    python benchmarks/bench_scan.py [--device auto|cpu|cuda] [--models ...] [--n-candidates N] [--full] [--out DIR]

See benchmarks/README.md for the methods, the cost model and the latest table.
"""

import sys
from pathlib import Path

try:
    from rmfast.cli.bench import main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rmfast.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
