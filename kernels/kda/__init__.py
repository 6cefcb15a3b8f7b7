"""Kimi Delta Attention (KDA) operators: ``chunk_kda`` (training/prefill) and ``fused_recurrent_kda`` (decode).

Public API of ``docs/INTERFACES.md``, argument-compatible with flash-linear-attention's
``fla.ops.kda``; the maths is ``../shared/REFERENCE.md`` section 1. One dispatch point: ``backend``
argument, else ``KVL_KDA_BACKEND`` (``triton`` | ``torch``), else Triton on CUDA and PyTorch on CPU.

Example::

    import torch
    from kernels.kda import chunk_kda
    B, T, H, K = 1, 100, 2, 32
    q, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K))  # log-decay <= 0
    beta = torch.rand(B, T, H)
    o, S = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    # o [1, 100, 2, 32] (dtype of v), S [1, 2, 32, 32] fp32
"""

from __future__ import annotations

import torch

from kernels.backend import interpreting
from kernels.kda.api import preprocess, resolve_backend, validate
from kernels.kda.chunk_torch import chunk_kda_torch, pack_varlen, recurrent_kda_torch, unpack_varlen
from kernels.kda.naive import kda_gate_ref, l2norm_ref, naive_chunk_kda, naive_recurrent_kda

__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "kda_gate_ref",
    "l2norm_ref",
    "naive_chunk_kda",
    "naive_recurrent_kda",
]


def _torch_path(core, q, k, v, g, beta, scale, initial_state, cu_seqlens, shapes, flags):
    """Pre-process (L2 norm, gate), expand grouped heads, pad varlen sequences, run ``core``."""
    q, k, g = preprocess(q, k, g, *flags)
    rep = shapes.HV // shapes.H
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    if cu_seqlens is None:
        return core(q, k, v, g, beta, scale, initial_state)
    packed = [pack_varlen(x, cu_seqlens) for x in (q, k, v, g, beta)]
    flat = packed[0][1]
    o, S = core(*(p[0] for p in packed), scale, initial_state)
    return unpack_varlen(o, flat), S


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KDA over whole sequences, differentiable in every tensor input.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` (HV a multiple of H); g ``[B, T, HV, K]``: log-decay (<= 0), or
    the raw gate pre-activation when ``use_gate_in_kernel`` (then ``A_log [HV]``, ``dt_bias [HV*K]`` and, for
    the sigmoid gate, ``lower_bound`` in [-5, 0)); beta ``[B, T, HV]``; ``initial_state [N, HV, K, V]`` fp32;
    ``cu_seqlens [N + 1]`` int (B must be 1). ``scale`` defaults to ``K ** -0.5``.
    Returns ``o [B, T, HV, V]`` in v's dtype and the final state ``[N, HV, K, V]`` fp32 (or None).
    """
    shapes = validate(
        "chunk_kda", q, k, v, g, beta, initial_state, cu_seqlens, use_gate_in_kernel, A_log, dt_bias, lower_bound
    )
    scale = shapes.K**-0.5 if scale is None else float(scale)
    which = resolve_backend(backend, q.device, "chunk_kda")
    flags = (use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    if which == "triton":
        from kernels.kda.chunk_triton import chunk_kda_triton

        ins = (q, k, v, g, beta)
        if interpreting():  # the interpreter multiplies bf16 tl.dot operands as raw bits (triton-lang/triton#11584)
            ins = tuple(t.float() if t.dtype == torch.bfloat16 else t for t in ins)
        o, S = chunk_kda_triton(*ins, scale, initial_state, cu_seqlens, flags)
    else:
        o, S = _torch_path(chunk_kda_torch, q, k, v, g, beta, scale, initial_state, cu_seqlens, shapes, flags)
    out_dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    return o.to(v.dtype), (S.to(out_dt) if output_final_state else None)


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token KDA (decode; typically T = 1). Same arguments and shapes as :func:`chunk_kda`, plus:

    ``ssm_state_indices [N]`` int: ``initial_state`` is then a state pool ``[P, HV, K, V]`` fp32; sequence n
    starts from ``pool[ssm_state_indices[n]]``, and when ``output_final_state`` its final state is written back
    into that slot in place and the returned state is the pool itself. Without indices the final state is a new
    ``[N, HV, K, V]`` fp32 tensor. The Triton path is forward-only; the PyTorch path is differentiable.
    """
    shapes = validate(
        "fused_recurrent_kda",
        q,
        k,
        v,
        g,
        beta,
        initial_state,
        cu_seqlens,
        use_gate_in_kernel,
        A_log,
        dt_bias,
        lower_bound,
        ssm_state_indices,
    )
    scale = shapes.K**-0.5 if scale is None else float(scale)
    which = resolve_backend(backend, q.device, "fused_recurrent_kda")
    flags = (use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    if which == "triton":
        from kernels.kda.recurrent_triton import fused_recurrent_kda_triton

        o, S = fused_recurrent_kda_triton(
            q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices, flags
        )
        return o, S
    h0 = initial_state
    if ssm_state_indices is not None:
        h0 = initial_state.index_select(0, ssm_state_indices.to(torch.long))
    o, S = _torch_path(recurrent_kda_torch, q, k, v, g, beta, scale, h0, cu_seqlens, shapes, flags)
    if not output_final_state:
        return o.to(v.dtype), None
    if ssm_state_indices is not None:
        with torch.no_grad():
            initial_state.index_copy_(0, ssm_state_indices.to(torch.long), S.to(initial_state.dtype))
        return o.to(v.dtype), initial_state
    out_dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    return o.to(v.dtype), S.to(out_dt)
