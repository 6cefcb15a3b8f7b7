"""Token embedding with a deterministic Triton backward: ``out = weight[ids]``, ``dweight[v] = sum_{ids_t = v} dout_t``.

PyTorch's CUDA embedding backward sorts the ids too, then reduces through several generic kernels (0.46 ms a step of
the small hybrid's 8 x 4096 tokens, H200, session 34 call7). Here, after one stable sort of the ids (``perm`` the
token order, so every sum runs in token order and the result is bit-for-bit reproducible):

- ``_embed_rows_kernel``: one program per chunk of ``CHUNK`` sorted positions sums each run of equal ids in fp32, in
  order. A run that begins and ends inside the chunk is written to its weight row (no other program touches that
  row); the chunk's first run, when it continues from the chunk before, and its last run, when it starts here and
  goes on into the next chunk, go to a boundary buffer ``part [chunks, 2, D]``.
- ``_embed_join_kernel``: one program per chunk whose last run starts there and goes on: that run's partial sum plus
  the continuing partials of the following chunks, in order, to its row. A frequent id spanning many chunks costs its
  program one ``D``-vector read per chunk, so skewed (Zipf) ids stay balanced across the first kernel's programs.

Rows of ids that do not occur are zero (the gradient starts as zeros). The forward is PyTorch's gather. Measured
(H200, session 35 call8): the small hybrid's embedding kernels 0.448 -> 0.105 ms a step.
``KVL_EMBEDDING_BACKEND=torch`` (or the ``backend`` argument) keeps PyTorch's backward; it is the default off CUDA.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["embedding", "embedding_backward", "resolve_backend"]

CHUNK = 32  # sorted positions a program of the first kernel
BLOCK_D = 256  # feature columns a program (the grid's second axis)
NUM_WARPS = 4


@triton.jit
def _embed_rows_kernel(ids_ptr, perm_ptr, dout_ptr, dw_ptr, part_ptr, T, D, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    c = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = cols < D
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, T)
    run_id = tl.load(ids_ptr + start)
    # 1 while the run being summed is the chunk's first and began in the chunk before
    from_before = tl.where((start > 0) & (tl.load(ids_ptr + tl.maximum(start - 1, 0)) == run_id), 1, 0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(start, end):
        tok = tl.load(perm_ptr + i).to(tl.int64)
        acc += tl.load(dout_ptr + tok * D + cols, mask=d_ok, other=0.0).to(tl.float32)
        nxt = tl.load(ids_ptr + tl.minimum(i + 1, T - 1))
        ends_here = (i + 1 >= T) | (nxt != run_id)
        if ends_here | (i + 1 == end):
            if from_before == 1:  # begun in an earlier chunk: the joining program adds it
                tl.store(part_ptr + (c * 2) * D + cols, acc, mask=d_ok)
            elif ends_here:  # begun and ended here: this program owns the row
                tl.store(dw_ptr + run_id.to(tl.int64) * D + cols, acc.to(dw_ptr.dtype.element_ty), mask=d_ok)
            else:  # begun here, continued in the next chunk
                tl.store(part_ptr + (c * 2 + 1) * D + cols, acc, mask=d_ok)
            acc = tl.zeros([BLOCK_D], dtype=tl.float32)
            run_id = nxt
            from_before = from_before * 0


@triton.jit
def _embed_join_kernel(ids_ptr, dw_ptr, part_ptr, T, D, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    c = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = cols < D
    end = tl.minimum((c + 1) * CHUNK, T)
    last = tl.load(ids_ptr + end - 1)
    goes_on = (end < T) & (tl.load(ids_ptr + tl.minimum(end, T - 1)) == last)
    # the run starts in this chunk unless the whole chunk continues a run from the chunk before
    started_here = (c == 0) | (tl.load(ids_ptr + tl.maximum(c * CHUNK - 1, 0)) != last)
    if goes_on & started_here:
        acc = tl.load(part_ptr + (c * 2 + 1) * D + cols, mask=d_ok, other=0.0)
        j = c + 1
        more = True
        while more:  # chunk j's first run continues this one; it goes on past chunk j when j ends on it
            acc += tl.load(part_ptr + (j * 2) * D + cols, mask=d_ok, other=0.0)
            j_end = tl.minimum((j + 1) * CHUNK, T)
            more = (j_end < T) & (tl.load(ids_ptr + j_end - 1) == last) & (
                tl.load(ids_ptr + tl.minimum(j_end, T - 1)) == last)
            j += 1
        tl.store(dw_ptr + last.to(tl.int64) * D + cols, acc.to(dw_ptr.dtype.element_ty), mask=d_ok)


BACKENDS = ("torch", "triton")


def resolve_backend(weight: torch.Tensor, backend: str | None = None) -> str:
    """``backend``, else ``KVL_EMBEDDING_BACKEND`` (``triton`` | ``torch``), else Triton on CUDA; a forced ``triton``
    on a CPU tensor needs ``TRITON_INTERPRET=1``."""
    forced = backend or os.environ.get("KVL_EMBEDDING_BACKEND") or None
    if forced is not None and forced not in BACKENDS:
        raise ValueError(f"kernels/embedding.py: backend (or KVL_EMBEDDING_BACKEND) must be one of {BACKENDS}, got "
                         f"{forced!r}")
    if forced == "triton" and not weight.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"kernels/embedding.py: backend 'triton' on a {weight.device} tensor needs TRITON_INTERPRET=1")
    return forced or ("triton" if weight.is_cuda else "torch")


def embedding_backward(ids: torch.Tensor, dout: torch.Tensor, num_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """``dweight [num_rows, D]`` in ``dtype`` from ``ids [*]`` and ``dout [*, D]`` (the kernels above): each id's rows
    of ``dout`` summed in token order in fp32, rounded once; zero rows for ids that do not occur."""
    d = dout.shape[-1]
    flat_ids, flat = ids.reshape(-1), dout.reshape(-1, d).contiguous()
    t = flat_ids.numel()
    dw = torch.zeros(num_rows, d, dtype=dtype, device=dout.device)
    if t == 0:
        return dw
    sorted_ids, perm = torch.sort(flat_ids, stable=True)
    chunks = triton.cdiv(t, CHUNK)
    part = torch.empty(chunks, 2, d, dtype=torch.float32, device=dout.device)
    grid = (chunks, triton.cdiv(d, BLOCK_D))
    _embed_rows_kernel[grid](sorted_ids, perm, flat, dw, part, t, d, CHUNK=CHUNK, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
    _embed_join_kernel[grid](sorted_ids, dw, part, t, d, CHUNK=CHUNK, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
    return dw


class EmbeddingFunction(torch.autograd.Function):
    """``apply(ids, weight) -> weight[ids]`` with :func:`embedding_backward` as the weight's gradient."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows, ctx.dtype = weight.shape[0], weight.dtype
        return torch.nn.functional.embedding(ids, weight)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        (ids,) = ctx.saved_tensors
        return None, embedding_backward(ids, dout, ctx.rows, ctx.dtype)


def embedding(ids: torch.Tensor, weight: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``weight[ids]`` (``ids`` int32/int64 ``[*]``, ``weight [V, D]``), differentiable in ``weight``: on the Triton
    backend (see :func:`resolve_backend`) its gradient comes from the kernels above, on ``torch`` from
    ``F.embedding``'s own backward. Ids must lie in ``[0, V)`` (not checked on the GPU, as ``F.embedding``)."""
    if ids.dtype not in (torch.int32, torch.int64) or weight.dim() != 2:
        raise ValueError(f"kernels/embedding.embedding: ids must be int32/int64 and weight [V, D], got ids {ids.dtype} "
                         f"and weight {tuple(weight.shape)}")
    if (resolve_backend(weight, backend) == "torch" or not (torch.is_grad_enabled() and weight.requires_grad)
            or type(weight).__name__ == "DTensor"):  # a still-sharded FSDP2 parameter: DTensor's own dispatch
        return torch.nn.functional.embedding(ids, weight)
    return EmbeddingFunction.apply(ids, weight)
