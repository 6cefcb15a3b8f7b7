"""The backend choice every op package makes the same way (``docs/INTERFACES.md``): the ``backend`` argument, else
the op's environment variable (``KVL_KDA_BACKEND``, ``KVL_CONV_BACKEND``, ...), else Triton on CUDA and PyTorch
elsewhere; Triton on a CPU needs ``TRITON_INTERPRET=1`` (:func:`interpreting`, :func:`require_triton_device`). Errors
name the calling function and its package. Also the SM count that kernels size their grids by (:func:`sm_count`) and
the dtype a product runs in under autocast (:func:`matmul_dtype`)."""

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
    if choice == "triton":
        require_triton_device(device, f"{fn} ({package})")
    return choice


def interpreting() -> bool:
    """Whether Triton kernels run under its interpreter (``TRITON_INTERPRET=1``, read at each call)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def require_triton_device(device: torch.device, where: str, what: str = "backend 'triton'") -> None:
    """A ``ValueError`` naming ``where`` unless Triton can run on ``device`` (CUDA, or any device interpreted)."""
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"{where}: {what} on device {device} needs CUDA or TRITON_INTERPRET=1")


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` computes ``x``'s product in: autocast's on x's device when it is on there, else x's."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind) and x.is_floating_point():
        return torch.get_autocast_dtype(kind)
    return x.dtype


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (without an index: the current device), cached per device."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
