"""MuonClip: Muon for hidden matrices, AdamW for the rest, QK-Clip on softmax attention (Kimi K2).

See ``kimi_vl/optim/README.md``. Entry points: :func:`build_optimizer` / :func:`build_scheduler` with an
:class:`OptimConfig`, or :meth:`MuonClip.from_model`.
"""

from kimi_vl.optim.builder import OptimConfig, build_optimizer, build_scheduler, routing_summary
from kimi_vl.optim.muonclip import MuonClip, param_groups_from_routes
from kimi_vl.optim.qk_clip import QKClipper, QKClipStats, find_qk_clip_modules
from kimi_vl.optim.routing import ParamRoute, RoutingRules, format_routing, route_model

__all__ = [
    "MuonClip",
    "OptimConfig",
    "ParamRoute",
    "QKClipStats",
    "QKClipper",
    "RoutingRules",
    "build_optimizer",
    "build_scheduler",
    "find_qk_clip_modules",
    "format_routing",
    "param_groups_from_routes",
    "route_model",
    "routing_summary",
]
