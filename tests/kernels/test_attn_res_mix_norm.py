"""The AttnRes mix with its sublayer's RMSNorm in one kernel each way (``kernels/attn_res/mix_norm_triton.py``) against
the mix and the norm run one after the other, forward and every gradient; deferred sources, gradient sinks and the
chained running sum as the training stream uses them. On a CPU the kernels run under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.attn_res import attn_res_mix, attn_res_mix_norm, mix_norm_triton
from kernels.attn_res.mix_autograd import DeferredBlock
from kernels.attn_res.mix_norm_triton import mix_norm_bwd_triton, mix_norm_fwd_triton
from kernels.attn_res.mix_triton import GradSink, mix_bwd_triton, mix_fwd_triton
from kernels.norm import norm_triton as nt
from kernels.norm import rms_norm


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_ATTNRES_BACKEND", raising=False)
    monkeypatch.delenv("KVL_ATTNRES_ADDRESSING", raising=False)


def _case(n: int, m: int = 37, d: int = 96, dtype=torch.float32, norm_dtype=None, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    dev = kernel_device()
    src = [(torch.randn(m, d, generator=gen) * (1 + 0.5 * i) + 0.2 * i).to(dev, dtype) for i in range(n)]
    u = (torch.randn(d, generator=gen) * 0.3).to(dev)
    nw = (1 + 0.3 * torch.randn(d, generator=gen)).to(dev, norm_dtype or dtype)
    dy = torch.randn(m, d, generator=gen).to(dev, torch.promote_types(dtype, nw.dtype))
    return dict(src=src, u=u, nw=nw, dy=dy)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("deferring", ["none", "all but the last", "all"])
def test_kernels_equal_the_mix_then_the_norm_fp32(n, deferring):
    """fp32: ``y``, ``rstd(h)``, alpha, every source gradient (or the deferred coefficients), the query's and the
    gain's gradients and the stored ``dh`` equal the mix's kernels with ``kernels/norm``'s between them. Deferred
    sources: none (the output's mix), the completed states (a mix with a running sum) or all (a block's first)."""
    c = _case(n)
    src, u, nw, dy = c["src"], c["u"], c["nw"], c["dy"]
    h, rstd, alpha = mix_fwd_triton(src, u, 1e-6)
    y, hr = nt.norm_fwd(h, None, nw, 1e-5)
    yf, hrf, rstdf, alphaf = mix_norm_fwd_triton(src, u, 1e-6, nw, 1e-5)
    for name, got, want in (("y", yf, y), ("rstd(h)", hrf, hr), ("rstd", rstdf, rstd), ("alpha", alphaf, alpha)):
        assert_rel_rms(got, want, 1e-6, name)
    defer = {"none": 0, "all but the last": (1 << (n - 1)) - 1, "all": (1 << n) - 1}[deferring]
    deferred = defer != 0
    dh, _, dw = nt.norm_bwd(h, None, nw, hr, dy)
    dxs, du, coef = mix_bwd_triton(src, u, dh, rstd, alpha, None, defer)
    dxf, duf, dwf, coeff, dhf = mix_norm_bwd_triton(src, u, nw, dy, hr, rstd, alpha, None, defer, store_dh=deferred)
    assert_rel_rms(duf, du, 1e-5, "du")
    assert_rel_rms(dwf, dw, 1e-5, "norm gain")
    for i, (a, b) in enumerate(zip(dxf, dxs)):
        assert (a is None) == (b is None) == bool((defer >> i) & 1)
        if b is not None:
            assert_rel_rms(a, b, 1e-5, f"dx{i}")
    if deferred:
        k = bin(defer).count("1")  # only the deferred sources' rows are written
        assert_rel_rms(coeff[:k], coef[:k], 1e-5, "coefficients")
        assert_rel_rms(dhf, dh, 1e-6, "dh")
    else:
        assert coeff is None and dhf is None


@pytest.mark.parametrize(("dtype", "norm_dtype", "tol"), [(torch.float32, torch.float32, 1e-5),
                                                          (torch.bfloat16, torch.float32, 3e-2)])
@pytest.mark.parametrize("chain", [False, True])
def test_public_function_equals_mix_then_rms_norm(monkeypatch, dtype, norm_dtype, tol, chain):
    """``attn_res_mix_norm`` through autograd (Triton) against ``attn_res_mix`` and ``rms_norm`` on the PyTorch
    backend: output (its dtype promoted with an fp32 gain, as ``rms_norm``'s), the passed-through last source and
    every gradient (sources, pseudo-query, key gain, norm gain), with the passed source feeding a next sum."""
    dev = kernel_device()
    gen = torch.Generator().manual_seed(4)
    d = 64
    leaves = [(torch.randn(3, 5, d, generator=gen) * (1 + i)).to(dev, dtype).requires_grad_() for i in range(3)]
    w = (torch.randn(1, d, generator=gen) * 0.3).to(dev).requires_grad_()
    g = (1 + 0.3 * torch.randn(d, generator=gen)).to(dev).requires_grad_()
    nw = (1 + 0.3 * torch.randn(d, generator=gen)).to(dev, norm_dtype).requires_grad_()
    target = torch.randn(3, 5, d, generator=gen).to(dev)
    results = {}
    for backend in ("torch", "triton"):
        out = attn_res_mix_norm(leaves, w, g, 1e-6, nw, 1e-5, backend=backend, chain=chain)
        y = out[0]
        loss = (y.float() * target).sum()
        if chain:
            passed = leaves[-1] if out[2] is None else out[2]  # the PyTorch path passes nothing
            loss = loss + ((passed + y.to(dtype)).float() * target.flip(-1)).sum()
        params = [*leaves, w, g, nw]
        results[backend] = (y, torch.autograd.grad(loss, params))
    y_t, grads_t = results["triton"]
    y_p, grads_p = results["torch"]
    assert y_t.dtype == y_p.dtype == torch.promote_types(dtype, norm_dtype)
    assert_rel_rms(y_t.float(), y_p.float(), tol, "y")
    for i, (a, b) in enumerate(zip(grads_t, grads_p)):
        assert_rel_rms(a.float(), b.float(), tol, f"gradient {i}")


def test_deferred_block_and_sinks_through_the_fused_function():
    """A block of three mixes over one shared state (its gradient deferred to the block's flush, which reads each
    fused mix's stored ``dh``) and one more with the state in a gradient sink: the state's, the running sums' and the
    norm gains' gradients equal the mix-then-norm path's (fp32)."""
    dev = kernel_device()
    gen = torch.Generator().manual_seed(7)
    d = 48
    state = torch.randn(2, 6, d, generator=gen).to(dev).requires_grad_()
    outs = [torch.randn(2, 6, d, generator=gen).to(dev) for _ in range(3)]
    ws = [(torch.randn(1, d, generator=gen) * 0.5).to(dev).requires_grad_() for _ in range(4)]
    g = torch.ones(d, device=dev)
    nws = [(1 + 0.2 * torch.randn(d, generator=gen)).to(dev).requires_grad_() for _ in range(4)]
    grads = {}
    for fused in (False, True):
        sink, block = GradSink(), DeferredBlock()
        partial, total = None, 0.0
        for i in range(3):  # the block's mixes: first flushes
            sources = [state] + ([partial] if partial is not None else [])
            sinks = [sink] + [None] * (len(sources) - 1)
            if fused:
                y, _ = attn_res_mix_norm(sources, ws[i], g, 1e-6, nws[i], 1e-5, sinks=sinks, defer=(block, i == 0))
            else:
                h, _ = attn_res_mix(sources, ws[i], g, 1e-6, sinks=sinks, defer=(block, i == 0))
                y = rms_norm(h, nws[i], 1e-5)
            total = total + (y * outs[i]).sum()
            partial = y * outs[i] if partial is None else partial + y * outs[i]
        if fused:
            y, _ = attn_res_mix_norm([state, partial], ws[3], g, 1e-6, nws[3], 1e-5, sinks=[sink, None])
        else:
            y = rms_norm(attn_res_mix([state, partial], ws[3], g, 1e-6, sinks=[sink, None])[0], nws[3], 1e-5)
        total = total + y.square().sum()
        grads[fused] = torch.autograd.grad(total, [state, *ws, *nws])
    for i, (a, b) in enumerate(zip(grads[True], grads[False])):
        assert_rel_rms(a, b, 1e-5, f"gradient {i}")


def test_mix_norm_checks_and_limits(monkeypatch):
    """A norm gain of the wrong width is refused, naming it; beyond ``MAX_SOURCES`` the public function takes the mix
    and then the norm (same values)."""
    dev = kernel_device()
    xs = [torch.randn(4, 32, device=dev) for _ in range(3)]
    w, g = torch.randn(1, 32, device=dev), torch.ones(32, device=dev)
    with pytest.raises(ValueError, match=r"norm_weight must be \[D=32\]"):
        attn_res_mix_norm(xs, w, g, 1e-6, torch.ones(31, device=dev), 1e-5)
    nw = torch.rand(32, device=dev) + 0.5
    want = rms_norm(attn_res_mix(xs, w, g, 1e-6, backend="torch")[0], nw, 1e-5)
    for limit in (2, 4):
        monkeypatch.setattr(mix_norm_triton, "MAX_SOURCES", limit)
        assert mix_norm_triton.fusable(3) == (limit >= 3)
        got, _ = attn_res_mix_norm(xs, w, g, 1e-6, nw, 1e-5, backend="triton")
        assert_rel_rms(got, want, 1e-6, f"MAX_SOURCES={limit}")
