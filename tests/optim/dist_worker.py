"""Two-process gloo check of distributed MuonClip against single-process MuonClip (run by test_distributed.py).

Usage: python tests/optim/dist_worker.py {ddp,fsdp2,all} [world]
Each rank trains a tiny model for 3 steps on its slice of the batch (DDP or FSDP2 ``fully_shard``), and
also trains a single-process copy (``distributed="off"``) on the whole batch; parameters must agree to
1e-5 (fp32 Newton-Schulz), QK-Clip included, and every matrix must be orthogonalised by exactly one rank.
Exits non-zero on any mismatch.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from gloo_spawn import end_gloo, full, init_gloo, spawn_main
from optim_tiny_models import TinyLM

from kimi_vl.optim import MuonClip

STEPS = 3
KW = dict(lr=0.02, weight_decay=0.1, ns_dtype=torch.float32, qk_clip_tau=1.0)


def _batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 32, (2 * world, 10), generator=g) for _ in range(STEPS)]


def _drop_grads(model: TinyLM) -> None:
    """A parameter without a gradient on every rank; and the key bias, whose true gradient is 0 (softmax
    is invariant to it), so its AdamW step would be the sign of rounding noise."""
    model.layers[0].mlp[0].bias.grad = None
    model.layers[0].attn.k_proj.bias.grad = None


def _reference(model: TinyLM, world: int) -> tuple[list, list]:
    """Per step: the single-process parameters and QK-Clip stats."""
    ref = copy.deepcopy(model)
    opt = MuonClip.from_model(ref, distributed="off", **KW)
    params, stats = [], []
    for ids in _batches(world):
        opt.zero_grad()
        ref.loss(ids).backward()
        _drop_grads(ref)
        opt.step()
        params.append([p.detach().clone() for p in ref.parameters()])
        stats.append(opt.last_qk_stats.to_dict())
    return params, stats


def _wrap(model: TinyLM, case: str, world: int) -> tuple[torch.nn.Module, TinyLM]:
    if case == "ddp":
        # forward_sync_buffers=False: DDP would otherwise overwrite each rank's max_logits_H with rank 0's
        ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False, find_unused_parameters=True)
        return ddp, model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model


def _check_once(ids_local: list[int], total: int, world: int) -> None:
    every: list = [None] * world
    dist.all_gather_object(every, ids_local)
    flat = [i for ids in every for i in ids]
    assert sorted(flat) == list(range(total)), f"matrices not orthogonalised exactly once: {every}"
    assert all(len(ids) > 0 for ids in every), f"a rank owned no matrix: {every}"


def worker(rank: int, world: int, cases: list[str], port: int) -> None:
    init_gloo(rank, world, port, timeout_s=60)
    for case in cases:
        run_case(rank, world, case)
    end_gloo()


def run_case(rank: int, world: int, case: str) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    ref_params, ref_stats = _reference(model, world)
    wrapped, inner = _wrap(model, case, world)
    opt = MuonClip.from_model(inner, **KW)
    worst, clipped = 0.0, 0
    for step, ids in enumerate(_batches(world)):
        opt.zero_grad()
        logits = wrapped(ids[2 * rank: 2 * rank + 2, :-1])
        target = ids[2 * rank: 2 * rank + 2, 1:]
        torch.nn.functional.cross_entropy(logits.reshape(-1, 32), target.reshape(-1)).backward()
        _drop_grads(inner)
        opt.step()
        _check_once(opt.last_ns_ids, int(opt.last_muon_stats["muon/ns_matrices_total"]), world)
        for (name, p), q in zip(inner.named_parameters(), ref_params[step]):
            err = ((full(p.detach()) - q).abs().max() / q.abs().max().clamp_min(1e-12)).item()
            worst = max(worst, err)
            assert err <= 1e-5, f"{case} rank {rank} step {step}: {name} differs from single-process by {err:.2e}"
        got, want = opt.last_qk_stats.to_dict(), ref_stats[step]
        clipped += sum(opt.last_qk_stats.clipped_heads)
        assert got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1e-4 * max(1, abs(want[k])) for k in got), (
            f"step {step}: qk stats {got} != {want}")
    assert clipped > 0, "QK-Clip never fired"
    # a parameter whose gradient exists on one rank only must not hang the collectives
    opt.zero_grad()
    wrapped(ids[:2, :-1]).float().pow(2).mean().backward()
    if rank == 1:
        inner.layers[0].attn.q_proj.weight.grad = None
    opt.step()
    if rank == 0:
        comm = opt.last_muon_stats["muon/comm_bytes"]
        print(f"{case}: world {world}, max relative error {worst:.2e}, clipped heads {clipped}, comm bytes {comm:.0f}")


def main() -> None:
    spawn_main(worker, ["ddp", "fsdp2"])


if __name__ == "__main__":
    main()
