"""Build the optimizer and scheduler from one typed config (the training app's entry point).

Source: REFERENCE.md section 4 (MuonClip defaults: lr shared by Muon and AdamW, wd 0.1, mu 0.95 Nesterov,
5 Newton-Schulz steps in bf16, AdamW betas 0.9/0.95, QK-Clip tau 100).

Example (YAML section merged into :class:`OptimConfig` by ``kimi_vl.runconfig``)::

    optim:
      name: muonclip
      lr: 2.0e-3
      qk_clip_tau: 100.0
      schedule: wsd
      warmup_steps: 100
      total_steps: 2000
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from kimi_vl.optim.muonclip import MuonClip
from kimi_vl.optim.routing import RoutingRules, format_routing
from kimi_vl.optim.schedules import Schedule, make_scheduler

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class OptimConfig:
    """Optimizer settings. ``name="adamw"`` routes every parameter to AdamW (the baseline)."""

    name: Literal["muonclip", "adamw"] = "muonclip"
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    adamw_lr: float | None = None  # None: same lr as Muon (RMS matching makes one lr work for both)
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    update_rms: Literal["shape", "measured"] = "shape"  # measured: exact 0.2 update RMS (see muon.py)
    qk_clip: bool = True  # False: max logits are still tracked and logged, never clipped
    qk_clip_tau: float = 100.0
    distributed: Literal["auto", "off"] = "auto"
    # fused Muon path in one process (CUDA): normalise + Newton-Schulz replayed as one CUDA graph (muon_step.GraphedNS)
    ns_cuda_graph: bool = True
    schedule: Literal["constant", "wsd", "cosine"] = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    decay_fraction: float = 0.2
    min_lr_ratio: float = 0.0
    extra_adamw_patterns: list[str] = field(default_factory=list)  # regexes of names forced to AdamW
    no_decay_patterns: list[str] = field(default_factory=lambda: [r"_res_proj\b", r"_res_norm\b"])

    def rules(self) -> RoutingRules:
        return RoutingRules(no_decay=tuple(self.no_decay_patterns), extra_adamw=tuple(self.extra_adamw_patterns))

    def schedule_spec(self) -> Schedule:
        return Schedule(self.schedule, self.warmup_steps, self.total_steps, self.decay_fraction, self.min_lr_ratio)


def build_optimizer(model: nn.Module, cfg: OptimConfig, process_group: object = None) -> MuonClip:
    """Route ``model``'s parameters and build :class:`MuonClip` (or its AdamW-only form) from ``cfg``."""
    if cfg.name not in ("muonclip", "adamw"):
        raise ValueError(f"kimi_vl/optim/builder.py: optim.name must be muonclip or adamw, got {cfg.name!r}")
    return MuonClip.from_model(
        model, rules=cfg.rules(), adamw_only=cfg.name == "adamw", adamw_lr=cfg.adamw_lr, qk_clip=cfg.qk_clip,
        qk_clip_tau=cfg.qk_clip_tau, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
        nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, betas=tuple(cfg.betas), eps=cfg.eps,
        ns_dtype=_DTYPES[cfg.ns_dtype], update_rms=cfg.update_rms, distributed=cfg.distributed,
        process_group=process_group, ns_cuda_graph=cfg.ns_cuda_graph,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + constant / WSD / cosine multiplier on every group's lr."""
    return make_scheduler(optimizer, cfg.schedule_spec())


def routing_summary(model: nn.Module, cfg: OptimConfig | None = None) -> str:
    """The dry-run table: every parameter, where it goes and why, plus the QK-Clip layers found."""
    cfg = cfg or OptimConfig()
    opt = build_optimizer(model, cfg)
    text = format_routing(opt.routes)
    if cfg.name == "adamw":
        text += "\n(optim.name=adamw: every parameter is stepped by AdamW)"
    layers = [n for n, _ in opt.qk_clipper.modules] if opt.qk_clipper else []
    mode = "clip" if cfg.qk_clip else "track only"
    text += f"\nqk-clip ({mode}, tau={cfg.qk_clip_tau}): {len(layers)} attention modules" + (
        ": " + ", ".join(layers) if layers else "")
    return text
