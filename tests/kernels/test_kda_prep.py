"""Triton L2 norm and KDA gate autograd functions (``kernels/kda/prep_triton.py``) vs PyTorch autograd through
``l2norm_ref`` / ``kda_gate_ref``. On a CPU they run under the Triton interpreter (tiny shapes)."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.kda import kda_gate_ref
from kernels.kda.naive import l2norm_ref
from kernels.kda.prep_triton import kda_gate_triton, l2norm_bwd, l2norm_fwd, l2norm_triton, qkv_base, qkv_l2_grad


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)



@pytest.mark.parametrize("shape", [(1, 5, 2, 16), (2, 37, 3, 20), (1, 3, 1, 130)])
def test_l2norm_fwd_bwd(shape):
    x = (torch.randn(shape) * 3).to(kernel_device()).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y = l2norm_triton(x)
    y2 = l2norm_ref(x2)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_rel_rms(y, y2, 1e-6, "y")
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    (y2 * dy).sum().backward()
    assert_rel_rms(x.grad, x2.grad, 1e-5, "dx")


def test_l2norm_fp16_storage():
    x = torch.randn(1, 9, 2, 32).to(kernel_device(), torch.float16).requires_grad_()
    y = l2norm_triton(x)
    assert y.dtype == torch.float16
    assert_rel_rms(y, l2norm_ref(x.detach().float()), 1e-3, "y fp16")
    dy = torch.randn_like(y)
    y.backward(dy)
    x2 = x.detach().float().requires_grad_()
    l2norm_ref(x2).backward(dy.float())
    assert x.grad.dtype == torch.float16
    assert_rel_rms(x.grad, x2.grad, 2e-3, "dx fp16")


def _thirds(qkv: torch.Tensor, H: int) -> tuple[torch.Tensor, ...]:
    B, T, _ = qkv.shape
    return tuple(z.reshape(B, T, H, -1) for z in qkv.chunk(3, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_l2_grad_equals_separate_grads(dtype):
    """d(qkv) in one pass (what the KDA op's backward returns for q|k|v views): the L2 backward of each third read in
    place at the views' stride, bit for bit what ``l2norm_bwd`` gives on contiguous copies, and dv in the v third."""
    B, T, H, D = 2, 7, 3, 20
    qkv = (torch.randn(B, T, 3 * H * D) * 3).to(kernel_device(), dtype)
    q, k, _ = _thirds(qkv, H)
    assert qkv_base(*_thirds(qkv, H)) is qkv
    (yq, rq), (yk, rk) = l2norm_fwd(q), l2norm_fwd(k)
    dq, dk, dv = (torch.randn(B, T, H, D).to(kernel_device(), dtype) for _ in range(3))
    got = qkv_l2_grad(qkv, H, D, (dq, rq), (dk, rk), dv)
    qc, kc = q.contiguous(), k.contiguous()
    assert torch.equal(l2norm_fwd(qc)[0], yq) and torch.equal(l2norm_fwd(kc)[0], yk)
    want = torch.cat([t.reshape(B, T, H * D) for t in (l2norm_bwd(qc, rq, dq), l2norm_bwd(kc, rk, dk), dv)], dim=-1)
    assert torch.equal(got, want)
    assert_rel_rms(got[..., : H * D].reshape(B, T, H, D).float(), l2norm_triton_grad(qc, dq), 1e-6, "dq")


def l2norm_triton_grad(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx of ``l2norm_triton`` through autograd (the standalone differentiable op), fp32."""
    xg = x.detach().clone().requires_grad_()
    l2norm_triton(xg).backward(dy)
    return xg.grad.float()


def test_qkv_base_refuses_other_layouts():
    x = torch.randn(1, 4, 12)
    q, k, v = _thirds(x, 2)
    assert qkv_base(q, k, v) is x
    flat = torch.randn(4, 12)  # a base of another shape
    assert qkv_base(*_thirds(flat.view(1, 4, 12), 2)) is None
    # views that need a gradient of a base outside the graph (a custom function's output viewed in its forward)
    q, k, v = _thirds(torch.randn(1, 4, 12), 2)
    assert qkv_base(q.requires_grad_(), k, v) is None
    assert qkv_base(k, q, v) is None  # wrong order
    assert qkv_base(q, k, v.clone()) is None  # not one tensor
    y = torch.randn(1, 4, 24)[..., :12]  # a base wider than q|k|v
    assert qkv_base(*_thirds(y, 2)) is None
    assert qkv_base(*(torch.randn(1, 4, 2, 2) for _ in range(3))) is None


@pytest.mark.parametrize("lower_bound", [None, -3.0])
@pytest.mark.parametrize("with_dtb", [True, False])
def test_gate_fwd_bwd(lower_bound, with_dtb):
    B, T, HV, K = 2, 300, 3, 20  # several token blocks per head (deterministic partial sums)
    raw = torch.randn(B, T, HV, K) * 4
    raw[0, 0, 0, :4] = torch.tensor([25.0, 21.0, -30.0, 19.5])  # both sides of softplus' threshold
    A_log = torch.log(torch.empty(HV).uniform_(1, 16))
    dtb = torch.randn(HV * K) if with_dtb else None
    ins = [t.to(kernel_device()).requires_grad_() for t in (raw, A_log) + ((dtb,) if with_dtb else ())]
    ref = [t.detach().clone().requires_grad_() for t in ins]
    g = kda_gate_triton(ins[0], ins[1], ins[2] if with_dtb else None, lower_bound)
    g2 = kda_gate_ref(ref[0], ref[1], ref[2] if with_dtb else None, lower_bound)
    assert g.dtype == torch.float32
    assert_rel_rms(g, g2, 1e-6, "g")
    dg = torch.randn_like(g)
    (g * dg).sum().backward()
    (g2 * dg).sum().backward()
    for name, a, b in zip(["d g_raw", "dA_log", "d dt_bias"], ins, ref):
        assert a.grad.shape == b.grad.shape
        assert_rel_rms(a.grad, b.grad, 1e-5, name)


def test_gate_deterministic():
    raw = torch.randn(1, 500, 2, 16, device=kernel_device())
    A_log = torch.zeros(2, device=kernel_device(), requires_grad=True)
    dtb = torch.zeros(32, device=kernel_device(), requires_grad=True)
    dg = torch.randn(1, 500, 2, 16, device=kernel_device())
    grads = []
    for _ in range(2):
        A_log.grad = dtb.grad = None
        (kda_gate_triton(raw, A_log, dtb, None) * dg).sum().backward()
        grads.append((A_log.grad.clone(), dtb.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.gpu
def test_gpu_bf16_prep_matches_torch_chains():
    """bf16 storage on the GPU: the Triton L2 norm and gate (forward and gradients) vs the PyTorch chains they
    replaced (``l2norm_ref``, ``kda_gate_ref``), fp32 math in both."""
    q = torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    raw = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    A_log = torch.log(torch.empty(8, device="cuda").uniform_(1, 16)).requires_grad_()
    dtb = (torch.randn(8 * 128, device="cuda") * 0.5 - 3.0).requires_grad_()
    ins = [q, raw, A_log, dtb]
    ref = [t.detach().clone().requires_grad_() for t in ins]
    y, g = l2norm_triton(ins[0]), kda_gate_triton(ins[1], ins[2], ins[3], None)
    y2, g2 = l2norm_ref(ref[0].float()).to(torch.bfloat16), kda_gate_ref(ref[1], ref[2], ref[3], None)
    assert_rel_rms(y, y2, 4e-3, "y bf16")
    assert_rel_rms(g, g2, 1e-5, "g")
    dy, dg = torch.randn_like(y), torch.randn_like(g)
    ((y.float() * dy.float()).sum() + (g * dg).sum()).backward()
    ((y2.float() * dy.float()).sum() + (g2 * dg).sum()).backward()
    for name, a, b in zip(["dq", "d g_raw", "dA_log", "d dt_bias"], ins, ref):
        assert_rel_rms(a.grad, b.grad, 8e-3, name)
