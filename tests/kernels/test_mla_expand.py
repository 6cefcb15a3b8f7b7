"""``kernels.mla_expand.expand_kv`` (MLA's per-head keys and values) against its PyTorch reference, forward and
backward, through the Triton kernels (the interpreter on a CPU), and the kernels' sm_90a compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device, ptxas_lines

from kernels.mla_expand import expand_kv, expand_kv_reference


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.setenv("KVL_MLA_EXPAND_BACKEND", "triton")  # the kernels on a CPU too (default there: PyTorch)


def _case(dtype, b=2, s=37, h=3, dn=48, dv=40, dr=24, r=40, seed=0):
    """``kv [B, S, H, dn + dv]`` and ``k_rope`` as the model makes them: a slice of the latent projection."""
    gen = torch.Generator().manual_seed(seed)
    dev = kernel_device()
    kv_a = torch.randn(b, s, r + dr, generator=gen).to(dev, dtype).requires_grad_()
    kv = torch.randn(b, s, h, dn + dv, generator=gen).to(dev, dtype).requires_grad_()
    q = torch.randn(b, h, s, dn + dr, generator=gen).to(dev, dtype)
    return kv, kv_a, q, dn


def _attend(k, v, q):
    """SDPA over the heads' layout, as MLA calls it (its gradients come back as transposed views)."""
    return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 0.0), (torch.bfloat16, 4e-3)])
def test_expand_kv_equals_reference(dtype, tol):
    """k bit for bit (a copy), v the same view; the gradients of kv (a copy) and k_rope (an fp32 sum over heads,
    rounded once: bit for bit in fp32 and on a GPU, within rounding in the interpreter, which truncates to bf16)."""
    kv, kv_a, q, dn = _case(dtype)
    got, ref = (fn(kv, kv_a[..., 40:], dn) for fn in (expand_kv, expand_kv_reference))
    assert got[0].grad_fn.name() == "ExpandKVBackward"
    assert got[0].is_contiguous() and torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert got[1].data_ptr() == kv.data_ptr() + dn * kv.element_size()  # v is a view of kv
    grads = [torch.autograd.grad(_attend(*pair, q).float().square().sum(), [kv, kv_a]) for pair in (got, ref)]
    assert torch.equal(grads[0][0], grads[1][0])
    exact = dtype == torch.float32 or torch.cuda.is_available()
    assert_rel_rms(grads[0][1], grads[1][1], 0.0 if exact else tol, "d k_rope")


def test_expand_kv_one_output_used_and_backend_choice(monkeypatch):
    """Only v (or only k) reaching the loss gives the reference's gradients; ``KVL_MLA_EXPAND_BACKEND=torch`` and
    mixed dtypes take the reference; bad shapes are named."""
    kv, kv_a, _, dn = _case(torch.float32, seed=1)
    for i in (0, 1):
        got, ref = (torch.autograd.grad(fn(kv, kv_a[..., 40:], dn)[i].square().sum(), [kv, kv_a], allow_unused=True)
                    for fn in (expand_kv, expand_kv_reference))
        for a, b in zip(got, ref):  # an unused input: None in the reference, None or zeros here
            assert (a is None or not a.any()) if b is None else torch.equal(a, b)
    monkeypatch.setenv("KVL_MLA_EXPAND_BACKEND", "torch")
    k, v = expand_kv(kv, kv_a[..., 40:], dn)
    assert k.grad_fn.name() == "CatBackward0"
    monkeypatch.setenv("KVL_MLA_EXPAND_BACKEND", "triton")
    k, _ = expand_kv(kv, kv_a[..., 40:].double(), dn)
    assert k.dtype == torch.float64 and k.grad_fn.name() == "CatBackward0"
    with pytest.raises(ValueError, match="kv must be"):
        expand_kv(kv, kv_a[:, :5, 40:], dn)


@pytest.mark.timeout(600)
def test_mla_expand_kernels_compile_for_sm90():
    """Both kernels compile for sm_90a without spills (no GPU needed; see ``test_attnres_compiles``)."""
    lines = ptxas_lines("from kernels.benchmarks.ptxas_regs import mla_expand_ptxas_report as r\n"
                        "for k in ('fwd', 'bwd'):\n    print(k, ' | '.join(r(k).splitlines()), flush=True)\n", 2)
    for line in lines:
        assert "0 bytes spill stores" in line, line
