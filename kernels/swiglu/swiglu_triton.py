"""The dense SwiGLU's two activation passes inside Triton GEMMs (GPU; also under ``TRITON_INTERPRET=1``).

The split path (``kernels.swiglu.swiglu_split``) runs three cuBLAS GEMMs and two elementwise kernels a layer and
direction; the elementwise ones move ``[M, 2I]`` and ``[M, I]`` tensors through memory that the GEMMs next to
them have just written:

- forward: ``gu = x W_gu^T`` (GEMM, writes ``[M, 2I]``), ``h = silu(g) u`` (reads ``gu``, writes ``h``),
  ``y = h W_down^T``;
- backward: ``dh = dy W_down`` (GEMM, writes ``[M, I]``), ``dgu = silu_mul'(gu, dh)`` (reads ``gu`` and ``dh``,
  writes ``[M, 2I]``), then the weight gradients and ``dx = dgu W_gu`` (GEMMs).

Here ``_gate_up_silu_kernel`` computes a ``[BLOCK_M, BLOCK_N]`` tile of the gate and the matching tile of up (two
accumulators over the same ``x`` tile) and writes ``g``, ``u`` (saved for the backward) and ``h`` from its
registers: the re-read of ``gu`` goes. ``_down_silu_bwd_kernel`` computes a tile of ``dh = dy W_down`` and applies
the activation's backward in its epilogue (reading the ``g``, ``u`` tiles): ``dh`` is never written or read. Per
layer at ``M = 32768, I = 2048`` in bf16 that is 268 MB less traffic forward and 268 MB backward. The other GEMMs
(``y``, ``dx``, both weight gradients) stay cuBLAS calls.

Rounding points are the split path's: ``g``, ``u`` and ``dh`` are rounded to the compute dtype (as cuBLAS's
outputs are) before the activation, which runs in fp32 (``kernels/norm``'s ``silu_mul`` formulas). The GEMMs
accumulate in fp32; fp32 inputs use IEEE products (``input_precision="ieee"``, like ``F.linear`` without TF32).

Tiles: ``GROUP_M`` row tiles share a column band before the next band starts (the usual L2 swizzle); rows and
columns past the edge are loaded clamped (``% M``, ``% N``) and masked only at the store; ``EVEN_K`` drops the
reduction's mask when ``BLOCK_K`` divides it. Fixed configurations (:data:`GPU_CONFIG`, :data:`INTERPRET_CONFIG`);
``kernels/benchmarks/bench_swiglu.py --sweep`` times others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import interpreting, matmul_dtype


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


# Not timed yet (no GPU in session 43): Hopper starting points that compile for sm_90a without spills (Triton 3.9's
# ptxas: forward 220 registers a thread, backward 108; the backward's epilogue holds dh, g and u, and spills at 8
# warps for a 128 x 128 tile). ``kernels/benchmarks/bench_swiglu.py --sweep`` times the alternatives.
GPU_CONFIG = {"fwd": GemmConfig(128, 128, 64, 8, 8, 3), "bwd": GemmConfig(128, 128, 64, 8, 16, 3)}
INTERPRET_CONFIG = GemmConfig(16, 16, 16, 2, 4, 1)  # the interpreter runs each program in numpy: small tiles


def pick_config(kind: str, device: torch.device) -> GemmConfig:
    """The launch configuration of ``kind`` (``"fwd"`` or ``"bwd"``) on ``device``."""
    if device.type != "cuda" or interpreting():
        return INTERPRET_CONFIG
    return GPU_CONFIG[kind]


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's row and column offsets, ``GROUP_M`` row tiles a column band."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    band = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // band) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % size_m
    pid_n = (pid % band) // size_m
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, gu_ptr, h_ptr, M, I, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr):
    """``x [M, K]``, ``w [2I, K]`` (gate rows, then up rows) -> ``gu [M, 2I]``, ``h = silu(g) u [M, I]``."""
    rm, rn = _tile(M, I, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * K + rk[None, :]
    g_ptrs = w_ptr + (rn % I).to(tl.int64)[None, :] * K + rk[:, None]  # [BLOCK_K, BLOCK_N] = W_gate^T's tile
    up_offset = I.to(tl.int64) * K
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b_g = tl.load(g_ptrs)
            b_u = tl.load(g_ptrs + up_offset)
        else:
            k_in = rk < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_in[None, :], other=0.0)
            b_g = tl.load(g_ptrs, mask=k_in[:, None], other=0.0)
            b_u = tl.load(g_ptrs + up_offset, mask=k_in[:, None], other=0.0)
        if UPCAST:
            a, b_g, b_u = a.to(tl.float32), b_g.to(tl.float32), b_u.to(tl.float32)
        acc_g = tl.dot(a, b_g, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, b_u, acc_u, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
    g = acc_g.to(gu_ptr.dtype.element_ty)
    u = acc_u.to(gu_ptr.dtype.element_ty)
    m = (rm < M)[:, None] & (rn < I)[None, :]
    gu_off = rm.to(tl.int64)[:, None] * (2 * I) + rn[None, :]
    tl.store(gu_ptr + gu_off, g, mask=m)
    tl.store(gu_ptr + gu_off + I, u, mask=m)
    g32 = g.to(tl.float32)
    h = g32 * tl.sigmoid(g32) * u.to(tl.float32)
    tl.store(h_ptr + rm.to(tl.int64)[:, None] * I + rn[None, :], h.to(h_ptr.dtype.element_ty), mask=m)


@triton.jit
def _down_silu_bwd_kernel(dy_ptr, wd_ptr, gu_ptr, dgu_ptr, M, I, D,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                          UPCAST: tl.constexpr):
    """``dy [M, D]``, ``wd [D, I]``, ``gu [M, 2I]`` -> ``dgu [M, 2I]``, the activation's backward of
    ``dh = dy wd`` (rounded to ``dgu``'s dtype first, as the split path's GEMM output is)."""
    rm, rn = _tile(M, I, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = dy_ptr + (rm % M).to(tl.int64)[:, None] * D + rk[None, :]
    b_ptrs = wd_ptr + rk.to(tl.int64)[:, None] * I + (rn % I)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(D, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_in = rk < D - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_in[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_in[:, None], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * I
    dh = acc.to(dgu_ptr.dtype.element_ty).to(tl.float32)
    m = (rm < M)[:, None] & (rn < I)[None, :]
    gu_off = rm.to(tl.int64)[:, None] * (2 * I) + rn[None, :]
    g = tl.load(gu_ptr + gu_off, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + gu_off + I, mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    tl.store(dgu_ptr + gu_off, (dh * u * s * (1.0 + g * (1.0 - s))).to(dgu_ptr.dtype.element_ty), mask=m)
    tl.store(dgu_ptr + gu_off + I, (dh * g * s).to(dgu_ptr.dtype.element_ty), mask=m)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # (tf32 is ignored for 16-bit inputs)


def _launch(kernel, cfg: GemmConfig, M: int, N: int, K: int, dtype: torch.dtype, *args) -> None:
    # Triton's interpreter multiplies bf16 tl.dot operands as their raw bit patterns (triton-lang/triton#11584, not
    # supported there): there the bf16 tiles are widened to fp32 first, the same exact products the GPU's MMA forms
    upcast = dtype == torch.bfloat16 and interpreting()
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    kernel[grid](*args, M, N, K, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                 EVEN_K=K % cfg.block_k == 0, PRECISION="ieee" if upcast else _precision(dtype), UPCAST=upcast,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def gate_up_silu(x_MK: torch.Tensor, w_2IK: torch.Tensor,
                 cfg: GemmConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gu [M, 2I], h [M, I])`` of contiguous ``x [M, K]`` and ``w [2I, K]`` of one dtype."""
    M, K = x_MK.shape
    I = w_2IK.shape[0] // 2
    gu = torch.empty(M, 2 * I, dtype=x_MK.dtype, device=x_MK.device)
    h = torch.empty(M, I, dtype=x_MK.dtype, device=x_MK.device)
    if M and I:
        if K == 0:
            gu.zero_()
            h.zero_()
        else:
            _launch(_gate_up_silu_kernel, cfg or pick_config("fwd", x_MK.device), M, I, K, x_MK.dtype,
                    x_MK, w_2IK, gu, h)
    return gu, h


def down_silu_bwd(dy_MD: torch.Tensor, wd_DI: torch.Tensor, gu_M2I: torch.Tensor,
                  cfg: GemmConfig | None = None) -> torch.Tensor:
    """``d gate_up [M, 2I]`` from contiguous ``dy [M, D]``, ``wd [D, I]`` and the saved ``gu [M, 2I]``."""
    M, D = dy_MD.shape
    I = wd_DI.shape[1]
    dgu = torch.empty_like(gu_M2I)
    if M and I:
        if D == 0:
            dgu.zero_()
        else:
            _launch(_down_silu_bwd_kernel, cfg or pick_config("bwd", dy_MD.device), M, I, D, dy_MD.dtype,
                    dy_MD, wd_DI, gu_M2I, dgu)
    return dgu


class SwiGLUGemmFunction(torch.autograd.Function):
    """``(x [..., K], w_gu [2I, K], w_down [D, I]) -> y [..., D]``: the dense SwiGLU with the activation inside the
    gate/up GEMM (forward) and inside the ``dh`` GEMM (backward). Under autocast every matmul runs in autocast's
    dtype (as ``F.linear`` does); gradients come back in each input's own dtype."""

    @staticmethod
    def forward(ctx, x, w_gu, w_down):
        cdt = matmul_dtype(x)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(cdt).contiguous()
        wgu = w_gu.to(cdt).contiguous()
        wd = w_down.to(cdt).contiguous()
        gu, h = gate_up_silu(x2, wgu)
        y = h @ wd.t()
        ctx.save_for_backward(x2, gu, h, wgu, wd)
        ctx.shape, ctx.dtypes = shape, (x.dtype, w_gu.dtype, w_down.dtype)
        return y.view(*shape[:-1], wd.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, gu, h, wgu, wd = ctx.saved_tensors
        x_dt, wgu_dt, wd_dt = ctx.dtypes
        dy2 = dy.reshape(-1, wd.shape[0]).to(x2.dtype).contiguous()
        need_x, need_wgu, need_wd = ctx.needs_input_grad
        dgu = down_silu_bwd(dy2, wd, gu) if need_x or need_wgu else None
        dx = (dgu @ wgu).view(ctx.shape).to(x_dt) if need_x else None
        dwgu = (dgu.t() @ x2).to(wgu_dt) if need_wgu else None
        dwd = (dy2.t() @ h).to(wd_dt) if need_wd else None
        return dx, dwgu, dwd
