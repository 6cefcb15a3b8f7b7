"""transformers registration: ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` know ``model_type="kimi_vl"``.

Runs once when ``kimi_vl`` is imported, so ``AutoModelForCausalLM.from_pretrained(dir)`` and lm-eval's
``hf`` model load saved checkpoints in any process that imported the package first.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from kimi_vl.configuration import KimiVLConfig
from kimi_vl.modeling.model import KimiVLForCausalLM, KimiVLModel

_DONE = False


def register() -> None:
    global _DONE
    if _DONE:
        return
    AutoConfig.register(KimiVLConfig.model_type, KimiVLConfig, exist_ok=True)
    AutoModel.register(KimiVLConfig, KimiVLModel, exist_ok=True)
    AutoModelForCausalLM.register(KimiVLConfig, KimiVLForCausalLM, exist_ok=True)
    _DONE = True
