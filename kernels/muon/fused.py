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

Both also come grouped (:class:`MomentumGroup`, :func:`apply_update_group`): one launch for every parameter of a
step, the per-parameter addresses, sizes and factors read from an int64 / fp32 table (one pinned copy per step),
the same arithmetic per element. On a GPU the step is bound by host time per launch (~30 us in Triton's launcher,
two launches per parameter), not by its bytes.

The references (:func:`momentum_to_batch_reference`, :func:`apply_update_reference`) are the specification;
the Triton versions differ only by rounding order (fp32 FMA), far below bf16 Newton-Schulz tolerance.
Under ``TRITON_INTERPRET=1`` the kernels also run on CPU tensors (the tests use that).
"""

from __future__ import annotations

import numpy as np
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


    @triton.jit
    def _momentum_group_kernel(table_ptr, n_rows, g_like, buf_like, out_like, mu, NESTEROV: tl.constexpr,
                               BLOCK_SIZE: tl.constexpr):
        """One block of one matrix per program: ``table`` holds one row per matrix ``[g, buf, out, partial
        addresses, numel, n_blocks, first program]`` then, per program, its row; element types from the ``*_like``
        tensors."""
        pid = tl.program_id(0)
        j = tl.load(table_ptr + n_rows * 7 + pid)
        row = table_ptr + j * 7
        blk = pid - tl.load(row + 6)
        g_ptr = tl.load(row).to(tl.pointer_type(g_like.dtype.element_ty))
        buf_ptr = tl.load(row + 1).to(tl.pointer_type(buf_like.dtype.element_ty))
        out_ptr = tl.load(row + 2).to(tl.pointer_type(out_like.dtype.element_ty))
        part_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
        numel, n_blocks = tl.load(row + 4), tl.load(row + 5)
        offs = blk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < numel
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(buf_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b_st = (b * mu + g).to(buf_like.dtype.element_ty)
        tl.store(buf_ptr + offs, b_st, mask=mask)
        if NESTEROV:
            u = g + mu * b_st.to(tl.float32)
        else:
            u = b_st.to(tl.float32)
        tl.store(out_ptr + offs, u.to(out_like.dtype.element_ty), mask=mask)
        tl.store(part_ptr + blk, tl.sum(u * u, axis=0), mask=blk < n_blocks)

    @triton.jit
    def _apply_group_kernel(table_ptr, n_rows, factor_ptr, p_like, o_like, BLOCK_SIZE: tl.constexpr):
        """One block of one parameter per program: ``table`` holds one row per parameter ``[p address, O
        address, numel, first program]`` then, per program, its row; factors ``[decay, alpha]`` (fp32) in
        ``factor_ptr``."""
        pid = tl.program_id(0)
        j = tl.load(table_ptr + n_rows * 4 + pid)
        p_ptr = tl.load(table_ptr + j * 4).to(tl.pointer_type(p_like.dtype.element_ty))
        o_ptr = tl.load(table_ptr + j * 4 + 1).to(tl.pointer_type(o_like.dtype.element_ty))
        numel = tl.load(table_ptr + j * 4 + 2)
        decay, alpha = tl.load(factor_ptr + j * 2), tl.load(factor_ptr + j * 2 + 1)
        offs = (pid - tl.load(table_ptr + j * 4 + 3)).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < numel
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
        o = tl.load(o_ptr + offs, mask=mask).to(tl.float32)
        p = (p * decay).to(p_like.dtype.element_ty).to(tl.float32)
        tl.store(p_ptr + offs, (p + alpha * o).to(p_like.dtype.element_ty), mask=mask)


def _device_table(rows: list[list], dtype: torch.dtype, device: torch.device,
                  blocks: list[int] | None = None) -> torch.Tensor:
    """A small per-step table on ``device``: built on the host, one (pinned, non-blocking on CUDA) copy.
    ``blocks`` (programs per row): each row gets its first program's index as a last column, and the row index of
    every program follows the rows (a 1-D grid with no idle programs, whatever the spread of sizes)."""
    if blocks is None:
        host = torch.tensor(rows, dtype=dtype)
    else:
        counts = np.asarray(blocks, dtype=np.int64)
        first = np.cumsum(counts) - counts
        table = np.concatenate([np.asarray(rows, dtype=np.int64), first[:, None]], axis=1)
        host = torch.from_numpy(np.concatenate([table.reshape(-1), np.repeat(np.arange(len(rows)), counts)]))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


class MomentumGroup:
    """:func:`momentum_to_batch` for many parameters in one launch.

    ``add`` takes the arguments of one :func:`momentum_launch` (validated once by the caller's cached plan:
    contiguous, ``g`` and ``buf`` of one shape ``[E, A, B]``, ``out`` ``E`` matrices of ``A * B``, ``partial``
    ``[E, K]`` fp32); :meth:`launch` runs them all. Parameters are grouped by the dtypes of ``g``, ``buf`` and
    ``out`` (one launch per combination). The tensors must stay alive until the launch is queued.
    """

    def __init__(self, mu: float, nesterov: bool) -> None:
        self.mu, self.nesterov = float(mu), bool(nesterov)
        self.groups: dict[tuple, tuple[list[list[int]], list[torch.Tensor]]] = {}

    def add(self, g: torch.Tensor, buf: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, E: int, K: int) -> None:
        rows, like = self.groups.setdefault((g.dtype, buf.dtype, out.dtype, g.device), ([], [g, buf, out]))
        numel = buf.numel() // E
        for e in range(E):
            rows.append([g.data_ptr() + e * numel * g.element_size(), buf.data_ptr() + e * numel * buf.element_size(),
                         out.data_ptr() + e * numel * out.element_size(),
                         partial.data_ptr() + e * K * partial.element_size(), numel, K])

    def launch(self) -> None:
        for (_, _, _, device), (rows, like) in self.groups.items():
            blocks = [r[5] for r in rows]
            table = _device_table(rows, torch.int64, device, blocks)
            _momentum_group_kernel[(sum(blocks),)](
                table, len(rows), *like, self.mu, NESTEROV=self.nesterov, BLOCK_SIZE=BLOCK, num_warps=8)
        self.groups = {}


def apply_update_group(updates: list[tuple[torch.Tensor, torch.Tensor, float, float, float]]) -> None:
    """:func:`apply_update` for every ``(p, O, lr, weight_decay, scale)`` in one launch per (device, dtypes); the
    factors are rounded to fp32 as the per-parameter kernel's scalar arguments are. ``p`` and ``O`` contiguous,
    of equal numel (checked)."""
    groups: dict[tuple, tuple[list[list[int]], list[list[float]], list[torch.Tensor]]] = {}
    for p, O, lr, wd, scale in updates:
        if p.numel() != O.numel():
            raise ValueError(f"{_WHERE} apply_update_group: p {tuple(p.shape)} and O {tuple(O.shape)} differ in size")
        _check_contiguous("apply_update_group", p=p, O=O)
        rows, factors, _ = groups.setdefault((p.dtype, O.dtype, p.device), ([], [], [p, O]))
        rows.append([p.data_ptr(), O.data_ptr(), p.numel()])
        factors.append([1.0 - lr * wd, -lr * scale])
    for (_, _, device), (rows, factors, like) in groups.items():
        blocks = [triton.cdiv(r[2], BLOCK) for r in rows]
        table = _device_table(rows, torch.int64, device, blocks)
        factor = _device_table(factors, torch.float32, device)
        _apply_group_kernel[(sum(blocks),)](table, len(rows), factor, *like, BLOCK_SIZE=BLOCK, num_warps=8)


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
