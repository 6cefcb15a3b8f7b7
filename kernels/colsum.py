"""Column sums of per-program partial results: ``out[...] = sum_p partial[p, ...]`` in one launch.

Several backward kernels (RMSNorm's gain, the KDA gate's ``A_log`` / ``dt_bias``, the short conv's weight and bias,
the KDA dbeta slots, the AttnRes query) reduce over tokens in two stages: each program writes one fp32 (fp64 for
fp64 inputs) partial row, and the rows are summed afterwards, in a fixed order (deterministic, no atomics). ATen's
``partial.sum(0).to(dtype)`` took a reduction kernel of ~12 us and a cast kernel per call for ``[1024, 768]`` (the
small model's 64 reductions: 0.75 ms a step, H200, session 29). :func:`column_sum` is one Triton launch that also
writes the result in the parameter's dtype; it runs under ``TRITON_INTERPRET=1`` on a CPU and falls back to ATen
for CPU tensors otherwise.

Tile: ``COLSUM_ELEMS`` elements a loop step, ``BLOCK_P`` rows (at most ``COLSUM_MAX_ROWS``, fewer for few rows) x
``BLOCK_X`` columns (at least ``COLSUM_MIN_COLS``), one program per column block looping over the rows. Fixed
configuration (no autotuning). The AttnRes backward's query-gradient sums ([264, 768]) were the first user, with a
kernel of their own in 64 x 32 tiles: 24 calls a step took 0.100-0.102 ms (session 23); here, in 256 x 16 tiles,
0.03-0.07 ms (the block-AttnRes step's 97 column sums against the standard step's 73, session 30 call5). In the
small hybrid's step the change from ATen's sums left the step time where it was (session 30 call3: the GPU runs
that step at its power cap).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.fast_launch import CompiledLaunch, aligned16

__all__ = ["column_sum"]

COLSUM_ELEMS = 4096
COLSUM_MAX_ROWS = 256
COLSUM_MIN_COLS = 16
COLSUM_WARPS = 4


@triton.jit
def _colsum_kernel(p_ptr, out_ptr, P, X, BLOCK_P: tl.constexpr, BLOCK_X: tl.constexpr):
    """``out [X] = sum_p p [P, X]``, accumulated in the partials' dtype (fp32 or fp64), rows added in a fixed order,
    stored in ``out``'s dtype."""
    cols = tl.program_id(0).to(tl.int64) * BLOCK_X + tl.arange(0, BLOCK_X)
    x_ok = cols < X
    acc = tl.zeros([BLOCK_P, BLOCK_X], dtype=p_ptr.dtype.element_ty)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        acc += tl.load(p_ptr + rows.to(tl.int64)[:, None] * X + cols[None, :], mask=(rows < P)[:, None] & x_ok[None, :],
                       other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=x_ok)


_COLSUM = CompiledLaunch(_colsum_kernel)


@functools.lru_cache(maxsize=64)
def colsum_blocks(p: int, x: int) -> tuple[int, int]:
    """``(BLOCK_P, BLOCK_X)`` for ``[p, x]`` partials: many rows a step for tall inputs, wide column blocks for few rows."""
    block_p = min(COLSUM_MAX_ROWS, triton.next_power_of_2(max(p, 1)))
    block_x = max(COLSUM_MIN_COLS, COLSUM_ELEMS // block_p)
    return block_p, min(block_x, max(COLSUM_MIN_COLS, triton.next_power_of_2(max(x, 1))))


def column_sum(partial: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``partial.sum(0).to(dtype)`` of a contiguous fp32 / fp64 ``partial [P, *rest]`` -> ``[*rest]`` in ``dtype``
    (default: the partials' dtype), by one Triton launch on CUDA (or under ``TRITON_INTERPRET=1``)."""
    if partial.dim() < 1 or partial.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"kernels/colsum.column_sum: partial must be fp32 or fp64 [P, ...], got {partial.dtype} "
                         f"{tuple(partial.shape)}")
    out_dtype = dtype or partial.dtype
    use_triton = partial.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if not use_triton or partial.numel() == 0:
        return partial.sum(0).to(out_dtype)
    if not partial.is_contiguous():
        raise ValueError(f"kernels/colsum.column_sum: partial must be contiguous, got strides {partial.stride()}")
    p = partial.shape[0]
    x = partial.numel() // p
    out = torch.empty(partial.shape[1:], device=partial.device, dtype=out_dtype)
    block_p, block_x = colsum_blocks(p, x)
    key = (partial.dtype, out_dtype, aligned16(partial, out), p, x, block_p, block_x)
    _COLSUM((triton.cdiv(x, block_x),), key, partial, out, p, x, block_p, block_x, num_warps=COLSUM_WARPS)
    return out
