"""How many of the scores kernel's K tiles take the pairwise diagonal path with ``bench_kda.make``'s gates: the
in-kernel softplus gate on N(0, 1) raw gates, ``A_log = log U(1, 16)``, ``dt_bias = N(0, 0.5^2) - 3``; a (chunk,
head, 16-column) tile goes pairwise when its largest ``|G_i - G_f|`` inside a 16-row sub-block exceeds
``INTRA_SPAN_MAX`` (60). CPU, seconds.

    python scripts/kda_gate_spans.py --shape 1x8192x32
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x8192x32")
    ap.add_argument("--span-max", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    B, T, H = (int(x) for x in args.shape.split("x"))
    K, C, S, BK = 128, 64, 16, 16
    torch.manual_seed(args.seed)
    raw = torch.randn(B, T, H, K)
    a_log = torch.log(torch.empty(H).uniform_(1, 16))
    dt_bias = torch.randn(H * K) * 0.5 - 3.0
    g = -a_log.exp().view(H, 1) * F.softplus(raw + dt_bias.view(H, K))
    G = g.view(B, T // C, C, H, K).cumsum(2).view(B, T // C, C // S, S, H, K)
    Gd = (G - G[:, :, :, :1]).abs()
    span_tile = Gd.view(B, T // C, C // S, S, H, K // BK, BK).amax(dim=(2, 3, 6))  # [B, NC, H, K / BK]
    print(f"{args.shape}: per-step |g| mean {g.abs().mean():.3f}, max {g.abs().max():.1f}; tiles over "
          f"{args.span_max:g}: {(span_tile > args.span_max).float().mean():.1%}, (chunk, head) pairs with one: "
          f"{(span_tile.amax(-1) > args.span_max).float().mean():.1%}; largest span {span_tile.max():.1f}")


if __name__ == "__main__":
    main()
