"""Distributed Newton-Schulz: every matrix orthogonalised once, by an owner rank, results shared.

Source: REFERENCE.md section 4 ("Distributed Muon"), Liu et al. "Muon is Scalable for LLM Training".

- DDP (replicated parameters, all-reduced gradients): each rank already holds every full update
  matrix. Matrices of one shape are dealt round-robin to ranks (the start rotates between shape groups
  so the extra matrices spread out); each rank runs the batched iteration on its own matrices only; one
  ``all_gather_into_tensor`` per shape group shares the results.
- FSDP2 (DTensor parameters): the sharded update is gathered with ``full_tensor()`` first, then the same
  owner scheme runs, and each rank keeps only its own shard of the result
  (``distribute_tensor(..., src_data_rank=None)``: slicing, no communication).

``comm_bytes`` counts the payload bytes each rank receives from these collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    """The process group Muon's collectives run on."""

    group: dist.ProcessGroup | None
    rank: int
    world: int

    @staticmethod
    def detect(group: dist.ProcessGroup | None = None) -> DistContext | None:
        """A context when torch.distributed is initialised with more than one rank, else None."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        world = dist.get_world_size(group)
        return DistContext(group, dist.get_rank(group), world) if world > 1 else None


@dataclass
class NSReport:
    """What the owner scheme did at one step (for logging and for the orthogonalise-once test)."""

    ids_local: list[int] = field(default_factory=list)
    total: int = 0
    comm_bytes: int = 0


def owner_of(j: int, offset: int, world: int) -> int:
    return (offset + j) % world


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """``all_gather_single`` (torch >= 2.12) or ``all_gather_into_tensor`` (older), whichever exists."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def owner_newton_schulz(
    batches: dict[tuple, torch.Tensor], ctx: DistContext, ns_fn: Callable[[tuple, torch.Tensor], torch.Tensor],
    dtype: torch.dtype,
) -> tuple[dict[tuple, torch.Tensor], NSReport]:
    """Orthogonalise every ``[N, A, B]`` batch with each matrix computed by exactly one rank.

    ``batches`` must hold the same keys, in the same order, with the same shapes on every rank;
    ``ns_fn(key, G_nAB)`` orthogonalises a sub-batch and returns it in ``dtype``.
    Returns the full results on every rank and the report (global ids this rank computed).
    """
    out: dict[tuple, torch.Tensor] = {}
    report = NSReport()
    base = 0
    for key, G_NAB in batches.items():
        N, A, B = G_NAB.shape
        offset = base % ctx.world
        owners = [owner_of(j, offset, ctx.world) for j in range(N)]
        mine = [j for j in range(N) if owners[j] == ctx.rank]
        per = -(-N // ctx.world)
        chunk_PAB = torch.empty(per, A, B, dtype=dtype, device=G_NAB.device)
        if mine:
            chunk_PAB[: len(mine)] = ns_fn(key, G_NAB[mine])
        if len(mine) < per:
            chunk_PAB[len(mine):].zero_()
        gathered_MAB = torch.empty(ctx.world * per, A, B, dtype=dtype, device=G_NAB.device)
        _all_gather_flat(gathered_MAB, chunk_PAB, ctx.group)
        # matrix j is the taken[r]-th matrix of its owner r: one gather puts them back in order
        taken = [0] * ctx.world
        rows = []
        for r in owners:
            rows.append(r * per + taken[r])
            taken[r] += 1
        index = torch.tensor(rows, device=G_NAB.device)
        out[key] = gathered_MAB.index_select(0, index)
        report.ids_local += [base + j for j in mine]
        report.comm_bytes += (ctx.world - 1) * chunk_PAB.numel() * chunk_PAB.element_size()
        base += N
    report.total = base
    return out, report


def is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_view(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (shares storage), or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def check_fsdp_param(p: torch.Tensor, name: str) -> None:
    """Muon supports DTensor parameters on a 1-D mesh (FSDP2 ``fully_shard``)."""
    if p.device_mesh.ndim != 1:
        raise ValueError(
            f"kimi_vl/optim/distributed.py: {name} is a DTensor on a {p.device_mesh.ndim}-D mesh; "
            "MuonClip supports 1-D meshes (FSDP2 without HSDP/TP)"
        )


def shard_rows(n: int, world: int) -> list[int]:
    """Rows of dim 0 held by each rank under FSDP2's ``Shard(0)`` (``torch.chunk`` semantics, may be 0)."""
    per = -(-n // world)
    return [max(0, min(per, n - r * per)) for r in range(world)]


def gather_full(p: torch.Tensor, local: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Full tensor from this rank's dim-0 shard ``local`` laid out like DTensor ``p`` (``Shard(0)``, 1-D mesh).

    One ``all_gather_into_tensor`` of the shards padded to equal rows (so byte counters see it); also
    returns the payload bytes this rank received.
    """
    from torch.distributed.tensor import Shard

    if tuple(p.placements) != (Shard(0),):
        raise ValueError(f"kimi_vl/optim/distributed.py: gather_full supports Shard(0) placements, got {p.placements}")
    group = p.device_mesh.get_group()
    world = dist.get_world_size(group)
    rows = shard_rows(p.shape[0], world)
    if local.shape[0] != rows[dist.get_rank(group)]:
        raise ValueError(f"kimi_vl/optim/distributed.py: local shard {tuple(local.shape)} of {tuple(p.shape)} is not "
                         f"torch.chunk's {rows} rows per rank")
    per = rows[0]
    padded = local.new_zeros((per, *p.shape[1:]))
    padded[: local.shape[0]] = local
    out = local.new_empty((world * per, *p.shape[1:]))
    _all_gather_flat(out, padded, group)
    # torch.chunk: ranks before the last non-empty one hold ``per`` rows, so the padded rows all come last
    return out[: p.shape[0]], (world - 1) * padded.numel() * padded.element_size()


def shard_like(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``full`` under ``p``'s placements (local slicing, no communication)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
