"""Distributed MuonClip on 2+ ranks: DDP and FSDP2 updates vs one process, and bytes per step vs AdamW (issue 7).

One command (GPUs: NCCL; ``--device cpu``: gloo), JSON from rank 0 to ``$OUT/dist_muon.json`` and a table:

    torchrun --nproc_per_node 2 -m kimi_vl.benchmarks.dist_muon [--device cuda] [--steps 3]

``--fused on --device cpu`` with ``TRITON_INTERPRET=1`` runs Muon's Triton path (the GPU default) on CPU.

Model: a small decoder LM (``--vocab 32768 --width 1024 --layers 8 --mlp 2816``, ~168M parameters, of which
the ~101M hidden matrices go to Muon; embeddings, LM head and norms to AdamW), bf16 Newton-Schulz by default.

- ``end_to_end_max_rel``: each rank trains on its half of every batch under DDP (owner scheme, gradient
  all-reduce) or FSDP2 (``fully_shard`` per block); a one-process MuonClip trains on the whole batch. Max over
  parameters of ``|dW_dist - dW_ref| / |dW_ref|`` (dW: change over ``--steps`` steps). With bf16
  Newton-Schulz this also measures how the quintic amplifies fp32 rounding differences of the gradient
  reduction (~a^5 = 480 on small singular values: ~1e-2 on small-batch gradients), so it is reported for bf16
  and checked (<= 1e-3) with fp32 NS.
- ``same_grad_max_rel``: the one-process replica gets the distributed run's (gathered) gradient each step, so
  only the optimizer paths differ: the bf16 check (<= 1e-3).
- ``one_process_ns_dtype_vs_fp32_max_rel``: one process, bf16 vs fp32 Newton-Schulz: the spread bf16 rounding
  alone causes, the scale against which the bf16 end-to-end numbers should be read.
- bytes: one training step (forward, backward, optimizer) after a warm-up step, counted by
  :class:`kimi_vl.optim.comm_count.CommCounter` (DDP's gradient all-reduce through its comm hook, FSDP2's
  all-gathers/reduce-scatters, Muon's collectives), for MuonClip and for AdamW on every parameter
  ("distributed AdamW": the same wrapper, nothing but AdamW). Target: MuonClip / AdamW <= 1.25.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kimi_vl.optim import MuonClip
from kimi_vl.optim.comm_count import CommCounter


class Block(nn.Module):
    """Pre-norm causal attention (SDPA) + SwiGLU MLP. x ``[B, T, D]``."""

    def __init__(self, width: int, mlp: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(width), nn.RMSNorm(width)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate_proj, self.up_proj = nn.Linear(width, mlp, bias=False), nn.Linear(width, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, width, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        h = self.attn_norm(x_BTD)
        q, k, v = (p(h).view(B, T, self.heads, D // self.heads).transpose(1, 2) for p in
                   (self.q_proj, self.k_proj, self.v_proj))
        x_BTD = x_BTD + self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
                                    .reshape(B, T, D))
        h = self.mlp_norm(x_BTD)
        return x_BTD + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BenchLM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, mlp: int, heads: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, mlp, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids_BT: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids_BT)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


def lm_loss(model: nn.Module, ids_BT: torch.Tensor) -> torch.Tensor:
    logits = model(ids_BT[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids_BT[:, 1:].reshape(-1))


def wrap(model: BenchLM, case: str, device: torch.device) -> nn.Module:
    """DDP (gradient all-reduce through the counting comm hook) or FSDP2 (one shard group per block + root)."""
    if case == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                  broadcast_buffers=False)
        ddp.register_comm_hook(None, CommCounter.ddp_hook)
        return ddp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).float().norm() / y.float().norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def global_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """``|a - b| / |b|`` over all parameters together (one ill-conditioned matrix cannot dominate it)."""
    num = sum((x - y).float().pow(2).sum() for x, y in zip(a, b))
    return (num / sum(y.float().pow(2).sum() for y in b).clamp_min(1e-30)).sqrt().item()


def run_case(base: BenchLM, case: str, batches: list[torch.Tensor], ref_delta: list[torch.Tensor],
             kw: dict[str, Any], device: torch.device) -> dict[str, float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    init = [p.detach().clone() for p in base.parameters()]
    model, shadow = copy.deepcopy(base), copy.deepcopy(base)
    wrapped = wrap(model, case, device)
    opt = MuonClip.from_model(model, **kw)
    shadow_opt = MuonClip.from_model(shadow, distributed="off", **kw)
    per = batches[0].shape[0] // world
    for ids in batches:
        opt.zero_grad()
        lm_loss(wrapped, ids[rank * per:(rank + 1) * per]).backward()
        for sp, p in zip(shadow.parameters(), model.parameters()):
            sp.grad = None if p.grad is None else full(p.grad).clone()
        opt.step()
        shadow_opt.step()
    got = [full(p.detach()) - q for p, q in zip(model.parameters(), init)]
    shadow_delta = [p.detach() - q for p, q in zip(shadow.parameters(), init)]
    return {"end_to_end_max_rel": max_rel(got, ref_delta), "same_grad_max_rel": max_rel(got, shadow_delta),
            "end_to_end_global_rel": global_rel(got, ref_delta), "same_grad_global_rel": global_rel(got, shadow_delta),
            "ns_matrices_local": opt.last_muon_stats["muon/ns_matrices_local"],
            "ns_matrices_total": opt.last_muon_stats["muon/ns_matrices_total"]}


def reference_delta(base: BenchLM, batches: list[torch.Tensor], kw: dict[str, Any]) -> list[torch.Tensor]:
    """One process on the whole batch: each parameter's change over the steps."""
    ref = copy.deepcopy(base)
    opt = MuonClip.from_model(ref, distributed="off", **kw)
    for ids in batches:
        opt.zero_grad()
        lm_loss(ref, ids).backward()
        opt.step()
    return [p.detach() - q.detach() for p, q in zip(ref.parameters(), base.parameters())]


def count_bytes(base: BenchLM, case: str, batches: list[torch.Tensor], kw: dict[str, Any], adamw_only: bool,
                device: torch.device) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = copy.deepcopy(base)
    wrapped = wrap(model, case, device)
    opt = MuonClip.from_model(model, adamw_only=adamw_only, **kw)
    per = batches[0].shape[0] // world

    def step(ids: torch.Tensor) -> None:
        opt.zero_grad()
        lm_loss(wrapped, ids[rank * per:(rank + 1) * per]).backward()
        opt.step()

    step(batches[0])  # warm-up: lazy optimizer state, DDP bucket rebuild
    with CommCounter() as counter:
        step(batches[1 % len(batches)])
    return counter.summary()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchrun --nproc_per_node 2 -m kimi_vl.benchmarks.dist_muon",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step, all ranks together")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ns-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--fused", default="auto", choices=["auto", "on", "off"],
                    help="Muon's Triton path (auto: on CUDA); 'on' with --device cpu needs TRITON_INTERPRET=1")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        raise ValueError(f"kimi_vl/benchmarks/dist_muon.py: --batch {args.batch} must divide by the world {world}")
    torch.manual_seed(0)
    base = BenchLM(args.vocab, args.width, args.layers, args.mlp, args.heads).to(device)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
               for _ in range(args.steps)]
    n_muon = sum(p.numel() for g_ in MuonClip.from_model(copy.deepcopy(base), distributed="off").param_groups
                 if g_["use_muon"] for p in g_["params"])
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "world": world, "args": vars(args), "params": sum(p.numel() for p in base.parameters()), "muon_params": n_muon,
    }
    ref_deltas = {}
    for ns_name in dict.fromkeys([args.ns_dtype, "float32"]):
        kw = dict(lr=0.02, weight_decay=0.1, ns_dtype=getattr(torch, ns_name),
                  fused={"auto": None, "on": True, "off": False}[args.fused])
        ref_delta = ref_deltas[ns_name] = reference_delta(base, batches, kw)
        for case in ("ddp", "fsdp2"):
            r = run_case(base, case, batches, ref_delta, kw, device)
            if ns_name == args.ns_dtype:
                muon = count_bytes(base, case, batches, kw, False, device)
                adamw = count_bytes(base, case, batches, kw, True, device)
                r.update(muonclip_bytes=muon, adamw_bytes=adamw, bus_bytes_ratio=muon["bus_bytes"] / adamw["bus_bytes"])
            result.setdefault(case, {})[ns_name] = r
    # the spread bf16 rounding alone causes: one process, bf16 vs fp32 Newton-Schulz
    result["one_process_ns_dtype_vs_fp32_max_rel"] = max_rel(ref_deltas[args.ns_dtype], ref_deltas["float32"])
    for case in ("ddp", "fsdp2"):
        r = result[case]
        r["checks"] = {f"{args.ns_dtype}_same_grad_max_rel<=1e-3": r[args.ns_dtype]["same_grad_max_rel"] <= 1e-3,
                       "float32_end_to_end_max_rel<=1e-3": r["float32"]["end_to_end_max_rel"] <= 1e-3,
                       "bus_bytes_ratio<=1.25": r[args.ns_dtype]["bus_bytes_ratio"] <= 1.25}
        r["ok"] = all(r["checks"].values())
    result["seconds"] = time.perf_counter() - t0
    if rank == 0:
        out = Path(os.environ.get("OUT", "."))
        out.mkdir(parents=True, exist_ok=True)
        (out / "dist_muon.json").write_text(json.dumps(result, indent=2))
        print(format_table(result))
    dist.destroy_process_group()
    return 0


def format_table(result: dict[str, Any]) -> str:
    ns = result["args"]["ns_dtype"]
    lines = [f"{result['device']} x{result['world']}, torch {result['torch']}, {result['params'] / 1e6:.1f}M params "
             f"({result['muon_params'] / 1e6:.1f}M Muon), {result['seconds']:.0f} s", "",
             f"| case | {ns} NS: end-to-end / same-grad max rel | fp32 NS: end-to-end / same-grad | "
             "MuonClip / AdamW bus MB per step | ratio | ok |", "| --- | --- | --- | --- | --- | --- |"]
    for case in ("ddp", "fsdp2"):
        r, b = result[case], result[case][ns]
        f32 = r["float32"]
        lines.append(f"| {case} | {b['end_to_end_max_rel']:.2e} / {b['same_grad_max_rel']:.2e} | "
                     f"{f32['end_to_end_max_rel']:.2e} / {f32['same_grad_max_rel']:.2e} | "
                     f"{b['muonclip_bytes']['bus_bytes'] / 1e6:.2f} / {b['adamw_bytes']['bus_bytes'] / 1e6:.2f} | "
                     f"{b['bus_bytes_ratio']:.3f} | {r['ok']} |")
    lines.append(f"\none process, {ns} vs fp32 NS update: max rel {result['one_process_ns_dtype_vs_fp32_max_rel']:.2e}")
    for case in ("ddp", "fsdp2"):
        b = result[case][ns]
        lines.append(f"{case}: {ns} global rel end-to-end {b['end_to_end_global_rel']:.2e}, same-grad "
                     f"{b['same_grad_global_rel']:.2e}; checks {json.dumps(result[case]['checks'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
