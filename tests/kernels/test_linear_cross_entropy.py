"""``kernels.cross_entropy.linear_cross_entropy``: the LM head and its loss as one node whose forward writes the
logits' gradient over them (``ce_triton._ce_fwd_grad_kernel``) and whose backward applies the rows' upstream
gradients to the head's operands. Against ``F.linear`` then the PyTorch cross entropy (the interpreter on a CPU,
compiled kernels on a GPU; bf16 only on a GPU, where the conversions round as compiled code does)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.cross_entropy import cross_entropy_torch, linear_cross_entropy

IGN = -100


def _inputs(lead: tuple[int, ...], D: int, V: int, dtype: torch.dtype, seed: int = 0):
    """x ``lead + (D,)``, weight ``[V, D]`` (leaves), targets with every fifth row ignored, upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, D, generator=g)
    w = torch.randn(V, D, generator=g) / D ** 0.5
    t = torch.randint(0, V, lead, generator=g)
    t.view(-1)[::5] = IGN
    up = torch.rand(lead, generator=g) + 0.5
    dev = kernel_device()
    return (x.to(dev, dtype).requires_grad_(), w.to(dev, dtype).requires_grad_(), t.to(dev), up.to(dev))


def _grads(x, w, t, up, reduction: str, backend: str):
    loss = linear_cross_entropy(x, w, t, IGN, reduction, backend=backend)
    out = (loss * up).sum() if reduction == "none" else loss
    return (loss.detach(), *torch.autograd.grad(out, [x, w]))


@pytest.mark.parametrize("lead,D,V", [((2, 7), 16, 37), ((11,), 8, 4099)])  # one chunk; two with a 3-wide tail
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_matches_linear_then_cross_entropy_fp32(monkeypatch, lead, D, V, reduction):
    """Losses, dx and dw within 1e-5 (relative RMS) of ``F.linear`` + ``cross_entropy_torch`` (per-row upstream
    gradients for ``"none"``; ignored rows contribute nothing)."""
    interpret_without_gpu(monkeypatch)
    x, w, t, up = _inputs(lead, D, V, torch.float32)
    got = _grads(x, w, t, up, reduction, "triton")
    ref = _grads(x, w, t, up, reduction, "torch")
    for name, a, b in zip(("loss", "dx", "dw"), got, ref):
        assert_rel_rms(a, b, 1e-5, f"{name} ({reduction})")
    assert got[0].dtype == torch.float32 and got[1].dtype == x.dtype and got[2].dtype == w.dtype


@pytest.mark.parametrize("mode", ["row", "chunks", "persistent"])
def test_forward_grad_kernel_forms(monkeypatch, mode):
    """Every form of the forward-with-gradient kernel (``ce_triton.FWD_GRAD_MODE``) gives the PyTorch path's losses
    and gradients: a one-chunk row, a two-chunk row (the whole-row form above its ``FWD_GRAD_ROW_MAX_V`` falls back
    to chunks), and a persistent grid of fewer programs than rows."""
    from kernels.cross_entropy import ce_triton

    interpret_without_gpu(monkeypatch)
    monkeypatch.setattr(ce_triton, "FWD_GRAD_MODE", mode)
    monkeypatch.setattr(ce_triton, "FWD_GRAD_PROGRAMS_PER_SM", 1)  # 4 "SMs" on a CPU: 4 programs for 9 rows
    for V, row_max in ((37, 64), (4099, 8192), (4099, 4096)):
        monkeypatch.setattr(ce_triton, "FWD_GRAD_ROW_MAX_V", row_max)
        x, w, t, up = _inputs((9,), 8, V, torch.float32, seed=V)
        for name, a, b in zip(("loss", "dx", "dw"), _grads(x, w, t, up, "none", "triton"),
                              _grads(x, w, t, up, "none", "torch")):
            assert_rel_rms(a, b, 1e-5, f"{name} ({mode}, V={V}, row max {row_max})")


def test_torch_path_is_linear_then_cross_entropy():
    """The PyTorch path is exactly ``cross_entropy_torch(F.linear(x, w), t)``."""
    x, w, t, _ = (a.cpu() for a in _inputs((3, 5), 8, 19, torch.float32))
    assert torch.equal(linear_cross_entropy(x, w, t, backend="torch"), cross_entropy_torch(F.linear(x, w), t))


def test_inputs_untouched(monkeypatch):
    """The logits are overwritten with their gradient, but x and the weight are not."""
    interpret_without_gpu(monkeypatch)
    x, w, t, up = _inputs((6,), 8, 33, torch.float32)
    x0, w0 = x.detach().clone(), w.detach().clone()
    _grads(x, w, t, up, "none", "triton")
    assert torch.equal(x.detach(), x0) and torch.equal(w.detach(), w0)


def test_fp64_takes_the_pytorch_path(monkeypatch):
    """fp64 (the tests' fp64 models) on the Triton backend: ``F.linear`` in fp64, the loss like the reference's."""
    interpret_without_gpu(monkeypatch)
    x, w, t, up = _inputs((3, 4), 8, 19, torch.float64)
    got = _grads(x, w, t, up, "none", "triton")
    want = _grads(x, w, t, up, "none", "torch")
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got[1].dtype == torch.float64


def test_bad_inputs_name_the_shapes():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"weight \[V, D\].*\(5, 7\)"):
        linear_cross_entropy(x, torch.randn(5, 7), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x.shape\[:-1\] = \(4,\)"):
        linear_cross_entropy(x, torch.randn(5, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="share a dtype"):
        linear_cross_entropy(x, torch.randn(5, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="share a dtype"):
        linear_cross_entropy(x.int(), torch.randn(5, 8).int(), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="one device"):
        linear_cross_entropy(x, torch.randn(5, 8), torch.zeros(4, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, torch.randn(5, 8), torch.zeros(4, dtype=torch.long), reduction="avg")


@pytest.mark.gpu
def test_bf16_at_the_small_models_head_on_gpu():
    """bf16 at the ``small`` model's head (D = 768, V = 32768; 2048 rows): loss, dx, dw against the fp32 reference
    on the same bf16 values within 1e-2 relative RMS, and as close as the separate bf16 ops are."""
    x, w, t, up = _inputs((2048,), 768, 32768, torch.bfloat16)
    got = _grads(x, w, t, up, "none", "triton")
    sep = _grads(x, w, t, up, "none", "torch")
    ref = _grads(*(a.detach().float().requires_grad_() for a in (x, w)), t, up, "none", "torch")
    for name, a, b, c in zip(("loss", "dx", "dw"), got, ref, sep):
        err = ((a.float() - b).norm() / b.norm()).item()
        err_sep = ((c.float() - b).norm() / b.norm()).item()
        assert err <= max(1e-2, 2 * err_sep), (name, err, err_sep)
