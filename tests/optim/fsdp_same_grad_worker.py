"""Two-process gloo check: FSDP2 MuonClip's bf16 update equals one process's for the same gradient, bit for bit.

Usage: python tests/optim/fsdp_same_grad_worker.py {exact,fused,all} [world]
Each rank trains a tiny model (one-block matrices, a fused gate/up expert stack with row splits, experts) under
FSDP2 ``fully_shard``; a one-process replica (``distributed="off"``) gets the gathered gradient every step, so
only the optimizer paths differ (issue 7). ``fused`` runs the Triton path (``TRITON_INTERPRET=1`` on CPU).
Prints the largest parameter difference per case and exits non-zero unless every one is exactly 0.
"""

from __future__ import annotations

import copy

import torch
from gloo_spawn import end_gloo, full, init_gloo, spawn_main
from optim_tiny_models import TinyLM

from kimi_vl.optim import MuonClip

STEPS = 3
KW = dict(lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16, qk_clip=False)


def _fsdp(model: TinyLM, world: int) -> TinyLM:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_case(rank: int, world: int, fused: bool) -> float:
    """Largest ``|W_fsdp2 - W_one_process|`` over parameters and steps."""
    torch.manual_seed(0)
    base = TinyLM(d=24)
    model, shadow = _fsdp(copy.deepcopy(base), world), copy.deepcopy(base)
    opt = MuonClip.from_model(model, fused=fused, **KW)
    shadow_opt = MuonClip.from_model(shadow, distributed="off", fused=fused, **KW)
    g = torch.Generator().manual_seed(7)
    worst = 0.0
    for _ in range(STEPS):
        ids = torch.randint(0, 32, (2 * world, 10), generator=g)
        opt.zero_grad()
        model.loss(ids[2 * rank:2 * rank + 2]).backward()
        for sp, p in zip(shadow.parameters(), model.parameters()):
            sp.grad = None if p.grad is None else full(p.grad).clone()
        opt.step()
        shadow_opt.step()
        for p, q in zip(model.parameters(), shadow.parameters()):
            worst = max(worst, (full(p.detach()) - q.detach()).abs().max().item())
    return worst


def worker(rank: int, world: int, cases: list[str], port: int) -> None:
    init_gloo(rank, world, port, timeout_s=120)
    failed = []
    for case in cases:
        worst = run_case(rank, world, fused=case == "fused")
        if rank == 0:
            print(f"fsdp2 {case} bf16 same-grad: world {world}, max |W_fsdp2 - W_one_process| {worst:.3e}")
        if worst != 0.0:
            failed.append(case)
    end_gloo()
    if failed:
        raise SystemExit(f"rank {rank}: FSDP2 update differs from one process for the same gradient in {failed}")


def main() -> None:
    spawn_main(worker, ["exact", "fused"])


if __name__ == "__main__":
    main()
