"""Registers the MoonViT flavors with timm: ``timm.create_model("moonvit_debug")`` (no pretrained weights).

Keyword arguments are ``MoonViTConfig`` overrides, e.g. ``timm.create_model("moonvit_small",
out_hidden_size=1024)``. ``pretrained=True`` is refused: the suite never downloads weights at run time.
"""

from __future__ import annotations

from timm.models import register_model

from vision_encoder.config import moonvit_config
from vision_encoder.model import MoonViT


def _build(flavor: str, pretrained: bool, kwargs: dict) -> MoonViT:
    if pretrained:
        raise ValueError(f"moonvit_{flavor}: no pretrained weights are published here; load a converted "
                         "checkpoint with vision_encoder.convert instead")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    return MoonViT(moonvit_config(flavor, **kwargs))


@register_model
def moonvit_debug(pretrained: bool = False, **kwargs) -> MoonViT:
    """MoonViT ``debug`` flavor (width 32, 2 layers): CPU tests."""
    return _build("debug", pretrained, kwargs)


@register_model
def moonvit_tiny(pretrained: bool = False, **kwargs) -> MoonViT:
    """MoonViT ``tiny`` flavor (width 64, 2 layers): CPU quickstart."""
    return _build("tiny", pretrained, kwargs)


@register_model
def moonvit_small(pretrained: bool = False, **kwargs) -> MoonViT:
    """MoonViT ``small`` flavor (width 384, 12 layers)."""
    return _build("small", pretrained, kwargs)


@register_model
def moonvit_so400m(pretrained: bool = False, **kwargs) -> MoonViT:
    """MoonViT ``so400m`` flavor: the released shape (width 1152, 27 layers, 16 heads, MLP 4304)."""
    return _build("so400m", pretrained, kwargs)
