"""The package version, and the versions every manifest records, in a module any layer can import."""

__version__ = "0.1.0"


def versions() -> dict:
    """rmfast, torch, transformers, numpy and Python versions, the platform and the thread count
    (what a result's numbers depend on)."""
    import os
    import platform
    import sys

    import numpy as np
    import torch
    import transformers

    return {
        "rmfast": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
