"""How exact ``sum_j alpha_j (dh . x_j) = dh . h`` is when ``h`` is the mix's stored bf16 output: the premise of the
AttnRes backward that would defer every completed-source term to the block's flush (``kimi_vl/README.md``, "What
could still cut the training overhead"; not built). CPU only, a few seconds.

For random bf16 sources and output gradients, at several query scales (0: uniform weights; larger: nearly all
weight on the partial sum ``p``, the last source, where ``dh . x_p - dh . h`` cancels), three gradients are formed
three ways: the partial sum's score gradient ``ds_p`` and input gradient ``dx_p``, and the query's gradient ``du``;
in fp64 (the reference), as the mix kernels do (the sum over sources in fp32 from the bf16 sources), and through the
identity with the bf16 ``h``. Prints and returns the relative RMS error of each against fp64.

    python -m kimi_vl.benchmarks.attnres_h_identity
"""

from __future__ import annotations

import argparse
import json

import torch


def _grads(xs: torch.Tensor, u: torch.Tensor, dh: torch.Tensor, eps: float, s_sum: str) -> tuple:
    """``(ds_p, dx_p, du)``: the last source's score and input gradients and the query's gradient ``du = sum over
    tokens and sources of ds_i n_i``, in ``xs``' dtype's arithmetic; ``s_sum``: ``"sources"`` forms
    ``sum_j alpha_j dh . x_j`` over the sources, ``"h_bf16"`` as ``dh . h`` with h rounded to bf16."""
    D = xs.shape[-1]
    rstd = torch.rsqrt(xs.pow(2).mean(-1) + eps)  # [N, M]
    n = xs * rstd[..., None]
    alpha = torch.softmax(n @ u, dim=0)  # [N, M]
    dots = (xs * dh).sum(-1)  # [N, M]
    if s_sum == "sources":
        s = (alpha * dots).sum(0)
    else:
        h = (alpha[..., None] * xs).sum(0).to(torch.bfloat16).to(xs.dtype)
        s = (dh * h).sum(-1)
    ds_all = alpha * (dots - s)  # [N, M]
    ds = ds_all[-1]
    dx = alpha[-1][:, None] * dh + (ds * rstd[-1])[:, None] * (u - n[-1] * (n[-1] @ u)[:, None] / D)
    return ds, dx, (ds_all[..., None] * n).sum((0, 1))


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300))


def measure(num_sources: int = 4, tokens: int = 2048, dim: int = 768,
            scales: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3), seed: int = 0, eps: float = 1e-6) -> list[dict]:
    """One row per query scale: the mean weight on the partial sum and the relative errors of ``ds_p``, ``dx_p`` and
    ``du`` both ways."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(dim, generator=g, dtype=torch.float64)  # the partial sum's common direction (unit RMS)
    bias = bias / bias.pow(2).mean().sqrt()
    xs = torch.randn(num_sources, tokens, dim, generator=g, dtype=torch.float64)
    xs[-1] += bias
    xs = xs.to(torch.bfloat16)
    dh = torch.randn(tokens, dim, generator=g).to(torch.bfloat16)
    rows = []
    for scale in scales:
        u = scale * bias / bias.norm()  # large scales put nearly all the weight on the partial sum
        ref_ds, ref_dx, ref_du = _grads(xs.double(), u, dh.double(), eps, "sources")
        row = {"scale": scale, "mean_alpha_partial": float(torch.softmax(
            (xs.double() * torch.rsqrt(xs.double().pow(2).mean(-1, keepdim=True) + eps)) @ u, 0)[-1].mean())}
        for name in ("sources", "h_bf16"):
            ds, dx, du = _grads(xs.float(), u.float(), dh.float(), eps, name)
            row[f"ds_rel_err_{name}"] = _rel(ds, ref_ds)
            row[f"dx_rel_err_{name}"] = _rel(dx, ref_dx)
            row[f"du_rel_err_{name}"] = _rel(du, ref_du)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--sources", type=int, default=4)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = measure(args.sources, args.tokens, args.dim)
    cols = [f"{q} err ({w})" for q in ("ds_p", "dx_p", "du") for w in ("sum", "dh.h")]
    print(f"{'scale':>6} {'alpha_p':>8} " + " ".join(f"{c:>14}" for c in cols))
    for r in rows:
        errs = [r[f"{q}_rel_err_{w}"] for q in ("ds", "dx", "du") for w in ("sources", "h_bf16")]
        print(f"{r['scale']:6.2f} {r['mean_alpha_partial']:8.3f} " + " ".join(f"{e:14.2e}" for e in errs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
