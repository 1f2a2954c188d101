"""The CPU rmfast runs on: its features, how fast it multiplies in each dtype, and the dtype
``--dtype auto`` takes there.

bf16 halves the memory traffic and, where the CPU multiplies bf16 natively (AMX tiles on Xeon
Sapphire Rapids and later; AVX-512 BF16 on Cooper Lake, Zen 4 and later), runs 2-10x faster than
fp32. Where it does not (AVX2-only: most laptops, many cloud VMs, older servers), torch converts
every bf16 operand to fp32 and back, and bf16 runs several to 30x *slower* than fp32 while
rounding worse. So on CPU ``auto`` takes bf16 only where a GEMM at the model's own shapes runs
clearly faster in bf16 than in fp32 on this machine:

- x86 without AVX-512 BF16 or AMX: bf16 is emulated; fp32 is chosen from the flags alone, no probe;
- otherwise a probe times both dtypes at the model's projection shape (well under a second), and
  the result is cached per CPU model, flags, torch version, thread count and shape in
  ``<rmfast cache>/cpu/gemm-probe.json``, so every later job on the machine makes the same choice.

A measured choice is a :class:`DtypeChoice`: one line for the user and a ``dtype_choice`` entry
for the manifest. An explicit bf16 on a CPU where it is slower gets a one-line warning with the
measured factor (:func:`warn_if_slow`).

Two more things about the CPU keep its results right, and live here too: MKL's reproducible mode
(set on import, reported by :func:`mkl_cbwr`: the same bits in every process) and one inductor cache
per CPU kind (:func:`isolate_compile_cache`; every compile goes through :func:`compile_here`). And what
every manifest records about the machine and the software a result was computed with (:func:`versions`,
:func:`manifest_fields`).

Why an inductor cache of its own: inductor's cache key does not include ATen's CPU capability, so C++
kernels compiled under one level were loaded under another and computed garbage. Measured on a Zen 4
(AVX-512), torch 2.13: after a process with ``ATEN_CPU_CAPABILITY=avx2`` had compiled the log-prob
head's chunk update, a normal process loaded its kernel from the shared ``/tmp/torchinductor_<user>``:
wrong max/sum-exp in ~all rows, heap corruption ("double free") at other row counts, and a
full-vocabulary scan of NaN. The same can happen to a cache shared by two kinds of CPU (a home folder
on a cluster). ``import rmfast`` sets it (loading a model through transformers fixes the folder for the
process, so it must be set first), and ``import rmfast`` must stay cheap (issue 37: the CLI took 8-11 s
to print its help): so this module imports torch only inside the functions that use it. The key is what
decides the kernels without asking torch: the CPU's model, architecture and flags (:data:`FLAGS`; ATen's
kernel level follows from them), the environment that limits the kernel level (:data:`ISA_ENV`,
``ATEN_CPU_CAPABILITY`` among them) and torch's version.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
import warnings

from .errors import UserNote
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from .dims import mlp_dims  # the probe's shape (also rmfast.cpu.mlp_dims for its callers)
from .io import write_json
from .version import __version__

#: the CPU flags rmfast reads: bf16 support (the dtype choice) and the kernel levels (the compile cache)
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "bf16", "sve")
#: the environment variables that limit which kernels run
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@lru_cache(maxsize=1)
def _first_cpu() -> dict[str, str]:
    """The first processor's fields in Linux's /proc/cpuinfo (key -> value; {} where there is none)."""
    got: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if not key and got:  # the first processor's block ends
                    break
                got.setdefault(key, val.strip())
    except OSError:
        pass
    return got


def proc_cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) from Linux's /proc/cpuinfo; elsewhere platform's words and no flags."""
    c = _first_cpu()
    flags = c.get("flags") or c.get("Features") or ""  # x86 / aarch64
    return c.get("model name") or platform.processor() or platform.machine(), frozenset(flags.split())


def cpu_id() -> str:
    """The CPU's vendor, family, model and stepping from Linux's /proc/cpuinfo (x86), e.g. ``AuthenticAMD family 26
    model 2 stepping 1``: the model name alone ("AMD EPYC" in a VM) does not tell one generation from the next. ""
    where there is none."""
    got = _first_cpu()
    parts = [got.get("vendor_id", "")] + [f"{k.removeprefix('cpu ')} {got[k]}" for k in ("cpu family", "model", "stepping")
                                          if k in got]
    return " ".join(p for p in parts if p)


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


#: auto takes bf16 only where a bf16 GEMM is at least this much faster than fp32 at the model's
#: shapes: the GEMMs are most but not all of a scan (norms, attention softmax and the fp32 head run
#: at the same speed or slower in bf16), and bf16 rounds scores ~2^-8 relative, so a marginal gain
#: does not pay for it.
BF16_MIN_GAIN = 1.3

#: the probe's GEMM: the model's MLP projection (hidden x intermediate), capped so one call is at most
#: ~PROBE_FLOPS (a few ms to a few tens of ms in fp32), with M rows = tokens of one engine batch
PROBE_FLOPS = 2e9
PROBE_ROWS = (64, 1024)
#: seconds each dtype is timed for, per trial (two interleaved trials; the best of each is kept)
PROBE_SECONDS = 0.08

_PRINTED: set[str] = set()


@dataclass(frozen=True)
class CpuInfo:
    """What this CPU is: model name, architecture, the bf16-relevant flags, torch's kernel level."""

    model: str
    arch: str  # platform.machine(): x86_64, aarch64, arm64 ...
    flags: tuple[str, ...]  # the subset of FLAGS this CPU has
    capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...

    @property
    def kind(self) -> str:
        """A label for benchmark rows: ``AMX``, ``AVX-512 BF16``, ``AVX-512``, ``AVX2-only``, or the arch."""
        f = set(self.flags)
        if self.arch not in ("x86_64", "AMD64", "i686"):
            return f"{self.arch}{' BF16' if 'bf16' in f else ''}"
        if "amx_bf16" in f:
            return "AMX"
        if "avx512_bf16" in f:
            return "AVX-512 BF16"
        if "avx512f" in f:
            return "AVX-512 (no BF16)"
        return "AVX2-only" if "avx2" in f else "x86 (no AVX2)"

    @property
    def native_bf16(self) -> bool | None:
        """True / False where the flags settle whether bf16 GEMMs run natively (x86); None elsewhere."""
        if self.arch not in ("x86_64", "AMD64", "i686"):
            return None
        return bool({"amx_bf16", "avx512_bf16"} & set(self.flags))


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's :class:`CpuInfo` (Linux /proc/cpuinfo; elsewhere platform's words, no flags)."""
    import torch

    model, flags = proc_cpuinfo()
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - very old torch
        cap = ""
    return CpuInfo(model=model, arch=platform.machine(),
                   flags=tuple(x for x in FLAGS if x in flags), capability=cap)


@dataclass
class DtypeChoice:
    """The dtype ``auto`` took on this CPU, why, and the measurements behind it (the manifest's ``dtype_choice``)."""

    dtype: str  # "float32" or "bfloat16"
    source: str  # "flags" (no probe needed), "probe" (measured now) or "cache" (measured earlier on this machine)
    reason: str  # one clause, e.g. "bf16 GEMMs run 0.2x fp32 here (emulated)"
    cpu: str
    cpu_kind: str
    gflops: dict = field(default_factory=dict)  # {"float32": .., "bfloat16": ..} at ``shape``; empty for "flags"
    shape: list = field(default_factory=list)  # [M, K, N] of the probe
    threads: int = 0
    torch: str = ""

    @property
    def bf16_factor(self) -> float | None:
        """bf16 GEMM speed / fp32 GEMM speed, where measured."""
        g = self.gflops
        return g["bfloat16"] / g["float32"] if g.get("float32") and g.get("bfloat16") else None

    def line(self) -> str:
        """The one line printed when a job takes this choice."""
        return (f"rmfast: --dtype auto -> {self.dtype} on this CPU [{self.cpu_kind}]: {self.reason}"
                + (" (measured earlier on this machine)" if self.source == "cache" else ""))

    def manifest(self) -> dict:
        return asdict(self)


def probe_shape(hidden: int, intermediate: int) -> tuple[int, int, int]:
    """The (M, K, N) the probe times: the MLP up-projection, K and N capped, M sized to ~PROBE_FLOPS.

    >>> probe_shape(576, 1536)
    (1024, 576, 1536)
    >>> probe_shape(4096, 14336)
    (238, 2048, 2048)
    """
    K, N = min(int(hidden), 2048), min(int(intermediate), 2048)
    M = int(PROBE_FLOPS // (2 * K * N))
    return max(PROBE_ROWS[0], min(PROBE_ROWS[1], M)), K, N


def measure_gemm(shape: tuple[int, int, int], dtypes=None,
                 seconds: float = PROBE_SECONDS) -> dict[str, float]:
    """GFLOP/s of ``x @ W^T`` (the Linear layout) at ``shape`` = (M, K, N) per dtype, on this CPU.

    Two interleaved trials of ~``seconds`` each per dtype after one warm-up call; the best trial counts
    (load from other programs only ever slows a trial down).
    """
    import torch

    dtypes = dtypes or (torch.float32, torch.bfloat16)
    M, K, N = shape
    g = torch.Generator().manual_seed(0)
    ops = {dt: (torch.randn(M, K, generator=g).to(dt), torch.randn(N, K, generator=g).to(dt).t()) for dt in dtypes}
    best = {dt: 0.0 for dt in dtypes}
    for dt, (x, w) in ops.items():
        torch.matmul(x, w)  # warm-up: oneDNN / BLAS picks and caches its kernel for the shape
    for _ in range(2):
        for dt, (x, w) in ops.items():
            n, t0 = 0, time.perf_counter()
            while True:
                torch.matmul(x, w)
                n += 1
                el = time.perf_counter() - t0
                if el >= seconds:
                    break
            best[dt] = max(best[dt], 2.0 * M * K * N * n / el / 1e9)
    return {str(dt).replace("torch.", ""): round_rate(v) for dt, v in best.items()}


def round_rate(v: float, digits: int = 4) -> float:
    """A measured rate (GFLOP/s, candidates/s) kept to ``digits`` significant digits, not decimals: a tiny
    model's GEMM on a CPU that emulates bf16 runs under 0.005 GFLOP/s, which two decimals made 0.0 (and a
    division by it). A positive rate stays positive.

    >>> round_rate(0.0012345678), round_rate(1234.5678), round_rate(0.0)
    (0.001235, 1235.0, 0.0)
    """
    return float(f"{v:.{digits}g}")


def _measured(rates) -> bool:
    """Whether ``rates`` holds a positive, finite rate for both dtypes (a cache entry or a probe's result)."""
    import math

    return isinstance(rates, dict) and all(isinstance(rates.get(k), (int, float)) and math.isfinite(rates[k])
                                           and rates[k] > 0 for k in ("float32", "bfloat16"))


def _cache_file(cache: Path | None) -> Path | None:
    return None if cache is None else Path(cache) / "cpu" / "gemm-probe.json"


#: environment variables that change which GEMM kernels run (so what the probe measures)
def machine_key(info: CpuInfo | None = None) -> str:
    """What decides which CPU kernels run here: CPU model, arch, flags, ATen's kernel level, the
    ISA-limiting environment and torch's version (the probe cache and the compile cache key on it)."""
    import torch

    info = info or cpu_info()
    return "|".join([info.model, info.arch, ",".join(info.flags), info.capability, isa_env(), torch.__version__])


def _probe_key(info: CpuInfo, shape) -> str:
    import torch

    return "|".join([machine_key(info), f"threads={torch.get_num_threads()}", "x".join(str(s) for s in shape)])


def read_verdicts(path: Path | None) -> dict:
    """A verdict file of the cache (``<cache>/cpu/*.json``: key -> entry) as a dict; {} where there is none, or it
    cannot be read or is not a JSON object: a damaged cache is measured again, never an error. Each reader checks
    its own entries' shape (a hand-edited entry may be anything)."""
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_verdict(path: Path | None, key: str, entry: dict) -> None:
    """Add ``entry`` (stamped with its time) under ``key`` to the verdict file ``path``, atomically. A cache that
    cannot take it (read-only, full, or something other than a file at ``path``: a folder) is skipped without an
    error: the next job measures again."""
    from .errors import UserError

    if path is None:
        return
    try:
        data = read_verdicts(path)
        data[key] = {**entry, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, data)
    except (OSError, UserError):  # UserError: write_json replaces only a regular file
        pass


def measured_rates(shape, cache: Path | None = None) -> tuple[dict[str, float], str]:
    """(GFLOP/s per dtype at ``shape``, "cache" or "probe"): from the cache, else measured and cached."""
    info = cpu_info()
    key, path = _probe_key(info, shape), _cache_file(cache)
    hit = read_verdicts(path).get(key)
    if _measured(hit):
        return {"float32": float(hit["float32"]), "bfloat16": float(hit["bfloat16"])}, "cache"
    rates = measure_gemm(tuple(shape))
    if _measured(rates):  # a probe that measured nothing is not a verdict to keep
        write_verdict(path, key, rates)
    return rates, "probe"


def choose_cpu_dtype(config=None, cache: Path | None = None) -> DtypeChoice:
    """The dtype ``--dtype auto`` takes on this CPU for a model with ``config`` (see the module doc).

    Without a config (its shapes unknown) the probe times a 576 x 1536 projection (SmolLM2's).
    """
    import torch

    info = cpu_info()
    common = dict(cpu=info.model, cpu_kind=info.kind, threads=torch.get_num_threads(), torch=torch.__version__)
    if info.native_bf16 is False:
        return DtypeChoice("float32", "flags", "no AVX-512 BF16 or AMX: bf16 would be emulated, slower than fp32 "
                           "and less exact", **common)
    hid, inter = mlp_dims(config) or (576, 1536)
    shape = probe_shape(hid, inter)
    rates, source = measured_rates(shape, cache)
    if not _measured(rates):  # the clock saw no time pass, or a rate of nothing: fp32 is never the slow choice
        return DtypeChoice("float32", "probe", f"the GEMM probe could not measure this CPU ({_rates_text(rates)} "
                           "GFLOP/s); float32 is exact and never emulated", gflops=rates, shape=list(shape), **common)
    factor = rates["bfloat16"] / rates["float32"]
    dtype = "bfloat16" if factor >= BF16_MIN_GAIN else "float32"
    reason = (f"bf16 GEMMs run {factor:.2g}x as fast as fp32 at the model's {shape[1]}x{shape[2]} projection, "
              f"{_gf(rates['bfloat16'])} vs {_gf(rates['float32'])} GFLOP/s"
              + ("" if dtype == "bfloat16" else f"; auto takes bf16 from {BF16_MIN_GAIN}x"))
    return DtypeChoice(dtype, source, reason, gflops=rates, shape=list(shape), **common)


def announce(choice: DtypeChoice) -> None:
    """Print the choice's line on stderr, once per process and choice (a sweep loads many models)."""
    key = choice.dtype + choice.reason
    if key not in _PRINTED:
        _PRINTED.add(key)
        print(choice.line(), file=sys.stderr, flush=True)


def _gf(v: float) -> str:
    """A GFLOP/s rate for a line: whole numbers from 10, else 3 significant digits (a tiny model's 0.0042)."""
    return f"{v:.0f}" if v >= 10 else f"{v:.3g}"


def _rates_text(rates: dict) -> str:
    """``bfloat16 0 vs float32 0.5``: a probe's rates as measured, for a line that says they are unusable."""
    return " vs ".join(f"{k} {rates.get(k)!r}" for k in ("bfloat16", "float32"))


def warn_if_slow(dtype: torch.dtype, config=None, cache: Path | None = None) -> float | None:
    """An explicit bf16 on a CPU where bf16 GEMMs are slower than fp32: one warning with the measured factor.

    Returns the factor (bf16 speed / fp32 speed) where it was measured, else None. Measured at a small
    M where bf16 is emulated, so that the warning costs well under a second even there.
    """
    import torch

    if dtype != torch.bfloat16:
        return None
    info = cpu_info()
    hid, inter = mlp_dims(config) or (576, 1536)
    M, K, N = probe_shape(hid, inter)
    shape = (32, K, N) if info.native_bf16 is False else (M, K, N)
    rates, _ = measured_rates(shape, cache)
    if not _measured(rates):
        warnings.warn(UserNote(f"rmfast: could not measure bfloat16 against float32 on this CPU ({info.kind}): the "
                               f"GEMM probe read {_rates_text(rates)} GFLOP/s; if the scan is slow, try --dtype "
                               "float32 (or auto)"), stacklevel=3)
        return None
    factor = rates["bfloat16"] / rates["float32"]
    if factor < 1:
        warnings.warn(UserNote(f"rmfast: bfloat16 on this CPU ({info.kind}) runs GEMMs at {factor:.2g}x the speed of "
                               f"float32 ({_gf(rates['bfloat16'])} vs {_gf(rates['float32'])} GFLOP/s measured): --dtype "
                               "float32 (or auto) is faster and exact"), stacklevel=3)
    elif info.native_bf16 is False:  # the flags settle it; the tiny probe was noise (a loaded machine, a cold cache)
        warnings.warn(UserNote(f"rmfast: bfloat16 on this CPU ({info.kind}) is emulated (no avx512_bf16 or AMX): its "
                               "GEMMs run many times slower than float32 at a scan's sizes: --dtype float32 (or auto) is "
                               "faster and exact"), stacklevel=3)
    return factor


#: the attribute a loaded model carries its DtypeChoice's manifest entry in (read by every job's manifest)
_ATTR = "_rmfast_dtype_choice"


def record(model, choice: DtypeChoice | None) -> None:
    """Attach ``choice`` to a loaded ``model`` (for :func:`recorded` and :func:`say_choice`); a no-op for None."""
    if choice is not None:
        setattr(model, _ATTR, choice.manifest())


def say_choice(model) -> None:
    """Print the line of the dtype choice ``model`` was loaded with, if any, once per process and choice.
    Jobs call it when their work starts, after every check of their input: bad input stays one line."""
    c = recorded(model)
    if c:
        announce(DtypeChoice(**c))


def recorded(model) -> dict | None:
    """The ``dtype_choice`` manifest entry of a model loaded with ``--dtype auto`` on CPU, else None."""
    return getattr(model, _ATTR, None)


def mkl_cbwr() -> str | None:
    """MKL's conditional-numerical-reproducibility mode in this process ("AUTO,STRICT", "OFF", ...), or
    None where torch has no MKL or does not expose it. rmfast sets ``MKL_CBWR=AUTO,STRICT`` on import
    (``rmfast/__init__.py``); a process that ran MKL math before importing rmfast keeps MKL's default
    ("OFF": fp32 results may then differ in the last bit between processes)."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    mode = get(-1) & 0xFFFFFFFF  # MKL_CBWR_ALL: the branch in the low bits, STRICT as 0x10000
    names = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSE4_1", 7: "SSE4_2", 8: "AVX", 9: "AVX2",
             10: "AVX512_MIC", 11: "AVX512", 12: "AVX512_MIC_E1", 13: "AVX512_E1"}
    branch = names.get(mode & 0xFF, str(mode & 0xFF))
    return branch + (",STRICT" if mode & 0x10000 else "")


_MKL_SAID: list = []  # the one note of a process whose MKL started before rmfast was imported (said once)


def mkl_mode_noted(stacklevel: int = 3) -> str | None:
    """:func:`mkl_cbwr`, and once per process a note where it is "OFF": a library caller that ran torch math before
    ``import rmfast`` (its MKL started in its default mode) gets fp32 scores that can differ from the CLI's and
    another process's in the last bits (169 of 300 SmolLM2 scores, max 1.1e-5, in a new user's walk), which only
    the manifest's ``mkl_cbwr`` said before."""
    mode = mkl_cbwr()
    if mode == "OFF" and not _MKL_SAID:
        _MKL_SAID.append(True)
        import warnings

        from .errors import UserNote

        warnings.warn(UserNote("rmfast: note: MKL started before rmfast was imported, in its default mode, so CPU "
                               "scores may differ from the CLI's (and another process's) in the last bits: import "
                               "rmfast before any torch math, or set MKL_CBWR=AUTO,STRICT in the environment "
                               "(docs/determinism.md)"), stacklevel=stacklevel)
    return mode


def manifest_fields(model) -> dict:
    """What every job's manifest records about the CPU side of its numbers: the measured dtype choice
    (models loaded with ``--dtype auto`` on CPU) and MKL's reproducibility mode (CPU jobs; noted once where off)."""
    p = next(model.parameters())
    out = {"dtype_choice": recorded(model)} if recorded(model) else {}
    if p.device.type == "cpu":
        out["mkl_cbwr"] = mkl_mode_noted()
    return out


def compile_here(fn, **options):
    """``torch.compile(fn, dynamic=False)`` with inductor ``options``, its cache isolated to this CPU
    kind (:func:`isolate_compile_cache`): every compile of rmfast goes through here."""
    import torch

    isolate_compile_cache()
    return torch.compile(fn, dynamic=False, options=options or None)


@lru_cache(maxsize=1)
def source_commit(path: str | None = None) -> str | None:
    """The git commit rmfast runs from, ``-dirty`` where its tracked files differ from it (a source checkout, as
    ``make`` installs it), or None (an installed package, no git): a benchmark row or manifest names the code
    behind its numbers, not only the version, which does not change between commits. Only a repository that
    tracks this very file counts: rmfast installed in a virtual environment inside a user's own repository
    recorded that repository's commit (and ran ``git status`` over it)."""
    import subprocess
    from pathlib import Path

    here = Path(path or __file__).resolve()  # ``path``: another file (tests)

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(here.parent), *args], capture_output=True, text=True, timeout=5)

    try:
        if git("ls-files", "--error-unmatch", here.name).returncode != 0:  # not rmfast's own checkout
            return None
        head = git("rev-parse", "--short=10", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def versions() -> dict:
    """rmfast, torch, transformers, numpy and Python versions, the platform and the thread count
    (what a result's numbers depend on; every manifest records them)."""
    import numpy as np
    import torch
    import transformers

    return {
        "rmfast": __version__,
        "rmfast_commit": source_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
