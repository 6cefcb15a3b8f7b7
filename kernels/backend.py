"""The backend choice every op package makes the same way (``docs/INTERFACES.md``): the ``backend`` argument, else
the op's environment variable (``KVL_KDA_BACKEND``, ``KVL_CONV_BACKEND``, ...), else Triton on CUDA and PyTorch
elsewhere; Triton on a CPU needs ``TRITON_INTERPRET=1``. Errors name the calling function and its package. Also the
SM count that kernels size their grids by (:func:`sm_count`)."""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("triton", "torch")


def choose_backend(backend: str | None, device: torch.device, fn: str, package: str, env_var: str) -> str:
    """``"triton"`` or ``"torch"`` for a call of ``fn`` (in ``package``) on ``device``."""
    choice = backend if backend is not None else os.environ.get(env_var) or None
    if choice is None:
        return "triton" if device.type == "cuda" else "torch"
    if choice not in BACKENDS:
        raise ValueError(f"{fn} ({package}): backend must be one of {BACKENDS} (argument or {env_var}), "
                         f"got {choice!r}")
    if choice == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{fn} ({package}): backend 'triton' on device {device} needs CUDA or TRITON_INTERPRET=1")
    return choice


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (without an index: the current device), cached per device."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
