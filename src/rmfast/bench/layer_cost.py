"""The eager CUDA decoder layer of a token scan, kernel by kernel: FLOPs and HBM bytes, and the time each needs.

Issue 33 asks for a cost model per part that predicts the GPU's figures. :func:`rmfast.bench.flops.gpu_cost_model`
bounds a whole scan; this one follows the eager layer as it runs on CUDA (``rmfast.fast.layer.decoder_layer`` with
the plan's elementwise kernels), one row per kernel:

- the seven projection GEMMs (q, k, v, o, gate, up, down: CUDA keeps them separate, ``build_layers(fuse=False)``);
- RMSNorm (the input norm; Gemma's sandwich norms too), RoPE on q and k, SiLU·up: one Triton kernel each,
  each reading its input from HBM and writing its output once;
- the attention's residual add with the MLP's input norm, one Triton kernel (two reads, two writes);
- the MLP's residual add (torch: two reads, one write);
- the shared-prefix attention: the row's q, k, v in and its output out (the prompt's K/V, one shared copy, stays in
  L2), and its FLOPs over prompt + own keys.

A kernel's time is the larger of FLOPs / GEMM peak and bytes / bandwidth (each kernel is one or the other), with
no launch gaps or tails: what is measured beyond it is what the model does not explain. The last layer runs its
queries, output projection and MLP on the final position only (``n_out``), its k and v on every row token.

On run d's H100 (`benchmarks/results/gpu_h100_2026-11-26_d/`: 662 TFLOP/s on the 8B's shapes, copy 2.95 TB/s),
a batch of 8,192 one-token candidates with a one-token suffix is predicted at 90.6% of the GEMM peak (21,819 cand/s;
90.3% before the attention residual's add and the MLP's norm became one kernel), measured 84.2% (19,973, before
that kernel): ~7% of the time is not in the model (launch gaps and tails, GEMMs slower in the layer than in the
peak's loop), and the profile step of ``make gpu-check`` now sets each kernel class beside it:

    >>> from rmfast.dims import ModelDims
    >>> d = ModelDims(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)
    >>> c = scan_batch_cost(d, rows=8192, row_tokens=2, prompt=65, peak_tflops=662, bandwidth_tb_s=2.95)
    >>> round(c["gemm_fraction"], 3), round(c["elementwise_ms"] / c["gemm_ms"], 3)
    (0.906, 0.093)
    >>> sorted(c["by_kernel"], key=lambda k: -c["by_kernel"][k])[:3]
    ['gate', 'up', 'down']
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One kernel launch of a layer: its kind ("gemm", "elementwise", "attention"), FLOPs and HBM bytes."""

    name: str
    kind: str
    flops: float
    bytes: float

    def seconds(self, peak_flops: float, bandwidth: float) -> float:
        """The larger of its compute time at the GEMM peak and its memory time at the bandwidth."""
        return max(self.flops / peak_flops, self.bytes / bandwidth)


def layer_kernels(dims, rows: int, row_tokens: int, prompt: int, *, last: bool = False, sandwich: bool = False,
                  dtype_bytes: int = 2) -> list[Kernel]:
    """The eager layer's kernels for ``rows`` rows of ``row_tokens`` tokens after a ``prompt``-token prompt.

    ``last``: the final layer (queries, output projection, MLP on the final position only). ``sandwich``:
    Gemma 2/3's extra norms after attention and after the MLP.
    """
    d, hq, hkv, inter = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.intermediate
    m = rows * row_tokens  # tokens in: k, v (and everything on a layer that is not the last)
    mq = rows if last else m  # tokens out: queries, output projection, MLP
    b = dtype_bytes

    def gemm(name, tokens, k, n):  # (tokens, k) @ (k, n): weights read once, activations in and out
        return Kernel(name, "gemm", 2.0 * tokens * k * n, b * (k * n + tokens * (k + n)))

    def rw(name, reads, writes):  # an elementwise kernel: element counts read and written
        return Kernel(name, "elementwise", 0.0, b * (reads + writes))

    ks = [rw("rmsnorm in", m * d, m * d),
          gemm("q", mq, d, hq), gemm("k", m, d, hkv), gemm("v", m, d, hkv),
          rw("rope q", mq * hq, mq * hq), rw("rope k", m * hkv, m * hkv),
          Kernel("attention", "attention", 4.0 * mq * (prompt + row_tokens) * hq,
                 b * (mq * hq + 2 * m * hkv + mq * hq)),
          gemm("o", mq, hq, d)]
    if sandwich:
        ks.append(rw("rmsnorm post-attention", mq * d, mq * d))
    ks += [rw("residual add + rmsnorm pre-MLP", 2 * mq * d, 2 * mq * d),  # one kernel: r, a in; h, rmsnorm(h) out
           gemm("gate", mq, d, inter), gemm("up", mq, d, inter), rw("silu * up", 2 * mq * inter, mq * inter),
           gemm("down", mq, inter, d)]
    if sandwich:
        ks.append(rw("rmsnorm post-MLP", mq * d, mq * d))
    ks.append(rw("residual add (MLP)", 2 * mq * d, mq * d))
    return ks


def scan_batch_cost(dims, rows: int, row_tokens: int, prompt: int, *, peak_tflops: float, bandwidth_tb_s: float,
                    sandwich: bool = False, dtype_bytes: int = 2) -> dict:
    """A scan batch through every layer: the predicted milliseconds by kind and by kernel name, the GEMM FLOPs'
    share of the predicted time (``gemm_fraction``: the fraction of the GEMM peak a perfect eager run reaches),
    and the predicted candidates/s."""
    peak, bw = peak_tflops * 1e12, bandwidth_tb_s * 1e12
    by_kind: dict[str, float] = {"gemm": 0.0, "elementwise": 0.0, "attention": 0.0}
    by_kernel: dict[str, float] = {}
    gemm_flops = 0.0
    for li in range(dims.layers):
        for k in layer_kernels(dims, rows, row_tokens, prompt, last=li == dims.layers - 1, sandwich=sandwich,
                               dtype_bytes=dtype_bytes):
            s = k.seconds(peak, bw)
            by_kind[k.kind] += s
            by_kernel[k.name] = by_kernel.get(k.name, 0.0) + s
            gemm_flops += k.flops if k.kind == "gemm" else 0.0
    total = sum(by_kind.values())
    return {"rows": rows, "row_tokens": row_tokens, "prompt": prompt, "total_ms": 1e3 * total,
            "gemm_ms": 1e3 * by_kind["gemm"], "elementwise_ms": 1e3 * by_kind["elementwise"],
            "attention_ms": 1e3 * by_kind["attention"], "gemm_tflop": gemm_flops / 1e12,
            "gemm_fraction": gemm_flops / peak / total,
            "cand_per_s": rows / total, "by_kernel": {k: 1e3 * v for k, v in by_kernel.items()}}
