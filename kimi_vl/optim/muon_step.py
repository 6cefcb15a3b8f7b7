"""The batched Muon step of MuonClip: momentum into shape batches, normalise, Newton-Schulz, apply.

Source: REFERENCE.md section 4 (the maths is :mod:`kimi_vl.optim.muon`); this module only lays the work out.

Each Muon parameter ``[A, B]`` or expert stack ``[E, A, B]`` is cut into row blocks ``[E, a_i, B]``
(fused projections); blocks of equal ``(a_i, B, ns_steps, dtype)`` share one ``[N, a_i, B]`` batch. The
momentum pass writes each block's Nesterov direction straight into its batch (no per-step ``torch.cat``),
so one step is:

1. momentum (per parameter; with the fused path one grouped Triton launch for all parameters that also writes
   the batch in bf16 and partial sums of squares), 2. normalise (fused path only: one in-place pass per batch
   from the partial sums), 3. Newton-Schulz per batch (owner ranks under DDP/FSDP2), 4. apply (per parameter;
   fused path one grouped Triton launch of ``p <- p (1 - lr wd) - lr s O`` reading bf16 ``O``).

Two paths, one maths:
- exact (``fused=False``, the CPU default): the same PyTorch ops and roundings as writing each update
  separately and concatenating (bit-identical to that in fp32 and in bf16 Newton-Schulz).
- fused (CUDA default): Triton kernels of :mod:`kernels.muon.fused`; the batch holds the unnormalised
  direction in bf16 and the last iteration of tall matrices returns the natural layout. Differences are
  rounding only (checked against the exact path within bf16 tolerance).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels.muon.fused import MomentumGroup, apply_update_group, partial_blocks
from kimi_vl.optim.distributed import check_fsdp_param, gather_full, is_dtensor, local_view, shard_like
from kimi_vl.optim.muon import NS_EPS, apply_muon_update_, rms_match_scale

Key = tuple  # (rows, cols, ns_steps, param dtype)


@dataclass(frozen=True)
class Block:
    """One row block of one parameter inside the batch of its key: matrices ``index .. index + E``."""

    key: Key
    index: int
    E: int
    start: int
    rows: int


@dataclass
class MuonItem:
    """A Muon parameter stepped this step (``grad`` None: no gradient on this rank, zeros are used)."""

    group: dict[str, Any]
    name: str
    p: torch.Tensor
    grad: torch.Tensor | None
    blocks: list[Block] = field(default_factory=list)

    @property
    def shape3(self) -> tuple[int, int, int]:
        s = self.p.shape
        return (1 if len(s) == 2 else s[0], s[-2], s[-1])


def plan_batches(items: list[MuonItem], row_splits: dict[str, tuple[int, ...]]) -> dict[Key, int]:
    """Assign every row block a place in its key's batch (fills ``item.blocks``); return N per key, in order."""
    counts: dict[Key, int] = {}
    for it in items:
        E, A, B = it.shape3
        it.blocks, start = [], 0
        for rows in row_splits.get(it.name) or (A,):
            key = (rows, B, it.group["ns_steps"], it.p.dtype)
            index = counts.get(key, 0)
            it.blocks.append(Block(key, index, E, start, rows))
            counts[key] = index + E
            start += rows
    return counts


def momentum_buffer(state: dict[str, Any], p: torch.Tensor) -> torch.Tensor:
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state["momentum_buffer"]


@dataclass
class _Launch:
    """A validated fused momentum launch for one parameter: its buffer and its places in the batch."""

    buf: torch.Tensor
    out: torch.Tensor
    partial: torch.Tensor
    E: int
    K: int


def _fused_plan(items: list[MuonItem], state: Any, counts: dict[Key, int], ns_dtype: torch.dtype,
                cache: dict[str, Any]) -> tuple[dict[Key, torch.Tensor], dict[Key, torch.Tensor], dict[int, _Launch]]:
    """Batches, partial sums and per-item launches, rebuilt only when the parameters or buffers change."""
    bufs = [momentum_buffer(state[it.p], it.p) for it in items]
    sig = (ns_dtype, tuple(map(id, (it.p for it in items))), tuple(map(id, bufs)), tuple(counts.items()))
    if cache.get("sig") == sig:
        return cache["batches"], cache["partials"], cache["launches"]
    dev = items[0].p.device
    batches = {k: torch.empty(n, k[0], k[1], dtype=ns_dtype, device=dev) for k, n in counts.items()}
    partials = {k: torch.empty(n, partial_blocks(k[0] * k[1]), dtype=torch.float32, device=dev)
                for k, n in counts.items()}
    launches = {}
    for i, (it, buf) in enumerate(zip(items, bufs)):
        if len(it.blocks) == 1 and not is_dtensor(it.p) and buf.is_contiguous() and it.p.is_contiguous():
            b, E = it.blocks[0], it.shape3[0]
            launches[i] = _Launch(buf, batches[b.key][b.index:b.index + E], partials[b.key][b.index:b.index + E],
                                  E, partials[b.key].shape[1])
    cache.clear()
    cache.update(sig=sig, batches=batches, partials=partials, launches=launches)
    return batches, partials, launches


def momentum_phase(items: list[MuonItem], state: Any, counts: dict[Key, int], ns_dtype: torch.dtype, fused: bool,
                   cache: dict[str, Any] | None = None) -> tuple[dict[Key, torch.Tensor], dict[Key, torch.Tensor], int]:
    """Momentum for every item; return the batches ``[N, a, B]``, the partial sums (fused) and bytes gathered.

    Exact path: batches in the parameter dtype hold the Nesterov direction. Fused path: batches in
    ``ns_dtype`` hold it unnormalised, with fp32 partial sums of squares ``[N, K]`` for :func:`normalise_`;
    its buffers and per-parameter launch arguments persist in ``cache`` between steps (host time per
    parameter is what bounds this phase on a GPU).
    """
    if fused:
        batches, partials, launches = _fused_plan(items, state, counts, ns_dtype, cache if cache is not None else {})
    else:
        dev = items[0].p.device
        batches = {k: torch.empty(n, k[0], k[1], dtype=k[3], device=dev) for k, n in counts.items()}
        partials, launches = {}, {}
    comm = 0
    grouped: dict[tuple[float, bool], MomentumGroup] = {}  # one launch per (mu, nesterov) for all fused items
    for i, it in enumerate(items):
        mu, nesterov = it.group["momentum"], it.group["nesterov"]
        launch, g = launches.get(i), it.grad
        if launch is not None and g is not None and g.dtype == launch.buf.dtype and g.is_contiguous():
            group = grouped.setdefault((mu, nesterov), MomentumGroup(mu, nesterov))
            group.add(g, launch.buf, launch.out, launch.partial, launch.E, launch.K)
            continue
        comm += _momentum_torch(it, momentum_buffer(state[it.p], it.p), batches, partials, mu, nesterov)
    for group in grouped.values():
        group.launch()
    return batches, partials, comm


def _momentum_torch(it: MuonItem, buf: torch.Tensor, batches: dict[Key, torch.Tensor],
                    partials: dict[Key, torch.Tensor], mu: float, nesterov: bool) -> int:
    """PyTorch momentum for one item, its blocks copied into the batches; returns bytes gathered (FSDP2)."""
    p_loc, buf_loc = local_view(it.p), local_view(buf)
    grad = local_view(it.grad) if it.grad is not None else torch.zeros_like(p_loc)
    buf_loc.mul_(mu).add_(grad)
    E, A, B = it.shape3
    b0 = it.blocks[0]
    direct = len(it.blocks) == 1 and not is_dtensor(it.p) and not partials and nesterov
    if direct:  # write the direction straight into the batch (same op and layout as computing it separately)
        torch.add(grad, buf_loc, alpha=mu, out=batches[b0.key][b0.index:b0.index + E].view(grad.shape))
        return 0
    U = grad.add(buf_loc, alpha=mu) if nesterov else buf_loc
    nbytes = 0
    if is_dtensor(it.p):
        check_fsdp_param(it.p, it.name)
        U, nbytes = gather_full(it.p, U)
    U3 = U.reshape(E, A, B)
    for b in it.blocks:
        blk = U3[:, b.start:b.start + b.rows]
        batches[b.key][b.index:b.index + E] = blk
        if partials:
            part = partials[b.key][b.index:b.index + E]
            part.zero_()
            part[:, 0] = blk.float().pow(2).sum(dim=(-2, -1))
    return nbytes


def normalise_(batches: dict[Key, torch.Tensor], partials: dict[Key, torch.Tensor], eps: float = NS_EPS) -> None:
    """Fused path: divide each matrix of each batch by its Frobenius norm (``+ eps``) in place.

    ``partials[k]`` may have more rows than ``batches[k]`` has matrices (the FSDP2 owner sums them in the
    one-process batch's shape); the first ``N`` rows belong to the batch.
    """
    for k, X in batches.items():
        norm_N11 = partials[k].sum(dim=1)[:X.shape[0]].sqrt().view(-1, 1, 1)
        X.div_(norm_N11 + eps)


class GraphedNS:
    """Phases 2-3 of the fused path (normalise + Newton-Schulz of every batch) as one CUDA graph, replayed.

    The fused path's batches and partial sums persist between steps (``_fused_plan``'s cache), so these phases
    launch the same few hundred small ops (5 iterations x 5-6 ops per batch) on the same addresses every step, and
    on an H100 their host time is several times their GPU time. The first step with a given set of buffers runs
    eagerly, the next one captures the ops into a graph and replays it, later ones only replay (one launch). Other
    buffers (another set of parameters with gradients) drop the graph and start over; ``captures`` counts the graphs
    made. The results live in the graph's memory pool and are overwritten by the next replay: use them before the
    next step (``apply_phase`` does, on the same stream). Capture uses ``capture_error_mode="thread_local"`` (the
    data loader's pin-memory thread may allocate pinned memory meanwhile); if capturing fails anyway, a warning
    says why and every later step runs eagerly (``disabled``)."""

    def __init__(self) -> None:
        self.signature: tuple | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: dict[Key, torch.Tensor] = {}
        self.captures = 0
        self.disabled = ""  # why capturing failed (then every step runs eagerly)

    def __call__(self, batches: dict[Key, torch.Tensor], partials: dict[Key, torch.Tensor],
                 ns_fn: Any) -> dict[Key, torch.Tensor]:
        sig = tuple((k, X.data_ptr(), tuple(X.shape), partials[k].data_ptr(), tuple(partials[k].shape))
                    for k, X in batches.items())
        if sig != self.signature:
            self.signature, self.graph, self.out = sig, None, {}
            return self._run(batches, partials, ns_fn)
        if self.disabled:
            return self._run(batches, partials, ns_fn)
        if self.graph is None:
            graph = torch.cuda.CUDAGraph()
            try:  # thread_local: the data loader's pin-memory thread may allocate pinned memory meanwhile
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    out = self._run(batches, partials, ns_fn)
            except RuntimeError as err:  # nothing captured ran: do this step, and the rest of the run, eagerly
                self.disabled = f"{type(err).__name__}: {err}"
                warnings.warn(f"MuonClip: capturing Newton-Schulz as a CUDA graph failed ({self.disabled}); "
                              "running it eagerly from now on", stacklevel=2)
                return self._run(batches, partials, ns_fn)
            self.graph, self.out = graph, out
            self.captures += 1
        self.graph.replay()
        return dict(self.out)

    @staticmethod
    def _run(batches: dict[Key, torch.Tensor], partials: dict[Key, torch.Tensor],
             ns_fn: Any) -> dict[Key, torch.Tensor]:
        normalise_(batches, partials)
        return {k: ns_fn(k, G) for k, G in batches.items()}


def apply_phase(items: list[MuonItem], ortho: dict[Key, torch.Tensor], fused: bool, measured: bool) -> None:
    """``W <- W (1 - lr wd) - lr * 0.2 sqrt(max(a, B)) * O`` per row block (decay once per parameter); the fused
    path's single-block parameters in one grouped launch."""
    grouped = []
    for it in items:
        lr, wd = it.group["lr"], it.group["weight_decay"]
        E, A, B = it.shape3
        if is_dtensor(it.p):
            _apply_dtensor(it, ortho)
            continue
        b0 = it.blocks[0]
        O0 = ortho[b0.key][b0.index:b0.index + E]
        if fused and not measured and len(it.blocks) == 1 and it.p.is_contiguous() and O0.is_contiguous():
            grouped.append((it.p, O0, lr, wd, rms_match_scale(b0.rows, B)))
            continue
        p3 = it.p.view(E, A, B)
        if wd != 0:
            p3.mul_(1 - lr * wd)
        for b in it.blocks:
            O = ortho[b.key][b.index:b.index + E]
            p3[:, b.start:b.start + b.rows].add_(O, alpha=-lr * rms_match_scale(b.rows, B))
    if grouped:
        apply_update_group(grouped)


def _apply_dtensor(it: MuonItem, ortho: dict[Key, torch.Tensor]) -> None:
    E, A, B = it.shape3
    O3 = torch.empty(E, A, B, dtype=it.p.dtype, device=local_view(it.p).device)
    for b in it.blocks:
        O3[:, b.start:b.start + b.rows] = ortho[b.key][b.index:b.index + E].to(it.p.dtype) * rms_match_scale(b.rows, B)
    apply_muon_update_(local_view(it.p), shard_like(O3.view(it.p.shape), it.p), it.group["lr"],
                       it.group["weight_decay"], 1.0)
