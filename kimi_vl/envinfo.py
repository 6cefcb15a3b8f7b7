"""The environment report printed by ``kimi-vl env``."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def kernel_mode() -> str:
    """How the project's Triton kernels will run here: compiled, interpreted, or not at all."""
    import torch

    try:
        importlib.import_module("triton")
    except ImportError:
        return "torch fallback (triton not installed)"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton interpreter (TRITON_INTERPRET=1, CPU)"
    if torch.cuda.is_available():
        return "triton compiled (CUDA)"
    return "torch fallback on CPU (set KVL_KDA_BACKEND=triton TRITON_INTERPRET=1 to interpret the kernels)"


def env_report() -> dict[str, object]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch cuda": torch.version.cuda or "none (CPU build)",
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "accelerate": _version("accelerate"),
        "lm-eval": _version("lm_eval"),
        "timm": _version("timm"),
        "webdataset": _version("webdataset"),
        "decord": _version("decord"),
        "kimi-vl-suite": _version("kimi-vl-suite"),
        "devices": ", ".join(devices),
        "kernels": kernel_mode(),
    }


def format_report(report: dict[str, object]) -> str:
    width = max(len(k) for k in report)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in report.items())
