"""``--dtype auto`` on CPU chooses by what this CPU does fast (rmfast.cpu): the CPU's flags where they
settle it, else a GEMM probe at the model's shapes, cached per machine. The probe is faked here (both
outcomes); no test times anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_run import run
from rmfast import cpu
from rmfast.loading.loader import dtype_and_choice, load

AVX2 = cpu.CpuInfo(model="Some AVX2 CPU", arch="x86_64", flags=("avx2",), capability="AVX2")
ZEN4 = cpu.CpuInfo(model="Some BF16 CPU", arch="x86_64", flags=("avx2", "avx512f", "avx512_bf16"), capability="AVX512")
AMX = cpu.CpuInfo(model="Some AMX CPU", arch="x86_64", flags=("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"),
                  capability="AVX512")


@pytest.fixture
def fake_cpu(monkeypatch, tmp_path):
    """Pretend to be a given CPU whose GEMMs run at given rates; count the probe's measurements."""
    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "cache"))
    calls = []

    def use(info: cpu.CpuInfo, fp32: float = 100.0, bf16: float = 300.0):
        monkeypatch.setattr(cpu, "cpu_info", lambda: info)

        def measure(shape, dtypes=None, seconds=None):
            calls.append(tuple(shape))
            return {"float32": fp32, "bfloat16": bf16}

        monkeypatch.setattr(cpu, "measure_gemm", measure)
        monkeypatch.setattr(cpu, "_PRINTED", set())
        return calls

    return use


def _cfg(hidden=576, inter=1536):
    from types import SimpleNamespace

    return SimpleNamespace(hidden_size=hidden, intermediate_size=inter)


@pytest.mark.parametrize("fp32, bf16, want", [(100.0, 300.0, torch.bfloat16), (100.0, 20.0, torch.float32),
                                              (100.0, 110.0, torch.float32)],
                         ids=["bf16-3x-faster", "bf16-5x-slower", "bf16-marginal"])
def test_auto_takes_bf16_only_where_the_probe_says_it_is_clearly_faster(fake_cpu, fp32, bf16, want, capsys):
    calls = fake_cpu(ZEN4, fp32, bf16)
    dt, choice = dtype_and_choice("auto", torch.device("cpu"), config=_cfg())
    assert dt is want and choice.dtype == str(want).removeprefix("torch.") and choice.source == "probe"
    assert calls == [cpu.probe_shape(576, 1536)]  # at the model's own projection
    assert choice.gflops == {"float32": fp32, "bfloat16": bf16} and choice.bf16_factor == pytest.approx(bf16 / fp32)
    assert capsys.readouterr().err == ""  # said only once a model has loaded (cpu.record): bad input stays one line
    m = torch.nn.Linear(1, 1)
    cpu.record(m, choice)
    assert capsys.readouterr().err == ""
    cpu.say_choice(m)  # jobs say it when their work starts
    cpu.say_choice(m)  # once per process
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rmfast: --dtype auto -> {choice.dtype} on this CPU [AVX-512 BF16]: ")
    assert f"{bf16 / fp32:.2g}x" in err[0]


def test_the_probe_is_cached_per_machine_and_shape(fake_cpu, tmp_path, capsys):
    calls = fake_cpu(ZEN4, 100.0, 20.0)
    first = dtype_and_choice("auto", "cpu", config=_cfg())[1]
    again = dtype_and_choice("auto", "cpu", config=_cfg())[1]
    assert len(calls) == 1 and (first.source, again.source) == ("probe", "cache") and again.dtype == first.dtype
    assert again.gflops == first.gflops
    other = dtype_and_choice("auto", "cpu", config=_cfg(1024, 4096))[1]  # another model's shapes: measured anew
    assert len(calls) == 2 and other.source == "probe"
    cache = json.loads((tmp_path / "cache" / "cpu" / "gemm-probe.json").read_text())
    assert len(cache) == 2 and all(k.startswith("Some BF16 CPU|x86_64|") for k in cache)
    assert f"threads={torch.get_num_threads()}" in next(iter(cache)) and torch.__version__ in next(iter(cache))


def test_a_damaged_cache_is_measured_again(fake_cpu, tmp_path):
    calls = fake_cpu(ZEN4)
    f = tmp_path / "cache" / "cpu" / "gemm-probe.json"
    f.parent.mkdir(parents=True)
    f.write_text("{not json")
    assert dtype_and_choice("auto", "cpu", config=_cfg())[1].source == "probe" and len(calls) == 1
    assert json.loads(f.read_text())  # and rewritten whole


def test_flags_settle_an_avx2_only_cpu_without_a_probe(fake_cpu, capsys):
    calls = fake_cpu(AVX2)
    dt, choice = dtype_and_choice("auto", "cpu", config=_cfg())
    assert dt is torch.float32 and choice.source == "flags" and calls == [] and choice.gflops == {}
    assert "emulated" in choice.reason and choice.cpu_kind == "AVX2-only"


def test_amx_still_measures(fake_cpu):
    calls = fake_cpu(AMX, 300.0, 2500.0)
    dt, choice = dtype_and_choice("auto", "cpu", config=_cfg())
    assert dt is torch.bfloat16 and choice.cpu_kind == "AMX" and len(calls) == 1


def test_cuda_auto_needs_no_probe(fake_cpu):
    calls = fake_cpu(AVX2)
    assert dtype_and_choice("auto", torch.device("cuda"), "float16") == (torch.float16, None) and calls == []


@pytest.mark.parametrize("info, bf16, warns", [(ZEN4, 20.0, True), (ZEN4, 300.0, False), (AVX2, 4.0, True),
                                               (AVX2, 300.0, True)],
                         ids=["slow", "fast", "avx2-only", "avx2-only-noisy-probe"])
def test_explicit_bf16_where_it_is_slower_warns_with_the_measured_factor(fake_cpu, info, bf16, warns, recwarn):
    calls = fake_cpu(info, 100.0, bf16)
    dt, choice = dtype_and_choice("bfloat16", "cpu", config=_cfg())
    assert dt is torch.bfloat16 and choice is None  # the user's dtype is kept
    msgs = [str(w.message) for w in recwarn if "rmfast: bfloat16 on this CPU" in str(w.message)]
    assert len(msgs) == int(warns)
    if warns:
        assert "dtype='float32'" in msgs[0]  # what a Python caller reads; the CLI prints --dtype float32
        assert "--dtype float32" in next(w.message for w in recwarn if w.message is not None and
                                         "this CPU" in str(w.message)).cli_message()
        # the measured factor where it says slower; where a noisy probe says faster, the flags' word (emulated)
        assert (f"{bf16 / 100:.2g}x the speed of float32" if bf16 < 100 else "is emulated (no avx512_bf16") in msgs[0]
        assert calls[0][0] == (32 if info is AVX2 else cpu.probe_shape(576, 1536)[0])  # small M where emulated
    assert dtype_and_choice("float32", "cpu", config=_cfg())[0] is torch.float32 and len(calls) == 1


def test_probe_shape_is_the_mlp_projection_capped():
    assert cpu.probe_shape(576, 1536) == (1024, 576, 1536)
    M, K, N = cpu.probe_shape(8192, 28672)
    assert (K, N) == (2048, 2048) and cpu.PROBE_ROWS[0] <= M <= cpu.PROBE_ROWS[1]
    assert 2 * M * K * N <= cpu.PROBE_FLOPS * 1.01


def test_measure_gemm_returns_both_rates_on_this_cpu():
    rates = cpu.measure_gemm((64, 32, 48), seconds=0.001)
    assert set(rates) == {"float32", "bfloat16"} and all(v > 0 for v in rates.values())


def test_cpu_info_names_this_machine():
    info = cpu.cpu_info()
    assert info.model and info.arch and set(info.flags) <= set(cpu.FLAGS) and info.kind


def test_the_choice_is_in_the_model_and_the_scan_manifest(fake_cpu, tiny_dir, tmp_path, capsys):
    fake_cpu(ZEN4, 100.0, 20.0)
    lm = load(str(tiny_dir), device="cpu")
    assert lm.model.dtype == torch.float32 and cpu.recorded(lm.model)["dtype"] == "float32"
    out = tmp_path / "s.parquet"
    rc, so, se = run(["scan", tiny_dir, "--token-ids", "0:64", "--compile", "off", "--out", out, "--no-progress",
                      "--top", "0"], capsys)
    assert rc == 0, se
    assert se.count("rmfast: --dtype auto -> float32 on this CPU [AVX-512 BF16]: ") == 1, se
    m = json.loads(Path(str(out) + ".json").read_text())
    assert m["dtype"] == "float32" and m["dtype_choice"]["dtype"] == "float32"
    assert m["dtype_choice"]["gflops"] == {"float32": 100.0, "bfloat16": 20.0} and m["dtype_choice"]["source"] in ("probe", "cache")
    assert "bf16_audit" not in m  # an fp32 scan has nothing to audit
    assert m["mkl_cbwr"] == cpu.mkl_cbwr()  # whether MKL's reproducible mode was in effect
    # an explicit dtype records no choice
    rc, so, se = run(["scan", tiny_dir, "--dtype", "float32", "--token-ids", "0:64", "--compile", "off", "--out", out,
                      "--overwrite", "--no-progress", "--top", "0"], capsys)
    assert rc == 0 and "dtype_choice" not in json.loads(Path(str(out) + ".json").read_text())


@pytest.mark.parametrize("math_first, want", [(False, "AUTO,STRICT"), (True, "OFF")], ids=["import-first", "math-first"])
def test_importing_rmfast_makes_mkl_reproducible(math_first, want):
    """rmfast sets MKL_CBWR=AUTO,STRICT on import (MKL's GEMMs otherwise choose code paths by memory
    alignment: two processes' fp32 scores differed in the last bit). MKL reads it at its first call, so a
    process that multiplied before importing rmfast keeps MKL's default; mkl_cbwr() says which."""
    import os
    import subprocess
    import sys

    if cpu.mkl_cbwr() is None:
        pytest.skip("this torch has no MKL (or does not expose its mode)")
    code = ("import torch\n" + ("a = torch.randn(64, 64); a @ a\n" if math_first else "")
            + "import rmfast\nfrom rmfast import cpu\na = torch.randn(64, 64); a @ a\nprint(cpu.mkl_cbwr())\n"
            + "m = torch.nn.Linear(2, 2)\nfor _ in range(2):\n    cpu.manifest_fields(m)\n")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == want
    # a library caller whose MKL started first is told once (it was said only in the manifest's mkl_cbwr)
    assert p.stderr.count("MKL started before rmfast was imported") == (want == "OFF")


_HEAD_UPDATE = """
import sys, torch
from rmfast import cpu
from rmfast.kernels.torch_twins import lse_update
from torch._inductor.runtime.cache_dir_utils import cache_dir
cache_dir()  # loading a model through transformers fixes the folder like this, before rmfast compiles
f = cpu.compile_here(lse_update)
g = torch.Generator().manual_seed(0)
N, D, C, V = 2048, 64, 4096, 49152
y = torch.randn(N, D, generator=g); w = torch.randn(C, D, generator=g) * 0.05
t = torch.randint(0, V, (N,), generator=g); v0 = torch.tensor(0)
m = torch.full((N,), -float("inf")); s = torch.zeros(N); tg = torch.zeros(N)
a, b = f(y, w, v0, t, m, s, tg, None), lse_update(y, w, v0, t, m, s, tg, None)
print(sum(int(((x - z).abs() > 1e-4 * (1 + z.abs())).sum()) for x, z in zip(a, b)))
"""


@pytest.mark.compiles
def test_compiled_kernels_are_not_shared_across_kernel_levels(tmp_path):
    """Inductor's cache key misses ATen's CPU capability: a kernel compiled under AVX2 kernels and then
    loaded by a process running AVX-512 ones computed garbage (and corrupted the heap). Importing rmfast
    points the cache at a folder per CPU kind and kernel level (cpu.isolate_compile_cache), so the second
    process compiles its own. Both processes share one default cache location here (TMPDIR) and must agree with eager."""
    import os
    import subprocess
    import sys

    if "avx512" not in torch.backends.cpu.get_cpu_capability().lower():
        pytest.skip("this CPU runs AVX2 kernels already: there is no second kernel level to mix")
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    base["TMPDIR"] = str(tmp_path)
    folders = set()
    for extra in ({"ATEN_CPU_CAPABILITY": "avx2"}, {}):
        code = _HEAD_UPDATE + "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        p = subprocess.run([sys.executable, "-c", code], env={**base, **extra}, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        bad, folder = p.stdout.split()[-2:]
        assert bad == "0", f"{extra or 'native'}: {bad} values differ from eager"
        assert folder.startswith(str(tmp_path)) and os.path.basename(folder).startswith("rmfast-")
        folders.add(folder)
    assert len(folders) == 2  # one cache per kernel level


class _SlowClock:
    """``time`` for rmfast.cpu whose perf_counter jumps 1000 s per read: every GEMM seems to run at ~1e-7 GFLOP/s
    (a tiny model's probe on a CPU that emulates bf16, only more so)."""

    def __init__(self):
        import time

        self.t, self.strftime = 0.0, time.strftime

    def perf_counter(self):
        self.t += 1000.0
        return self.t


def test_a_tiny_rate_never_rounds_to_zero(monkeypatch, tmp_path):
    """Issue 50 item 1: the rates were rounded to two decimals; a tiny model's probe on an AVX2 CPU measured under
    0.005 GFLOP/s, cached 0.0, and warn_if_slow divided by it (ZeroDivisionError for --dtype bfloat16)."""
    monkeypatch.setattr(cpu, "time", _SlowClock())
    monkeypatch.setattr(cpu, "cpu_info", lambda: AVX2)
    rates = cpu.measure_gemm((32, 32, 64), seconds=0.001)
    assert all(0 < v < 1e-3 for v in rates.values()), rates
    with pytest.warns(UserWarning, match="bfloat16 on this CPU"):
        f = cpu.warn_if_slow(torch.bfloat16, _cfg(32, 64), tmp_path)
    assert f is not None and f > 0
    cached = json.loads((tmp_path / "cpu" / "gemm-probe.json").read_text())
    assert all(v["float32"] > 0 and v["bfloat16"] > 0 for v in cached.values())


def test_a_probe_that_cannot_measure_says_so_in_one_line(fake_cpu, tmp_path):
    fake_cpu(AVX2, 0.0, 0.0)
    with pytest.warns(UserWarning) as got:
        assert cpu.warn_if_slow(torch.bfloat16, _cfg(32, 64), tmp_path) is None
    msgs = [str(w.message) for w in got]
    assert any("could not measure" in m and "\n" not in m for m in msgs), msgs
    assert not (tmp_path / "cpu" / "gemm-probe.json").exists()  # nothing cached: the next job measures again
    fake_cpu(ZEN4, 0.0, 0.0)
    choice = cpu.choose_cpu_dtype(_cfg(32, 64), tmp_path)
    assert choice.dtype == "float32" and "could not measure" in choice.reason


def test_the_commit_recorded_is_rmfasts_own_checkout_or_none(tmp_path):
    """Every manifest and bench row names the commit behind it; rmfast installed in a virtual environment inside a
    user's own repository recorded the user's commit (and dirty state). Only a repository tracking the file counts."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("no git here")
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], capture_output=True, text=True, check=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "app.py").write_text("x = 1\n")
    venv = tmp_path / "venv" / "rmfast"
    venv.mkdir(parents=True)
    (venv / "cpu.py").write_text("# an installed copy\n")
    git("add", "app.py")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "user's project")
    assert cpu.source_commit(str(venv / "cpu.py")) is None  # not tracked there: not rmfast's checkout
    git("add", "venv/rmfast/cpu.py")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "tracked")
    head = git("rev-parse", "--short=10", "HEAD").stdout.strip()
    cpu.source_commit.cache_clear()  # one lookup a process (a path): cleared to look again
    assert cpu.source_commit(str(venv / "cpu.py")) == head
    (tmp_path / "app.py").write_text("x = 2\n")
    cpu.source_commit.cache_clear()
    assert cpu.source_commit(str(venv / "cpu.py")) == head + "-dirty"
