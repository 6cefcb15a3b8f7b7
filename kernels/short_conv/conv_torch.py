"""PyTorch implementation of the depthwise causal short convolution (the CPU path and the reference of the
Triton kernels in ``conv_triton.py``). Written from the definition:

    y[t, d] = act( bias[d] + sum_{w < W} weight[d, w] * x[t - (W - 1) + w, d] )

where inputs before a sequence's start come from ``initial_state`` (the last W-1 inputs of the previous
segment, in time order) or are zero. Vectorised: one gather per tap, fp32 (fp64 for fp64 inputs)
accumulation, autograd for the backward. Inputs are validated by the public wrappers in ``__init__.py``.

Shapes: x ``[B, T, D]``; weight ``[D, W]``; bias ``[D]``; state ``[N, D, W-1]``; decode x ``[N, D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.short_conv.api import uses_silu


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y) if uses_silu(activation) else y


def _seq_index(B: int, T: int, cu_seqlens: torch.Tensor | None, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per flattened token: sequence id and position inside it; and the number of sequences."""
    if cu_seqlens is None:
        seq = torch.arange(B, device=device).repeat_interleave(T)
        pos = torch.arange(T, device=device).repeat(B)
        return seq, pos, B
    cs = cu_seqlens.to(device=device, dtype=torch.long)
    lens = cs[1:] - cs[:-1]
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens, output_size=T)
    return seq, torch.arange(T, device=device) - cs[seq], lens.numel()


def _tap(x_TD, state_NDW, seq, pos, back: int) -> torch.Tensor:
    """x at (pos - back) of the same sequence, from the state before the start, zeros without state."""
    src = pos - back
    inside = src >= 0
    flat_idx = torch.arange(x_TD.shape[0], device=x_TD.device) - back
    from_x = x_TD.index_select(0, flat_idx.clamp(min=0))
    if state_NDW is None:
        from_s = torch.zeros_like(from_x)
    else:
        W1 = state_NDW.shape[-1]
        col = (W1 + src).clamp(min=0, max=W1 - 1)
        from_s = state_NDW[seq, :, col].to(x_TD.dtype)
        from_s = torch.where((W1 + src >= 0)[:, None], from_s, torch.zeros_like(from_s))
    return torch.where(inside[:, None], from_x, from_s)


def causal_conv1d_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cu_seqlens: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x ``[B, T, D]`` -> y ``[B, T, D]`` (x's dtype) and, if asked, the final state ``[N, D, W-1]``."""
    B, T, D = x.shape
    seq, pos, N = _seq_index(B, T, cu_seqlens, x.device)
    W = weight.shape[1]
    x_TD = x.reshape(B * T, D)
    y = torch.zeros_like(x_TD, dtype=torch.promote_types(x.dtype, torch.float32))
    for w in range(W):
        y = y + weight[:, w].to(y.dtype) * _tap(x_TD, initial_state, seq, pos, W - 1 - w).to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    y = _act(y, activation).to(x.dtype).view(B, T, D)
    if not output_final_state:
        return y, None
    return y, _final_state(x_TD, initial_state, cu_seqlens, B, T, N, W)


def _final_state(x_TD, state, cu_seqlens, B, T, N, W) -> torch.Tensor:
    """Last W-1 inputs per sequence: [N, D, W-1]."""
    D = x_TD.shape[1]
    if cu_seqlens is None:
        ends = torch.arange(1, B + 1, device=x_TD.device) * T
        lens = torch.full((B,), T, device=x_TD.device)
    else:
        cs = cu_seqlens.to(device=x_TD.device, dtype=torch.long)
        ends, lens = cs[1:], cs[1:] - cs[:-1]
    cols = []
    for w in range(W - 1):
        back = W - 2 - w  # column w holds x at (len - 1 - back)
        src = lens - 1 - back
        if x_TD.shape[0]:
            from_x = x_TD.index_select(0, (ends - 1 - back).clamp(min=0, max=x_TD.shape[0] - 1))
        else:
            from_x = x_TD.new_zeros(N, D)
        if state is None:
            from_s = torch.zeros(N, D, dtype=x_TD.dtype, device=x_TD.device)
        else:
            col = (W - 1 + src).clamp(min=0, max=W - 2)
            from_s = state[torch.arange(N, device=x_TD.device), :, col].to(x_TD.dtype)
            from_s = torch.where((W - 1 + src >= 0)[:, None], from_s, torch.zeros_like(from_s))
        cols.append(torch.where((src >= 0)[:, None], from_x, from_s))
    out_dt = state.dtype if state is not None else x_TD.dtype
    return torch.stack(cols, dim=-1).to(out_dt) if cols else x_TD.new_zeros(N, D, 0)


def causal_conv1d_update_torch(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: x ``[N, D]``, state ``[N, D, W-1]`` -> y ``[N, D]`` and a new state tensor."""
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, D, W]
    cdt = torch.promote_types(x.dtype, torch.float32)
    y = (window.to(cdt) * weight.to(cdt)).sum(-1)
    if bias is not None:
        y = y + bias.to(cdt)
    return _act(y, activation).to(x.dtype), window[:, :, 1:].to(state.dtype)


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    initial_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for one batch of equal-length sequences with F.conv1d: x ``[B, T, D]`` -> y ``[B, T, D]``."""
    B, T, D = x.shape
    W = weight.shape[1]
    xt = x.transpose(1, 2)
    left = initial_state.to(x.dtype) if initial_state is not None else x.new_zeros(B, D, W - 1)
    y = F.conv1d(torch.cat([left, xt], -1), weight[:, None, :].to(x.dtype), bias, groups=D)
    return _act(y, activation).transpose(1, 2)
