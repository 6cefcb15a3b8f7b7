"""How many diagonal blocks take the KDA kernels' pairwise path: a (chunk, head, 16-row sub-block, key tile) goes
pairwise when its largest ``|G_i - G_f|`` inside the sub-block exceeds the span limit (60: ``INTRA_SPAN_MAX``,
``BWD_SPAN_MAX``). Gate sources:

- ``bench_kda.make``'s (the default; its ``--gates bench``): the in-kernel softplus gate on N(0, 1) raw gates
  (bf16), ``A_log = log U(1, 16)``, ``dt_bias = N(0, 0.5^2) - 3``;
- ``--gates init``: ``bench_kda.make``'s gates as a model layer's at initialisation;
- ``--flavor NAME``: one KDA layer of that model flavor at initialisation (its ``kda_init_values`` and normal(0,
  ``initializer_range``) projections) on unit-RMS random hidden states, as ``bench_backbone``'s model meets them.

CPU, seconds.

    python scripts/kda_gate_spans.py --shape 1x8192x32              # scores kernel tiles (16 key columns)
    python scripts/kda_gate_spans.py --flavor small --shape 1x4096 --tile 32   # pair kernel tiles in the model
    python scripts/kda_gate_spans.py --gates init --shape 8x4096x6 --tile 32  # bench_kda --gates init, same shape
"""

from __future__ import annotations

import argparse

import torch


def bench_gates(B: int, T: int, H: int, gates: str = "bench") -> torch.Tensor:
    """The log-decay of ``bench_kda.make``'s raw gates (``gates``: its ``--gates`` distribution, on the CPU) through
    the in-kernel gate's reference."""
    from kernels.benchmarks import bench_kda
    from kimi_vl.modeling.kda_layer import kda_gate_torch

    bench_kda.use_gates(gates)
    _, _, _, raw, _, a_log, dt_bias = bench_kda.make(B, T, H, dev="cpu")
    return kda_gate_torch(raw, a_log, dt_bias, None)


def flavor_gates(flavor: str, B: int, T: int) -> torch.Tensor:
    from kimi_vl import KimiVLConfig
    from kimi_vl.modeling.kda_layer import KDALayer, kda_gate_torch, kda_init_values

    cfg = KimiVLConfig.from_flavor(flavor)
    layer = KDALayer(cfg, 0)
    for proj in (layer.f_a_proj, layer.f_b_proj):
        torch.nn.init.normal_(proj.weight, std=cfg.initializer_range)
    a_log, dt_bias, _ = kda_init_values(layer)
    with torch.no_grad():
        raw = layer.f_b_proj(layer.f_a_proj(torch.randn(B, T, cfg.hidden_size)))
    return kda_gate_torch(raw.view(B, T, cfg.linear_num_heads, -1), a_log, dt_bias, cfg.kda_gate_lower_bound)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x8192x32", help="BxTxH (with --flavor: BxT, H from the flavor)")
    ap.add_argument("--flavor", default=None, help="a model flavor's KDA layer at initialisation")
    ap.add_argument("--gates", choices=("bench", "init"), default="bench", help="bench_kda.make's gates (no --flavor)")
    ap.add_argument("--tile", type=int, default=16, help="key columns a tile (scores kernel 16, pair kernel 32)")
    ap.add_argument("--span-max", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dims = [int(x) for x in args.shape.split("x")]
    torch.manual_seed(args.seed)
    g = flavor_gates(args.flavor, *dims[:2]) if args.flavor else bench_gates(*dims, args.gates)
    B, T, H, K = g.shape
    C, S = 64, 16
    G = g.view(B, T // C, C, H, K).cumsum(2).view(B, T // C, C // S, S, H, K)
    Gd = (G - G[:, :, :, :1]).abs()
    span = Gd.view(B, T // C, C // S, S, H, K // args.tile, args.tile).amax(dim=(3, 6))  # [B, NC, C/S, H, K/tile]
    span_tile = span.amax(2)  # [B, NC, H, K / tile]: the scores kernel's check covers a chunk's four sub-blocks
    source = args.flavor or f"bench_kda --gates {args.gates}"
    print(f"{source} {args.shape}: per-step |g| mean {g.abs().mean():.3f}, max "
          f"{g.abs().max():.1f}; over {args.span_max:g}: {(span > args.span_max).float().mean():.1%} of (sub-block, "
          f"tile), {(span_tile > args.span_max).float().mean():.1%} of (chunk, tile), "
          f"{(span_tile.amax(-1) > args.span_max).float().mean():.1%} of (chunk, head); largest span {span.max():.1f}")


if __name__ == "__main__":
    main()
