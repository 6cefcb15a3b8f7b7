"""Fused rotate-half RoPE of q and k (``kernels/rope2d``): Triton == the PyTorch reference, forward and backward.

On a CPU the kernel runs under the Triton interpreter (conftest sets ``TRITON_INTERPRET=1``). In fp32 the kernel
is bit-identical to the reference (separate roundings, no FMA); the interpreter truncates fp32 -> bf16 where the
GPU rounds to nearest, so bf16 is compared loosely here and exactly in the ``gpu`` test.
"""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device, poison_

from kernels.rope2d import rope_2d, rope_torch, rope_triton


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_ROPE_BACKEND", raising=False)



def _inputs(lead: tuple[int, ...], H: int, D: int, dtype: torch.dtype, fused: bool, seed: int = 0):
    """q, k ``[*lead, H, D]`` (strided views of one ``[*lead, 3, H, D]`` q|k|v tensor when ``fused``), fp32 cos/sin
    of random angles, and output gradients."""
    g = torch.Generator().manual_seed(seed)
    if fused:
        q, k, _ = torch.randn(*lead, 3, H, D, generator=g).to(kernel_device(), dtype).unbind(-3)
    else:
        q, k = (torch.randn(*lead, H, D, generator=g).to(kernel_device(), dtype) for _ in range(2))
    angles = 50 * torch.randn(*lead, D, generator=g).to(kernel_device())
    dq, dk = (torch.randn(*lead, H, D, generator=g).to(kernel_device(), dtype) for _ in range(2))
    return q, k, angles.cos(), angles.sin(), dq, dk


def _run(backend: str | None, q, k, cos, sin, dq, dk):
    """Outputs and the gradients of q and k; ``backend`` None = the reference (``rope_torch`` per tensor)."""
    q, k = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    if backend is None:
        outs = rope_torch(q, cos, sin), rope_torch(k, cos, sin)
    else:
        outs = rope_2d(q, k, cos, sin, backend=backend)
    torch.autograd.backward(outs, (dq, dk))
    return [t.detach() for t in outs] + [q.grad, k.grad]


SHAPES = [((1,), 1, 4), ((7,), 2, 8), ((65,), 3, 72), ((2, 33), 6, 12), ((1000,), 2, 64)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("lead,H,D", SHAPES)
def test_fp32_is_bit_identical_to_reference(lead, H, D, fused) -> None:
    inputs = _inputs(lead, H, D, torch.float32, fused)
    ours, ref = _run("triton", *inputs), _run(None, *inputs)
    for name, a, b in zip(["q", "k", "dq", "dk"], ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.equal(a, b), name


@pytest.mark.parametrize("lead,H,D", SHAPES[1:4])
def test_bf16_close_to_reference(lead, H, D) -> None:
    inputs = _inputs(lead, H, D, torch.bfloat16, fused=True)
    ours, ref = _run("triton", *inputs), _run(None, *inputs)
    for name, a, b in zip(["q", "k", "dq", "dk"], ours, ref):
        assert a.dtype == torch.bfloat16, name
        assert_rel_rms(a, b, 1e-2, name)


def test_every_output_element_is_written(monkeypatch) -> None:
    monkeypatch.setattr(rope_triton, "_empty_like_rows", lambda x: poison_(torch.empty(x.shape, dtype=x.dtype,
                                                                                       device=x.device)))
    q, k, cos, sin, dq, dk = _inputs((65,), 3, 72, torch.float32, fused=True)
    for t in _run("triton", q, k, cos, sin, dq, dk):
        assert torch.isfinite(t).all()


def test_gradient_reaches_the_fused_projection() -> None:
    """Through strided views of one q|k|v tensor: q's and k's gradients land in their slots, v's slot stays 0."""
    g = torch.Generator().manual_seed(1)  # a CPU generator: the same numbers on either device
    qkv = torch.randn(9, 3, 2, 8, generator=g).to(kernel_device()).requires_grad_(True)
    angles = torch.randn(9, 8, generator=g).to(kernel_device())
    grads = []
    for backend in ("triton", "torch"):
        q, k, _ = qkv.unbind(1)
        q_rot, k_rot = rope_2d(q, k, angles.cos(), angles.sin(), backend=backend)
        (gq,) = torch.autograd.grad((q_rot * 2 + k_rot).sum(), qkv)
        grads.append(gq)
    _assert_same(grads[0], grads[1])
    assert torch.count_nonzero(grads[0][:, 2]) == 0


def _assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-equal through the interpreter (same fp32 operations as PyTorch on the CPU); within fp32 rounding for the
    compiled kernel, whose products may fuse into FMAs."""
    if a.is_cuda:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(a, b)


def test_dispatch_and_errors(monkeypatch) -> None:
    q, k, cos, sin, _, _ = _inputs((5,), 2, 8, torch.float32, fused=False)
    monkeypatch.setenv("KVL_ROPE_BACKEND", "torch")
    assert torch.equal(rope_2d(q, k, cos, sin)[0], rope_torch(q, cos, sin))
    monkeypatch.setenv("KVL_ROPE_BACKEND", "cuda")
    with pytest.raises(ValueError, match="KVL_ROPE_BACKEND"):
        rope_2d(q, k, cos, sin)
    monkeypatch.delenv("KVL_ROPE_BACKEND")
    with pytest.raises(ValueError, match=r"q and k must have one shape.*k \(5, 2, 6\)"):
        rope_2d(q, k[..., :6], cos, sin)
    with pytest.raises(ValueError, match="D must be even"):
        rope_2d(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="cos and sin must be"):
        rope_2d(q, k, cos[:4], sin[:4])
    if not torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            rope_2d(q, k, cos, sin, backend="triton")


def test_moonvit_output_and_gradients_equal_with_either_backend(monkeypatch) -> None:
    from vision_encoder.config import moonvit_config
    from vision_encoder.model import MoonViT

    grid = torch.tensor([[1, 4, 6], [2, 2, 4], [1, 2, 2]])
    pv = torch.randn(int(grid.prod(-1).sum()), 3, 14, 14).to(kernel_device())
    results = []
    for backend in ("triton", "torch"):
        monkeypatch.setenv("KVL_ROPE_BACKEND", backend)
        torch.manual_seed(0)
        model = MoonViT(moonvit_config("debug", out_hidden_size=16)).to(kernel_device())
        out = model(pv, grid)
        out.projected.square().mean().backward()
        results.append([out.projected.detach()] + [p.grad for p in model.parameters()])
    for a, b in zip(*results):
        _assert_same(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_bit_identical_at_model_shapes(dtype) -> None:
    """MoonViT-small (6 heads x 64) and so400m (16 x 72) shapes: the compiled kernel rounds like PyTorch."""
    for H, D in ((6, 64), (16, 72)):
        inputs = _inputs((4099,), H, D, dtype, fused=True)
        ours, ref = _run("triton", *inputs), _run(None, *inputs)
        for name, a, b in zip(["q", "k", "dq", "dk"], ours, ref):
            assert torch.equal(a, b), (H, D, name)
