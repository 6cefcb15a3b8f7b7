"""GPU benchmark of the fused cross entropy (``kernels/cross_entropy``) vs ``F.cross_entropy(logits.float())``.

bf16 logits ``[N, V]`` at V = 32768 and N = 8192 / 32768 (one training step of the ``small`` model has 8 x 4096
rows), every 64th target ``ignore_index``, mean reduction (the model's loss). For each path:
- forward (no grad) and forward+backward times with ``triton.testing.do_bench`` (median), and the bytes/s of the
  minimum traffic (forward reads the logits; forward+backward reads them twice and writes the gradient);
- peak memory of one forward and of one forward+backward above what the inputs already hold (the gradient
  buffer included, except in place);
- max abs error of the per-row loss and of the bf16 gradient against an fp32 reference (``F.cross_entropy`` on an
  fp32 leaf copy of the same logits, its fp32 gradient), for ours and for the PyTorch path.
``triton_inplace`` is ours with ``inplace_backward=True`` (the gradient overwrites the logits).
``--linear``: instead, the ``small`` model's LM head and loss (x ``[32768, 768]``, weight ``[32768, 768]`` bf16, mean
loss): ``kernels.cross_entropy.linear_cross_entropy`` (one node, the logits' gradient written in its forward) against
``F.linear`` then ``cross_entropy`` (Triton; and with ``inplace_backward``), forward+backward time and peak memory,
and the relative RMS difference of the loss, dx and dw between them; with ``--fwd-grad-sweep`` first the loss +
gradient kernel alone in each of its forms (:data:`FWD_GRAD_SETTINGS`). Writes ``$OUT/bench_cross_entropy.json``
(or ``--out``) and prints a table.

    python kernels/benchmarks/bench_cross_entropy.py [--linear [--fwd-grad-sweep]]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels.cross_entropy import cross_entropy, linear_cross_entropy  # noqa: E402

V = 32768
ROWS = (8192, 32768)
IGN = -100


def make(N: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(N, V, device="cuda", generator=g) * 2).to(torch.bfloat16)
    target = torch.randint(0, V, (N,), device="cuda", generator=g)
    target[::64] = IGN
    return logits, target


def loss_fn(path: str):
    """The loss of one path: ``fn(logits, target, reduction) -> fp32``."""
    if path == "torch":
        return lambda x, t, r="mean": F.cross_entropy(x.float(), t, ignore_index=IGN, reduction=r)
    inplace = path == "triton_inplace"
    return lambda x, t, r="mean": cross_entropy(x, t, IGN, r, backend="triton", inplace_backward=inplace)


def errors(logits: torch.Tensor, target: torch.Tensor) -> dict:
    """Max abs error of the per-row loss and of d(mean loss)/dlogits vs the fp32 reference, per path."""
    ref_x = logits.float().requires_grad_()
    ref = F.cross_entropy(ref_x, target, ignore_index=IGN, reduction="none")
    (ref_g,) = torch.autograd.grad(ref.sum() / (target != IGN).sum(), ref_x)
    ref, out = ref.detach(), {}
    del ref_x
    for path in ("triton", "torch"):
        x = logits.clone().requires_grad_()
        loss = loss_fn(path)(x, target, "none")
        (g,) = torch.autograd.grad(loss.sum() / (target != IGN).sum(), x)
        out[path] = {"loss_max_abs_err": float((loss.detach() - ref).abs().max()),
                     "grad_max_abs_err": float((g.float() - ref_g).abs().max()),
                     "grad_dtype": str(g.dtype).replace("torch.", "")}
        del x, g, loss
    out["ref_grad_max_abs"] = float(ref_g.abs().max())
    return out


def peak_bytes(fn) -> int:
    """Peak allocation of ``fn()`` above what is allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def timings(path: str, logits: torch.Tensor, target: torch.Tensor) -> dict:
    x = logits.clone().requires_grad_()
    fn = loss_fn(path)
    nbytes = x.numel() * x.element_size()

    def fwd():
        with torch.no_grad():
            fn(x, target)

    def fwd_bwd():  # autograd.grad, not backward: no accumulation into x.grad (logits are not a leaf in a model)
        torch.autograd.grad(fn(x, target), x)

    f_ms = float(triton.testing.do_bench(fwd, warmup=5, rep=100, return_mode="median"))
    fb_ms = float(triton.testing.do_bench(fwd_bwd, warmup=5, rep=100, return_mode="median"))
    res = {"fwd_ms": round(f_ms, 4), "fwd_bwd_ms": round(fb_ms, 4),
           "fwd_GBps": round(nbytes / f_ms / 1e6, 1), "fwd_bwd_GBps": round(3 * nbytes / fb_ms / 1e6, 1),
           "peak_fwd_GB": round(peak_bytes(fwd) / 1e9, 3)}
    res["peak_fwd_bwd_GB"] = round(peak_bytes(fwd_bwd) / 1e9, 3)  # includes the gradient unless in place
    return res


def linear_head(N: int = 32768, D: int = 768) -> dict:
    """The LM head + loss as one node against ``F.linear`` + ``cross_entropy``: times, peaks, differences."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, D, device="cuda", generator=g) / D ** 0.5).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    t[::64] = IGN
    paths = {"fused": lambda: linear_cross_entropy(x, w, t, IGN, backend="triton"),
             "separate": lambda: cross_entropy(F.linear(x, w), t, IGN, backend="triton"),
             "separate_inplace": lambda: cross_entropy(F.linear(x, w), t, IGN, backend="triton",
                                                       inplace_backward=True)}
    res: dict = {"N": N, "D": D, "V": V}
    outs = {}
    for name, fn in paths.items():
        step = lambda fn=fn: torch.autograd.grad(fn(), [x, w])  # noqa: E731
        loss = fn()
        outs[name] = (loss.detach(), *torch.autograd.grad(loss, [x, w]))
        res[name] = {"fwd_bwd_ms": round(float(triton.testing.do_bench(step, warmup=5, rep=100,
                                                                     return_mode="median")), 4),
                     "peak_fwd_bwd_GB": round(peak_bytes(step) / 1e9, 3)}
        torch.cuda.empty_cache()
    for i, name in enumerate(("loss", "dx", "dw")):
        a, b = (outs[p][i].float() for p in ("fused", "separate"))
        res[f"{name}_rel_rms_diff"] = float((a - b).norm() / b.norm())
        res[f"{name}_rel_rms_diff_inplace"] = float((outs["separate_inplace"][i].float() - b).norm() / b.norm())
    res["speedup"] = round(res["separate"]["fwd_bwd_ms"] / res["fused"]["fwd_bwd_ms"], 3)
    return res


FWD_GRAD_SETTINGS = {  # name -> ce_triton constants
    "chunks": {"FWD_GRAD_MODE": "chunks"},
    **{f"persistent_{k}": {"FWD_GRAD_MODE": "persistent", "FWD_GRAD_PROGRAMS_PER_SM": k} for k in (1, 2, 4, 8)},
    **{f"row_{w}w": {"FWD_GRAD_MODE": "row", "FWD_GRAD_ROW_WARPS": w} for w in (8, 16, 32)},
}


def fwd_grad_sweep(N: int = 32768) -> dict:
    """``ce_forward_grad_`` (the linear CE's loss + gradient kernel) under each of :data:`FWD_GRAD_SETTINGS` at
    ``[N, V]`` bf16, against the separate forward and backward kernels and a copy of the logits (one read, one
    write: the floor of the one-pass forms); each setting's loss and gradient against the separate kernels'."""
    from kernels.benchmarks.constants import overridden
    from kernels.cross_entropy import ce_triton

    logits, target = make(N)
    nbytes = logits.numel() * logits.element_size()
    work = logits.clone()
    bench = lambda fn: float(triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median"))  # noqa: E731
    ref_loss, lse = ce_triton.ce_forward(logits, target, IGN)
    ones = torch.ones(N, device="cuda")
    ref_grad = ce_triton.ce_backward(logits, target, lse, ones, IGN, False)
    res: dict = {"N": N, "V": V, "copy_ms": bench(lambda: work.copy_(logits)),
                 "separate_fwd_ms": bench(lambda: ce_triton.ce_forward(logits, target, IGN)),
                 "separate_bwd_ms": bench(lambda: ce_triton.ce_backward(logits, target, lse, ones, IGN, False))}
    res["copy_GBps"] = 2 * nbytes / res["copy_ms"] / 1e6
    for name, consts in FWD_GRAD_SETTINGS.items():
        with overridden([(ce_triton, k, v) for k, v in consts.items()]):
            work.copy_(logits)
            loss = ce_triton.ce_forward_grad_(work, target, IGN)
            err = {"loss_max_abs_diff": float((loss - ref_loss).abs().max()),
                   "grad_max_abs_diff": float((work.float() - ref_grad.float()).abs().max())}
            ms = bench(lambda: ce_triton.ce_forward_grad_(work, target, IGN))  # (values change; the work does not)
        res[name] = {"ms": ms, "GBps": 2 * nbytes / ms / 1e6, **err}
        print(f"{name:>14}: {ms:.3f} ms ({res[name]['GBps']:.0f} GB/s one read + one write), loss diff "
              f"{err['loss_max_abs_diff']:.1e}, grad diff {err['grad_max_abs_diff']:.1e}")
    print(f"separate fwd {res['separate_fwd_ms']:.3f} + bwd {res['separate_bwd_ms']:.3f} ms; copy {res['copy_ms']:.3f} ms "
          f"({res['copy_GBps']:.0f} GB/s)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_cross_entropy.json"))
    ap.add_argument("--linear", action="store_true", help="the LM head and loss as one node against two")
    ap.add_argument("--fwd-grad-sweep", action="store_true",
                    help="with --linear: first the loss + gradient kernel's forms (ce_triton.FWD_GRAD_MODE) alone")
    args = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "date": datetime.date.today().isoformat(), "V": V, "dtype": "bfloat16", "ignore_every": 64}
    if args.linear:
        if args.fwd_grad_sweep:
            res["fwd_grad_sweep"] = fwd_grad_sweep()
            torch.cuda.empty_cache()
        res["linear_head"] = r = linear_head()
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        for name in ("fused", "separate", "separate_inplace"):
            print(f"{name:>9}: fwd+bwd {r[name]['fwd_bwd_ms']:.3f} ms, peak {r[name]['peak_fwd_bwd_GB']:.3f} GB")
        print(f"speedup {r['speedup']}x; rel RMS diff loss {r['loss_rel_rms_diff']:.2e}, dx {r['dx_rel_rms_diff']:.2e},"
              f" dw {r['dw_rel_rms_diff']:.2e}; wrote {args.out}")
        return

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for N in ROWS:
        logits, target = make(N)
        entry = {"errors_vs_fp32": errors(logits, target)}
        torch.cuda.empty_cache()
        for path in ("triton", "torch", "triton_inplace"):
            entry[path] = timings(path, logits, target)
            torch.cuda.empty_cache()
        entry["speedup_fwd"] = round(entry["torch"]["fwd_ms"] / entry["triton"]["fwd_ms"], 2)
        entry["speedup_fwd_bwd"] = round(entry["torch"]["fwd_bwd_ms"] / entry["triton"]["fwd_bwd_ms"], 2)
        res[f"N{N}"] = entry
        save()
        del logits, target
        torch.cuda.empty_cache()
    print(f"{'N':>6} {'path':>15} {'fwd ms':>8} {'f+b ms':>8} {'f+b GB/s':>9} {'peak f+b GB':>12} "
          f"{'loss err':>9} {'grad err':>9}")
    for N in ROWS:
        e = res[f"N{N}"]
        for path in ("triton", "torch", "triton_inplace"):
            t, err = e[path], e["errors_vs_fp32"].get(path.replace("_inplace", ""), {})
            print(f"{N:>6} {path:>15} {t['fwd_ms']:>8.3f} {t['fwd_bwd_ms']:>8.3f} {t['fwd_bwd_GBps']:>9.1f} "
                  f"{t['peak_fwd_bwd_GB']:>12.3f} {err.get('loss_max_abs_err', 0):>9.2e} "
                  f"{err.get('grad_max_abs_err', 0):>9.2e}")
        print(f"{N:>6} speedup fwd {e['speedup_fwd']}x, fwd+bwd {e['speedup_fwd_bwd']}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
