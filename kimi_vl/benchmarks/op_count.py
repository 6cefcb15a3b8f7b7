"""Counting the host's work on a CPU: aten operators dispatched and Triton launches, bucketed by a key.

A launch-bound GPU step costs roughly its number of operators and kernel launches, and that number can be counted
without a GPU. Under ``TRITON_INTERPRET=1`` with the ``KVL_*_BACKEND=triton`` switches (:data:`GPU_PATH_ENV`) the
code takes the GPU's kernel path; :func:`count_triton_launches` makes each interpreted launch count once and keeps
the interpreter's own tensor work (which a GPU launch does not do) out of the counts. Used by ``decode_ops.py``
(per operator) and ``profile_train_step.py --count-ops`` (per phase).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

GPU_PATH_ENV = {"TRITON_INTERPRET": "1", "KVL_KDA_BACKEND": "triton", "KVL_NORM_BACKEND": "triton",
                "KVL_CONV_BACKEND": "triton", "KVL_ATTNRES_TWO_PHASE": "triton", "KVL_ATTNRES_BACKEND": "triton",
                "KVL_ROPE_BACKEND": "triton", "KVL_QK_MAX_BACKEND": "triton", "KVL_CE_BACKEND": "triton"}


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while active under ``key(name)`` (default: the operator's name), and
    Triton launches (see :func:`count_triton_launches`) under ``key("triton:<kernel>")``."""

    active: OpCounter | None = None

    def __init__(self, key: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.key = key or (lambda name: name)
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.counts[self.key(str(func.overloadpacket))] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        OpCounter.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        OpCounter.active = None
        return super().__exit__(*exc)

    def launches(self) -> int:
        """Triton launches counted (only meaningful with the default key)."""
        return sum(v for k, v in self.counts.items() if k.startswith("triton:"))


def use_gpu_path(tool: str) -> None:
    """Switch every kernel dispatch to its Triton path (:data:`GPU_PATH_ENV`) and count interpreted launches. Only on
    a CPU started with ``TRITON_INTERPRET=1``: the flag is read when the kernels are defined, at import."""
    import torch

    if torch.cuda.is_available():
        raise SystemExit(f"{tool}: --gpu-path stands in for a GPU on a CPU; on a GPU that path is taken anyway")
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit(f"{tool}: --gpu-path runs the Triton kernels through the interpreter: start it with "
                         "TRITON_INTERPRET=1")
    os.environ.update(GPU_PATH_ENV)
    count_triton_launches()


def count_triton_launches() -> None:
    """Make interpreted Triton launches count once each in the active :class:`OpCounter` (idempotent)."""
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run
    if getattr(run, "_counted", False):
        return

    def counted(self, *args, **kwargs):
        counter = OpCounter.active
        if counter is None or counter.paused:
            return run(self, *args, **kwargs)
        counter.counts[counter.key("triton:" + self.fn.__name__)] += 1
        counter.paused = True
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.paused = False

    counted._counted = True
    interpreter.InterpretedFunction.run = counted
