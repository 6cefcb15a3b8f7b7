"""Route every parameter of a model to Muon or AdamW, by name and module (not by ndim alone).

Source: REFERENCE.md section 4 (Kimi K2 / Moonlight). Hidden matrices (attention and FFN projections,
the MoE router, expert stacks ``[E, out, in]`` as a batch of E matrices) go to Muon; embeddings, the LM
head, norms, biases, gate vectors (``A_log``, ``dt_bias``), convolutions and the AttnRes pseudo-queries
and key norms (``*_res_proj``, ``*_res_norm``) go to AdamW, the AttnRes ones without weight decay.

Fused projections: a module whose weight concatenates several projections along the output rows
declares it with ``muon_row_splits: dict[str, Sequence[int]]`` (local parameter name -> row sizes,
summing to the rows of that parameter, i.e. its dim -2). Muon then orthogonalises each row block on
its own, as if the projections were separate matrices. Example: a fused QKV ``nn.Linear`` sets
``self.muon_row_splits = {"weight": (q_dim, kv_dim, kv_dim)}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

Target = Literal["muon", "adamw"]
ROW_SPLITS_ATTR = "muon_row_splits"


@dataclass(frozen=True)
class RoutingRules:
    """Name patterns (regular expressions searched in the full parameter name) that steer routing."""

    no_decay: tuple[str, ...] = (r"_res_proj\b", r"_res_norm\b")
    embedding: tuple[str, ...] = (r"embed", r"\bwte\b", r"\bwpe\b", r"pos_emb")
    lm_head: tuple[str, ...] = (r"(^|\.)lm_head\.", r"(^|\.)output\.weight$")
    norm: tuple[str, ...] = (r"norm",)
    gate_vector: tuple[str, ...] = (r"(^|\.)A_log$", r"(^|\.)dt_bias$")
    conv: tuple[str, ...] = (r"conv",)
    expert_stack: tuple[str, ...] = (r"expert",)
    extra_adamw: tuple[str, ...] = ()
    extra_muon: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParamRoute:
    """Where one parameter goes, and why (one line of the routing summary)."""

    name: str
    shape: tuple[int, ...]
    target: Target
    reason: str
    weight_decay: bool = True
    row_splits: tuple[int, ...] | None = None
    aliases: tuple[str, ...] = field(default=())


def _hit(patterns: Sequence[str], name: str) -> bool:
    return any(re.search(p, name) for p in patterns)


def _is_norm_module(module: nn.Module | None) -> bool:
    return module is not None and "norm" in type(module).__name__.lower()


def decide(name: str, param: torch.Tensor, module: nn.Module | None, rules: RoutingRules) -> tuple[Target, str, bool]:
    """Return (target, reason, weight_decay) for one parameter; first matching rule wins."""
    leaf = name.rsplit(".", 1)[-1]
    checks: list[tuple[bool, Target, str, bool]] = [
        (_hit(rules.no_decay, name), "adamw", "AttnRes query/norm (no decay)", False),
        (_hit(rules.extra_adamw, name), "adamw", "extra_adamw pattern", True),
        (_hit(rules.extra_muon, name) and param.dim() >= 2, "muon", "extra_muon pattern", True),
        (isinstance(module, nn.Embedding) or _hit(rules.embedding, name), "adamw", "embedding", True),
        (_hit(rules.lm_head, name), "adamw", "LM head", True),
        (_is_norm_module(module) or _hit(rules.norm, name), "adamw", "norm", True),
        (leaf == "bias" or leaf.endswith("_bias") and not _hit(rules.gate_vector, name), "adamw", "bias", True),
        (_hit(rules.gate_vector, name), "adamw", "gate vector", True),
        (isinstance(module, nn.modules.conv._ConvNd) or _hit(rules.conv, name), "adamw", "convolution", True),
        (param.dim() < 2, "adamw", f"{param.dim()}-D vector", True),
        (param.dim() == 2, "muon", "hidden matrix", True),
        (param.dim() == 3 and _hit(rules.expert_stack, name), "muon", "expert stack [E,out,in]", True),
    ]
    for hit, target, reason, wd in checks:
        if hit:
            return target, reason, wd
    return "adamw", f"{param.dim()}-D tensor (not a matrix)", True


def _row_splits(module: nn.Module | None, leaf: str, name: str, param: torch.Tensor) -> tuple[int, ...] | None:
    splits = getattr(module, ROW_SPLITS_ATTR, None) if module is not None else None
    if not splits or leaf not in splits:
        return None
    sizes = tuple(int(s) for s in splits[leaf])
    if param.dim() < 2 or sum(sizes) != param.shape[-2] or min(sizes) <= 0:
        raise ValueError(
            f"kimi_vl/optim/routing.py: {type(module).__name__}.{ROW_SPLITS_ATTR}[{leaf!r}] = {sizes} must be positive "
            f"and sum to the rows (dim -2) of {name} with shape {tuple(param.shape)}"
        )
    return sizes


def route_model(model: nn.Module, rules: RoutingRules | None = None) -> list[tuple[ParamRoute, nn.Parameter]]:
    """Route every trainable parameter of ``model`` (shared/tied parameters once, under their first name)."""
    rules = rules or RoutingRules()
    seen: dict[int, int] = {}
    routed: list[tuple[ParamRoute, nn.Parameter]] = []
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for leaf, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            name = f"{mod_name}.{leaf}" if mod_name else leaf
            if id(param) in seen:
                i = seen[id(param)]
                route, p = routed[i]
                if name != route.name and name not in route.aliases:
                    routed[i] = (_with_alias(route, name), p)
                continue
            target, reason, wd = decide(name, param, module, rules)
            splits = _row_splits(module, leaf, name, param) if target == "muon" else None
            seen[id(param)] = len(routed)
            routed.append((ParamRoute(name, tuple(param.shape), target, reason, wd, splits), param))
    return routed


def route_named_parameters(
    named_params: Iterable[tuple[str, nn.Parameter]], rules: RoutingRules | None = None
) -> list[tuple[ParamRoute, nn.Parameter]]:
    """Route bare named parameters (no module information, so no fused splits)."""
    rules = rules or RoutingRules()
    out = []
    for name, param in named_params:
        if param.requires_grad:
            target, reason, wd = decide(name, param, None, rules)
            out.append((ParamRoute(name, tuple(param.shape), target, reason, wd), param))
    return out


def _with_alias(route: ParamRoute, alias: str) -> ParamRoute:
    return ParamRoute(route.name, route.shape, route.target, route.reason + " (tied)", route.weight_decay,
                      route.row_splits, route.aliases + (alias,))


def format_routing(routes: Sequence[ParamRoute]) -> str:
    """A human-readable table of every routing decision plus totals (the ``--dry-run`` summary)."""
    rows = [("parameter", "shape", "->", "why", "wd", "row blocks")]
    for r in routes:
        blocks = "x".join(map(str, r.row_splits)) if r.row_splits else ""
        name = r.name + (f" (= {', '.join(r.aliases)})" if r.aliases else "")
        rows.append((name, "x".join(map(str, r.shape)), r.target, r.reason, "yes" if r.weight_decay else "no", blocks))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    for target in ("muon", "adamw"):
        sel = [r for r in routes if r.target == target]
        numel = sum(_numel(r.shape) for r in sel)
        lines.append(f"{target}: {len(sel)} tensors, {numel:,} parameters")
    return "\n".join(lines)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
