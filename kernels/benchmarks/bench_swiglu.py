"""GPU benchmark of ``kernels/swiglu``: the dense SwiGLU with its activation inside Triton GEMMs against the split path
(cuBLAS GEMMs + ``kernels.norm.silu_mul``), at the ``small`` model's MLP for one 8 x 4096-token step (bf16,
``M = 32768`` rows, ``D = 768``, ``I = 2048``; ``--rows`` / ``--dims`` for others).

Times (``triton.testing.do_bench_cudagraph`` medians: GPU time of CUDA-graph replays):
- the parts each fused kernel replaces: the gate/up GEMM and ``silu_mul`` forward against ``gate_up_silu``; the
  ``dh`` GEMM and ``silu_mul``'s backward against ``down_silu_bwd``; with TFLOP/s of every GEMM;
- the whole MLP, forward and forward + backward (gradients of x and both weights), split against fused (also
  eager: with the host's launch and autograd work);
- ``--sweep``: each kernel under the tilings of :data:`FWD_SWEEP` / :data:`BWD_SWEEP`; the whole MLP is then also
  timed with the best pair, and ``$OUT/swiglu_gpu_config.txt`` holds that pair as the ``GPU_CONFIG = ...`` line of
  ``kernels/swiglu/swiglu_triton.py``.

Errors: fused and split output and gradients against fp32 maths of the same bf16 inputs (relative RMS). JSON to
``$OUT/bench_swiglu.json`` (or ``--out``) and a table.

    python kernels/benchmarks/bench_swiglu.py --sweep
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.norm.norm_triton import silu_mul_bwd, silu_mul_fwd  # noqa: E402
from kernels.swiglu import swiglu_mlp  # noqa: E402
from kernels.swiglu import swiglu_triton as st  # noqa: E402
from kernels.swiglu.swiglu_triton import GemmConfig  # noqa: E402

# (block_m, block_n, block_k, group_m, num_warps, num_stages); the forward holds two fp32 accumulators of
# block_m x block_n (gate and up), the backward one. Registers and spills of each for sm_90a (no GPU needed):
# kernels/benchmarks/ptxas_regs.py --swiglu; the two marked (spills) spill at Triton 3.9, the others do not.
FWD_SWEEP = [(128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 128, 32, 8, 8, 4), (128, 64, 64, 8, 4, 4),
             (128, 64, 64, 8, 8, 4), (256, 64, 64, 8, 8, 3), (64, 256, 64, 8, 8, 3), (128, 128, 64, 8, 16, 3),
             (128, 128, 64, 8, 16, 4), (128, 128, 64, 16, 8, 3)]
BWD_SWEEP = [(128, 128, 64, 8, 16, 3), (128, 128, 64, 8, 16, 4), (64, 128, 64, 8, 8, 4), (64, 128, 64, 8, 8, 3),
             (64, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 3),  # (spills)
             (128, 64, 64, 8, 4, 4),  # (spills)
             (128, 128, 32, 8, 16, 5), (128, 128, 64, 16, 16, 3), (128, 128, 64, 4, 16, 3)]


DEVICE = "cuda"  # tests run the script's logic on a CPU under the interpreter with stub timers


def graph_ms(fn) -> float:
    with torch.cuda.stream(torch.cuda.Stream()):
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))


def eager_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def config_line(fwd: GemmConfig, bwd: GemmConfig) -> str:
    """The ``GPU_CONFIG = ...`` source line of ``swiglu_triton.py`` for this pair."""
    def spell(c: GemmConfig) -> str:
        return (f"GemmConfig({c.block_m}, {c.block_n}, {c.block_k}, {c.group_m}, {c.num_warps}, "
                f"{c.num_stages})")
    return f'GPU_CONFIG = {{"fwd": {spell(fwd)}, "bwd": {spell(bwd)}}}'


def inputs(M: int, D: int, I: int):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(M, D, device=DEVICE, generator=g).bfloat16()
    w_gu = (torch.randn(2 * I, D, device=DEVICE, generator=g) / D**0.5).bfloat16()
    w_d = (torch.randn(D, I, device=DEVICE, generator=g) / I**0.5).bfloat16()
    dy = torch.randn(M, D, device=DEVICE, generator=g).bfloat16()
    return x, w_gu, w_d, dy


def parts(x, w_gu, w_d, dy) -> dict:
    """The fused kernels against the GEMM + activation pairs they replace, each alone."""
    M, D = x.shape
    I = w_d.shape[1]
    gu, h = st.gate_up_silu(x, w_gu)
    tflop = lambda flops, ms: round(flops / ms / 1e9, 1)  # noqa: E731
    f_fwd, f_bwd = 2 * M * D * 2 * I, 2 * M * D * I
    ms = {
        "gate_up_gemm": graph_ms(lambda: x @ w_gu.t()),
        "silu_mul_fwd": graph_ms(lambda: silu_mul_fwd(gu)),
        "fused_fwd_kernel": graph_ms(lambda: st.gate_up_silu(x, w_gu)),
        "dh_gemm": graph_ms(lambda: dy @ w_d),
        "silu_mul_bwd": graph_ms(lambda: silu_mul_bwd(gu, h)),
        "fused_bwd_kernel": graph_ms(lambda: st.down_silu_bwd(dy, w_d, gu)),
    }
    out = {k: round(v, 4) for k, v in ms.items()}
    out.update(gate_up_gemm_tflops=tflop(f_fwd, ms["gate_up_gemm"]), fused_fwd_tflops=tflop(f_fwd, ms["fused_fwd_kernel"]),
               dh_gemm_tflops=tflop(f_bwd, ms["dh_gemm"]), fused_bwd_tflops=tflop(f_bwd, ms["fused_bwd_kernel"]),
               fwd_ratio=round(ms["fused_fwd_kernel"] / (ms["gate_up_gemm"] + ms["silu_mul_fwd"]), 3),
               bwd_ratio=round(ms["fused_bwd_kernel"] / (ms["dh_gemm"] + ms["silu_mul_bwd"]), 3))
    return out


def whole(impl: str, x, w_gu, w_d, dy) -> dict:
    """Forward and forward + backward of the MLP through ``impl`` (GPU and eager times)."""
    leaves = [t.detach().requires_grad_(True) for t in (x, w_gu, w_d)]

    def fwd():
        with torch.no_grad():
            swiglu_mlp(x, w_gu, w_d, impl=impl)

    def both():
        for t in leaves:
            t.grad = None
        swiglu_mlp(*leaves, impl=impl).backward(dy)

    return {"fwd_ms": round(graph_ms(fwd), 4), "fwd_bwd_ms": round(graph_ms(both), 4),
            "eager_fwd_ms": round(eager_ms(fwd), 4), "eager_fwd_bwd_ms": round(eager_ms(both), 4)}


def errors(x, w_gu, w_d, dy) -> dict:
    """Relative RMS of each path's output and gradients against fp32 maths of the same bf16 inputs."""
    def run(impl, ts):
        leaves = [t.detach().clone().requires_grad_(True) for t in ts]
        y = swiglu_mlp(*leaves, impl=impl)
        y.backward(dy.to(y.dtype))
        return [y.detach()] + [t.grad for t in leaves]

    ref = run("split", [t.float() for t in (x, w_gu, w_d)])
    out = {}
    for impl in ("split", "fused"):
        got = run(impl, (x, w_gu, w_d))
        out[impl] = {name: rel(a, b) for name, a, b in zip(("y", "dx", "dw_gate_up", "dw_down"), got, ref)}
    return out


def sweep(x, w_gu, w_d, dy) -> dict:
    """Each kernel alone under each tiling; the fastest of each."""
    gu, _ = st.gate_up_silu(x, w_gu)
    res = {"fwd": [], "bwd": []}
    for kind, table, call in (("fwd", FWD_SWEEP, lambda c: st.gate_up_silu(x, w_gu, c)),
                              ("bwd", BWD_SWEEP, lambda c: st.down_silu_bwd(dy, w_d, gu, c))):
        for spec in table:
            cfg = GemmConfig(*spec)
            try:
                ms = round(graph_ms(lambda cfg=cfg, call=call: call(cfg)), 4)
            except Exception as exc:  # a tiling that does not fit (shared memory, registers) on this GPU
                res[kind].append({"config": list(spec), "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            res[kind].append({"config": list(spec), "ms": ms})
        timed = [r for r in res[kind] if "ms" in r]
        res[f"best_{kind}"] = min(timed, key=lambda r: r["ms"])["config"] if timed else None
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8 * 4096)
    ap.add_argument("--dims", default="768,2048", help="D,I (model width, MLP width)")
    ap.add_argument("--sweep", action="store_true", help="also time each kernel under FWD_SWEEP / BWD_SWEEP")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_swiglu.json"))
    args = ap.parse_args(argv)
    D, I = (int(v) for v in args.dims.split(","))
    x, w_gu, w_d, dy = inputs(args.rows, D, I)
    res = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "M": args.rows, "D": D, "I": I, "dtype": "bf16",
           "default_config": {k: list(vars(c).values()) for k, c in st.GPU_CONFIG.items()},
           "parts": parts(x, w_gu, w_d, dy), "errors": errors(x, w_gu, w_d, dy),
           "split": whole("split", x, w_gu, w_d, dy), "fused": whole("fused", x, w_gu, w_d, dy)}
    if args.sweep:
        res["sweep"] = sweep(x, w_gu, w_d, dy)
        best_f, best_b = res["sweep"]["best_fwd"], res["sweep"]["best_bwd"]
        if best_f and best_b:
            default = dict(st.GPU_CONFIG)
            st.GPU_CONFIG.update(fwd=GemmConfig(*best_f), bwd=GemmConfig(*best_b))
            res["fused_best"] = whole("fused", x, w_gu, w_d, dy)
            res["parts_best"] = parts(x, w_gu, w_d, dy)
            st.GPU_CONFIG.update(default)
            line = config_line(GemmConfig(*best_f), GemmConfig(*best_b))
            res["best_config_line"] = line
            with open(os.path.join(os.path.dirname(os.path.abspath(args.out)), "swiglu_gpu_config.txt"), "w") as f:
                f.write(line + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    print_table(res)


def print_table(res: dict) -> None:
    p = res["parts"]
    print(f"{res['device']}, triton {res['triton']}, {res['date']}: SwiGLU MLP M={res['M']} D={res['D']} "
          f"I={res['I']} bf16, CUDA-graph ms")
    print("| part | split ms | fused ms | ratio | GEMM TFLOP/s split / fused |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| forward: gate/up GEMM + silu_mul | {p['gate_up_gemm']} + {p['silu_mul_fwd']} | {p['fused_fwd_kernel']} "
          f"| {p['fwd_ratio']} | {p['gate_up_gemm_tflops']} / {p['fused_fwd_tflops']} |")
    print(f"| backward: dh GEMM + silu_mul bwd | {p['dh_gemm']} + {p['silu_mul_bwd']} | {p['fused_bwd_kernel']} "
          f"| {p['bwd_ratio']} | {p['dh_gemm_tflops']} / {p['fused_bwd_tflops']} |")
    for key in ("fused", "fused_best"):
        if key in res:
            s, f = res["split"], res[key]
            print(f"| whole MLP ({key}) fwd / fwd+bwd | {s['fwd_ms']} / {s['fwd_bwd_ms']} | {f['fwd_ms']} / "
                  f"{f['fwd_bwd_ms']} | {f['fwd_ms'] / s['fwd_ms']:.3f} / {f['fwd_bwd_ms'] / s['fwd_bwd_ms']:.3f} | |")
    e = res["errors"]
    print("errors vs fp32 maths (y, dx, dw_gate_up, dw_down): split "
          + ", ".join(f"{v:.1e}" for v in e["split"].values()) + "; fused "
          + ", ".join(f"{v:.1e}" for v in e["fused"].values()))
    if "sweep" in res:
        for kind in ("fwd", "bwd"):
            rows = res["sweep"][kind]
            print(f"sweep {kind}: " + "; ".join(f"{r['config']} {r.get('ms', 'error')}" for r in rows))
        print(res.get("best_config_line", "no best config"))


if __name__ == "__main__":
    main()
