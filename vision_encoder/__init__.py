"""vision_encoder: MoonViT / MoonViT-3D, a native-resolution packed ViT for images and video (REFERENCE.md s5).

Public API: ``MoonViTProcessor`` (images/video -> packed patches + grid_thw), ``MoonViT`` + ``MoonViTConfig``
+ ``moonvit_config(flavor)`` (flavors ``debug``, ``tiny``, ``small``, ``so400m``), the token counter
``num_vision_tokens`` (``geometry``), and the kimi_k25 key maps in ``vision_encoder.convert``.

Attributes load lazily so ``vision_encoder.geometry`` stays importable without torch. timm: the flavors are
registered as ``moonvit_<flavor>`` when timm is already imported at this point, or by
``import vision_encoder.timm_registry`` (timm costs ~2 s to import, so it is never imported implicitly).
"""

from __future__ import annotations

import importlib
import sys

_LAZY = {
    "FLAVORS": "vision_encoder.config",
    "MoonViTConfig": "vision_encoder.config",
    "moonvit_config": "vision_encoder.config",
    "DEFAULT_GEOMETRY": "vision_encoder.geometry",
    "PatchGeometry": "vision_encoder.geometry",
    "num_vision_tokens": "vision_encoder.geometry",
    "MoonViT": "vision_encoder.model",
    "MoonViTOutput": "vision_encoder.model",
    "MoonViTProcessor": "vision_encoder.processor",
    "MoonViTProcessorConfig": "vision_encoder.processor",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vision_encoder' has no attribute {name!r}")


if "timm" in sys.modules:
    importlib.import_module("vision_encoder.timm_registry")
