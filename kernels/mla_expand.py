"""``expand_kv``: MLA's per-head keys and values from the up-projected latent, as one autograd node.

MLA (``kimi_vl/modeling/attention.py``) up-projects the latent to ``kv [B, S, H, dn + dv]`` per head and shares one
``k_rope [B, S, dr]`` across heads: ``k = [kv[..., :dn] | k_rope]`` ``[B, S, H, dn + dr]``, ``v = kv[..., dn:]``.
In PyTorch that is a ``split``, an ``expand`` and a ``cat``; the backward is a ``cat`` of ``dk[..., :dn]`` and
``dv`` (the ``split``'s backward) and a sum over heads of ``dk[..., dn:]`` (the ``expand``'s). ATen's concatenation
kernel ran at 0.7-1.1 TB/s for these shapes on an H200 (the small flavor's profile: 6 calls, 1.1 ms a training
step; ``docs/results/gpu-2026-11-29-s29/``). Here one Triton kernel writes ``k`` (``v`` stays a view of ``kv``),
and one writes ``dkv`` and ``dk_rope`` together; the PyTorch form is the reference and the CPU path.

One dispatch point: ``backend`` argument, else ``KVL_MLA_EXPAND_BACKEND`` (``triton`` | ``torch``), else Triton
on CUDA and PyTorch elsewhere (``kernels.backend.choose_backend``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import choose_backend

__all__ = ["expand_kv", "expand_kv_reference"]

# tokens a program (both kernels; the columns: a whole head part, padded to a power of two). ptxas (sm_90a, bf16,
# heads of 128 + 64 | 128): 8 tokens 64 / 114 registers (forward / backward), 16 tokens 164 / 242, 32 spill
BLOCK_S = 8
NUM_WARPS = 4


def expand_kv_reference(kv_BSHE: torch.Tensor, krope_BSd: torch.Tensor, nope_dim: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch form (the specification): ``(k [B, S, H, dn + dr] contiguous, v [B, S, H, dv] a view)``."""
    b, s, h, _ = kv_BSHE.shape
    k_nope, v = torch.split(kv_BSHE, [nope_dim, kv_BSHE.shape[-1] - nope_dim], dim=-1)
    k_rope = krope_BSd[:, :, None, :].expand(b, s, h, krope_BSd.shape[-1])
    return torch.cat([k_nope, k_rope], dim=-1), v


@triton.jit
def _expand_fwd_kernel(kv_ptr, kr_ptr, k_ptr, S, H,
                       s_kv_b, s_kv_s, s_kv_h, s_kr_b, s_kr_s, s_k_b, s_k_s, s_k_h,
                       DN: tl.constexpr, DR: tl.constexpr, BLOCK_S: tl.constexpr, BN: tl.constexpr,
                       BR: tl.constexpr):
    """Program ``(s block, b)``: every head's ``k[b, s, h] = [kv[b, s, h, :DN] | kr[b, s]]``."""
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_ok = rows < S
    cn, cr = tl.arange(0, BN), tl.arange(0, BR)
    n_ok = row_ok[:, None] & (cn < DN)[None, :]
    r_ok = row_ok[:, None] & (cr < DR)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    rope = tl.load(kr_ptr + b * s_kr_b + rows64 * s_kr_s + cr[None, :], mask=r_ok, other=0.0)
    kv_rows = kv_ptr + b * s_kv_b + rows64 * s_kv_s
    k_rows = k_ptr + b * s_k_b + rows64 * s_k_s
    for h in range(H):
        nope = tl.load(kv_rows + h * s_kv_h + cn[None, :], mask=n_ok, other=0.0)
        tl.store(k_rows + h * s_k_h + cn[None, :], nope, mask=n_ok)
        tl.store(k_rows + h * s_k_h + DN + cr[None, :], rope.to(nope.dtype), mask=r_ok)


@triton.jit
def _expand_bwd_kernel(dk_ptr, dv_ptr, dkv_ptr, dkr_ptr, S, H,
                       s_dk_b, s_dk_s, s_dk_h, s_dv_b, s_dv_s, s_dv_h, s_kv_b, s_kv_s, s_kv_h, s_kr_b, s_kr_s,
                       DN: tl.constexpr, DV: tl.constexpr, DR: tl.constexpr, BLOCK_S: tl.constexpr,
                       BN: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):
    """Program ``(s block, b)``: ``dkv[b, s, h] = [dk[b, s, h, :DN] | dv[b, s, h]]`` for every head and
    ``dkr[b, s] = sum_h dk[b, s, h, DN:]`` (fp32 sum)."""
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    row_ok = rows < S
    cn, cv, cr = tl.arange(0, BN), tl.arange(0, BV), tl.arange(0, BR)
    n_ok = row_ok[:, None] & (cn < DN)[None, :]
    v_ok = row_ok[:, None] & (cv < DV)[None, :]
    r_ok = row_ok[:, None] & (cr < DR)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    dk_rows = dk_ptr + b * s_dk_b + rows64 * s_dk_s
    dv_rows = dv_ptr + b * s_dv_b + rows64 * s_dv_s
    dkv_rows = dkv_ptr + b * s_kv_b + rows64 * s_kv_s
    acc = tl.zeros([BLOCK_S, BR], dtype=tl.float32)
    for h in range(H):
        tl.store(dkv_rows + h * s_kv_h + cn[None, :],
                 tl.load(dk_rows + h * s_dk_h + cn[None, :], mask=n_ok, other=0.0), mask=n_ok)
        tl.store(dkv_rows + h * s_kv_h + DN + cv[None, :],
                 tl.load(dv_rows + h * s_dv_h + cv[None, :], mask=v_ok, other=0.0), mask=v_ok)
        acc += tl.load(dk_rows + h * s_dk_h + DN + cr[None, :], mask=r_ok, other=0.0).to(tl.float32)
    tl.store(dkr_ptr + b * s_kr_b + rows64 * s_kr_s + cr[None, :], acc.to(dkr_ptr.dtype.element_ty), mask=r_ok)


def _grid(b: int, s: int) -> tuple[int, int]:
    return triton.cdiv(s, BLOCK_S), b


def _expand_fwd(kv: torch.Tensor, kr: torch.Tensor, dn: int) -> torch.Tensor:
    b, s, h, _ = kv.shape
    dr = kr.shape[-1]
    k = torch.empty(b, s, h, dn + dr, device=kv.device, dtype=kv.dtype)
    _expand_fwd_kernel[_grid(b, s)](
        kv, kr, k, s, h, kv.stride(0), kv.stride(1), kv.stride(2), kr.stride(0), kr.stride(1),
        k.stride(0), k.stride(1), k.stride(2), DN=dn, DR=dr, BLOCK_S=BLOCK_S, BN=triton.next_power_of_2(dn),
        BR=triton.next_power_of_2(dr), num_warps=NUM_WARPS)
    return k


def _expand_bwd(dk: torch.Tensor, dv: torch.Tensor, dn: int, kr_dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, h, dq = dk.shape
    dvd, dr = dv.shape[-1], dq - dn
    dkv = torch.empty(b, s, h, dn + dvd, device=dk.device, dtype=dk.dtype)
    dkr = torch.empty(b, s, dr, device=dk.device, dtype=kr_dtype)
    _expand_bwd_kernel[_grid(b, s)](
        dk, dv, dkv, dkr, s, h, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        dkv.stride(0), dkv.stride(1), dkv.stride(2), dkr.stride(0), dkr.stride(1),
        DN=dn, DV=dvd, DR=dr, BLOCK_S=BLOCK_S, BN=triton.next_power_of_2(dn), BV=triton.next_power_of_2(dvd),
        BR=triton.next_power_of_2(dr), num_warps=NUM_WARPS)
    return dkv, dkr


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class ExpandKV(torch.autograd.Function):
    """``(kv [B, S, H, dn + dv], k_rope [B, S, dr], dn) -> (k [B, S, H, dn + dr], v = kv[..., dn:])``."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, krope: torch.Tensor, dn: int):
        ctx.dn, ctx.dr, ctx.dv, ctx.kr_dtype = dn, krope.shape[-1], kv.shape[-1] - dn, krope.dtype
        ctx.set_materialize_grads(False)
        return _expand_fwd(kv, krope, dn), kv[..., dn:]

    @staticmethod
    def backward(ctx, dk: torch.Tensor | None, dv: torch.Tensor | None):
        if dk is None and dv is None:
            return None, None, None
        like = dk if dk is not None else dv
        b, s, h = like.shape[:3]
        if dk is None:  # only v reached the loss: the keys' part is zero
            dk = like.new_zeros(b, s, h, ctx.dn + ctx.dr)
        if dv is None:
            dv = like.new_zeros(b, s, h, ctx.dv)
        dkv, dkr = _expand_bwd(_last_dim_contiguous(dk), _last_dim_contiguous(dv), ctx.dn, ctx.kr_dtype)
        return dkv, dkr, None


def expand_kv(kv_BSHE: torch.Tensor, krope_BSd: torch.Tensor, nope_dim: int, backend: str | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k [B, S, H, dn + dr], v [B, S, H, dv])`` of :func:`expand_kv_reference`, differentiable in both inputs;
    ``k`` contiguous, ``v`` a view of ``kv_BSHE``. Inputs: ``kv_BSHE [B, S, H, dn + dv]`` and ``krope_BSd [B, S,
    dr]``, any strides (a last dimension that is not contiguous is copied first). The Triton path takes one dtype
    and ``dr > 0``; otherwise the reference runs (mixed dtypes promote as ``torch.cat`` does)."""
    if kv_BSHE.dim() != 4 or krope_BSd.dim() != 3 or kv_BSHE.shape[:2] != krope_BSd.shape[:2] \
            or not 0 < nope_dim < kv_BSHE.shape[-1]:
        raise ValueError(f"expand_kv (kernels/mla_expand.py): kv must be [B, S, H, dn + dv] and k_rope [B, S, dr] "
                         f"with 0 < dn={nope_dim} < dn + dv, got kv {tuple(kv_BSHE.shape)}, k_rope "
                         f"{tuple(krope_BSd.shape)}")
    if choose_backend(backend, kv_BSHE.device, "expand_kv", "kernels/mla_expand.py",
                      "KVL_MLA_EXPAND_BACKEND") == "torch" or kv_BSHE.dtype != krope_BSd.dtype \
            or krope_BSd.shape[-1] == 0 or kv_BSHE.numel() == 0:
        return expand_kv_reference(kv_BSHE, krope_BSd, nope_dim)  # (mixed dtypes: the concatenation promotes)
    return ExpandKV.apply(_last_dim_contiguous(kv_BSHE), _last_dim_contiguous(krope_BSd), nope_dim)
