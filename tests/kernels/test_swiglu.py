"""The dense SwiGLU with its activation inside Triton GEMMs (``kernels/swiglu``): fused == split.

On a CPU the Triton kernels run under the interpreter (conftest sets ``TRITON_INTERPRET=1``) at small shapes; with a
GPU the same tests run on it (``kernel_device``), and the ``gpu`` test checks the ``small`` model's shape in bf16.
"""

from __future__ import annotations

import pytest
import torch
from kvl_testing import kernel_device

from kernels.swiglu import resolve_impl, swiglu_mlp
from kernels.swiglu.swiglu_triton import GemmConfig, down_silu_bwd, gate_up_silu


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def make(M: int, K: int, I: int, D: int, dtype: torch.dtype, seed: int = 0, lead: tuple[int, ...] = ()):
    g = torch.Generator().manual_seed(seed)
    dev = kernel_device()
    x = torch.randn(*lead, M, K, generator=g).to(dev, dtype)
    w_gu = (torch.randn(2 * I, K, generator=g) / K**0.5).to(dev, dtype)
    w_d = (torch.randn(D, I, generator=g) / I**0.5).to(dev, dtype)
    dy = torch.randn(*lead, M, D, generator=g).to(dev, dtype)
    return x, w_gu, w_d, dy


def run(impl: str, x, w_gu, w_d, dy, need=(True, True, True)):
    """``y`` and the gradients of the inputs flagged in ``need`` (None for the others)."""
    leaves = [t.detach().clone().requires_grad_(n) for t, n in zip((x, w_gu, w_d), need)]
    y = swiglu_mlp(*leaves, impl=impl)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


# (M, K, I, D): ragged rows and columns, K not a multiple of the interpreter's BLOCK_K (the masked reduction) and a
# multiple of it (EVEN_K), one row, more row tiles than GROUP_M
SHAPES = [(37, 48, 40, 24), (64, 32, 32, 32), (1, 20, 8, 8), (150, 16, 24, 40)]


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_equals_split_fp32(shape):
    """fp32: output and the three gradients within 1e-5 of the split path (IEEE products in the GEMMs)."""
    x, w_gu, w_d, dy = make(*shape, torch.float32)
    y_f, g_f = run("fused", x, w_gu, w_d, dy)
    y_s, g_s = run("split", x, w_gu, w_d, dy)
    assert y_f.shape == y_s.shape == (shape[0], shape[3])
    assert rel(y_f, y_s) < 1e-5
    for name, a, b in zip(("dx", "dw_gate_up", "dw_down"), g_f, g_s):
        assert rel(a, b) < 1e-5, name


def test_kernels_against_fp64():
    """The two kernels alone against fp64 maths on the same fp32 inputs: ``gu``, ``h`` and ``d gate_up``."""
    M, K, I, D = 45, 40, 24, 32
    x, w_gu, w_d, dy = make(M, K, I, D, torch.float32, seed=1)
    gu, h = gate_up_silu(x, w_gu)
    gu64 = x.double() @ w_gu.double().t()
    g64, u64 = gu64[:, :I], gu64[:, I:]
    assert rel(gu, gu64) < 1e-6
    assert rel(h, torch.nn.functional.silu(g64) * u64) < 1e-6
    dgu = down_silu_bwd(dy, w_d, gu)
    dh64 = dy.double() @ w_d.double()
    s = torch.sigmoid(g64)
    assert rel(dgu[:, :I], dh64 * u64 * s * (1 + g64 * (1 - s))) < 1e-6
    assert rel(dgu[:, I:], dh64 * g64 * s) < 1e-6


def test_other_tile_configs_agree():
    """A different tiling (rectangular tiles, a wider reduction step, one row tile a band) gives the same values:
    the benchmark's sweep changes nothing but the speed."""
    M, K, I, D = 50, 64, 48, 32
    x, w_gu, w_d, dy = make(M, K, I, D, torch.float32, seed=2)
    cfg = GemmConfig(32, 16, 32, 1, 4, 1)
    gu_a, h_a = gate_up_silu(x, w_gu)
    gu_b, h_b = gate_up_silu(x, w_gu, cfg)
    assert rel(gu_b, gu_a) < 1e-6 and rel(h_b, h_a) < 1e-6
    assert rel(down_silu_bwd(dy, w_d, gu_a, cfg), down_silu_bwd(dy, w_d, gu_a)) < 1e-6


def test_fp16_error_at_most_split():
    """fp16 (the interpreter truncates fp32 -> bf16, so bf16 is the ``gpu`` test's): against fp64 maths on the same
    fp16 inputs, the fused output and gradients are as accurate as the split path's (same rounding points)."""
    M, K, I, D = 70, 48, 40, 32
    x, w_gu, w_d, dy = make(M, K, I, D, torch.float16, seed=3)
    y_f, g_f = run("fused", x, w_gu, w_d, dy)
    y_s, g_s = run("split", x.float(), w_gu.float(), w_d.float(), dy.float())  # fp32 maths of the fp16 inputs
    y_h, g_h = run("split", x, w_gu, w_d, dy)
    assert y_f.dtype == torch.float16 and all(t.dtype == torch.float16 for t in g_f)
    assert rel(y_f, y_s) <= 1.5 * rel(y_h, y_s) + 1e-4
    for a, h, ref in zip(g_f, g_h, g_s):
        assert rel(a, ref) <= 1.5 * rel(h, ref) + 1e-4


def test_bf16_is_bf16_accurate():
    """bf16 against fp32 maths of the same bf16 inputs: errors of bf16's size (Triton's interpreter multiplies bf16
    ``tl.dot`` operands as raw bits, triton-lang/triton#11584; the launcher widens them to fp32 there). The
    interpreter also truncates fp32 -> bf16, hence the loose bound; the ``gpu`` test compares with the split path's
    error."""
    x, w_gu, w_d, dy = make(40, 32, 48, 24, torch.bfloat16, seed=7)
    y_f, g_f = run("fused", x, w_gu, w_d, dy)
    y_r, g_r = run("split", x.float(), w_gu.float(), w_d.float(), dy.float())
    assert y_f.dtype == torch.bfloat16
    for a, b in zip([y_f, *g_f], [y_r, *g_r]):
        assert rel(a, b) < 0.02


def test_leading_dims_and_partial_gradients():
    """``x [B, T, K]`` keeps its leading dims; with only the weights requiring gradients, x gets none and the
    weights' gradients equal the split path's."""
    x, w_gu, w_d, dy = make(9, 24, 16, 20, torch.float32, seed=4, lead=(3,))
    y_f, g_f = run("fused", x, w_gu, w_d, dy, need=(False, True, True))
    y_s, g_s = run("split", x, w_gu, w_d, dy, need=(False, True, True))
    assert y_f.shape == (3, 9, 20) and g_f[0] is None
    assert rel(y_f, y_s) < 1e-5 and rel(g_f[1], g_s[1]) < 1e-5 and rel(g_f[2], g_s[2]) < 1e-5


def test_no_rows():
    """M = 0: empty output, zero weight gradients, no launch."""
    x, w_gu, w_d, dy = make(0, 8, 8, 8, torch.float32)
    y, (dx, dwgu, dwd) = run("fused", x, w_gu, w_d, dy)
    assert y.shape == (0, 8) and dx.shape == (0, 8)
    assert not dwgu.any() and not dwd.any()


def test_autocast_matches_split():
    """Under autocast (fp16) both paths run their matmuls in the autocast dtype; the gradients come back in the fp32
    parameters' dtype."""
    x, w_gu, w_d, dy = make(33, 32, 24, 16, torch.float32, seed=5)
    outs = {}
    for impl in ("fused", "split"):
        with torch.autocast(kernel_device().type, dtype=torch.float16):
            outs[impl] = run(impl, x, w_gu, w_d, dy.half())
    (y_f, g_f), (y_s, g_s) = outs["fused"], outs["split"]
    assert y_f.dtype == y_s.dtype == torch.float16
    assert [t.dtype for t in g_f] == [t.dtype for t in g_s] == [torch.float32] * 3
    assert rel(y_f, y_s) < 2e-3
    for a, b in zip(g_f, g_s):
        assert rel(a, b) < 2e-3


def test_errors_name_the_problem(monkeypatch):
    x, w_gu, w_d, _ = make(4, 8, 6, 5, torch.float32)
    with pytest.raises(ValueError, match=r"w_gate_up must be \[2I, K=8\], got \(12, 7\)"):
        swiglu_mlp(x, w_gu[:, :7], w_d)
    with pytest.raises(ValueError, match=r"w_down must be \[D, I=6\], got \(5, 5\)"):
        swiglu_mlp(x, w_gu, w_d[:, :5])
    with pytest.raises(ValueError, match="x must be a floating-point"):
        swiglu_mlp(x.long(), w_gu, w_d)
    monkeypatch.setenv("KVL_SWIGLU_IMPL", "cublas")
    with pytest.raises(ValueError, match=r"KVL_SWIGLU_IMPL.*'cublas'"):
        swiglu_mlp(x, w_gu, w_d)
    monkeypatch.delenv("KVL_SWIGLU_IMPL")
    assert resolve_impl(None, torch.device("cpu")) == "split"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs CUDA or TRITON_INTERPRET=1"):
        resolve_impl("fused", torch.device("cpu"))


def test_model_swiglu_follows_the_env(monkeypatch):
    """``kimi_vl``'s dense SwiGLU module gives the same output and parameter gradients with ``KVL_SWIGLU_IMPL=fused``
    as with the default split path."""
    from kimi_vl.modeling.mlp import SwiGLU

    torch.manual_seed(0)
    mlp = SwiGLU(24, 40).to(kernel_device())
    x = torch.randn(2, 7, 24, device=kernel_device())
    results = {}
    for impl in ("split", "fused"):
        monkeypatch.setenv("KVL_SWIGLU_IMPL", impl)
        mlp.zero_grad()
        y = mlp(x)
        y.square().sum().backward()
        results[impl] = (y.detach(), [p.grad.clone() for p in mlp.parameters()])
    (y_s, g_s), (y_f, g_f) = results["split"], results["fused"]
    assert rel(y_f, y_s) < 1e-5
    assert len(g_f) == 3 and all(rel(a, b) < 1e-5 for a, b in zip(g_f, g_s))


@pytest.mark.gpu
def test_gpu_small_model_shape_bf16():
    """bf16 at the ``small`` flavor's dense MLP (D = 768, I = 2048) on 4096 rows: fused against the split path and
    both against fp32 maths of the same bf16 inputs."""
    M, K, I, D = 4096, 768, 2048, 768
    x, w_gu, w_d, dy = make(M, K, I, D, torch.bfloat16, seed=6)
    y_f, g_f = run("fused", x, w_gu, w_d, dy)
    y_s, g_s = run("split", x, w_gu, w_d, dy)
    y_r, g_r = run("split", x.float(), w_gu.float(), w_d.float(), dy.float())
    assert rel(y_f, y_s) < 1e-2
    assert rel(y_f, y_r) <= 1.2 * rel(y_s, y_r) + 1e-4
    for a, b, r in zip(g_f, g_s, g_r):
        assert rel(a, b) < 1e-2
        assert rel(a, r) <= 1.2 * rel(b, r) + 1e-4
