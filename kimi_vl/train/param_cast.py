"""``precision: bf16_params``: the model computes with bf16 copies of its fp32 weights, made once per micro-batch.

Under plain bf16 autocast (``precision: bf16``) the weights stay fp32 and autocast casts, at every matmul, the
weight (cached per forward) and also the activation: the fp32 residual stream's norm output is cast once per
consumer (the KDA layer's x four times, MLA's twice), and each cast has its own backward copy. On one H100 the
training app spent ~16 ms of GPU time and ~1,200 host-side ops per step in those casts (session 8).

Here the fp32 parameters (what the optimizer, gradient clipping, checkpoints and exports see) are cast to
bf16 at the start of a micro-batch and swapped into their modules until its backward is done; autocast stays
on for the ops that want fp32. Activations, the residual stream included, are then bf16 end to end, as in
torchtitan's default (FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) and in the backbone
benchmarks. Gradients flow back through the casts into the fp32 parameters' ``.grad`` (fp32, accumulated in fp32
over micro-batches). Parameters named in ``keep_fp32`` (default: KDA's ``A_log`` and ``dt_bias``, which set the
decay rates) are not cast.

The casts are one autograd node: one concatenation and one cast each way a micro-batch (a multi-tensor copy
between dtypes runs a kernel per parameter: ~15 ms of host time a step under the profiler, session 9 on an
H100). Parameters whose copy gets no gradient (frozen, or unused in the batch, like the vision tower on
text-only batches) keep ``.grad`` None; under DDP with ``find_unused_parameters`` that trains like one process
(``tests/train/test_param_cast.py``, with an exact fp64 copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

__all__ = ["CastParams", "ParamCaster"]


def flat_cast(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` cast to ``dtype`` as views of one flat buffer: one concatenation and one cast, whatever their
    number (a multi-tensor copy between dtypes runs one kernel per tensor on CUDA)."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(dtype)
    return [v.view(t.shape) for v, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


class CastParams(torch.autograd.Function):
    """``(*params) -> params cast to dtype`` as one node, one :func:`flat_cast` each way (gradients in the
    parameters' dtype, all fp32 here). Outputs that get no gradient give their parameter none (``.grad`` stays
    None, as for an unused parameter)."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.param_dtype = params[0].dtype
        return tuple(flat_cast(params, dtype))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        idx = [i for i, g in enumerate(grads) if g is not None]
        out: list[torch.Tensor | None] = [None] * len(grads)
        if idx:
            for i, g in zip(idx, flat_cast([grads[i] for i in idx], ctx.param_dtype)):
                out[i] = g
        return (None, *out)


class ParamCaster:
    """Swaps low-precision copies of a model's floating-point parameters into its modules.

    ``with caster():`` around a micro-batch's forward *and* backward (activation checkpointing recomputes the
    forward inside backward, and must see the same copies). Only fp32 parameters are cast; ``keep_fp32``:
    parameter-name suffixes left alone. ``dtype`` float32 or float64 makes an exact copy (the mechanism's tests).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16,
                 keep_fp32: Sequence[str] = ("A_log", "dt_bias")) -> None:
        self.dtype = dtype
        kept = {id(p) for name, p in model.named_parameters() if name.split(".")[-1] in set(keep_fp32)}
        self.params: list[nn.Parameter] = []
        index: dict[int, int] = {}
        for p in model.parameters():  # each shared (tied) parameter once
            if p.dtype == torch.float32 and id(p) not in kept and id(p) not in index:
                index[id(p)] = len(self.params)
                self.params.append(p)
        # every (module, name) slot holding a cast parameter; a tied parameter fills several slots
        self.slots = [(m, name, index[id(p)]) for m in model.modules() for name, p in m._parameters.items()
                      if p is not None and id(p) in index]
        if not self.params:
            raise ValueError("ParamCaster: the model has no fp32 parameter to cast")

    def cast(self) -> list[torch.Tensor]:
        """The copies, in ``self.params`` order; frozen parameters' copies carry no autograd history."""
        train = [i for i, p in enumerate(self.params) if p.requires_grad]
        low = [None if p.requires_grad else p.detach().to(self.dtype) for p in self.params]
        for i, t in zip(train, CastParams.apply(self.dtype, *(self.params[i] for i in train)) if train else ()):
            low[i] = t
        return low

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        low = self.cast()
        for module, name, i in self.slots:
            module._parameters[name] = low[i]
        try:
            yield
        finally:
            for module, name, i in self.slots:
                module._parameters[name] = self.params[i]
