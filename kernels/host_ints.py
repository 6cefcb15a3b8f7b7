"""Host copies of small integer device tensors (``cu_seqlens``), read once per tensor instead of once per layer.

Every KDA layer (forward and backward), every QK max-logit pass and the model's own checks need the document
bounds on the host (chunk tables, validation). Reading a CUDA tensor with ``.tolist()`` synchronises the host with
the device, and one training step passes the same ``cu_seqlens`` tensor to dozens of such calls: each sync drains
the GPU's queue and exposes the launch latency of the kernels queued after it. :func:`host_ints` keeps the last
few tensors' values, keyed by the tensor object and its version counter (an in-place write invalidates the entry),
so one step pays one synchronisation per distinct tensor; :func:`remember` seeds an entry without any (for a
tensor just copied from host data the caller still holds).
"""

from __future__ import annotations

import weakref

import torch

_SLOTS = 8
_cache: list[tuple[weakref.ref, int, list[int]]] = []  # most recent last


def _version(t: torch.Tensor) -> int | None:
    """The in-place version counter; ``None`` for inference-mode tensors, which have none (never cached)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _lookup(t: torch.Tensor) -> list[int] | None:
    version = _version(t)
    for ref, seen, values in reversed(_cache):
        if ref() is t and version is not None and version == seen:
            return values
    return None


def remember(t: torch.Tensor, values: list[int]) -> None:
    """Record ``values`` (the host copy of ``t``'s current contents) for later :func:`host_ints` calls."""
    version = _version(t)
    if version is None:
        return
    _cache[:] = [e for e in _cache if e[0]() is not None and e[0]() is not t][-(_SLOTS - 1):]
    _cache.append((weakref.ref(t), version, values))


def host_ints(t: torch.Tensor) -> list[int]:
    """``t.tolist()`` (a 1-D integer tensor) as Python ints, synchronising only the first time a tensor is seen."""
    if t.device.type == "cpu":
        return [int(x) for x in t.tolist()]
    values = _lookup(t)
    if values is None:
        values = [int(x) for x in t.tolist()]
        remember(t, values)
    return values
