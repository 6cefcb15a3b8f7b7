"""The KDA training backward with the L2 norm's and the gate's parts inside the core kernels
(``chunk_triton.BWD_FUSED_L2``: the core kernels read the raw q, k rows with the forward's inverse norms, the dY kernel
scaling dA by them, and the L2 backward forms the norms again from q, k; ``BWD_FUSED_GATE``: the inter kernel takes the
gate's backward, writing d g_raw with dA_log and d dt_bias partial sums). Against the PyTorch path and the unfused
Triton path (interpreter on a CPU)."""

from __future__ import annotations

import pytest
import torch
from kda_cases import make_inputs
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.kda import chunk_kda

NAMES = ("dq", "dk", "dv", "dg_raw", "dbeta", "dh0", "dA_log", "ddt_bias")


def _leaves(B, T, H, HV, K, V, dtype, qkv: bool, dtb: bool, N=None):
    """Leaf tensors (q, k, v or one q|k|v tensor, g_raw, beta, h0, A_log[, dt_bias]) on the kernels' device: q, k
    unnormalised, A_log with a slow and a fast head."""
    q, k, v, _, beta, s0 = make_inputs(B, T, H, HV, K, V, h0=True, N=N)
    raw = torch.randn(B, T, HV, K, dtype=torch.float64)
    A_log = torch.log(torch.linspace(0.03, 3.0, HV, dtype=torch.float64))
    xs = [torch.cat([3 * q, 2 * k, v], -1).flatten(2)] if qkv else [3 * q, 2 * k, v]
    xs += [raw, beta, s0, A_log] + ([torch.randn(HV * K, dtype=torch.float64)] if dtb else [])
    n_in = (1 if qkv else 3) + 1  # q, k, v (or q|k|v) and g_raw in ``dtype``; beta, h0, A_log, dt_bias in fp32
    dev = kernel_device()
    return [x.to(dev, dtype if i < n_in else torch.float32).requires_grad_() for i, x in enumerate(xs)]


def _grads(leaves, H, K, backend, lower_bound, cu, seed=1):
    """Gradients of every leaf for random upstream gradients of o and the final state."""
    if leaves[0].dim() == 3:  # one q|k|v tensor: the views the KDA layer hands the op
        q, k, v = (x.unflatten(-1, (H, K)) for x in leaves[0].chunk(3, -1))
        rest = leaves[1:]
    else:
        (q, k, v), rest = leaves[:3], leaves[3:]
    raw, beta, s0, A_log, *dtb = rest
    o, S = chunk_kda(q, k, v, raw, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                     use_gate_in_kernel=True, A_log=A_log, dt_bias=dtb[0] if dtb else None, lower_bound=lower_bound,
                     cu_seqlens=cu, backend=backend)
    gen = torch.Generator().manual_seed(seed)
    do, dS = (torch.randn(t.shape, generator=gen).to(t.device, t.dtype) for t in (o, S))
    return torch.autograd.grad([o, S], leaves, [do, dS])


CASES = [
    # B, T, H, HV, K, V, q|k|v tensor, dt_bias, lower bound, cu_seqlens
    (2, 70, 2, 2, 32, 32, True, True, None, None),
    (1, 150, 1, 2, 48, 24, False, False, -3.0, [0, 5, 70, 150]),  # grouped heads, varlen, K over two masked blocks
    (1, 81, 2, 2, 16, 16, True, False, -3.0, [0, 64, 65, 81]),  # a 1-token sequence; one inter K block
]


@pytest.mark.parametrize("B,T,H,HV,K,V,qkv,dtb,lower_bound,cu", CASES)
def test_fused_prep_backward_matches_torch_and_the_unfused_path(monkeypatch, B, T, H, HV, K, V, qkv, dtb,
                                                                 lower_bound, cu):
    """fp32: every gradient (the q|k|v tensor's or q, k, v's; g_raw, beta, h0, A_log, dt_bias) within 1e-5 of the
    PyTorch path's (dA_log, a sum over every token and channel, 5e-5) and of the unfused Triton path's."""
    interpret_without_gpu(monkeypatch)
    from kernels.kda import chunk_triton

    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=kernel_device())
    leaves = _leaves(B, T, H, HV, K, V, torch.float32, qkv, dtb, N=None if cu is None else len(cu) - 1)
    ref = _grads(leaves, H, K, "torch", lower_bound, cu_t)
    got = {}
    for l2, gate in ((True, True), (True, False), (False, True), (False, False)):
        monkeypatch.setattr(chunk_triton, "BWD_FUSED_L2", l2)
        monkeypatch.setattr(chunk_triton, "BWD_FUSED_GATE", gate)
        got[l2, gate] = _grads(leaves, H, K, "triton", lower_bound, cu_t)
    names = (("dqkv",) if qkv else NAMES[:3]) + NAMES[3:]
    for setting, grads in got.items():
        for name, a, b, c in zip(names, grads, got[False, False], ref):
            tol = 5e-5 if name == "dA_log" else 1e-5
            assert_rel_rms(a, c, tol, f"{name} {setting} vs torch")
            assert_rel_rms(a, b, tol, f"{name} {setting} vs unfused")


def test_fused_prep_backward_fp16(monkeypatch):
    """fp16 inputs (dq, dk from unrounded normalised rows, d g_raw written in g_raw's dtype by the inter kernel)
    within 2e-2 of the PyTorch path on the same inputs in fp32."""
    interpret_without_gpu(monkeypatch)
    leaves = _leaves(1, 70, 2, 2, 32, 32, torch.float16, True, True)
    got = _grads(leaves, 2, 32, "triton", None, None)
    assert got[0].dtype == torch.float16 and got[1].dtype == torch.float16  # d qkv, d g_raw
    ref = _grads([x.detach().float().requires_grad_() for x in leaves], 2, 32, "torch", None, None)
    for name, a, b in zip(("dqkv",) + NAMES[3:], got, ref):
        assert_rel_rms(a.float(), b, 2e-2, name)


@pytest.mark.parametrize("l2,gate", [(True, True), (True, False), (False, True), (False, False)])
def test_fused_prep_backward_skips_the_l2_recompute_and_the_gate_kernel(monkeypatch, l2, gate):
    """With ``BWD_FUSED_L2`` the backward does not recompute normalised q, k (``l2norm_fwd``, else two calls); with
    ``BWD_FUSED_GATE`` it runs no gate backward of its own (``gate_bwd``, else one call)."""
    interpret_without_gpu(monkeypatch)
    from kernels.kda import chunk_triton

    calls = []
    for name in ("l2norm_fwd", "gate_bwd"):
        real = getattr(chunk_triton, name)
        monkeypatch.setattr(chunk_triton, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    monkeypatch.setattr(chunk_triton, "BWD_FUSED_L2", l2)
    monkeypatch.setattr(chunk_triton, "BWD_FUSED_GATE", gate)
    leaves = _leaves(1, 20, 1, 1, 16, 16, torch.float32, True, True)
    _grads(leaves, 1, 16, "triton", None, None)
    assert sorted(calls) == ([] if gate else ["gate_bwd"]) + ([] if l2 else ["l2norm_fwd", "l2norm_fwd"])


@pytest.mark.parametrize("fused", [True, False])
def test_fused_prep_backward_of_an_empty_sequence(monkeypatch, fused):
    """T = 0 (no chunks, no programs): the gradients equal the PyTorch path's: zero for every input but h0, which
    gets the final state's upstream gradient."""
    interpret_without_gpu(monkeypatch)
    from kernels.kda import chunk_triton

    monkeypatch.setattr(chunk_triton, "BWD_FUSED_L2", fused)
    monkeypatch.setattr(chunk_triton, "BWD_FUSED_GATE", fused)
    leaves = _leaves(1, 0, 2, 2, 16, 16, torch.float32, True, True)
    got, ref = (_grads(leaves, 2, 16, backend, None, None) for backend in ("triton", "torch"))
    for i, (leaf, a, b) in enumerate(zip(leaves, got, ref)):
        assert a.shape == leaf.shape and torch.allclose(a, b, atol=1e-6), i
        assert (i == 3) == bool(a.any()), i  # (leaves: q|k|v, g_raw, beta, h0, A_log, dt_bias)
