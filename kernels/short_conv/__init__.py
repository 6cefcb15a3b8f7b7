"""Depthwise causal short convolution (kernel W, typically 4) with varlen and a decode cache.

Contract: ``docs/INTERFACES.md`` ("Short convolution"); the layer is ``../shared/REFERENCE.md`` section 1
(q, k, v projections -> short conv -> SiLU). Semantics follow the public ``causal-conv1d`` /
flash-linear-attention API, written from the definition:

    y[t, d] = act( bias[d] + sum_{w < W} weight[d, w] * x[t - (W - 1) + w, d] )

where inputs before a sequence's start come from ``initial_state`` (the last W-1 inputs of the previous
segment, in time order) or are zero. Varlen sequences (``cu_seqlens``, B = 1) never see each other.

Two implementations behind one dispatch point: ``conv_torch.py`` (vectorised PyTorch, the reference and
the CPU path) and ``conv_triton.py`` (Triton forward, backward and decode kernels). The ``backend``
argument, else ``KVL_CONV_BACKEND=triton|torch``, else Triton on CUDA and PyTorch elsewhere;
``KVL_CONV_BACKEND=triton TRITON_INTERPRET=1`` runs the Triton kernels on a CPU.

Shapes: x ``[B, T, D]``; weight ``[D, W]``; bias ``[D]``; state ``[N, D, W-1]``; decode x ``[N, D]``.

Example::

    import torch
    from kernels.short_conv import causal_conv1d, causal_conv1d_update
    x, w = torch.randn(1, 10, 8), torch.randn(8, 4)
    y, state = causal_conv1d(x, w, activation="silu", cu_seqlens=torch.tensor([0, 3, 10]),
                             output_final_state=True)          # y [1, 10, 8], state [2, 8, 3]
    y1, state = causal_conv1d_update(torch.randn(2, 8), state, w)   # y1 [2, 8]
"""

from __future__ import annotations

import torch

from kernels.short_conv.api import check_conv, check_update, resolve_backend, uses_silu
from kernels.short_conv.conv_torch import causal_conv1d_ref, causal_conv1d_torch, causal_conv1d_update_torch

__all__ = ["causal_conv1d", "causal_conv1d_update", "causal_conv1d_ref"]


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Depthwise causal conv over time. x ``[B, T, D]`` (B = 1 with ``cu_seqlens [N+1]``); weight ``[D, W]``.

    Returns y ``[B, T, D]`` (x's dtype) and, if asked, the final state ``[N, D, W-1]``: the last W-1 inputs
    of each sequence in time order (taken from ``initial_state``/zeros when the sequence is shorter), in
    ``initial_state``'s dtype (x's without one). Differentiable in x, weight, bias and initial_state.
    """
    check_conv("causal_conv1d", x, weight, bias, activation, cu_seqlens, initial_state)
    if resolve_backend(backend, x.device, "causal_conv1d") == "triton":
        from kernels.short_conv.conv_triton import causal_conv1d_triton

        return causal_conv1d_triton(
            x, weight, bias, uses_silu(activation), cu_seqlens, initial_state, output_final_state
        )
    return causal_conv1d_torch(x, weight, bias, activation, cu_seqlens, initial_state, output_final_state)


def causal_conv1d_update(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step. x ``[N, D]``; state ``[N, D, W-1]`` (last W-1 inputs, time order). Returns y ``[N, D]``
    and the new state (a new tensor; the input state is not modified). The Triton path is forward-only."""
    check_update("causal_conv1d_update", x, state, weight, bias, activation)
    if resolve_backend(backend, x.device, "causal_conv1d_update") == "triton":
        from kernels.short_conv.conv_triton import causal_conv1d_update_triton

        return causal_conv1d_update_triton(x, state, weight, bias, uses_silu(activation))
    return causal_conv1d_update_torch(x, state, weight, bias, activation)
