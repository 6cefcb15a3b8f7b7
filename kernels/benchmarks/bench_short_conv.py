"""GPU benchmark of the short convolution (``kernels/short_conv``): Triton kernels vs the PyTorch path.

First checks the Triton path on the GPU against the PyTorch path in fp32 on the same bf16-rounded inputs
(y, final state, dx, dweight, d initial state; and that two backward runs give bit-identical dweight).
Then times with ``triton.testing.do_bench`` (median), bf16, W = 4, SiLU, no bias (the KDA layer's call), at
B*T = 32768 tokens, D = 4096 channels, two layouts: ``4x8192`` batched and ``varlen`` (16 ragged
sequences packed into 1 x 32768, with initial and final states): forward and forward+backward, with the
achieved bytes/s (minimum traffic: forward reads x and writes y; backward reads x and dy and writes dx)
next to the measured device-copy bandwidth. Also the one-token decode step at N = 64, D = 12288.
The backward alone at the model's shape (``8x4096x2304``: 32768 tokens of the ``small`` model's 2304 q/k/v
channels, bf16, W = 4, SiLU, no bias, no states): through autograd for both backends (the forward's graph
kept) and the Triton backward launch alone (``conv_triton._backward``: the dpre kernel, the dx kernel and the
dweight partial sum) and each of its two kernels alone, with the error against the same launch on fp32 inputs;
the same with dpre stored in bf16 (``DPRE_IN_X_DTYPE``); then each kernel alone at the tile configurations of
``DPRE_SWEEP`` / ``DX_SWEEP`` (``--no-sweep`` skips them) with the result's deviation from the default's, and the
whole launch at the fastest configuration of each (``best``); the one-kernel backward (``BWD_FUSED``) at the
configurations of ``STREAM_SWEEP``. ``--model-only``: the correctness checks, then at the model's shape only the
forward alone at the tiles of ``FWD_SWEEP`` and the one-kernel backward's sweep. Writes
``$OUT/bench_short_conv.json`` (or ``--out``) and prints a table; about 40-60 s on an H100.

    python kernels/benchmarks/bench_short_conv.py [--no-sweep | --model-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.short_conv import causal_conv1d, causal_conv1d_update, conv_triton  # noqa: E402

NT, D, W = 32768, 4096, 4
DEC_N, DEC_D = 64, 3 * 32 * 128
MODEL = (8, 4096, 2304)  # B, T, D of the backward-alone timing
# backward kernel 1 (dpre): rows, channels, warps, row tiles per program, deferred dweight row sums
DPRE_SWEEP = [(8, 128, 4, 32, True), (16, 128, 4, 16, True), (16, 128, 4, 16, False), (8, 128, 4, 64, True),
              (8, 128, 4, 16, True), (16, 64, 4, 16, True), (32, 64, 4, 8, False), (32, 128, 8, 8, False),
              (32, 128, 8, 8, True), (8, 256, 8, 32, True), (4, 128, 4, 64, True), (64, 64, 8, 4, False)]
DX_SWEEP = [(32, 128, 8), (16, 128, 4), (32, 128, 4), (64, 128, 8), (16, 256, 4), (32, 256, 8), (8, 128, 4),
            (64, 64, 4)]  # backward kernel 2 (dx): rows, channels, warps


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def copy_bandwidth() -> float:
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    return 2 * (1 << 30) / bench(lambda: y.copy_(x)) / 1e6  # GB/s


def make(layout: str, dtype=torch.bfloat16) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    d = D
    if layout == "varlen":
        cuts = torch.randperm(NT - 1, generator=g, device="cuda")[:15].sort().values + 1
        cu = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), NT)]).to(torch.int32)
        B, T, N = 1, NT, 16
    elif layout == "x".join(map(str, MODEL)):
        cu, (B, T, d), N = None, MODEL, MODEL[0]
    else:
        cu, B, T, N = None, 4, NT // 4, 4
    x = torch.randn(B, T, d, device="cuda", generator=g).to(dtype)
    w = (torch.rand(d, W, device="cuda", generator=g) * 2 - 1).div(W**0.5).to(dtype)
    s0 = torch.randn(N, d, W - 1, device="cuda", generator=g).to(dtype) if layout == "varlen" else None
    return {"x": x, "w": w, "cu": cu, "s0": s0, "dy": torch.randn_like(x)}


def run(inp: dict, backend: str, grad: bool):
    """Forward (and backward of sum(y * dy) + sum(final state)) through one backend; returns outputs, grads."""
    leaves = [t.detach().requires_grad_(grad) if t is not None else None for t in (inp["x"], inp["w"], inp["s0"])]
    x, w, s0 = leaves
    y, fs = causal_conv1d(x, w, None, "silu", inp["cu"], s0, s0 is not None, backend=backend)
    grads = []
    if grad:
        loss = (y * inp["dy"]).sum() + (fs.float().sum() if fs is not None else 0)
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    return y, fs, grads


def correctness() -> dict:
    out = {}
    for layout in ("4x8192", "varlen", "x".join(map(str, MODEL))):
        inp = make(layout)
        ref = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in inp.items()}
        y_r, fs_r, g_r = run(ref, "torch", True)
        y, fs, g = run(inp, "triton", True)
        res = {"y": rel_rms(y, y_r), "dx": rel_rms(g[0], g_r[0]), "dweight": rel_rms(g[1], g_r[1])}
        if fs is not None:
            res.update(final_state=rel_rms(fs, fs_r), d_initial_state=rel_rms(g[2], g_r[2]))
        res["dweight_deterministic"] = bool(torch.equal(run(inp, "triton", True)[2][1], g[1]))
        res["finite"] = bool(all(torch.isfinite(t).all() for t in (y, *g)))
        res["ok"] = res["finite"] and res["dweight_deterministic"] and max(
            v for k, v in res.items() if isinstance(v, float)) < 1e-2
        out[layout] = res
        del ref, y_r, g_r
    return out


def timings(layout: str, copy_gbps: float) -> dict:
    inp = make(layout)
    x, w = inp["x"].requires_grad_(), inp["w"].requires_grad_()
    nbytes = x.numel() * x.element_size()
    res = {}
    for backend in ("triton", "torch"):
        def fwd(backend=backend):
            with torch.no_grad():
                causal_conv1d(x, w, None, "silu", inp["cu"], inp["s0"], inp["s0"] is not None, backend=backend)

        def fwd_bwd(backend=backend):
            y, _ = causal_conv1d(x, w, None, "silu", inp["cu"], inp["s0"], False, backend=backend)
            y.backward(inp["dy"])

        f_ms = bench(fwd)
        fb_ms = triton.testing.do_bench(fwd_bwd, warmup=5, rep=60, grad_to_none=[x, w], return_mode="median")
        res[backend] = {
            "fwd_ms": round(f_ms, 4),
            "fwd_bwd_ms": round(float(fb_ms), 4),
            "fwd_GBps": round(2 * nbytes / f_ms / 1e6, 1),
            "fwd_bwd_GBps": round(5 * nbytes / fb_ms / 1e6, 1),
            "fwd_frac_of_copy": round(2 * nbytes / f_ms / 1e6 / copy_gbps, 3),
            "fwd_bwd_frac_of_copy": round(5 * nbytes / fb_ms / 1e6 / copy_gbps, 3),
        }
    res["speedup_fwd"] = round(res["torch"]["fwd_ms"] / res["triton"]["fwd_ms"], 2)
    res["speedup_fwd_bwd"] = round(res["torch"]["fwd_bwd_ms"] / res["triton"]["fwd_bwd_ms"], 2)
    return res


DPRE_NAMES = ("DPRE_BT", "DPRE_BD", "DPRE_WARPS", "DPRE_TILES", "DPRE_DEFER")
DX_NAMES = ("DX_BT", "DX_BD", "DX_WARPS")


@contextlib.contextmanager
def patched(names: tuple[str, ...], values: tuple) -> Iterator[None]:
    """``conv_triton``'s launch constants ``names`` set to ``values`` inside the block."""
    old = tuple(getattr(conv_triton, n) for n in names)
    try:
        for n, v in zip(names, values):
            setattr(conv_triton, n, v)
        yield
    finally:
        for n, v in zip(names, old):
            setattr(conv_triton, n, v)


def backward_alone(copy_gbps: float, sweep: bool) -> dict:
    """The backward at the model's shape: autograd (both backends), the Triton launch alone (both kernels + the
    dweight partial sum) and each kernel alone, the bf16-dpre variant; + the per-kernel tile sweeps."""
    layout = "x".join(map(str, MODEL))
    inp = make(layout)
    x, w, dy = inp["x"].requires_grad_(), inp["w"].requires_grad_(), inp["dy"]
    nbytes = x.numel() * x.element_size()  # minimum traffic 3 x this: read x and dy, write dx
    res: dict = {"shape": layout}
    for backend in ("triton", "torch"):
        y, _ = causal_conv1d(x, w, None, "silu", backend=backend)
        ms = bench(lambda y=y: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
        res[f"{backend}_autograd_ms"] = round(ms, 4)
        del y
    x_TD, dy_TD, wd = x.detach().reshape(-1, MODEL[2]), dy.reshape(-1, MODEL[2]), w.detach()
    lay = conv_triton._layout(*MODEL, W, None, x.device)
    dx_ref, dw_ref, _, _ = conv_triton._backward(x_TD.float(), wd.float(), None, None, dy_TD.float(), None, lay, True)

    def launch():
        return conv_triton._backward(x_TD, wd, None, None, dy_TD, None, lay, True)

    def k1():
        return conv_triton._bwd_dpre(x_TD, wd, None, None, dy_TD, lay, True)

    def timed(prefix: str) -> dict:
        """The whole launch and each kernel at the current constants; the error vs the fp32-input launch."""
        dx, dw, _, dpre = launch()
        ms, ms1 = bench(launch), bench(k1)
        ms2 = bench(lambda: conv_triton._bwd_dx(dpre, wd, None, lay, x_TD.dtype))
        dp = dpre.element_size() / x.element_size()  # dpre bytes per x byte
        return {f"{prefix}launch_ms": round(ms, 4), f"{prefix}launch_GBps": round(3 * nbytes / ms / 1e6, 1),
                f"{prefix}launch_frac_of_copy": round(3 * nbytes / ms / 1e6 / copy_gbps, 3),
                f"{prefix}dpre_kernel_ms": round(ms1, 4), f"{prefix}dpre_kernel_GBps": round((2 + dp) * nbytes / ms1 / 1e6, 1),
                f"{prefix}dx_kernel_ms": round(ms2, 4), f"{prefix}dx_kernel_GBps": round((1 + dp) * nbytes / ms2 / 1e6, 1),
                f"{prefix}dx_rel_vs_fp32": rel_rms(dx, dx_ref), f"{prefix}dweight_rel_vs_fp32": rel_rms(dw, dw_ref)}

    res.update(timed("triton_"))
    res["fused"] = fused_sweep(x_TD, wd, dy_TD, lay, dx_ref, dw_ref, nbytes, copy_gbps)
    res["speedup_autograd"] = round(res["torch_autograd_ms"] / res["triton_autograd_ms"], 2)
    with patched(("DPRE_IN_X_DTYPE",), (True,)):
        res["dpre_in_x_dtype"] = timed("")
    if sweep:
        res["dpre_sweep"], res["dx_sweep"] = tile_sweeps(k1, wd, lay, x_TD.dtype, nbytes)
        best1 = min(res["dpre_sweep"], key=lambda r: r["ms"])
        best2 = min(res["dx_sweep"], key=lambda r: r["ms"])
        cfg1, cfg2 = tuple(best1[k] for k in ("BT", "BD", "warps", "tiles", "defer")), tuple(best2[k] for k in ("BT", "BD", "warps"))
        with patched(DPRE_NAMES + DX_NAMES, cfg1 + cfg2):
            res["best"] = {"dpre": cfg1, "dx": cfg2, **timed("")}
    return res


STREAM_NAMES = ("STREAM_ROWS", "STREAM_BD", "STREAM_WARPS", "STREAM_STAGES")
STREAM_SWEEP = [(128, 128, 1, 3), (256, 128, 1, 3), (128, 128, 1, 2), (64, 128, 1, 3), (128, 256, 2, 3),
                (128, 128, 1, 4), (256, 256, 2, 3), (128, 64, 1, 3), (128, 128, 1, 1)]
FWD_NAMES = ("FWD_BT", "FWD_BD", "FWD_WARPS")
FWD_SWEEP = [(16, 128, 4), (32, 128, 4), (64, 128, 4), (32, 128, 8), (64, 128, 8), (16, 256, 4), (32, 256, 8),
             (8, 128, 2), (64, 64, 4)]  # (the first is the default)


def fused_sweep(x_TD, wd, dy_TD, lay, dx_ref, dw_ref, nbytes: int, copy_gbps: float) -> list[dict]:
    """The one-kernel backward (``conv_triton.BWD_FUSED``) at each (rows, channels, warps, stages) of
    ``STREAM_SWEEP`` (the first is the default): time, bytes/s of the minimum traffic (x, dy, dx) and the errors
    against the fp32-input launch."""
    def fused():
        return conv_triton._backward(x_TD, wd, None, None, dy_TD, None, lay, True, need_dpre=False)

    rows = []
    for cfg in STREAM_SWEEP:
        with patched(STREAM_NAMES, cfg):
            dx, dw, _, dpre = fused()
            assert dpre is None, "the one-kernel path did not run"
            ms = bench(fused)
        rows.append({"config": list(cfg), "names": list(STREAM_NAMES), "ms": round(ms, 4),
                     "GBps": round(3 * nbytes / ms / 1e6, 1),
                     "frac_of_copy": round(3 * nbytes / ms / 1e6 / copy_gbps, 3),
                     "dx_rel_vs_fp32": rel_rms(dx, dx_ref), "dweight_rel_vs_fp32": rel_rms(dw, dw_ref)})
        print(f"one-kernel backward {cfg}: {rows[-1]['ms']} ms, {rows[-1]['frac_of_copy']} of copy, dx err "
              f"{rows[-1]['dx_rel_vs_fp32']:.2e}", flush=True)
    return rows


def forward_sweep(x: torch.Tensor, w: torch.Tensor, copy_gbps: float) -> list[dict]:
    """The forward alone on ``x [B, T, D]`` (no gradient, the KDA layer's call) at each (rows, channels, warps)
    of ``FWD_SWEEP``: time, bytes/s of its minimum traffic (read x, write y) and whether y equals the default's."""
    nbytes = x.numel() * x.element_size()

    def fwd():
        return causal_conv1d(x, w, None, "silu", backend="triton")[0]

    y0, rows = fwd(), []
    for cfg in FWD_SWEEP:
        with patched(FWD_NAMES, cfg):
            y = fwd()
            ms = bench(fwd)
        gbps = 2 * nbytes / ms / 1e6
        rows.append({"config": list(cfg), "names": list(FWD_NAMES), "ms": round(ms, 4), "GBps": round(gbps, 1),
                     "frac_of_copy": round(gbps / copy_gbps, 3), "y_equal_default": bool(torch.equal(y, y0))})
        print(f"forward {cfg}: {rows[-1]['ms']} ms, {rows[-1]['frac_of_copy']} of copy", flush=True)
    return rows


def tile_sweeps(k1, wd, lay, dt, nbytes: int) -> tuple[list[dict], list[dict]]:
    """Kernel 1 (dpre) alone at each (rows, channels, warps, tiles per program, deferred dweight sums) of
    ``DPRE_SWEEP``: time and dpre / dweight deviation from the default's (dpre is expected identical; dweight's
    row-group sums round differently); kernel 2 (dx) alone at each (rows, channels, warps) of ``DX_SWEEP``, on
    the default's dpre."""
    dpre0, dw0, _ = k1()
    dx0 = conv_triton._bwd_dx(dpre0, wd, None, lay, dt)
    default1 = tuple(getattr(conv_triton, n) for n in DPRE_NAMES)
    default2 = tuple(getattr(conv_triton, n) for n in DX_NAMES)
    rows1, rows2 = [], []
    for cfg in DPRE_SWEEP:
        with patched(DPRE_NAMES, cfg):
            dpre, dw, _ = k1()
            ms = bench(k1)
        rows1.append({"BT": cfg[0], "BD": cfg[1], "warps": cfg[2], "tiles": cfg[3], "defer": cfg[4], "ms": round(ms, 4),
                      "GBps": round(4 * nbytes / ms / 1e6, 1), "dpre_equal": bool(torch.equal(dpre, dpre0)),
                      "dweight_rel": rel_rms(dw.sum(0), dw0.sum(0)), "default": cfg == default1})
        print(f"dpre kernel {cfg}: {json.dumps(rows1[-1])}", flush=True)
    for cfg in DX_SWEEP:
        with patched(DX_NAMES, cfg):
            dx = conv_triton._bwd_dx(dpre0, wd, None, lay, dt)
            ms = bench(lambda: conv_triton._bwd_dx(dpre0, wd, None, lay, dt))
        rows2.append({"BT": cfg[0], "BD": cfg[1], "warps": cfg[2], "ms": round(ms, 4),
                      "GBps": round(3 * nbytes / ms / 1e6, 1), "dx_equal": bool(torch.equal(dx, dx0)),
                      "default": cfg == default2})
        print(f"dx kernel {cfg}: {json.dumps(rows2[-1])}", flush=True)
    return rows1, rows2


def decode(copy_gbps: float) -> dict:
    x = torch.randn(DEC_N, DEC_D, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(DEC_N, DEC_D, W - 1, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(DEC_D, W, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * x.numel() * 2 + 2 * s.numel() * 2  # x, y, state in, state out
    y_t, s_t = causal_conv1d_update(x, s, w, backend="triton")
    y_r, s_r = causal_conv1d_update(x.float(), s.float(), w.float(), backend="torch")
    res = {"y_rel_rms": rel_rms(y_t, y_r), "state_equal": bool(torch.equal(s_t.float(), s_r))}
    for backend in ("triton", "torch"):
        ms = bench(lambda backend=backend: causal_conv1d_update(x, s, w, backend=backend))
        res[backend] = {"ms": round(ms, 4), "GBps": round(nbytes / ms / 1e6, 1)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_short_conv.json"))
    ap.add_argument("--no-sweep", action="store_true", help="skip the backward kernels' tile sweeps")
    ap.add_argument("--model-only", action="store_true",
                    help="only the correctness checks and, at the model's shape, the forward and one-kernel backward "
                         "sweeps (FWD_SWEEP, STREAM_SWEEP)")
    args = ap.parse_args()
    res: dict = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.date.today().isoformat(), "NT": NT, "D": D, "W": W, "dtype": "bfloat16",
    }

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    copy_gbps = copy_bandwidth()
    res["copy_GBps"] = round(copy_gbps, 1)
    res["correctness_vs_torch_fp32"] = correctness()
    print(json.dumps(res["correctness_vs_torch_fp32"]))
    save()
    if args.model_only:
        model = "x".join(map(str, MODEL))
        inp = make(model)
        x, w, dy = inp["x"], inp["w"], inp["dy"]
        x_TD, dy_TD = x.reshape(-1, MODEL[2]), dy.reshape(-1, MODEL[2])
        lay = conv_triton._layout(*MODEL, W, None, x.device)
        dx_ref, dw_ref, _, _ = conv_triton._backward(x_TD.float(), w.float(), None, None, dy_TD.float(), None, lay, True)
        res["fwd_sweep_" + model] = forward_sweep(x, w, copy_gbps)
        save()
        res["fused_sweep_" + model] = fused_sweep(x_TD, w, dy_TD, lay, dx_ref, dw_ref, x.numel() * x.element_size(),
                                                  copy_gbps)
        save()
        print(f"wrote {args.out}")
        return
    for layout in ("4x8192", "varlen"):
        res[layout] = timings(layout, copy_gbps)
        save()
        for backend in ("triton", "torch"):
            print(f"{layout:>7} {backend:>6}: {json.dumps(res[layout][backend])}")
    res["bwd_" + "x".join(map(str, MODEL))] = bwd = backward_alone(copy_gbps, not args.no_sweep)
    save()
    print(f"backward alone {json.dumps({k: v for k, v in bwd.items() if not k.endswith('_sweep') and k != 'fused'})}")
    res["decode_N64_D12288"] = decode(copy_gbps)
    save()
    print(f"copy {res['copy_GBps']} GB/s; decode {json.dumps(res['decode_N64_D12288'])}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
