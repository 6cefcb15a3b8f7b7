"""GPU speed of MuonClip against ``torch.optim.Muon`` and of batched vs per-matrix Newton-Schulz (issue 7).

One command, JSON to ``$OUT/bench_muon.json`` plus a markdown table on stdout:

    python -m kimi_vl.benchmarks.bench_muon [--iters 20] [--quick]

Measured in one run on one GPU (CUDA events, median of ``--iters`` after warm-up):
- ``step_1p2b``: the 168 hidden matrices of a ~1.2B model (24 layers x {q,k,v,o 2048x2048; gate, up 5632x2048;
  down 2048x5632}), fp32 params with random gradients:
  ``torch.optim.Muon.step()``; ``MuonClip.step()`` on the same matrices (Muon only); and the whole MuonClip step
  with its AdamW half (2 norm vectors per layer + embedding 32768x2048 + LM head) and QK-Clip
  (24 protocol modules whose heads are half above tau).
- ``ns_1p2b`` and ``ns_small``: Newton-Schulz alone (bf16, 5 steps) one matrix at a time vs batched by shape,
  for the 1.2B matrix set and for the ``small`` flavor's widths (12 layers, hidden 768, MLP 2048).
Targets (issue 7): whole MuonClip step <= 0.9x ``torch.optim.Muon``; batched NS >= 1.5x the loop at small widths.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch import nn

from kimi_vl.optim import MuonClip, QKClipper
from kimi_vl.optim.muon import newton_schulz5


def layer_shapes(hidden: int, mlp: int, layers: int) -> list[tuple[str, tuple[int, int]]]:
    per = [("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)), ("o", (hidden, hidden)),
           ("gate", (mlp, hidden)), ("up", (mlp, hidden)), ("down", (hidden, mlp))]
    return [(f"layers.{i}.{n}.weight", s) for i in range(layers) for n, s in per]


def time_cuda(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def make_params(shapes: list[tuple[str, tuple[int, ...]]], device: torch.device) -> list[tuple[str, nn.Parameter]]:
    out = []
    for name, shape in shapes:
        p = nn.Parameter(torch.randn(shape, device=device) * 0.02)
        p.grad = torch.randn(shape, device=device) * 1e-3
        out.append((name, p))
    return out


class FakeAttention(nn.Module):
    """QK-Clip protocol stand-in: q and k weights of one 2048-wide layer, 16 heads."""

    def __init__(self, device: torch.device, heads: int = 16, hidden: int = 2048) -> None:
        super().__init__()
        self.qk_clip_num_heads, self.track_max_logits, self.dh = heads, True, hidden // heads
        self.q = torch.randn(hidden, hidden, device=device)
        self.k = torch.randn(hidden, hidden, device=device)
        self.register_buffer("max_logits_H", torch.full((heads,), float("-inf"), device=device), persistent=False)

    def qk_clip_(self, gamma_H: torch.Tensor) -> None:
        rows = gamma_H.sqrt().repeat_interleave(self.dh)[:, None]
        self.q.mul_(rows)
        self.k.mul_(rows)


def bench_steps(device: torch.device, iters: int) -> dict[str, float]:
    shapes = layer_shapes(2048, 5632, 24)
    ref_params = make_params(shapes, device)
    muon_ref = torch.optim.Muon([p for _, p in ref_params], lr=1e-3, weight_decay=0.1)
    params = make_params(shapes, device)
    ours = MuonClip([{"params": params, "use_muon": True}], lr=1e-3, weight_decay=0.1)
    vec_shapes = [(f"layers.{i}.{n}_norm.weight", (2048,)) for i in range(24) for n in ("attn", "mlp")]
    vec_shapes += [("embed_tokens.weight", (32768, 2048)), ("lm_head.weight", (32768, 2048))]
    whole_params = make_params(shapes, device)
    adamw_params = make_params(vec_shapes, device)
    fakes = [(f"layers.{i}.attn", FakeAttention(device)) for i in range(24)]
    clipper = QKClipper(fakes, tau=100.0)

    def fill_logits() -> None:
        for _, m in fakes:
            m.max_logits_H.copy_(torch.linspace(50, 150, m.qk_clip_num_heads, device=device))

    whole = MuonClip([{"params": whole_params, "use_muon": True}, {"params": adamw_params, "use_muon": False}],
                     lr=1e-3, weight_decay=0.1, qk_clipper=clipper)

    def whole_step() -> None:
        fill_logits()
        whole.step()

    return {
        "torch_muon_step_ms": time_cuda(muon_ref.step, iters),
        "muonclip_muon_only_step_ms": time_cuda(ours.step, iters),
        "muonclip_whole_step_ms": time_cuda(whole_step, iters),
        "muonclip_adamw_half_numel": float(sum(p.numel() for _, p in adamw_params)),
    }


def bench_ns(shapes: list[tuple[str, tuple[int, int]]], device: torch.device, iters: int) -> dict[str, float]:
    mats = [torch.randn(s, device=device) for _, s in shapes]
    by_shape: dict[tuple[int, int], torch.Tensor] = {}
    for m in mats:
        by_shape.setdefault(tuple(m.shape), []).append(m)
    stacked = [torch.stack(v) for v in by_shape.values()]
    loop_ms = time_cuda(lambda: [newton_schulz5(m) for m in mats], iters)
    batched_ms = time_cuda(lambda: [newton_schulz5(s) for s in stacked], iters)
    return {"matrices": float(len(mats)), "loop_ms": loop_ms, "batched_ms": batched_ms,
            "batched_speedup": loop_ms / batched_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimi_vl.benchmarks.bench_muon", description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 iterations (smoke run)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_muon needs a CUDA GPU")
    device = torch.device("cuda")
    iters = 3 if args.quick else args.iters
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "iters": iters,
        "step_1p2b": bench_steps(device, iters),
        "ns_1p2b": bench_ns(layer_shapes(2048, 5632, 24), device, iters),
        "ns_small": bench_ns(layer_shapes(768, 2048, 12), device, iters),
    }
    s = result["step_1p2b"]
    result["targets"] = {
        "whole_step_over_torch_muon": s["muonclip_whole_step_ms"] / s["torch_muon_step_ms"],
        "whole_step_over_torch_muon_ok": s["muonclip_whole_step_ms"] <= 0.9 * s["torch_muon_step_ms"],
        "ns_small_batched_speedup_ok": result["ns_small"]["batched_speedup"] >= 1.5,
    }
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_muon.json").write_text(json.dumps(result, indent=2))
    print(f"device: {result['device']}, torch {result['torch']}\n")
    print("| measurement | ms |\n| --- | --- |")
    for k in ("torch_muon_step_ms", "muonclip_muon_only_step_ms", "muonclip_whole_step_ms"):
        print(f"| {k} | {s[k]:.1f} |")
    for name in ("ns_1p2b", "ns_small"):
        r = result[name]
        print(f"| {name}: loop / batched ({r['matrices']:.0f} matrices) | {r['loop_ms']:.1f} / {r['batched_ms']:.1f}"
              f" (x{r['batched_speedup']:.2f}) |")
    print(f"\ntargets: {json.dumps(result['targets'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
