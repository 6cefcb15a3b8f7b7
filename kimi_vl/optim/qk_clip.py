"""QK-Clip: per-head rescaling of query/key weights whose max pre-softmax logit exceeded tau.

Source: Kimi K2 technical report, REFERENCE.md section 4; module protocol in docs/INTERFACES.md ("QK-Clip").
During a step's forward passes each participating attention module keeps ``max_logits_H`` (a running
max over micro-batches). After the optimizer update :class:`QKClipper` all-reduces MAX of those
buffers across ranks (one collective for all layers), computes ``gamma_H = min(1, tau / S_max_H)``,
calls ``module.qk_clip_(gamma_H)`` (heads at or below tau have gamma 1, and a product with 1.0 is exact, so they
stay bit-identical), and resets the buffers to ``-inf``. Nothing here waits for the GPU: the clip is applied
on the device whatever the values, and :meth:`QKClipper.prepare` starts a non-blocking copy of the stats to the
host at the start of the optimizer step; :class:`QKClipStats` reads it only when a field is first used, so a
training loop can log a step's stats after it has queued the next step.
It is a feedback controller on the weights, not a hard bound on the next batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch
import torch.distributed as dist
from torch import nn

PROTOCOL = ("qk_clip_num_heads", "track_max_logits", "max_logits_H", "qk_clip_")


def find_qk_clip_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """All submodules implementing the duck-typed QK-Clip protocol, in ``named_modules`` order."""
    return [(n, m) for n, m in model.named_modules() if all(hasattr(m, a) for a in PROTOCOL)]


def qk_clip_gamma(max_logits_H: torch.Tensor, tau: float) -> torch.Tensor:
    """``gamma_H = min(1, tau / S_max_H)``; 1 for heads at or below tau and heads never seen (-inf / NaN)."""
    s = max_logits_H.float()
    over = torch.isfinite(s) & (s > tau)
    return torch.where(over, tau / torch.where(over, s, torch.ones_like(s)), torch.ones_like(s))


class QKClipStats:
    """What happened at one step: per-layer max logit (after the all-reduce) and clipped-head count.

    Built from the step's ``[2, total heads]`` stats (max logit; 1 where clipped), possibly still being copied
    to the host: the first use of :attr:`max_logit` or :attr:`clipped_heads` waits for that copy (``ready``)."""

    def __init__(self, tau: float, layer_names: list[str], heads_per_layer: list[int], stats_2H: torch.Tensor,
                 ready: torch.cuda.Event | None, clip_applied: bool) -> None:
        self.tau, self.layer_names, self.clip_applied = tau, layer_names, clip_applied
        self._heads, self._stats_2H, self._ready = heads_per_layer, stats_2H, ready

    @cached_property
    def _per_layer(self) -> tuple[list[float], list[int]]:
        if self._ready is not None:
            self._ready.synchronize()  # the small copy only, not the optimizer's kernels
        stats = self._stats_2H.tolist()
        layer_max, clipped, offset = [], [], 0
        for h in self._heads:
            seg_max, seg_clip = stats[0][offset:offset + h], stats[1][offset:offset + h]
            layer_max.append(max(seg_max) if seg_max else float("-inf"))
            clipped.append(int(sum(seg_clip)))
            offset += h
        return layer_max, clipped

    @property
    def max_logit(self) -> list[float]:
        return self._per_layer[0]

    @property
    def clipped_heads(self) -> list[int]:
        return self._per_layer[1]

    def to_dict(self, prefix: str = "qk_clip/", per_layer: bool = True) -> dict[str, float]:
        """Flat metrics for a JSON-lines logger: global max, total clipped heads, and per layer."""
        finite = [m for m in self.max_logit if m != float("-inf")]
        out = {f"{prefix}max_logit": max(finite) if finite else float("nan"),
               f"{prefix}clipped_heads": float(sum(self.clipped_heads))}
        if per_layer:
            for name, m, c in zip(self.layer_names, self.max_logit, self.clipped_heads):
                out[f"{prefix}max_logit/{name}"] = m
                out[f"{prefix}clipped_heads/{name}"] = float(c)
        return out


class QKClipper:
    """Turns tracking on, and after each optimizer step reduces, clips and resets (see module docstring).

    ``enabled=False`` keeps tracking and logging the max logits but never rescales (plain Muon baseline).
    """

    def __init__(
        self, modules: Sequence[tuple[str, nn.Module]], tau: float, enabled: bool = True,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        if tau <= 0:
            raise ValueError(f"kimi_vl/optim/qk_clip.py: tau must be > 0, got {tau}")
        self.modules = list(modules)
        self.tau = float(tau)
        self.enabled = enabled
        self.process_group = process_group
        self._pending: tuple | None = None
        for _, m in self.modules:
            m.track_max_logits = True
            m.max_logits_H.fill_(float("-inf"))

    def _gather_max(self) -> torch.Tensor:
        maxes = torch.cat([m.max_logits_H.detach().float().reshape(-1) for _, m in self.modules])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.process_group) > 1:
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=self.process_group)
        return maxes

    @torch.no_grad()
    def prepare(self) -> None:
        """Start of the optimizer step: reduce the step's max logits, compute gamma, start copying the stats to
        the host (non-blocking). The forward passes are over, so this can overlap the optimizer's work."""
        if not self.modules:
            return
        maxes = self._gather_max()
        gamma = qk_clip_gamma(maxes, self.tau)
        stats_2H = torch.stack([maxes, (gamma < 1).float()])
        if stats_2H.device.type == "cuda":
            host, ready = stats_2H.to("cpu", non_blocking=True), torch.cuda.Event()
            ready.record()
        else:
            host, ready = stats_2H.cpu(), None
        for _, m in self.modules:
            m.max_logits_H.fill_(float("-inf"))
        self._pending = (gamma, host, ready)

    @torch.no_grad()
    def step(self) -> QKClipStats | None:
        """After the update: clip (if enabled; every layer, on the device) and return the stats, whose host copy
        :meth:`prepare` started (called here if it was not). Does not wait for the GPU."""
        if not self.modules:
            return None
        if getattr(self, "_pending", None) is None:
            self.prepare()
        gamma, host, ready = self._pending
        self._pending = None
        sizes, offset = [], 0
        for _, m in self.modules:
            h = m.max_logits_H.numel()
            if self.enabled:
                m.qk_clip_(gamma[offset:offset + h].to(m.max_logits_H.device))
            sizes.append(h)
            offset += h
        return QKClipStats(self.tau, [name for name, _ in self.modules], sizes, host, ready, self.enabled)
