"""Depthwise causal short convolution (kernel W, typically 4) with varlen and a decode cache.

Contract: ``docs/INTERFACES.md`` ("Short convolution"); the layer is ``../shared/REFERENCE.md`` section 1
(q, k, v projections -> short conv -> SiLU). Semantics follow the public ``causal-conv1d`` /
flash-linear-attention API, written from the definition:

    y[t, d] = act( bias[d] + sum_{w < W} weight[d, w] * x[t - (W - 1) + w, d] )

where inputs before a sequence's start come from ``initial_state`` (the last W-1 inputs of the previous
segment, in time order) or are zero. Varlen sequences (``cu_seqlens``, B = 1) never see each other.
This is a vectorised PyTorch implementation (one gather per tap) used on every device: the op is
memory-bound and small next to KDA; there is no Triton kernel for it in this package.

Shapes: x ``[B, T, D]``; weight ``[D, W]``; bias ``[D]``; state ``[N, D, W-1]``; decode x ``[N, D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d", "causal_conv1d_update", "causal_conv1d_ref"]

_ACTS = (None, "silu", "swish", "identity")


def _fail(fn: str, msg: str) -> None:
    raise ValueError(f"{fn} (kernels/short_conv): {msg}")


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y) if activation in ("silu", "swish") else y


def _check(fn, x, weight, bias, activation, state, N) -> None:
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1] or weight.shape[1] < 1:
        _fail(fn, f"weight must be [D={x.shape[-1]}, W], got {tuple(weight.shape)} for x {tuple(x.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        _fail(fn, f"bias must be [D={weight.shape[0]}], got {tuple(bias.shape)}")
    if activation not in _ACTS:
        _fail(fn, f"activation must be one of {_ACTS}, got {activation!r}")
    want = (N, weight.shape[0], weight.shape[1] - 1)
    if state is not None and tuple(state.shape) != want:
        _fail(fn, f"state must be [N, D, W-1] = {want}, got {tuple(state.shape)}")


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


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Depthwise causal conv over time. x ``[B, T, D]`` (B = 1 with ``cu_seqlens [N+1]``); weight ``[D, W]``.

    Returns y ``[B, T, D]`` (x's dtype) and, if asked, the final state ``[N, D, W-1]``: the last W-1 inputs
    of each sequence in time order (taken from ``initial_state``/zeros when the sequence is shorter).
    """
    fn = "causal_conv1d"
    if x.dim() != 3:
        _fail(fn, f"x must be [B, T, D], got {tuple(x.shape)}")
    B, T, D = x.shape
    if cu_seqlens is not None and B != 1:
        _fail(fn, f"with cu_seqlens the batch size must be 1, got x {tuple(x.shape)}")
    if cu_seqlens is not None and (int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != T):
        _fail(fn, f"cu_seqlens must start at 0 and end at T={T}, got {cu_seqlens.tolist()}")
    seq, pos, N = _seq_index(B, T, cu_seqlens, x.device)
    _check(fn, x, weight, bias, activation, initial_state, N)
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


def causal_conv1d_update(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step. x ``[N, D]``; state ``[N, D, W-1]`` (last W-1 inputs, time order). Returns y ``[N, D]``
    and the new state (a new tensor; the input state is not modified)."""
    fn = "causal_conv1d_update"
    if x.dim() != 2:
        _fail(fn, f"x must be [N, D] (one token per sequence), got {tuple(x.shape)}")
    _check(fn, x, weight, bias, activation, state, x.shape[0])
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, D, W]
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
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
