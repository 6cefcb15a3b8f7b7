"""Fused elementwise passes of the Muon step (Triton), each beside its plain PyTorch reference.

Source: the Muon update of REFERENCE.md section 4; these kernels only remove memory traffic, not maths.
Per step, an fp32 ~1.2B-parameter Muon set moves ~100 GB through separate PyTorch kernels
(``buf.mul_().add_()``, the Nesterov ``add``, ``torch.cat`` into batches, fp32 normalisation, a cast,
``p.mul_()``, a cast of the update, ``p.add_()``). Two kernels do the same in ~30 GB:

- :func:`momentum_to_batch`: ``buf <- mu buf + g`` (stored in the buffer's dtype), the Nesterov direction
  ``u = g + mu buf`` written straight into the Newton-Schulz batch in its compute dtype (bf16), plus
  per-block partial sums of ``u^2`` (fp32, from the unrounded ``u``) so the Frobenius norm needs no extra pass.
  ``g``, ``buf`` ``[E, A, B]`` contiguous; ``out`` ``[E, A, B]`` contiguous; ``partial_EK`` ``[E, K]`` fp32 with
  ``K = cdiv(A*B, BLOCK)``.
- :func:`apply_update`: ``p <- p (1 - lr wd) - lr * scale * O`` reading the bf16 ``O`` directly (no cast copy).

The references (:func:`momentum_to_batch_reference`, :func:`apply_update_reference`) are the specification;
the Triton versions differ only by rounding order (fp32 FMA), far below bf16 Newton-Schulz tolerance.
Under ``TRITON_INTERPRET=1`` the kernels also run on CPU tensors (the tests use that).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a hard dependency on GPU machines
    triton = None

BLOCK = 2048
_WHERE = "kernels/muon/fused.py"


def triton_available() -> bool:
    return triton is not None


def partial_blocks(numel_per_matrix: int) -> int:
    """Number of partial sums per matrix (``K``) for :func:`momentum_to_batch`."""
    return -(-numel_per_matrix // BLOCK)


if triton is not None:

    @triton.jit
    def _momentum_kernel(g_ptr, buf_ptr, out_ptr, part_ptr, numel, n_blocks, mu, NESTEROV: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr):
        blk = tl.program_id(0)
        e = tl.program_id(1).to(tl.int64)
        offs = blk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < numel
        base = e * numel
        g = tl.load(g_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(buf_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        b_st = (b * mu + g).to(buf_ptr.dtype.element_ty)
        tl.store(buf_ptr + base + offs, b_st, mask=mask)
        if NESTEROV:
            u = g + mu * b_st.to(tl.float32)
        else:
            u = b_st.to(tl.float32)
        tl.store(out_ptr + base + offs, u.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(part_ptr + e * n_blocks + blk, tl.sum(u * u, axis=0))

    @triton.jit
    def _apply_kernel(p_ptr, o_ptr, numel, decay, alpha, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < numel
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
        o = tl.load(o_ptr + offs, mask=mask).to(tl.float32)
        p = (p * decay).to(p_ptr.dtype.element_ty).to(tl.float32)
        tl.store(p_ptr + offs, (p + alpha * o).to(p_ptr.dtype.element_ty), mask=mask)


def _check_contiguous(where: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{_WHERE} {where}: {name} must be contiguous, got strides {t.stride()}")


def momentum_to_batch(g_EAB: torch.Tensor, buf_EAB: torch.Tensor, out_EAB: torch.Tensor, partial_EK: torch.Tensor,
                      mu: float, nesterov: bool) -> None:
    """Triton: momentum in place, Nesterov direction into ``out`` (its dtype), partial sums of squares."""
    if triton is None:
        raise ValueError(f"{_WHERE}: momentum_to_batch needs triton")
    if not (g_EAB.shape == buf_EAB.shape == out_EAB.shape) or g_EAB.dim() != 3:
        raise ValueError(f"{_WHERE} momentum_to_batch: g, buf, out must be one [E, A, B] shape, got "
                         f"{tuple(g_EAB.shape)}, {tuple(buf_EAB.shape)}, {tuple(out_EAB.shape)}")
    E, A, B = g_EAB.shape
    K = partial_blocks(A * B)
    if partial_EK.shape != (E, K) or partial_EK.dtype != torch.float32:
        raise ValueError(f"{_WHERE} momentum_to_batch: partial must be fp32 [{E}, {K}], got "
                         f"{partial_EK.dtype} {tuple(partial_EK.shape)}")
    _check_contiguous("momentum_to_batch", g=g_EAB, buf=buf_EAB, out=out_EAB, partial=partial_EK)
    _momentum_kernel[(K, E)](g_EAB, buf_EAB, out_EAB, partial_EK, A * B, K, float(mu), NESTEROV=bool(nesterov),
                             BLOCK_SIZE=BLOCK, num_warps=8)


def momentum_launch(g: torch.Tensor, buf: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, E: int, K: int,
                    mu: float, nesterov: bool) -> None:
    """:func:`momentum_to_batch` without the checks, for arguments validated once (the step's cached plan)."""
    _momentum_kernel[(K, E)](g, buf, out, partial, buf.numel() // E, K, float(mu), NESTEROV=bool(nesterov),
                             BLOCK_SIZE=BLOCK, num_warps=8)


def momentum_to_batch_reference(g_EAB: torch.Tensor, buf_EAB: torch.Tensor, out_EAB: torch.Tensor,
                                partial_EK: torch.Tensor, mu: float, nesterov: bool) -> None:
    """PyTorch specification of :func:`momentum_to_batch` (partial sums: the whole sum in column 0)."""
    buf_EAB.mul_(mu).add_(g_EAB)
    u = g_EAB.float() + mu * buf_EAB.float() if nesterov else buf_EAB.float()
    out_EAB.copy_(u)
    partial_EK.zero_()
    partial_EK[:, 0] = u.pow(2).sum(dim=(-2, -1))


def apply_update(p: torch.Tensor, O: torch.Tensor, lr: float, weight_decay: float, scale: float) -> None:
    """Triton: ``p <- p (1 - lr wd) - lr * scale * O`` in place; ``O`` any float dtype, same numel, contiguous."""
    if triton is None:
        raise ValueError(f"{_WHERE}: apply_update needs triton")
    if p.numel() != O.numel():
        raise ValueError(f"{_WHERE} apply_update: p {tuple(p.shape)} and O {tuple(O.shape)} differ in size")
    _check_contiguous("apply_update", p=p, O=O)
    n = p.numel()
    _apply_kernel[(triton.cdiv(n, BLOCK),)](p, O, n, 1.0 - lr * weight_decay, -lr * scale, BLOCK_SIZE=BLOCK,
                                            num_warps=8)


def apply_update_reference(p: torch.Tensor, O: torch.Tensor, lr: float, weight_decay: float, scale: float) -> None:
    """PyTorch specification of :func:`apply_update`."""
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    p.add_(O.reshape(p.shape), alpha=-lr * scale)
