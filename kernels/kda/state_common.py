"""Triton pieces shared by the KDA forward (``chunk_triton.py``) and backward (``chunk_triton_bwd.py``) kernels: the
dot that takes fp32 inputs exactly, and the set-up of the sequential state passes (forward and reverse), whose
programs own one (sequence, value head, block of value columns) and walk its chunks, and how wide that block is."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import sm_count

# the forward's widths: 32 columns never beat 16 in the sweeps (H200, session 22: 0.211 / 0.745 against 0.204 / 0.664 ms
# at 8 x 2048 x 16 / 1 x 32768 x 16; session 20: 0.232 against 0.217 at 1 x 8192 x 32)
STATE_BV_CHOICES = (64, 16)


def state_block_v(setting: int | None, v: int, sequences_heads: int, device: torch.device,
                  choices: tuple[int, ...] = STATE_BV_CHOICES, fill: float = 1.0) -> int:
    """Value columns per program of a sequential state pass over ``sequences_heads`` (sequence, value head) pairs.
    ``setting`` an int: that, capped at V's power of two. ``None``: the widest of ``choices`` (widest first) that
    still gives at least ``fill`` programs an SM (a narrower block re-reads the chunk's W / kg rows once per program, a
    wider one walks its chunks more slowly), else the narrowest. H200, session 22: forward state kernel at
    8 x 2048 x 16 0.204 / 0.211 / 0.152 ms at 16 / 32 / 64 columns, at 1 x 32768 x 16 0.664 / 0.745 / 0.991 (and
    16 columns best at 1 x 8192 x 32, where 64 would give 64 programs); the whole backward at 8 x 2048 x 16
    3.78 / 3.56 / 3.42 ms, at 1 x 8192 x 32 3.66 / 3.41 / 3.46 (hence its choices 64 / 32; its ``fill``: see
    ``chunk_triton_bwd.BWD_STATE_FILL``). Off CUDA (the interpreter) every SM count is 1."""
    vp = max(16, triton.next_power_of_2(v))
    if setting is not None:
        return min(vp, setting)
    sms = sm_count(device) if device.type == "cuda" else 1
    for bv in choices:
        if bv <= vp and sequences_heads * triton.cdiv(vp, bv) >= fill * sms:
            return bv
    return min(vp, choices[-1])


MAX_GRID_YZ = 65535  # CUDA's limit on a grid's second and third dimensions


def chunk_head_grid(chunks: int, heads: int, heads_first: bool, lead: tuple[int, ...] = ()) -> tuple[tuple, bool]:
    """The grid of a per-(chunk, value head) kernel after ``lead`` dimensions, and whether it runs heads first:
    ``(*lead, heads, chunks)`` when ``heads_first`` and the chunks fit a grid dimension past the first, else
    ``(*lead, chunks, heads)``. Heads first, the programs resident together work on the same tokens' rows of every
    head (contiguous in q, k, v, g) and write neighbouring ``[NC, HV, ...]`` slabs; chunks first, neighbouring
    programs read a head's rows of other chunks, ``C`` tokens apart (the layout before session 23). With ``lead``
    both orders put the chunks past the first dimension, so the fallback keeps only the order."""
    hf = heads_first and chunks <= MAX_GRID_YZ
    return (*lead, heads, chunks) if hf else (*lead, chunks, heads), hf


@triton.jit
def _chunk_head_ids(AXIS: tl.constexpr, HEADS_FIRST: tl.constexpr):
    """``(chunk, value head)`` of a program of a :func:`chunk_head_grid` grid, whose two axes start at ``AXIS``."""
    if HEADS_FIRST:
        i_hv = tl.program_id(AXIS)
        i_c = tl.program_id(AXIS + 1)
    else:
        i_c = tl.program_id(AXIS)
        i_hv = tl.program_id(AXIS + 1)
    return i_c, i_hv


@triton.jit
def _mm(a, b, FP32: tl.constexpr):
    """fp32 ``ieee`` dot for fp32 inputs, else a tensor-core dot in the operands' (16-bit) dtype."""
    if FP32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _state_program(sc0_ptr, snc_ptr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, C: tl.constexpr):
    """A state-pass program's set-up, grid (V / BV, sequence x value head): ``(i_nh, i_hv, c0, nc, rows, ck, cv,
    kmask, vmask, smask, s_off)``: the (sequence, value head) index and the value head, the sequence's first chunk
    and chunk count, the row / key / value-column indices and masks, the [BK, BV] state tile's mask and offsets in
    a [K, V] state."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    c0 = tl.load(sc0_ptr + i_n)
    nc = tl.load(snc_ptr + i_n)
    rows = tl.arange(0, C)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    kmask = ck < K
    vmask = cv < V
    return i_nh, i_hv, c0, nc, rows, ck, cv, kmask, vmask, kmask[:, None] & vmask[None, :], ck[:, None] * V + cv[None, :]


@triton.jit
def _load_state(ptr, i_nh, s_off, smask, HAS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr):
    """The program's fp32 [BK, BV] tile of state ``i_nh`` of ``ptr`` ([N x HV, K, V]) when ``HAS``, else zeros."""
    if HAS:
        S = tl.load(ptr + i_nh.to(tl.int64) * (K * V) + s_off, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    return S
