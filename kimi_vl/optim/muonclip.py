"""The MuonClip optimizer: Muon for hidden matrices, AdamW for the rest, QK-Clip after every step.

Source: Kimi K2 technical report and Moonlight (REFERENCE.md section 4). The maths lives in pure
functions (:mod:`kimi_vl.optim.muon`, :mod:`kimi_vl.optim.adamw`); this class does the bookkeeping:
param groups (``use_muon`` True/False), state, batching same-shape matrices for Newton-Schulz,
fused-projection row blocks, the distributed owner scheme and the QK-Clip hook.

Shapes: a Muon parameter is ``[A, B]`` or an expert stack ``[E, A, B]`` (E matrices); it is viewed as
``U3 [E, A, B]`` (E = 1 for a matrix) and cut into row blocks ``[E, a_i, B]``. Blocks of equal
``(a_i, B)`` are concatenated into one ``[N, a_i, B]`` batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from kimi_vl.optim.adamw import adamw_update_, adamw_update_foreach_
from kimi_vl.optim.distributed import (
    DistContext,
    NSReport,
    check_fsdp_param,
    gather_full,
    is_dtensor,
    local_view,
    owner_newton_schulz,
    shard_like,
)
from kimi_vl.optim.muon import (
    apply_muon_update_,
    measured_rms_correction,
    momentum_update_,
    newton_schulz5,
    rms_match_scale,
)
from kimi_vl.optim.qk_clip import QKClipper, QKClipStats, find_qk_clip_modules
from kimi_vl.optim.routing import ParamRoute, RoutingRules, route_model

_WHERE = "kimi_vl/optim/muonclip.py"


def param_groups_from_routes(
    routes: list[tuple[ParamRoute, nn.Parameter]], adamw_only: bool = False, adamw_lr: float | None = None
) -> list[dict[str, Any]]:
    """Up to three named groups: ``muon``, ``adamw`` (decayed) and ``adamw_no_decay`` (weight_decay 0)."""
    muon = [(r.name, p) for r, p in routes if r.target == "muon" and not adamw_only]
    adamw = [(r.name, p) for r, p in routes if (r.target == "adamw" or adamw_only) and r.weight_decay]
    no_decay = [(r.name, p) for r, p in routes if (r.target == "adamw" or adamw_only) and not r.weight_decay]
    extra = {"lr": adamw_lr} if adamw_lr is not None else {}
    groups = [
        {"params": muon, "use_muon": True, "group_name": "muon"},
        {"params": adamw, "use_muon": False, "group_name": "adamw", **extra},
        {"params": no_decay, "use_muon": False, "group_name": "adamw_no_decay", "weight_decay": 0.0, **extra},
    ]
    return [g for g in groups if g["params"]]


class MuonClip(torch.optim.Optimizer):
    """Muon + AdamW + QK-Clip as one ``torch.optim.Optimizer``.

    Args:
        params: param groups; each group's ``"params"`` is a list of ``(name, parameter)`` pairs and
            ``"use_muon"`` says which update it gets. Build them with :meth:`from_model`.
        lr, weight_decay: shared by both halves (Muon's RMS matching makes that sensible).
        momentum, nesterov, ns_steps: Muon (mu = 0.95, Nesterov, 5 quintic steps).
        betas, eps: AdamW (0.9, 0.95).
        ns_dtype: Newton-Schulz compute dtype (bf16; fp32 for exact comparisons).
        update_rms: ``"shape"`` scales by ``0.2 * sqrt(max(A, B))`` (Moonlight, RMS ~0.16-0.19 in practice);
            ``"measured"`` also divides by each matrix's measured RMS so the update RMS is exactly 0.2.
        row_splits: parameter name -> row block sizes of fused projections.
        qk_clipper: the QK-Clip controller run after every step (None: no QK-Clip).
        distributed: ``"auto"`` uses the owner scheme when torch.distributed has > 1 rank; ``"off"`` never.
        foreach: batch the AdamW half with ``torch._foreach_*`` (default: on CUDA).

    After ``step()``: ``last_qk_stats`` (:class:`QKClipStats` or None) and ``last_muon_stats`` (dict).
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        ns_dtype: torch.dtype = torch.bfloat16,
        update_rms: str = "shape",
        row_splits: dict[str, tuple[int, ...]] | None = None,
        qk_clipper: QKClipper | None = None,
        distributed: str = "auto",
        process_group: Any = None,
        foreach: bool | None = None,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1 or ns_steps < 1:
            raise ValueError(
                f"{_WHERE}: need lr >= 0, weight_decay >= 0, 0 <= momentum < 1, ns_steps >= 1; got lr={lr}, "
                f"weight_decay={weight_decay}, momentum={momentum}, ns_steps={ns_steps}"
            )
        if update_rms not in ("shape", "measured"):
            raise ValueError(f"{_WHERE}: update_rms must be 'shape' or 'measured', got {update_rms!r}")
        if distributed not in ("auto", "off"):
            raise ValueError(f"{_WHERE}: distributed must be 'auto' or 'off', got {distributed!r}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                        betas=betas, eps=eps, use_muon=False)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if "param_names" not in group:
                raise ValueError(f"{_WHERE}: every param group needs (name, parameter) pairs so routing can be named")
            for name, p in zip(group["param_names"], group["params"]):
                if group["use_muon"] and p.dim() not in (2, 3):
                    raise ValueError(f"{_WHERE}: Muon parameter {name} must be [A,B] or [E,A,B], got {tuple(p.shape)}")
        self.ns_dtype = ns_dtype
        self.update_rms = update_rms
        self.row_splits = dict(row_splits or {})
        self.qk_clipper = qk_clipper
        self.distributed = distributed
        self.process_group = process_group
        self.foreach = foreach
        self.routes: list[ParamRoute] = []
        self.last_qk_stats: QKClipStats | None = None
        self.last_muon_stats: dict[str, float] = {}
        self.last_ns_ids: list[int] = []

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        rules: RoutingRules | None = None,
        adamw_only: bool = False,
        adamw_lr: float | None = None,
        qk_clip: bool = True,
        qk_clip_tau: float = 100.0,
        **kwargs: Any,
    ) -> MuonClip:
        """Route ``model``'s parameters (see :mod:`kimi_vl.optim.routing`), find QK-Clip modules, build.

        ``adamw_only`` sends everything to AdamW (the AdamW baseline, same routing of decay and QK-Clip).
        ``qk_clip=False`` still tracks and logs the max logits, without clipping.
        """
        routes = route_model(model, rules)
        groups = param_groups_from_routes(routes, adamw_only=adamw_only, adamw_lr=adamw_lr)
        modules = find_qk_clip_modules(model)
        clipper = None
        if modules:
            clipper = QKClipper(modules, qk_clip_tau, enabled=qk_clip, process_group=kwargs.get("process_group"))
        splits = {r.name: r.row_splits for r, _ in routes if r.row_splits and not adamw_only}
        opt = cls(groups, row_splits=splits, qk_clipper=clipper, **kwargs)
        opt.routes = [r for r, _ in routes]
        return opt

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not group["use_muon"]:
                self._adamw_group(group)
        self._muon_step([g for g in self.param_groups if g["use_muon"]])
        if self.qk_clipper is not None:
            self.last_qk_stats = self.qk_clipper.step()
        return loss

    def _adamw_group(self, group: dict[str, Any]) -> None:
        buckets: dict[tuple, list[tuple[torch.Tensor, ...]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError(f"{_WHERE}: sparse gradients are not supported")
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = state["step"].item()
            tensors = (local_view(p), local_view(p.grad), local_view(state["exp_avg"]), local_view(state["exp_avg_sq"]))
            buckets.setdefault((p.device, p.dtype, step), []).append(tensors)
        for (device, _, step), items in buckets.items():
            use_foreach = self.foreach if self.foreach is not None else device.type == "cuda"
            hyper = (step, group["lr"], group["betas"], group["eps"], group["weight_decay"])
            if use_foreach:
                adamw_update_foreach_(*[list(t) for t in zip(*items)], *hyper)
            else:
                for t in items:
                    adamw_update_(*t, *hyper)

    def _dist_ctx(self, params: list[torch.Tensor]) -> DistContext | None:
        ctx = DistContext.detect(self.process_group) if self.distributed == "auto" else None
        if ctx is None and any(is_dtensor(p) for p in params):
            ctx = DistContext.detect(self.process_group)
            if ctx is None:
                raise ValueError(f"{_WHERE}: DTensor parameters need an initialised torch.distributed group")
        return ctx

    def _muon_updates(self, groups: list[dict[str, Any]], ctx: DistContext | None) -> list[tuple]:
        """Momentum on every Muon parameter that has a gradient on any rank; full update matrices."""
        entries = [(g, n, p) for g in groups for n, p in zip(g["param_names"], g["params"])]
        device = entries[0][2].device if entries else None  # NCCL needs the flags on the GPU
        has_grad = torch.tensor([p.grad is not None for _, _, p in entries], dtype=torch.float32, device=device)
        if ctx is not None and entries:
            torch.distributed.all_reduce(has_grad, op=torch.distributed.ReduceOp.MAX, group=ctx.group)
        items, comm = [], 0
        for (group, name, p), flag in zip(entries, has_grad.tolist()):
            if flag == 0:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grad = local_view(p.grad) if p.grad is not None else torch.zeros_like(local_view(p))
            U = momentum_update_(local_view(state["momentum_buffer"]), grad, group["momentum"], group["nesterov"])
            if is_dtensor(p):
                check_fsdp_param(p, name)
                U, nbytes = gather_full(p, U)
                comm += nbytes
            items.append((group, name, p, U))
        self._comm_bytes = comm
        return items

    def _muon_step(self, groups: list[dict[str, Any]]) -> None:
        ctx = self._dist_ctx([p for g in groups for p in g["params"]])
        items = self._muon_updates(groups, ctx)
        batches: dict[tuple, list[torch.Tensor]] = {}
        blocks: list[list[tuple]] = []  # per item: (key, index in batch, E, row start, rows)
        for group, name, _p, U in items:
            U3 = U.reshape(-1, *U.shape[-2:])  # [E, A, B]
            per_item, start = [], 0
            for rows in self.row_splits.get(name) or (U3.shape[-2],):
                key = (rows, U3.shape[-1], group["ns_steps"], U3.dtype)
                lst = batches.setdefault(key, [])
                per_item.append((key, sum(t.shape[0] for t in lst), U3.shape[0], start, rows))
                lst.append(U3[:, start:start + rows])
                start += rows
            blocks.append(per_item)
        stacked = {k: torch.cat(v) for k, v in batches.items()}
        ortho, report = self._orthogonalise(stacked, ctx)
        if self.update_rms == "measured":
            ortho = {k: O.float() * measured_rms_correction(O) for k, O in ortho.items()}
        for (group, _name, p, U), per_item in zip(items, blocks):
            self._apply(group, p, U, per_item, ortho)
        self.last_ns_ids = report.ids_local
        self.last_muon_stats = {
            "muon/ns_matrices_local": float(len(report.ids_local)),
            "muon/ns_matrices_total": float(report.total),
            "muon/comm_bytes": float(report.comm_bytes + self._comm_bytes),
        }

    def _orthogonalise(
        self, stacked: dict[tuple, torch.Tensor], ctx: DistContext | None
    ) -> tuple[dict[tuple, torch.Tensor], NSReport]:
        if ctx is not None:
            return owner_newton_schulz(stacked, ctx, {k: k[2] for k in stacked}, self.ns_dtype)
        out = {k: newton_schulz5(G, steps=k[2], dtype=self.ns_dtype) for k, G in stacked.items()}
        total = sum(G.shape[0] for G in stacked.values())
        return out, NSReport(ids_local=list(range(total)), total=total)

    def _apply(self, group: dict[str, Any], p: torch.Tensor, U: torch.Tensor, per_item: list[tuple],
               ortho: dict[tuple, torch.Tensor]) -> None:
        lr, wd = group["lr"], group["weight_decay"]
        cols = U.shape[-1]
        if not is_dtensor(p):
            p3 = p.view(-1, *p.shape[-2:])
            if wd != 0:
                p3.mul_(1 - lr * wd)
            for key, i, E, start, rows in per_item:
                p3[:, start:start + rows].add_(ortho[key][i:i + E].to(p.dtype), alpha=-lr * rms_match_scale(rows, cols))
            return
        O3 = torch.empty(U.reshape(-1, *U.shape[-2:]).shape, dtype=p.dtype, device=U.device)
        for key, i, E, start, rows in per_item:
            O3[:, start:start + rows] = ortho[key][i:i + E].to(p.dtype) * rms_match_scale(rows, cols)
        apply_muon_update_(local_view(p), shard_like(O3.view(U.shape), p), lr, wd, 1.0)
