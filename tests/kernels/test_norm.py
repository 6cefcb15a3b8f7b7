"""Fused RMSNorm / gated RMSNorm / LayerNorm / SwiGLU activation (``kernels/norm``): Triton == the PyTorch reference.

On a CPU the Triton kernels run under the interpreter (conftest sets ``TRITON_INTERPRET=1``) at small shapes; with a
GPU the same tests run on it (``kernel_device``), and the ``gpu`` tests check the model's shapes on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from kvl_testing import kernel_device

from kernels.norm import add_rms_norm, gated_rms_norm, layer_norm, rms_norm, silu_mul
from kernels.norm.norm_torch import gated_rms_norm_torch, layer_norm_torch, rms_norm_torch, silu_mul_torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grads(fn, inputs: list[torch.Tensor], dy: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


def norm_inputs(shape, dtype, gated: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 0.5).to(dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    gate = (2 * torch.randn(shape, generator=g)).to(dtype) if gated else None
    dy = torch.randn(shape, generator=g).to(dtype)
    return tuple(t.to(kernel_device()) if t is not None else None for t in (x, gate, w, dy))


def norm_fn(gated: bool, backend: str | None):
    """The (gated) RMSNorm as a function of its tensors; ``backend`` None = the PyTorch reference."""
    if gated:
        if backend is None:
            return lambda x, g, w: gated_rms_norm_torch(x, g, w, 1e-6)
        return lambda x, g, w: gated_rms_norm(x, g, w, 1e-6, backend=backend)
    if backend is None:
        return lambda x, w: rms_norm_torch(x, w, 1e-6)
    return lambda x, w: rms_norm(x, w, 1e-6, backend=backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 64), (70, 64), (1, 1, 768), (1, 1)])  # one row a program up to 64 rows
def test_add_rms_norm_equals_add_then_norm(dtype, shape):
    """The one-launch residual update + norm: its sum is ``x + r`` and its output the Triton norm of that sum, bit for
    bit (same kernel body); the PyTorch backend gives the two ops' values. The interpreter truncates fp32 -> bf16
    where PyTorch rounds, so there the bf16 sum is compared to within one bf16 step."""
    x, _, w, r = norm_inputs(shape, dtype, False, seed=3)
    with torch.no_grad():
        s, y = add_rms_norm(x, r, w, 1e-5, backend="triton")
        s_ref = x + r
        if dtype == torch.float32 or x.is_cuda:
            assert torch.equal(s, s_ref)
        else:
            assert rel(s, s_ref) < 1e-2
        assert torch.equal(y, rms_norm(s, w, 1e-5, backend="triton"))
        s_t, y_t = add_rms_norm(x, r, w, 1e-5, backend="torch")
        assert torch.equal(s_t, s_ref) and torch.equal(y_t, rms_norm_torch(s_ref, w, 1e-5))


def _add_norm_grads(backend: str, x, r, w, ds, dy, uses: str):
    """Gradients of x, r, w through ``add_rms_norm`` when ``uses`` of (s, y) carry a gradient ("sy", "s", "y")."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, r, w)]
    s, y = add_rms_norm(*leaves, 1e-5, backend=backend)
    outs, gs = zip(*[(t, g) for t, g, k in ((s, ds, "s"), (y, dy, "y")) if k in uses])
    torch.autograd.backward(outs, gs)
    return s.detach(), y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("uses", ["sy", "y", "s"])
@pytest.mark.parametrize("shape", [(37, 64), (2, 9, 768), (70, 100)])
def test_add_rms_norm_backward_matches_two_ops(dtype, uses, shape):
    """The training form (``AddNormFunction``): the stream's gradient ``ds`` joins the norm's backward launch; x's
    and the residual's gradients (equal) and the gain's match autograd over ``x + r`` and the PyTorch norm, in fp32
    to 1e-5 and in bf16 to the roundings autograd adds (its dx is rounded before ``ds`` is added); with only s or
    only y carrying a gradient too."""
    x, _, w, dy = norm_inputs(shape, dtype, False, seed=5)
    r, ds = (t.to(dtype) for t in norm_inputs(shape, torch.float32, False, seed=6)[::3])
    s, y, gt = _add_norm_grads("triton", x, r, w, ds, dy, uses)
    s_t, y_t, gr = _add_norm_grads("torch", x, r, w, ds, dy, uses)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel(s, s_t) < tol and rel(y, y_t) < tol
    assert torch.equal(gt[0], gt[1]), "x and the residual get one gradient"
    for name, a, b in zip(("x", "residual", "weight"), gt, gr):
        if b is None:
            assert a is None or not a.any(), name
            continue
        assert rel(a, b) < tol, f"d{name}: {rel(a, b):.2e}"


def test_add_rms_norm_checks_shapes():
    x, _, w, r = norm_inputs((5, 16), torch.float32, False, seed=4)
    with pytest.raises(ValueError, match="residual must match x"):
        add_rms_norm(x, r[:, :8], w, 1e-6)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("shape", [(37, 64), (2, 40, 64), (3, 5, 100), (2, 9, 768), (1, 1)])
def test_norm_fp32_matches_torch(gated, shape):
    x, gate, w, dy = norm_inputs(shape, torch.float32, gated)
    ins = [x, gate, w] if gated else [x, w]
    ours, ref = grads(norm_fn(gated, "triton"), ins, dy), grads(norm_fn(gated, None), ins, dy)
    assert rel(ours[0], ref[0]) < 1e-6
    for name, a, b in zip(["dx", "dgate", "dw"] if gated else ["dx", "dw"], ours[1], ref[1]):
        # D = 1: x_hat = +-1 up to eps / x^2, so dx = rstd dn (1 - x_hat^2) is fp32 rounding noise of rstd dn;
        # compared absolutely on that scale (on the GPU: ~1e-10 apart before, 4.6e-8 in session 17 call3)
        noise = 1e-6 * float((dy * w / x).abs().max())
        assert rel(a, b) < 1e-5 or (shape[-1] == 1 and name == "dx" and (a - b).abs().max() < noise), name


@pytest.mark.parametrize("gated", [False, True])
def test_norm_half_error_not_above_torch_paths(gated):
    """Against fp64 on the same half-precision inputs, the fused kernel's error is at most the PyTorch path's.
    fp16 here: the interpreter rounds fp32 -> bf16 by truncation (twice the error of the GPU's
    round-to-nearest), so bf16 is checked by the ``gpu`` test."""
    x, gate, w, dy = norm_inputs((4, 33, 128), torch.float16, gated, seed=1)
    ins = [x, gate, w] if gated else [x, w]
    exact = grads(norm_fn(gated, None), [t.double() for t in ins], dy.double())
    ours, theirs = grads(norm_fn(gated, "triton"), ins, dy), grads(norm_fn(gated, None), ins, dy)
    assert ours[0].dtype == torch.float16
    assert rel(ours[0], exact[0]) <= 1.2 * rel(theirs[0], exact[0]) + 1e-4
    for a, b, e in zip(ours[1], theirs[1], exact[1]):
        assert rel(a, e) <= 1.2 * rel(b, e) + 1e-3


@pytest.mark.parametrize("shape", [(37, 2 * 64), (2, 3, 2 * 1100), (1, 2)])
def test_silu_mul_matches_torch(shape):
    g = torch.Generator().manual_seed(2)
    gu, dy = torch.randn(shape, generator=g) * 4, torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
    gu, dy = gu.to(kernel_device()), dy.to(kernel_device())
    ours = grads(lambda t: silu_mul(t, backend="triton"), [gu], dy)
    ref = grads(silu_mul_torch, [gu], dy)
    assert ours[0].shape == (*shape[:-1], shape[-1] // 2)
    assert rel(ours[0], ref[0]) < 1e-6 and rel(ours[1][0], ref[1][0]) < 1e-6


def test_mixed_dtypes_follow_torch():
    """bf16 x with an fp32 gain (autocast with fp32 weights): the same output dtype and values as PyTorch."""
    x, gate, w, dy = norm_inputs((5, 64), torch.float16, True)
    w = w.float()
    y = rms_norm(x, w, backend="triton")
    ref = rms_norm_torch(x, w, 1e-6)
    assert y.dtype == ref.dtype == torch.float32 and rel(y, ref) < 1e-6
    y = gated_rms_norm(x, gate, w, backend="triton")
    assert y.dtype == gated_rms_norm_torch(x, gate, w, 1e-6).dtype == torch.float16
    x32 = x.float().requires_grad_(True)
    rms_norm(x32, w.half(), backend="triton").backward(dy.float())
    assert x32.grad.dtype == torch.float32


def test_backend_choice_and_errors(monkeypatch):
    x, _, w, _ = (t.cpu() for t in norm_inputs((3, 8), torch.float32, True))
    assert torch.equal(rms_norm(x, w), rms_norm_torch(x, w, 1e-6))  # CPU default: the PyTorch path
    monkeypatch.setenv("KVL_NORM_BACKEND", "nope")
    with pytest.raises(ValueError, match="KVL_NORM_BACKEND"):
        rms_norm(x, w)
    monkeypatch.delenv("KVL_NORM_BACKEND")
    with pytest.raises(ValueError, match=r"weight must be \[D=8\], got \(7,\)"):
        rms_norm(x, w[:7])
    with pytest.raises(ValueError, match="gate must have x's shape"):
        gated_rms_norm(x, x[:2], w)
    with pytest.raises(ValueError, match=r"\[\.\.\., 2I\]"):
        silu_mul(torch.randn(2, 3))
    wide, w_wide = torch.randn(2, 16385, device=kernel_device()), torch.ones(16385, device=kernel_device())
    # above MAX_D: the PyTorch path, same result
    assert torch.equal(rms_norm(wide, w_wide, backend="triton"), rms_norm_torch(wide, w_wide, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_model_shapes(dtype):
    """The model's shapes on CUDA: RMSNorm [8192, 768], the KDA output norm [8192 * 6, 128], SwiGLU [8192, 2 * 2048]."""
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for gated, shape in ((False, (8, 1024, 768)), (True, (8, 1024, 6, 128))):
        x, gate, w, dy = (t.cuda() if t is not None else None for t in norm_inputs(shape, dtype, gated))
        ins = [x, gate, w] if gated else [x, w]
        ours = grads(norm_fn(gated, "triton"), ins, dy)
        exact = grads(norm_fn(gated, None), [t.double() for t in ins], dy.double())
        assert rel(ours[0], exact[0]) < tol
        for a, e in zip(ours[1], exact[1]):
            assert rel(a, e) < tol
    gu = torch.randn(8, 1024, 4096, device="cuda", dtype=dtype)
    dy = torch.randn(8, 1024, 2048, device="cuda", dtype=dtype)
    ours = grads(lambda t: silu_mul(t, backend="triton"), [gu], dy)
    exact = grads(silu_mul_torch, [gu.double()], dy.double())
    assert rel(ours[0], exact[0]) < tol and rel(ours[1][0], exact[1][0]) < tol


@pytest.mark.parametrize("gated", [False, True])
def test_triton_norm_without_grad_skips_autograd_and_equals_it(gated):
    """No gradient to record (decode, no_grad evaluation): the forward kernel alone, bit-equal to the autograd
    function's output, no graph; with a gradient wanted the autograd function records as before."""
    x, gate, w, _ = norm_inputs((3, 5, 40), torch.bfloat16, gated, seed=7)
    call = (lambda *t: gated_rms_norm(*t, backend="triton")) if gated else (lambda *t: rms_norm(*t, backend="triton"))
    args = (x, gate, w) if gated else (x, w)
    with torch.no_grad():
        fast = call(*args)
    w_leaf = w.clone().requires_grad_(True)
    tracked = call(*((x, gate, w_leaf) if gated else (x, w_leaf)))
    assert fast.grad_fn is None and tracked.grad_fn is not None
    assert fast.shape == x.shape and fast.dtype == tracked.dtype
    assert torch.equal(fast, tracked.detach())
    assert torch.equal(call(*args), fast)  # grad mode on, but nothing requires grad: the same fast path


def ln_inputs(shape, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 2.0).to(dtype)  # an offset: the mean matters
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    b = (0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return tuple(t.to(kernel_device()) for t in (x, w, b, torch.randn(shape, generator=g).to(dtype)))


@pytest.mark.parametrize("shape", [(37, 64), (3, 5, 100), (2, 9, 768), (4, 3)])
def test_layer_norm_fp32_matches_torch(shape):
    x, w, b, dy = ln_inputs(shape, torch.float32)
    ours = grads(lambda *t: layer_norm(*t, eps=1e-6, backend="triton"), [x, w, b], dy)
    ref = grads(lambda *t: torch.nn.functional.layer_norm(t[0], shape[-1:], t[1], t[2], 1e-6), [x, w, b], dy)
    assert ours[0].dtype == torch.float32 and rel(ours[0], ref[0]) < 1e-6
    for name, a, r in zip(["dx", "dw", "db"], ours[1], ref[1]):
        assert rel(a, r) < 1e-5, name


def test_layer_norm_half_error_not_above_torch_path():
    """fp16 (see test_norm_half_error_not_above_torch_paths): output in x's dtype, errors against fp64 at most the
    PyTorch path's (fp32 inside, one rounding)."""
    x, w, b, dy = ln_inputs((4, 33, 128), torch.float16, seed=1)
    exact = grads(lambda *t: layer_norm_torch(*t, 1e-6), [t.double() for t in (x, w, b)], dy.double())
    ours = grads(lambda *t: layer_norm(*t, eps=1e-6, backend="triton"), [x, w, b], dy)
    theirs = grads(lambda *t: layer_norm_torch(*t, 1e-6), [x, w, b], dy)
    assert ours[0].dtype == torch.float16
    assert rel(ours[0], exact[0]) <= 1.2 * rel(theirs[0], exact[0]) + 1e-4
    for a, t, e in zip(ours[1], theirs[1], exact[1]):
        assert rel(a, e) <= 1.2 * rel(t, e) + 1e-3


def test_layer_norm_errors_and_no_grad_path():
    x, w, b, _ = ln_inputs((3, 8), torch.float32)
    with pytest.raises(ValueError, match=r"bias must be \[D=8\], got \(7,\)"):
        layer_norm(x, w, b[:7])
    with torch.no_grad():
        fast = layer_norm(x, w, b, backend="triton")
    assert fast.grad_fn is None and rel(fast, layer_norm_torch(x, w, b, 1e-5)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_layer_norm_vision_shape(dtype):
    """The vision tower's LayerNorm on CUDA, [21000, 768] (patches of a training batch at batch 24)."""
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    x, w, b, dy = ln_inputs((21000, 768), dtype)
    ours = grads(lambda *t: layer_norm(*t, backend="triton"), [x, w, b], dy)
    exact = grads(lambda *t: layer_norm_torch(*t, 1e-5), [t.double() for t in (x, w, b)], dy.double())
    assert rel(ours[0], exact[0]) < tol
    for a, e in zip(ours[1], exact[1]):
        assert rel(a, e) < tol


@pytest.mark.parametrize(("d", "gated", "stream"), [(64, True, False), (100, False, True), (768, False, False),
                                                     (768, False, True), (1000, True, False)])
def test_norm_backward_row_kernel_equals_tile_kernel(monkeypatch, d, gated, stream):
    """``_norm_bwd_rows_kernel`` (allowed up to 8 chunks a row here; by default only one-chunk rows take it) gives
    the tile kernel's dx, dgate and dweight in fp32 (the same maths; sums in another order): one and several
    chunks, masked columns, grid-stride tiles with a ragged last one, the stream's gradient."""
    from kernels.norm import norm_triton as nt

    g = torch.Generator().manual_seed(5)
    dev = kernel_device()
    x, dy, gate, ds = (torch.randn(37, d, generator=g).to(dev) for _ in range(4))
    w = (1 + 0.2 * torch.randn(d, generator=g)).to(dev)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    args = (x, gate if gated else None, w, rstd, dy, ds if stream else None)
    monkeypatch.setattr(nt, "NORM_ROWS_MAX_CHUNKS", 8)
    monkeypatch.setattr(nt, "NORM_ROWS_PROGRAMS_PER_SM", 2)
    assert nt._row_layout(37, d, 4, x.device) is not None
    rows = nt.norm_bwd(*args)
    monkeypatch.setattr(nt, "NORM_BWD_ROWS", False)
    assert nt._row_layout(37, d, 4, x.device) is None
    tile = nt.norm_bwd(*args)
    for name, a, b in zip(("dx", "dgate", "dweight"), rows, tile):
        assert (a is None) == (b is None) == (name == "dgate" and not gated), name
        if a is not None:
            assert rel(a, b) < 1e-6, name
