"""Fused cross entropy (``kernels/cross_entropy``): Triton kernels vs the PyTorch reference, and the model's losses.

The Triton tests put their tensors on ``kvl_testing.kernel_device()``: compiled kernels on a GPU; on a CPU the
interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` there) at small shapes. Inputs come from seeded CPU
generators and are then moved, so the values are the same on both. ``gpu``-marked tests check V = 32768, N = 8192
in bf16 on a device.

Tolerances. fp32 loss: both paths sum the same exps in fp32 in a different order, a few ulp of the loss
(ulp(8) ~ 1e-6), so ``rtol=1e-6, atol=4e-6`` per row. fp32 gradient: ``g * (p - onehot)`` with p differing by a
few ulp, ``atol=1e-6`` at |g| <= ~3. bf16 gradient: the reference's is its fp32 gradient rounded once to bf16
(the cast's backward); ours rounds its own fp32 value, which is within ~1e-6 of the reference's, so
``|ours - ref_fp32| <= 2**-8 |ref_fp32| + 1e-6`` (half a bf16 ulp plus the fp32 difference), and the two bf16
gradients are bitwise equal except where the fp32 values straddle a rounding boundary (``>= 99.9%`` equal). The
interpreter truncates instead of rounding when it converts to bf16: a whole ulp (``2**-7``) there.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from kvl_testing import kernel_device

from kernels.cross_entropy import cross_entropy, cross_entropy_torch
from kernels.cross_entropy.api import resolve_backend

IGN = -100
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
VOCABS = (1000, 1531, 4099)  # one chunk (pow2 block > V), non-power-of-two, two chunks with a 3-wide tail


def make(shape: tuple[int, ...], V: int, dtype: torch.dtype, scale: float = 4.0, seed: int = 0,
         device: torch.device | None = None):
    """Logits and targets drawn on the CPU (same values everywhere), then moved to ``device`` (default
    ``kernel_device()``)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, V, generator=g) * scale).to(dtype)
    target = torch.randint(0, V, shape, generator=g)
    flat = target.view(-1)
    flat[::5] = IGN  # every fifth row ignored
    device = kernel_device() if device is None else device
    return logits.to(device), target.to(device)


def loss_and_grad(logits: torch.Tensor, target: torch.Tensor, reduction: str, backend: str, w=None, **kw):
    x = logits.detach().clone().requires_grad_()
    loss = cross_entropy(x, target, reduction=reduction, backend=backend, **kw)
    weight = torch.ones_like(loss) if w is None else w
    (dx,) = torch.autograd.grad((loss * weight).sum(), x)
    return loss.detach(), dx


def upstream(target: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-row weights for "none" (so the backward sees a non-uniform g_n), 0.7 for a scalar; on the target's
    device."""
    if reduction == "none":
        return torch.randn(target.shape, generator=torch.Generator().manual_seed(1)).to(target.device)
    return torch.tensor(0.7, device=target.device)


def assert_bf16_grad(dx: torch.Tensor, ref_fp32: torch.Tensor, ref_bf16: torch.Tensor) -> None:
    """Half a bf16 ulp from the reference's fp32 gradient, compiled; a whole ulp under the interpreter, whose
    fp32 -> bf16 conversion truncates (``triton/runtime/interpreter.py``, ``cast_impl``) where the GPU rounds
    to nearest."""
    assert dx.dtype == torch.bfloat16
    frac = 2**-7 if INTERPRETED else 2**-8
    err = (dx.float() - ref_fp32).abs()
    assert bool((err <= frac * ref_fp32.abs() + 1e-6).all()), f"max excess {(err - frac * ref_fp32.abs()).max()}"
    if not INTERPRETED:
        assert (dx == ref_bf16).float().mean() >= 0.999


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_fp32_matches_reference(V, reduction):
    logits, target = make((13,), V, torch.float32)
    w = upstream(target, reduction)
    loss, dx = loss_and_grad(logits, target, reduction, "triton", w)
    ref, dref = loss_and_grad(logits, target, reduction, "torch", w)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    n = 1 if reduction == "none" else target.numel()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=4e-6 * n)
    torch.testing.assert_close(dx, dref, rtol=0, atol=1e-6)
    assert bool((dx[target == IGN] == 0).all())


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bf16_matches_reference(V, reduction):
    logits, target = make((3, 5), V, torch.bfloat16)
    w = upstream(target, reduction)
    loss, dx = loss_and_grad(logits, target, reduction, "triton", w)
    ref, dref = loss_and_grad(logits, target, reduction, "torch", w)
    _, dref32 = loss_and_grad(logits.float(), target, reduction, "torch", w)
    n = 1 if reduction == "none" else target.numel()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=4e-6 * n)
    assert_bf16_grad(dx, dref32, dref)


def test_fp16_and_fp64_logits():
    for dtype in (torch.float16, torch.float64):
        logits, target = make((11,), 1531, dtype, scale=2.0)
        loss, dx = loss_and_grad(logits, target, "none", "triton")
        ref, dref = loss_and_grad(logits, target, "none", "torch")
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=4e-6)
        assert dx.dtype == dtype
        torch.testing.assert_close(dx.double(), dref.double(), rtol=2e-3 if dtype == torch.float16 else 0, atol=1e-6)


def test_strided_rows_are_read_in_place():
    """A ``logits_BLV[:, :-1]`` view (row stride V, batch stride L*V) and a transposed (non-unit V stride) tensor."""
    logits_BLV, labels = make((2, 9), 1000, torch.bfloat16)
    view, target = logits_BLV[:, :-1], labels[:, 1:]
    assert not view.is_contiguous()
    loss, dx = loss_and_grad(view, target, "none", "triton")
    ref, dref = loss_and_grad(view, target, "none", "torch")
    _, dref32 = loss_and_grad(view.float(), target, "none", "torch")
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=4e-6)
    assert dx.shape == view.shape
    assert_bf16_grad(dx, dref32, dref)
    rows_VN = torch.randn(1000, 7).to(kernel_device())  # [V, N]: .t() has stride (1, 7): copied to contiguous first
    t = torch.randint(0, 1000, (7,)).to(kernel_device())
    torch.testing.assert_close(cross_entropy(rows_VN.t(), t, reduction="none", backend="triton"),
                               cross_entropy(rows_VN.t(), t, reduction="none", backend="torch"), rtol=1e-6, atol=4e-6)


def test_large_logits_are_stable():
    """Logits of +-1e4 (fp32), and a row whose first 4096-wide chunk is all -inf (a masked vocabulary)."""
    logits, target = make((9,), 4099, torch.float32, scale=1e4)
    logits[2, :4096] = float("-inf")
    target[2] = 4097
    loss, dx = loss_and_grad(logits, target, "none", "triton")
    ref, dref = loss_and_grad(logits, target, "none", "torch")
    assert bool(torch.isfinite(loss).all()) and bool(torch.isfinite(dx).all())
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=4e-6)
    torch.testing.assert_close(dx, dref, rtol=0, atol=1e-6)


def test_ignored_rows_and_empty_input():
    logits, target = make((6,), 1000, torch.float32)
    target[:] = IGN
    loss, dx = loss_and_grad(logits, target, "none", "triton")
    assert bool((loss == 0).all()) and bool((dx == 0).all())
    for backend in ("triton", "torch"):  # mean over no targets is 0/0, like F.cross_entropy
        assert torch.isnan(cross_entropy(logits, target, backend=backend))
        assert cross_entropy(logits, target, reduction="sum", backend=backend) == 0
    dev = kernel_device()
    empty = cross_entropy(torch.randn(0, 10, device=dev, requires_grad=True),
                          torch.zeros(0, dtype=torch.long, device=dev), reduction="none", backend="triton")
    assert empty.shape == (0,)


def test_backward_writes_every_element(monkeypatch):
    """The gradient buffer is NaN-poisoned before the backward: ignored rows and V tails must be written."""
    logits, target = make((7,), 1531, torch.bfloat16)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    _, dx = loss_and_grad(logits, target, "none", "triton")
    monkeypatch.undo()
    assert bool(torch.isfinite(dx).all())


def test_inplace_backward_reuses_the_logits():
    logits, target = make((5,), 1531, torch.bfloat16)
    _, dx = loss_and_grad(logits, target, "none", "triton")
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, reduction="none", backend="triton", inplace_backward=True)
    (dx_inplace,) = torch.autograd.grad(loss.sum(), x)
    assert dx_inplace.data_ptr() == x.data_ptr() and torch.equal(dx_inplace, dx)


def test_out_of_range_target_gives_nan_on_triton():
    logits = torch.randn(3, 50).to(kernel_device())
    target = torch.tensor([1, 50, -3], device=kernel_device())
    loss = cross_entropy(logits, target, reduction="none", backend="triton")
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1:]).all()


def test_reference_is_the_former_formula_bit_for_bit():
    logits, target = make((4, 7), 1000, torch.bfloat16, device=torch.device("cpu"))
    old = F.cross_entropy(logits.float().reshape(-1, 1000), target.reshape(-1), ignore_index=IGN)
    assert torch.equal(cross_entropy_torch(logits, target), old)
    assert torch.equal(cross_entropy(logits, target), old)  # CPU default: the torch path


def test_model_losses_on_cpu_are_unchanged_and_triton_matches():
    """``token_losses`` and ``causal_lm_loss`` equal the former sliced ``F.cross_entropy(logits.float())`` exactly
    on CPU (values and gradients), and the Triton path (``KVL_CE_BACKEND=triton``, on ``kernel_device()``) to the
    tolerances above."""
    from kimi_vl.modeling.model import causal_lm_loss
    from kimi_vl.train.loss import token_losses

    logits, labels = make((2, 9), 1000, torch.bfloat16, device=torch.device("cpu"))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]] * 2)
    x = logits.clone().requires_grad_()
    old = F.cross_entropy(x[:, :-1].float().reshape(-1, 1000), labels[:, 1:].reshape(-1), ignore_index=IGN,
                          reduction="none").view(2, 8)
    (g_old,) = torch.autograd.grad(old.sum(), x)
    loss_BL, mask = token_losses(x, labels, pos)
    assert torch.equal(loss_BL[:, 1:], old * mask[:, 1:])
    (g_new,) = torch.autograd.grad(token_losses(x, labels)[0].sum(), x)
    assert torch.equal(g_new, g_old)
    dev = kernel_device()
    xd, labels_d, pos_d, cu = (t.to(dev) for t in (x, labels, pos, torch.tensor([0, 4, 9])))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVL_CE_BACKEND", "triton")
        loss_t, mask_t = token_losses(xd, labels_d, pos_d)
        torch.testing.assert_close(loss_t, loss_BL.to(dev), rtol=1e-6, atol=4e-6)
        assert torch.equal(mask_t, mask.to(dev))
        a = causal_lm_loss(xd[:1], labels_d[:1], cu)
        mp.setenv("KVL_CE_BACKEND", "torch")
        torch.testing.assert_close(a, causal_lm_loss(xd[:1], labels_d[:1], cu), rtol=1e-6, atol=4e-6)


def test_dispatch_and_errors(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("KVL_CE_BACKEND", raising=False)
    assert resolve_backend(None, cpu, "f") == "torch" and resolve_backend(None, torch.device("cuda"), "f") == "triton"
    monkeypatch.setenv("KVL_CE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a forced Triton on a CPU tensor needs the interpreter (a GPU
    # machine's session does not set it)
    assert resolve_backend(None, cpu, "f") == "triton" and resolve_backend("torch", cpu, "f") == "torch"
    monkeypatch.setenv("KVL_CE_BACKEND", "cuda")
    with pytest.raises(ValueError, match="KVL_CE_BACKEND"):
        resolve_backend(None, cpu, "f")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        resolve_backend("triton", cpu, "f")
    x, t = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    bad = [
        (dict(logits=x, target=t[:3]), r"target must have shape logits.shape\[:-1\] = \(4,\), got \(3,\)"),
        (dict(logits=x, target=t.float()), "integer tensor"),
        (dict(logits=x.int(), target=t), "torch.int32"),
        (dict(logits=x[0], target=t[0]), r"\[N, V\] or \[B, T, V\]"),
        (dict(logits=x, target=t, reduction="avg"), "reduction"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            cross_entropy(backend="torch", **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_vocab_32768(dtype):
    """N = 8192 rows, V = 32768 on the device: loss and gradient vs the reference (fp32 logits copy)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(8192, 32768, device="cuda", generator=g) * 3).to(dtype)
    target = torch.randint(0, 32768, (8192,), device="cuda", generator=g)
    target[::7] = IGN
    w = torch.randn(8192, device="cuda", generator=g)
    loss, dx = loss_and_grad(logits, target, "none", "triton", w)
    ref, dref = loss_and_grad(logits, target, "none", "torch", w)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    if dtype == torch.bfloat16:
        _, dref32 = loss_and_grad(logits.float(), target, "none", "torch", w)
        assert_bf16_grad(dx, dref32, dref)
    else:
        # a few ulps: Triton's exp and PyTorch's differ in the last bits (gradients up to |w| ~ 4 here)
        torch.testing.assert_close(dx, dref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cross_entropy(logits, target), cross_entropy_torch(logits, target), rtol=1e-5, atol=1e-5)
