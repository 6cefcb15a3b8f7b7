"""Rotate-half rotary position embedding of q and k with per-token cos/sin tables, fused (MoonViT's 2-D RoPE).

    rope_2d(q, k, cos, sin) = (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)
    rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])

in fp32, each output cast back to its input's dtype. The 2-D structure (half the rotary pairs turn with the patch's
column, half with its row) is all in ``cos/sin``, which ``vision_encoder/rope_2d.py`` builds; the op itself is the
plain rotate-half rotation. Two implementations behind one dispatch point: ``rope_torch.py`` (PyTorch, the
reference and the CPU path) and ``rope_triton.py`` (one launch for q and k forward, one backward; q and k may be
strided views, e.g. of a fused q|k|v projection, read in place; bit-identical to the reference). The ``backend``
argument, else ``KVL_ROPE_BACKEND=triton|torch``, else Triton on CUDA and PyTorch elsewhere;
``KVL_ROPE_BACKEND=triton TRITON_INTERPRET=1`` runs the kernel on a CPU. Inside ``torch.compile`` the PyTorch path
is traced (inductor fuses it), and cos/sin that require a gradient also take the PyTorch path.

Shapes: q, k ``[..., H, D]`` (the same shape, D even, last dim contiguous for the in-place read); cos, sin
``[..., D]`` over the same leading dims, fp32. Returns two contiguous ``[..., H, D]`` tensors in q's and k's dtypes.

Example::

    import torch
    from kernels.rope2d import rope_2d
    qkv = torch.randn(10, 3, 4, 8)                 # [P, 3, H, D]: a fused projection's output
    q, k, v = qkv.unbind(1)
    angles = torch.randn(10, 8)
    q_rot, k_rot = rope_2d(q, k, angles.cos(), angles.sin())   # [10, 4, 8] each
"""

from __future__ import annotations

import torch

from kernels.backend import choose_backend
from kernels.rope2d.rope_torch import rope_torch

__all__ = ["rope_2d", "rope_torch"]


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Explicit argument, else ``KVL_ROPE_BACKEND``, else Triton on CUDA and PyTorch elsewhere."""
    return choose_backend(backend, device, "rope_2d", "kernels/rope2d", "KVL_ROPE_BACKEND")


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    def fail(msg: str) -> None:
        raise ValueError(f"rope_2d (kernels/rope2d): {msg}; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")

    if q.dim() < 2 or q.shape != k.shape:
        fail("q and k must have one shape [..., H, D]")
    if q.shape[-1] % 2:
        fail("the head dim D must be even")
    if cos.shape != sin.shape or cos.shape != q.shape[:-2] + q.shape[-1:]:
        fail("cos and sin must be [..., D] over q's leading dims")
    if not (q.is_floating_point() and k.is_floating_point() and cos.is_floating_point() and sin.is_floating_point()):
        fail("all four must be floating point")


def rope_2d(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q, k [..., H, D]`` by the angles whose ``cos, sin [..., D]`` are given (fp32 maths); differentiable
    in q and k (the Triton path gives cos/sin no gradient, so they must not require one there)."""
    _check(q, k, cos, sin)
    use_torch = (resolve_backend(backend, q.device) == "torch" or torch.compiler.is_compiling()
                 or cos.requires_grad or sin.requires_grad)
    if use_torch:
        return rope_torch(q, cos, sin), rope_torch(k, cos, sin)
    from kernels.rope2d.rope_triton import RopeQKFunction

    H, D = q.shape[-2:]
    lead = q.shape[:-2]
    q_rot, k_rot = RopeQKFunction.apply(q.reshape(-1, H, D), k.reshape(-1, H, D), cos.reshape(-1, D),
                                        sin.reshape(-1, D))
    return q_rot.view(*lead, H, D), k_rot.view(*lead, H, D)
