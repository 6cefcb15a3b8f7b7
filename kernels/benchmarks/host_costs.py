"""Host-side cost of one call of the operations a training step is made of, on one GPU.

The app is host-bound (its process CPU time is about its wall time), so what matters for many operations is not
their GPU time but how long the Python thread spends issuing them. This measures that directly: each case issues
``--calls`` calls back to back without synchronising (the GPU queue never fills: every case's GPU work is far
shorter than its host time, which the ``gpu_us`` column confirms), and reports host microseconds per call.

Cases: ``torch.mm`` and ``F.linear`` (bias) at a fixed shape and with the row count ``M`` changing on every call
(as the packed vision tower's patch count does from batch to batch), ``mm`` cycling over 8 row counts (a shape
seen before), an fp32 batched matmul of changing shape (the position-table resample), under both BLAS back ends
(PyTorch's default on CUDA is cuBLAS; ``TORCH_BLAS_PREFER_CUBLASLT=1`` picks cuBLASLt); bf16 autocast linear of
fp32 weights that do not require grad (so autocast casts them on every call); an elementwise op; one of the
project's Triton kernels (RMSNorm forward, with its Python wrapper); an empty Triton kernel.

``--ops``: instead, the project's fused ops as a training step calls them (bf16, tiny tensors so that the GPU work
stays far below the host time), each forward alone and forward + backward (the autograd engine included): RMSNorm,
gated RMSNorm, SwiGLU activation, the AttnRes mix over 3 sources, the varlen short conv, varlen ``chunk_kda`` with
the in-kernel L2 norm and gate; and the same RMSNorm through ``NormFunction.apply`` directly (the wrapper's
checks and dispatch).

    python3 kernels/benchmarks/host_costs.py --out host_costs.json
    python3 kernels/benchmarks/host_costs.py --ops --out host_costs_ops.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def host_us_per_call(fn: Callable[[int], object], calls: int) -> tuple[float, float]:
    """(host us per call, host + drain us per call) of ``fn(i)`` for ``i`` in ``range(calls)``."""
    for i in range(5):
        fn(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def cases(dim: int, rows: int) -> dict[str, Callable[[int], object]]:
    dev = "cuda"
    w = torch.randn(3 * dim, dim, device=dev, dtype=torch.bfloat16)
    b = torch.randn(3 * dim, device=dev, dtype=torch.bfloat16)
    w32 = torch.randn(3 * dim, dim, device=dev)
    x = torch.randn(rows + 4096, dim, device=dev, dtype=torch.bfloat16)
    x32 = x.float()
    norm_w = torch.ones(dim, device=dev)
    t_w, t_rows = torch.randn(64, 64, device=dev), torch.randn(64, 64, dim, device=dev)  # a position-table resample

    def varying(i: int) -> int:  # a new row count per call, never repeated within a run
        return rows - 8 * (i % 500) - (i // 500)

    from kernels.norm import rms_norm

    buf = torch.zeros(1024, device=dev)
    return {
        "mm fixed M": lambda i: torch.mm(x[:rows], w.t()),
        "mm varying M": lambda i: torch.mm(x[: varying(i)], w.t()),
        "mm cycling 8 M values": lambda i: torch.mm(x[: rows - 256 * (i % 8)], w.t()),
        "fp32 bmm varying (h, w)": lambda i: torch.matmul(t_w[: 2 + i % 61], t_rows[: 2 + (i // 61) % 61]),
        "linear+bias fixed M": lambda i: F.linear(x[:rows], w, b),
        "linear+bias varying M": lambda i: F.linear(x[: varying(i)], w, b),
        "autocast linear+bias fixed M": lambda i: _autocast_linear(x32[:rows], w32, b),
        "add (elementwise)": lambda i: x[:rows] + 1,
        "rms_norm (project Triton)": lambda i: rms_norm(x[:rows], norm_w, 1e-6),
        "empty Triton kernel": lambda i: _empty_kernel[(1,)](buf, 1024, BLOCK=1024),
    }


def _autocast_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return F.linear(x, w, b)


def op_cases(dim: int, rows: int, dev: str = "cuda") -> dict[str, Callable[[int], object]]:
    """The project's fused ops, forward (``fwd``) and forward + backward (``fwd+bwd``), on ``rows`` tokens."""
    from kernels.attn_res import attn_res_mix
    from kernels.kda import chunk_kda
    from kernels.norm import gated_rms_norm, rms_norm, silu_mul
    from kernels.norm.norm_triton import NormFunction
    from kernels.short_conv import causal_conv1d

    bf = torch.bfloat16

    def leaf(*shape: int, dtype: torch.dtype = bf) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_()

    x, gate, w = leaf(rows, dim), leaf(rows, dim), leaf(dim, dtype=torch.float32)
    gu = leaf(rows, 2 * dim)
    srcs, u, gain = [leaf(rows, dim) for _ in range(3)], leaf(1, dim, dtype=torch.float32), leaf(dim, dtype=torch.float32)
    heads, hd = 4, 64
    cu = torch.tensor([0, rows // 3, rows], device=dev, dtype=torch.int32)
    conv_x, conv_w = leaf(1, rows, 3 * heads * hd), leaf(3 * heads * hd, 4, dtype=torch.float32)
    q, k, v, g = (leaf(1, rows, heads, hd) for _ in range(4))
    beta = torch.rand(1, rows, heads, device=dev).requires_grad_()
    a_log, dt_bias = leaf(heads, dtype=torch.float32), leaf(heads * hd, dtype=torch.float32)
    ops = {
        "rms_norm": lambda: rms_norm(x, w, 1e-6),
        "NormFunction.apply (no checks)": lambda: NormFunction.apply(x, None, w, 1e-6),
        "gated_rms_norm": lambda: gated_rms_norm(x, gate, w, 1e-6),
        "silu_mul": lambda: silu_mul(gu),
        "attn_res_mix (3 sources)": lambda: attn_res_mix(srcs, u, gain, 1e-6)[0],
        "causal_conv1d (varlen, silu)": lambda: causal_conv1d(conv_x, conv_w, activation="silu", cu_seqlens=cu)[0],
        "chunk_kda (varlen, l2norm + gate)": lambda: chunk_kda(
            q, k, v, g, beta, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
            cu_seqlens=cu)[0],
    }
    out: dict[str, Callable[[int], object]] = {}
    for name, fn in ops.items():
        out[f"{name} fwd"] = lambda i, fn=fn: _no_grad(fn)
        out[f"{name} fwd+bwd"] = lambda i, fn=fn: fn().sum().backward()
    return out


def _no_grad(fn: Callable[[], object]) -> object:
    with torch.no_grad():
        return fn()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--rows", type=int, default=6144)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--out", default=None)
    p.add_argument("--ops", action="store_true", help="the project's fused ops instead (on --op-rows tokens)")
    p.add_argument("--op-rows", type=int, default=256)
    args = p.parse_args()
    if args.ops:
        return _main_ops(args)
    results = []
    default_blas = str(torch.backends.cuda.preferred_blas_library())
    for blas in ("cublaslt", "cublas"):
        torch.backends.cuda.preferred_blas_library(blas)
        for name, fn in cases(args.dim, args.rows).items():
            if blas == "cublas" and "mm" not in name and "linear" not in name:
                continue
            try:
                host, total = host_us_per_call(fn, args.calls)
            except Exception as e:  # one failing case should not lose the others' numbers
                results.append(dict(case=name, blas=blas, error=f"{type(e).__name__}: {e}"[:300]))
                continue
            results.append(dict(case=name, blas=blas, host_us=round(host, 1), host_plus_drain_us=round(total, 1)))
    torch.backends.cuda.preferred_blas_library(default_blas.split(".")[-1].lower())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"dim {args.dim}, rows {args.rows}, {args.calls} calls per case; default BLAS back end {default_blas}")
    print("| case | BLAS | host us/call | host+drain us/call |\n| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r['blas']} | {r.get('host_us', r.get('error'))} | {r.get('host_plus_drain_us', '')} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, args=vars(args),
                           default_blas=default_blas,
                           results=results), f, indent=1)


def _main_ops(args: argparse.Namespace) -> None:
    results = []
    for name, fn in op_cases(args.dim, args.op_rows).items():
        try:
            host, total = host_us_per_call(fn, args.calls)
            results.append(dict(case=name, host_us=round(host, 1), host_plus_drain_us=round(total, 1)))
        except Exception as e:  # one failing case should not lose the others' numbers
            results.append(dict(case=name, error=f"{type(e).__name__}: {e}"[:300]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, dim {args.dim}, "
          f"{args.op_rows} tokens, bf16, {args.calls} calls per case")
    print("| op | host us/call | host+drain us/call |\n| --- | --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r.get('host_us', r.get('error'))} | {r.get('host_plus_drain_us', '')} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    main()
