"""The KDA layer with its Triton kernels equals the layer on the PyTorch path, forward and every gradient.

On a CPU the Triton kernels run under the interpreter (tiny shapes); with a GPU on the GPU. This is the layer's
training wiring end to end: the fused input projections (``kernels.linear``), the short conv, and the chunked
operator with its in-kernel L2 norm and gate, taking the q|k|v tensor and writing d(qkv) in place
(``ChunkKDAFunction``)."""

from __future__ import annotations

import pytest
import torch
from backbone_utils import tiny_config
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kimi_vl.modeling.kda_layer import KDALayer


@pytest.mark.parametrize("packed", [False, True])
def test_kda_layer_triton_equals_torch(monkeypatch, packed) -> None:
    interpret_without_gpu(monkeypatch)
    torch.manual_seed(0)
    cfg = tiny_config(linear_num_heads=2, linear_head_dim=16, hidden_size=32)
    dev = kernel_device()
    layer = KDALayer(cfg, 0).to(dev)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    b, t = (1, 70) if packed else (2, 37)
    cu = torch.tensor([0, 1, 40, 70], dtype=torch.int32, device=dev) if packed else None
    x = torch.randn(b, t, 32, device=dev)
    w = torch.randn(b, t, 32, device=dev)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVL_KDA_BACKEND", backend)
        monkeypatch.setenv("KVL_CONV_BACKEND", backend)
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        y = layer(xi, None, cu)
        (y * w).sum().backward()
        results[backend] = [y.detach(), xi.grad] + [p.grad.clone() for p in layer.parameters()]
    names = ["y", "dx"] + [n for n, _ in layer.named_parameters()]
    for name, got, want in zip(names, results["triton"], results["torch"]):
        assert_rel_rms(got, want, 1e-4, name)


def test_kda_layer_small_projection_padding_changes_nothing(monkeypatch) -> None:
    """The small input map's zero rows (``SMALL_PROJ_ALIGN``: 2K + H = 36 rows here, padded to 40) change no value:
    the layer's output and every gradient equal the unpadded layer's (PyTorch path, fp32, CPU)."""
    from kimi_vl.modeling import kda_layer

    torch.manual_seed(1)
    cfg = tiny_config(linear_num_heads=4, linear_head_dim=16, hidden_size=32)
    layer = KDALayer(cfg, 0)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 21, 32)
    w = torch.randn(2, 21, 32)
    results = {}
    for align in (1, 8):
        monkeypatch.setattr(kda_layer, "SMALL_PROJ_ALIGN", align)
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        small = layer._input_proj(xi)[1]
        assert small.shape[-1] == (36 if align == 1 else 40)
        y = layer(xi)
        (y * w).sum().backward()
        results[align] = [y.detach(), xi.grad] + [p.grad.clone() for p in layer.parameters()]
    names = ["y", "dx"] + [n for n, _ in layer.named_parameters()]
    for name, got, want in zip(names, results[8], results[1]):
        assert_rel_rms(got, want, 1e-6, name)
