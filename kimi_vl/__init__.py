"""Kimi VL suite: the Kimi Linear backbone (KDA + NoPE MLA, MoE, Attention Residuals) and its training app.

Importing the package registers ``KimiVLConfig`` / ``KimiVLForCausalLM`` with transformers' Auto classes
(``model_type="kimi_vl"``), so ``AutoModelForCausalLM.from_pretrained`` works on saved checkpoints.
"""

from kimi_vl.configuration import KimiVLConfig
from kimi_vl.hf import register as _register
from kimi_vl.modeling.cache import KimiVLCache
from kimi_vl.modeling.model import KimiVLForCausalLM, KimiVLModel
from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration  # registers AutoModelForImageTextToText

_register()

__all__ = ["KimiVLCache", "KimiVLConfig", "KimiVLForCausalLM", "KimiVLForConditionalGeneration", "KimiVLModel"]
