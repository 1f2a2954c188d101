"""Inductor's on-disk cache: a folder per CPU kind and kernel level, chosen without importing torch.

Why a folder of its own: inductor's cache key does not include ATen's CPU capability, so C++ kernels
compiled under one level were loaded under another and computed garbage. Measured on a Zen 4
(AVX-512), torch 2.13: after a process with ``ATEN_CPU_CAPABILITY=avx2`` had compiled the log-prob
head's chunk update, a normal process loaded its kernel from the shared ``/tmp/torchinductor_<user>``:
wrong max/sum-exp in ~all rows, heap corruption ("double free") at other row counts, and a
full-vocabulary scan of NaN. The same can happen to a cache shared by two kinds of CPU (a home folder
on a cluster).

Why without torch: ``import rmfast`` sets it (loading a model through transformers fixes the folder
for the process, so it must be set first), and ``import rmfast`` must stay cheap (issue 37: the CLI
took 8-11 s to print its help). The key is what decides the kernels without asking torch: the CPU's
model, architecture and flags (:data:`FLAGS`; ATen's kernel level follows from them), the environment
that limits the kernel level (:data:`ISA_ENV`, ``ATEN_CPU_CAPABILITY`` among them) and torch's version.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import platform
import re
import tempfile
from functools import lru_cache

#: the CPU flags rmfast reads: bf16 support (the dtype choice) and the kernel levels (the compile cache)
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "bf16", "sve")
#: the environment variables that limit which kernels run
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@lru_cache(maxsize=1)
def proc_cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) from Linux's /proc/cpuinfo; elsewhere platform's words and no flags."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:  # x86 / aarch64
                    flags = set(val.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), frozenset(flags)


def isa_env() -> str:
    """The environment variables in effect that limit which kernels run ("" for none), e.g.
    ``ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=AVX2``: a benchmark row on such a run is labelled."""
    return ",".join(f"{k}={os.environ[k]}" for k in ISA_ENV if os.environ.get(k))


def _torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return ""


def _default_parent() -> str:
    """Where inductor keeps its cache by default (torch's ``default_cache_dir``: the temp folder's
    ``torchinductor_<user>``); rmfast's folders go inside it."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def isolate_compile_cache() -> str | None:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at ``<inductor's default>/rmfast-<hash of the key>`` unless the user
    (or an earlier call) chose one; returns the folder set, else None."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    model, flags = proc_cpuinfo()
    key = "|".join([model, platform.machine(), ",".join(x for x in FLAGS if x in flags), isa_env(), _torch_version()])
    folder = os.path.join(_default_parent(), "rmfast-" + hashlib.sha256(key.encode()).hexdigest()[:12])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder
