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

from kernels.muon.fused import triton_available
from kimi_vl.optim.adamw import adamw_update_, adamw_update_foreach_, adamw_update_fused_
from kimi_vl.optim.distributed import DistContext, NSReport, is_dtensor, local_view, owner_newton_schulz
from kimi_vl.optim.fsdp_owner import fsdp_owner_step
from kimi_vl.optim.muon import measured_rms_correction, newton_schulz5, ns_iterate
from kimi_vl.optim.muon_step import GraphedNS, MuonItem, apply_phase, momentum_phase, normalise_, plan_batches
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
        foreach: batch the AdamW half with ``torch._foreach_*`` (default: on CUDA, when not ``adamw_fused``).
        fused: Muon's Triton momentum and update kernels, bf16 batches (default: on CUDA with triton);
            False is the exact PyTorch path (see :mod:`kimi_vl.optim.muon_step`).
        adamw_fused: the AdamW half as one ``torch._fused_adamw_`` kernel, bit-identical to
            ``torch.optim.AdamW(fused=True)`` (default: on CUDA); otherwise identical to ``foreach=False``.

    ``phase_hook`` (None or a callable taking a phase name) is called after ``"qk_stats"``, ``"adamw"``, ``"momentum"``,
    ``"ns"``, ``"update"`` and ``"qk_clip"`` inside ``step()`` (the benchmark records CUDA events there).

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
        fused: bool | None = None,
        adamw_fused: bool | None = None,
        ns_cuda_graph: bool = True,
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
        self.fused = fused
        self.adamw_fused = adamw_fused
        self.ns_cuda_graph = ns_cuda_graph
        self._graphed_ns = GraphedNS()
        self.phase_hook: Callable[[str], None] | None = None
        self._batch_cache: dict[str, Any] = {}
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
        self._mark("start")
        if self.qk_clipper is not None:
            self.qk_clipper.prepare()
        self._mark("qk_stats")
        for group in self.param_groups:
            if not group["use_muon"]:
                self._adamw_group(group)
        self._mark("adamw")
        self._muon_step([g for g in self.param_groups if g["use_muon"]])
        if self.qk_clipper is not None:
            self.last_qk_stats = self.qk_clipper.step()
        self._mark("qk_clip")
        return loss

    def _mark(self, phase: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(phase)

    def _adamw_group(self, group: dict[str, Any]) -> None:
        fused = self.adamw_fused
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
            use_fused = fused if fused is not None else p.device.type == "cuda"
            tensors = (local_view(p), local_view(p.grad), local_view(state["exp_avg"]), local_view(state["exp_avg_sq"]))
            if use_fused:  # the step count lives on the device: no host sync, one kernel for the whole group
                if state["step"].device != p.device:
                    state["step"] = state["step"].to(local_view(p).device)
                buckets.setdefault((p.device, p.dtype, "fused"), []).append((*tensors, state["step"]))
                continue
            if state["step"].device.type != "cpu":
                state["step"] = state["step"].cpu()
            state["step"] += 1
            buckets.setdefault((p.device, p.dtype, state["step"].item()), []).append(tensors)
        for (device, _, step), items in buckets.items():
            if step == "fused":
                params, grads, exp_avgs, exp_avg_sqs, steps = (list(t) for t in zip(*items))
                adamw_update_fused_(params, grads, exp_avgs, exp_avg_sqs, steps, group["lr"], group["betas"],
                                    group["eps"], group["weight_decay"])
                continue
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

    def _muon_items(self, groups: list[dict[str, Any]], ctx: DistContext | None) -> list[MuonItem]:
        """Muon parameters with a gradient on any rank (one flag all-reduce when distributed, none otherwise)."""
        entries = [(g, n, p) for g in groups for n, p in zip(g["param_names"], g["params"])]
        flags = [p.grad is not None for _, _, p in entries]
        if ctx is not None and entries:
            # NCCL needs the flags on the GPU
            has_grad = torch.tensor(flags, dtype=torch.float32, device=entries[0][2].device)
            torch.distributed.all_reduce(has_grad, op=torch.distributed.ReduceOp.MAX, group=ctx.group)
            flags = [f != 0 for f in has_grad.tolist()]
        return [MuonItem(g, n, p, p.grad) for (g, n, p), f in zip(entries, flags) if f]

    def _use_fused(self, items: list[MuonItem]) -> bool:
        if self.fused is not None:
            return self.fused
        return triton_available() and items[0].p.device.type == "cuda"

    def _muon_step(self, groups: list[dict[str, Any]]) -> None:
        ctx = self._dist_ctx([p for g in groups for p in g["params"]])
        items = self._muon_items(groups, ctx)
        if not items:
            self.last_ns_ids, self.last_muon_stats = [], {}
            return
        fused = self._use_fused(items)
        measured = self.update_rms == "measured"
        if ctx is not None and all(is_dtensor(it.p) for it in items):  # FSDP2: owners and two all-to-alls
            correct = (lambda O: O.float() * measured_rms_correction(O)) if measured else None
            report = fsdp_owner_step(items, self.state, ctx, self.row_splits, self.ns_dtype, fused, measured,
                                     self._ns_fn(fused), correct)
            self._mark("update")
            self._set_stats(report, 0)
            return
        counts = plan_batches(items, self.row_splits)
        batches, partials, comm = momentum_phase(items, self.state, counts, self.ns_dtype, fused, self._batch_cache)
        self._mark("momentum")
        if fused and ctx is None and self.ns_cuda_graph and items[0].p.is_cuda:  # normalise + NS: one CUDA graph
            ortho, report = self._graphed_ns(batches, partials, self._ns_fn(fused)), _local_report(batches)
        else:
            if fused:
                normalise_(batches, partials)
            ortho, report = self._orthogonalise(batches, ctx, fused)
        if measured:
            ortho = {k: O.float() * measured_rms_correction(O) for k, O in ortho.items()}
        self._mark("ns")
        apply_phase(items, ortho, fused, measured)
        self._mark("update")
        self._set_stats(report, comm)

    def _set_stats(self, report: NSReport, comm: int) -> None:
        self.last_ns_ids = report.ids_local
        self.last_muon_stats = {
            "muon/ns_matrices_local": float(len(report.ids_local)),
            "muon/ns_matrices_total": float(report.total),
            "muon/comm_bytes": float(report.comm_bytes + comm),
        }

    def _ns_fn(self, fused: bool) -> Callable[[tuple, torch.Tensor], torch.Tensor]:
        """Exact path: ``newton_schulz5`` on the raw directions; fused: iterate the normalised bf16 batches."""
        def ns_fn(key: tuple, G_NAB: torch.Tensor) -> torch.Tensor:
            if fused:
                return ns_iterate(G_NAB, key[2], natural_layout=True, copy_free=True)
            return newton_schulz5(G_NAB, steps=key[2], dtype=self.ns_dtype)

        return ns_fn

    def _orthogonalise(
        self, batches: dict[tuple, torch.Tensor], ctx: DistContext | None, fused: bool
    ) -> tuple[dict[tuple, torch.Tensor], NSReport]:
        ns_fn = self._ns_fn(fused)
        if ctx is not None:
            return owner_newton_schulz(batches, ctx, ns_fn, self.ns_dtype)
        return {k: ns_fn(k, G) for k, G in batches.items()}, _local_report(batches)


def _local_report(batches: dict[tuple, torch.Tensor]) -> NSReport:
    """One process orthogonalised every matrix of ``batches`` itself."""
    total = sum(G.shape[0] for G in batches.values())
    return NSReport(ids_local=list(range(total)), total=total)
