"""Muon under FSDP2 with owner ranks and two all-to-alls (ZeRO-1 style): no rank gathers what it does not own.

Source: REFERENCE.md section 4 ("Distributed Muon": momentum stays sharded, each matrix gathered in full once,
orthogonalised once by an owner rank, each rank applies its own shard; communication ~1-1.25x of AdamW).

Parameters are DTensors ``Shard(0)`` on a 1-D mesh (``fully_shard``); rank ``r`` holds rows
``shard_rows(dim0, world)[r]`` of dim 0 (rows of a matrix, or experts of an ``[E, A, B]`` stack).

1. every rank: momentum on its local shard, Nesterov direction ``U_loc`` (parameter dtype);
2. ``all_to_all_single``: each rank sends ``U_loc`` of every parameter to the parameter's owner
   (owners: greedy by size, identical on all ranks); the owner now holds full ``U``;
3. the owner batches its matrices by shape (row blocks of fused projections separately) and runs Newton-Schulz;
4. ``all_to_all_single``: the owner sends each rank its rows of ``O`` (in the Newton-Schulz dtype);
5. every rank: ``W_loc <- W_loc (1 - lr wd) - lr * 0.2 sqrt(max(a, B)) * O_loc`` per row block.

Same bits as one process (:mod:`kimi_vl.optim.muon_step`) for the same gradient: bf16 Newton-Schulz turns an
fp32 ulp in its input into ~1e-3 of the update, so every op before it is the one-process op. With ``fused``,
a parameter the one-process step gives the Triton momentum kernel gets it here too: on the shard (momentum and
``U``, elementwise) and, on the owner, again with ``mu = 0`` on the full ``U`` (the identity on ``U``), so the
bf16 batch and the per-block partial sums of squares come from the same kernel code; the partial sums are
summed in a buffer of the one-process batch's shape (a reduction's order depends on its shape); the update is
the same Triton ``apply_update``. Other parameters use the one-process PyTorch ops.

Bytes per rank and step (world ``w``, ``P_m`` Muon elements): ``(w-1)/w^2 * P_m * (4 + 2)`` with fp32 params and
bf16 results, against ``(w-1)/w * P_m * (4 + 2)`` when every rank gathers everything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from kernels.muon.fused import apply_update, momentum_launch, partial_blocks
from kimi_vl.optim.distributed import DistContext, NSReport, check_fsdp_param, local_view, shard_rows
from kimi_vl.optim.muon import rms_match_scale
from kimi_vl.optim.muon_step import Key, MuonItem, momentum_buffer, normalise_, plan_batches

_WHERE = "kimi_vl/optim/fsdp_owner.py"


def assign_owners(items: list[MuonItem], world: int) -> list[int]:
    """Owner rank per item: largest first to the least loaded rank (ties: lower index), same on every rank."""
    load = [0] * world
    owners = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i].p.numel(), i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[i] = r
        load[r] += items[i].p.numel()
    return owners


def _row_numel(p: torch.Tensor) -> int:
    """Elements per dim-0 row from the global shape (never index a DTensor: that would communicate)."""
    return math.prod(p.shape[1:])


def _exchange(send: list[list[torch.Tensor]], recv_counts: list[int], dtype: torch.dtype, device: torch.device,
              ctx: DistContext) -> list[torch.Tensor]:
    """``send[d]``: flat pieces for rank d; returns one flat tensor per source rank (one all_to_all_single)."""
    flat = [torch.cat([t.reshape(-1).to(dtype) for t in pieces]) if pieces else torch.empty(0, dtype=dtype,
                                                                                              device=device)
            for pieces in send]
    send_counts = [t.numel() for t in flat]
    out = torch.empty(sum(recv_counts), dtype=dtype, device=device)
    dist.all_to_all_single(out, torch.cat(flat), output_split_sizes=recv_counts, input_split_sizes=send_counts,
                           group=ctx.group)
    return list(out.split(recv_counts))


def _kernel_momentum(it: MuonItem, row_splits: dict[str, tuple[int, ...]], fused: bool) -> bool:
    """Whether the one-process fused step runs this parameter's momentum in the Triton kernel.

    Mirrors the launch condition of :func:`kimi_vl.optim.muon_step.momentum_phase`: one row block and a gradient
    in the buffer's (parameter's) dtype; the rest takes the PyTorch ops, here as there.
    """
    return (fused and len(row_splits.get(it.name) or (0,)) == 1 and it.grad is not None
            and local_view(it.grad).dtype == it.p.dtype)


def _launch_inplace(g: torch.Tensor, buf: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, E: int,
                    mu: float, nesterov: bool) -> None:
    """:func:`momentum_launch` on (possibly strided) ``g`` and ``buf``; elementwise, so a contiguous copy is exact."""
    buf_c = buf.contiguous()
    momentum_launch(g.contiguous(), buf_c, out, partial, E, partial_blocks(buf.numel() // E), mu, nesterov)
    if buf_c.data_ptr() != buf.data_ptr():
        buf.copy_(buf_c)


def _send_directions(items: list[MuonItem], owners: list[int], state: Any, ctx: DistContext,
                     row_splits: dict[str, tuple[int, ...]], fused: bool, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Momentum on every local shard, its direction written into one flat send buffer ordered by owner rank.

    Returns the buffer and the element count per destination (the input splits of ``all_to_all_single``).
    """
    order = sorted(range(len(items)), key=lambda i: (owners[i], i))
    sizes = [local_view(items[i].p).numel() for i in range(len(items))]
    flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    scratch = torch.empty(max(map(partial_blocks, sizes), default=1), dtype=torch.float32, device=device)
    counts, off = [0] * ctx.world, 0
    for i in order:
        it, n = items[i], sizes[i]
        check_fsdp_param(it.p, it.name)
        mu, nesterov = it.group["momentum"], it.group["nesterov"]
        buf = local_view(momentum_buffer(state[it.p], it.p))
        out = flat[off:off + n].view(buf.shape)
        if n and _kernel_momentum(it, row_splits, fused):
            _launch_inplace(local_view(it.grad), buf, out, scratch, 1, mu, nesterov)
        elif n:
            grad = local_view(it.grad) if it.grad is not None else torch.zeros_like(buf)
            buf.mul_(mu).add_(grad)
            if nesterov:
                torch.add(grad, buf, alpha=mu, out=out)
            else:
                out.copy_(buf)
        counts[owners[i]] += n
        off += n
    return flat, counts


def fsdp_owner_step(items: list[MuonItem], state: Any, ctx: DistContext, row_splits: dict[str, tuple[int, ...]],
                    ns_dtype: torch.dtype, fused: bool, measured: bool,
                    ns_fn: Callable[[Key, torch.Tensor], torch.Tensor],
                    correct: Callable[[torch.Tensor], torch.Tensor] | None) -> NSReport:
    """One Muon step for DTensor parameters (see the module docstring); returns the orthogonalise-once report.

    ``ns_fn(key, batch)`` orthogonalises a batch built as in :mod:`kimi_vl.optim.muon_step` (normalised
    ``ns_dtype`` when ``fused``, else raw in the parameter dtype); ``correct(O)`` is the measured-RMS factor.
    """
    dtypes = {it.p.dtype for it in items}
    if len(dtypes) != 1:
        raise ValueError(f"{_WHERE}: FSDP2 Muon parameters must share one dtype, got {sorted(map(str, dtypes))}")
    p_dtype = dtypes.pop()
    device = local_view(items[0].p).device
    w, me = ctx.world, ctx.rank
    owners = assign_owners(items, w)
    rows = [shard_rows(it.p.shape[0], w) for it in items]
    for it, rows_it in zip(items, rows):
        if local_view(it.p).shape[0] != rows_it[me]:
            raise ValueError(f"{_WHERE}: {it.name} local shard {tuple(local_view(it.p).shape)} is not torch.chunk's "
                             f"rows {rows_it}")
    # 1-2: momentum on the local shard, directions to their owners
    flat, send_counts = _send_directions(items, owners, state, ctx, row_splits, fused, p_dtype, device)
    recv_counts = [sum(r[s] * _row_numel(it.p) for it, r, o in zip(items, rows, owners) if o == me) for s in range(w)]
    received = torch.empty(sum(recv_counts), dtype=p_dtype, device=device)
    dist.all_to_all_single(received, flat, output_split_sizes=recv_counts, input_split_sizes=send_counts,
                           group=ctx.group)
    # 3: the owner assembles full directions, batches them by shape and orthogonalises
    mine = [i for i, o in enumerate(owners) if o == me]
    full = _assemble(items, mine, rows, list(received.split(recv_counts)))
    batches = _owner_batches(items, mine, full, row_splits, ns_dtype, fused, device)
    ortho = {k: ns_fn(k, X) for k, X in batches.items()}
    if correct is not None:
        ortho = {k: correct(O) for k, O in ortho.items()}
    # 4: each rank's rows of every result back to it
    out_dtype = torch.float32 if measured else ns_dtype
    send: list[list[torch.Tensor]] = [[] for _ in range(w)]
    for i in mine:
        it = items[i]
        E, A, B = it.shape3
        O3 = torch.empty(E, A, B, dtype=out_dtype, device=device)
        for b in it.blocks:
            O3[:, b.start:b.start + b.rows] = ortho[b.key][b.index:b.index + E]
        O = O3.view(it.p.shape)
        start = 0
        for d in range(w):
            send[d].append(O[start:start + rows[i][d]])
            start += rows[i][d]
    recv_counts = [sum(r[me] * _row_numel(it.p) for it, r, o in zip(items, rows, owners) if o == s) for s in range(w)]
    pieces = _exchange(send, recv_counts, out_dtype, device, ctx)
    # 5: apply this rank's rows
    offsets = [0] * w
    for i, it in enumerate(items):
        o = owners[i]
        n = rows[i][me] * _row_numel(it.p)
        O_loc = pieces[o][offsets[o]:offsets[o] + n].view(rows[i][me], *it.p.shape[1:])
        offsets[o] += n
        _apply_local(it, local_view(it.p), O_loc, rows[i], me, row_splits, fused and not measured)
    return _report(items, owners, row_splits, me)


def _assemble(items: list[MuonItem], mine: list[int], rows: list[list[int]],
              pieces: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Full direction of every owned item from the per-source pieces (sources send in item order)."""
    offsets = [0] * len(pieces)
    full: dict[int, torch.Tensor] = {}
    for i in mine:
        it, parts = items[i], []
        for s in range(len(pieces)):
            n = rows[i][s] * _row_numel(it.p)
            parts.append(pieces[s][offsets[s]:offsets[s] + n])
            offsets[s] += n
        full[i] = torch.cat(parts).view(it.p.shape)
    return full


def _owner_batches(items: list[MuonItem], mine: list[int], full: dict[int, torch.Tensor],
                   row_splits: dict[str, tuple[int, ...]], ns_dtype: torch.dtype, fused: bool,
                   device: torch.device) -> dict[Key, torch.Tensor]:
    """The owner's Newton-Schulz batches, built (and, ``fused``, normalised) with the one-process step's ops."""
    total = plan_batches(items, row_splits)  # the one-process batch sizes: partial sums are reduced in that shape
    owned = [items[i] for i in mine]
    counts = plan_batches(owned, row_splits)
    batches = {k: torch.empty(n, k[0], k[1], dtype=ns_dtype if fused else k[3], device=device)
               for k, n in counts.items()}
    partials = {k: torch.zeros(total[k], partial_blocks(k[0] * k[1]), dtype=torch.float32, device=device)
                for k in counts} if fused else {}
    for i in mine:
        it = items[i]
        E, A, B = it.shape3
        U3 = full[i].view(E, A, B)
        if _kernel_momentum(it, row_splits, fused):  # mu = 0: the kernel's identity on U (see the module docstring)
            b = it.blocks[0]
            _launch_inplace(U3, U3, batches[b.key][b.index:b.index + E], partials[b.key][b.index:b.index + E], E,
                            0.0, it.group["nesterov"])
            continue
        for b in it.blocks:
            blk = U3[:, b.start:b.start + b.rows]
            batches[b.key][b.index:b.index + E] = blk
            if fused:
                partials[b.key][b.index:b.index + E, 0] = blk.float().pow(2).sum(dim=(-2, -1))
    if fused:
        normalise_(batches, partials)
    return batches


def _apply_local(it: MuonItem, p_loc: torch.Tensor, O_loc: torch.Tensor, rows: list[int], me: int,
                 row_splits: dict[str, tuple[int, ...]], kernel: bool) -> None:
    """``W_loc <- W_loc (1 - lr wd) - lr s O_loc``; ``kernel``: the Triton update for one-block parameters, as
    the one-process fused step does (elementwise, so the shard gets the bits of the full parameter)."""
    lr, wd = it.group["lr"], it.group["weight_decay"]
    if p_loc.numel() == 0:
        return
    B = it.p.shape[-1]
    splits = row_splits.get(it.name) or (it.p.shape[-2],)
    if kernel and len(splits) == 1:
        p_c = p_loc.contiguous()
        apply_update(p_c, O_loc.contiguous(), lr, wd, rms_match_scale(splits[0], B))
        if p_c.data_ptr() != p_loc.data_ptr():
            p_loc.copy_(p_c)
        return
    if wd != 0:
        p_loc.mul_(1 - lr * wd)
    if it.p.dim() == 3:  # experts sharded: whole matrices, every row block present
        start = 0
        for r in splits:
            p_loc[:, start:start + r].add_(O_loc[:, start:start + r], alpha=-lr * rms_match_scale(r, B))
            start += r
        return
    r0 = sum(rows[:me])
    r1 = r0 + rows[me]
    start = 0
    for r in splits:  # rows [start, start + r) of the matrix, intersected with this rank's [r0, r1)
        lo, hi = max(start, r0), min(start + r, r1)
        if lo < hi:
            p_loc[lo - r0:hi - r0].add_(O_loc[lo - r0:hi - r0], alpha=-lr * rms_match_scale(r, B))
        start += r


def _report(items: list[MuonItem], owners: list[int], row_splits: dict[str, tuple[int, ...]], me: int) -> NSReport:
    report, base = NSReport(), 0
    for it, o in zip(items, owners):
        n = it.shape3[0] * len(row_splits.get(it.name) or (1,))
        if o == me:
            report.ids_local += list(range(base, base + n))
        base += n
    report.total = base
    return report
