"""Input validation, backend choice and the shared pre-processing of the public KDA operators.

The contract is ``docs/INTERFACES.md`` ("KDA operator"); shapes are those of ``../shared/REFERENCE.md``
section 1: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]``;
states ``[N, HV, K, V]`` fp32; ``cu_seqlens [N + 1]`` int with B = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.backend import choose_backend
from kernels.host_ints import host_ints
from kernels.kda.naive import kda_gate_ref, l2norm_ref


@dataclass(frozen=True)
class KDAShapes:
    B: int
    T: int
    H: int
    K: int
    HV: int
    V: int
    N: int  # number of sequences (B, or len(cu_seqlens) - 1)


def _fail(fn: str, msg: str) -> None:
    raise ValueError(f"{fn} (kernels/kda): {msg}")


def resolve_backend(backend: str | None, device: torch.device, fn: str) -> str:
    """Explicit argument, else ``KVL_KDA_BACKEND``, else Triton on CUDA and PyTorch elsewhere."""
    return choose_backend(backend, device, fn, "kernels/kda", "KVL_KDA_BACKEND")


def validate(
    fn: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
    ssm_state_indices: torch.Tensor | None = None,
) -> KDAShapes:
    """Check every shape and dtype; raise ValueError naming what was received."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g)):
        if t.dim() != 4:
            _fail(fn, f"{name} must be 4-D, got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            _fail(fn, f"{name} must be floating point, got {t.dtype}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape != q.shape:
        _fail(fn, f"k shape {tuple(k.shape)} must equal q shape {tuple(q.shape)} [B, T, H, K]")
    if v.shape[:2] != (B, T):
        _fail(fn, f"v shape {tuple(v.shape)} must be [B={B}, T={T}, HV, V]")
    if H == 0 or HV % H:
        _fail(fn, f"value heads HV={HV} (v {tuple(v.shape)}) must be a multiple of H={H} (q {tuple(q.shape)})")
    if g.shape != (B, T, HV, K):
        _fail(fn, f"g shape {tuple(g.shape)} must be [B, T, HV, K] = {(B, T, HV, K)}")
    if beta.shape != (B, T, HV):
        _fail(fn, f"beta shape {tuple(beta.shape)} must be [B, T, HV] = {(B, T, HV)}")
    if K == 0 or V == 0:
        _fail(fn, f"head dims must be positive, got K={K}, V={V}")
    N = B if cu_seqlens is None else _check_cu_seqlens(fn, cu_seqlens, B, T)
    _check_gate(fn, use_gate_in_kernel, A_log, dt_bias, lower_bound, HV, K)
    if initial_state is not None:
        pool = ssm_state_indices is not None
        want_n = initial_state.shape[0] if pool else N
        if initial_state.shape != (want_n, HV, K, V):
            _fail(fn, f"initial_state shape {tuple(initial_state.shape)} must be [N={N}, HV, K, V] = {(N, HV, K, V)}")
        if initial_state.dtype != torch.float32 and initial_state.dtype != torch.float64:
            _fail(fn, f"initial_state must be fp32 (or fp64 for checks), got {initial_state.dtype}")
    if ssm_state_indices is not None:
        _check_indices(fn, ssm_state_indices, initial_state, N)
    return KDAShapes(B, T, H, K, HV, V, N)


def _check_cu_seqlens(fn: str, cu: torch.Tensor, B: int, T: int) -> int:
    if cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point():
        _fail(fn, f"cu_seqlens must be a 1-D integer tensor [N + 1], got {cu.dtype} shape {tuple(cu.shape)}")
    if B != 1:
        _fail(fn, f"with cu_seqlens the batch size must be 1, got B={B}")
    c = host_ints(cu)
    if c[0] != 0 or c[-1] != T:
        _fail(fn, f"cu_seqlens must start at 0 and end at T={T}, got {c[:4]}...{c[-1]}")
    if any(b < a for a, b in zip(c[:-1], c[1:])):
        _fail(fn, f"cu_seqlens must be non-decreasing, got {c}")
    return cu.numel() - 1


def _check_gate(fn, use_gate, A_log, dt_bias, lower_bound, HV, K) -> None:
    if not use_gate:
        return
    if A_log is None or A_log.numel() != HV:
        _fail(fn, f"use_gate_in_kernel needs A_log [HV={HV}], got {None if A_log is None else tuple(A_log.shape)}")
    if dt_bias is not None and dt_bias.numel() != HV * K:
        _fail(fn, f"dt_bias must have HV*K = {HV * K} elements, got shape {tuple(dt_bias.shape)}")
    if lower_bound is not None and not (-5.0 <= float(lower_bound) < 0.0):
        _fail(fn, f"lower_bound must lie in [-5, 0), got {lower_bound}")


def _check_indices(fn, idx, pool, N) -> None:
    if pool is None:
        _fail(fn, "ssm_state_indices needs initial_state (the state pool [P, HV, K, V])")
    if idx.dim() != 1 or idx.numel() != N or idx.is_floating_point():
        _fail(fn, f"ssm_state_indices must be an integer tensor [N={N}], got {idx.dtype} {tuple(idx.shape)}")
    if N and (int(idx.min()) < 0 or int(idx.max()) >= pool.shape[0]):
        _fail(fn, f"ssm_state_indices must lie in [0, {pool.shape[0]}), got {idx.tolist()}")


def preprocess(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PyTorch path's version of the in-kernel options: fp32 (or fp64) L2 norm of q, k and the gate."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = q.to(cdt), k.to(cdt)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_ref(q), l2norm_ref(k)
    if use_gate_in_kernel:
        g = kda_gate_ref(g, A_log, dt_bias, lower_bound)
    return q, k, g.to(cdt)
