"""Short-convolution Triton kernels vs the PyTorch implementation (forward, final state, backward, decode).

On a CPU the kernels run under the Triton interpreter at tiny shapes; ``gpu``-marked tests check larger
shapes, bf16 and determinism on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.short_conv import causal_conv1d, causal_conv1d_update, conv_triton


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Triton on the CPU through the interpreter when there is no GPU (the flag is read at launch)."""
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_CONV_BACKEND", raising=False)



def _inputs(lens, B, D, W, bias, state, dtype=torch.float32, seed=0):
    """x [B, T, D] (B = 1 and cu_seqlens when ``lens`` is given), weight, bias, initial state, cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    B, T, N = (B, 9, B) if lens is None else (1, sum(lens), len(lens))
    x = torch.randn(B, T, D, generator=g)
    w = torch.randn(D, W, generator=g) / W**0.5
    b = torch.randn(D, generator=g) if bias else None
    s = torch.randn(N, D, W - 1, generator=g) if state else None
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]) if lens is not None else None
    to = lambda t: None if t is None else t.to(kernel_device(), dtype)  # noqa: E731
    return to(x), to(w), to(b), to(s), (cu.to(kernel_device()) if cu is not None else None)


def _run(backend, x, w, b, s, cu, activation, final, seed=1, state_grad=True):
    """Forward and the gradients of a random linear loss on y (and the final state) for every input (the initial
    state's only with ``state_grad``)."""
    leaves = [t.detach().clone().requires_grad_(state_grad or i < 3) if t is not None else None
              for i, t in enumerate((x, w, b, s))]
    y, fs = causal_conv1d(*leaves[:3], activation=activation, cu_seqlens=cu, initial_state=leaves[3],
                          output_final_state=final, backend=backend)
    g = torch.Generator().manual_seed(seed)
    loss = (y * torch.randn(y.shape, generator=g).to(y)).sum()
    if fs is not None:
        loss = loss + (fs * torch.randn(fs.shape, generator=g).to(fs)).sum()
    loss.backward()
    return {"y": y, "final_state": fs, **{f"d{n}": t.grad for n, t in zip("xwbs", leaves) if t is not None}}


CASES = [  # lens (varlen) or None (B = 2, T = 9), D, W, bias, initial state, activation, final state
    (None, 6, 4, True, True, "silu", True),
    ([1, 2, 9, 0, 5], 5, 4, False, True, "silu", True),
    ([3, 1, 7], 7, 3, True, False, None, True),
    ([1, 1, 1], 4, 4, False, True, "silu", False),
    ([2, 6], 3, 8, True, True, "silu", True),
    ([4, 1], 5, 2, False, True, "silu", True),
    ([5, 2], 3, 1, True, False, "silu", True),
]


@pytest.mark.parametrize("lens,D,W,bias,state,activation,final", CASES)
def test_forward_backward_match_torch(lens, D, W, bias, state, activation, final):
    x, w, b, s, cu = _inputs(lens, 2, D, W, bias, state)
    ref = _run("torch", x, w, b, s, cu, activation, final)
    out = _run("triton", x, w, b, s, cu, activation, final)
    assert ref.keys() == out.keys()
    for name, r in ref.items():
        if r is None:
            assert out[name] is None
            continue
        assert out[name].dtype == r.dtype, name
        assert_rel_rms(out[name], r, 1e-5, name)


TILE_CASES = [  # backward tiles: kernel 1 (rows, channels, tiles per program, deferred dweight sums), kernel 2
    # (rows, channels): tile and program edges inside the W-1 rows of taps before / dpre after each row
    (4, 4, 2, True, 2, 8),
    (2, 8, 3, False, 8, 2),
    (8, 2, 1, True, 4, 4),
    (1, 4, 5, False, 1, 2),
]
TILE_NAMES = ("DPRE_BT", "DPRE_BD", "DPRE_TILES", "DPRE_DEFER", "DX_BT", "DX_BD")
TILED = [  # lens (None: B = 2, T = 9), D, W, bias, state, activation, final
    ([1, 1, 5, 1, 2, 0, 7, 1, 3, 4], 6, 4, True, True, "silu", True),  # 1-token and shorter-than-W sequences
    ([3, 5, 2, 11, 1, 6], 5, 8, False, True, "silu", True),  # W-1 wider than a tile
    ([6, 9, 1, 4], 3, 2, True, False, None, False),
    (None, 7, 4, False, True, "silu", True),  # batched, 9 rows: sequence starts inside tiles
]


@pytest.mark.parametrize("tiles", TILE_CASES)
@pytest.mark.parametrize("lens,D,W,bias,state,activation,final", TILED)
def test_backward_tile_edges_match_torch(monkeypatch, tiles, lens, D, W, bias, state, activation, final):
    """Tiny backward tiles, so that tile, program and sequence edges fall inside the (W-1)-row halo."""
    for name, v in zip(TILE_NAMES, tiles):
        monkeypatch.setattr(conv_triton, name, v)
    x, w, b, s, cu = _inputs(lens, 2, D, W, bias, state, seed=3)
    ref = _run("torch", x, w, b, s, cu, activation, final)
    out = _run("triton", x, w, b, s, cu, activation, final)
    for name, r in ref.items():
        if r is not None:
            assert_rel_rms(out[name], r, 1e-5, name)


STREAM_CASES = [(2, 4), (3, 2), (8, 8), (1, 4)]  # STREAM_ROWS, STREAM_BD: program edges inside the W-1-row halos


@pytest.mark.parametrize("tiles", STREAM_CASES)
@pytest.mark.parametrize("lens,D,W,bias,state,activation,final", TILED + CASES[:3] + CASES[6:])
def test_fused_backward_matches_torch(monkeypatch, tiles, lens, D, W, bias, state, activation, final):
    """The one-kernel backward (``BWD_FUSED``, taken when no initial-state gradient is asked for and W > 1): dx,
    dweight, dbias against the PyTorch path, with the state's taps (no gradient) and the final-state gradient, tiny
    programs and channel blocks."""
    for name, v in zip(("STREAM_ROWS", "STREAM_BD"), tiles):
        monkeypatch.setattr(conv_triton, name, v)
    calls = []
    real = conv_triton._bwd_stream
    monkeypatch.setattr(conv_triton, "_bwd_stream", lambda *a: calls.append(1) or real(*a))
    x, w, b, s, cu = _inputs(lens, 2, D, W, bias, state, seed=5)
    ref = _run("torch", x, w, b, s, cu, activation, final, state_grad=False)
    out = _run("triton", x, w, b, s, cu, activation, final, state_grad=False)
    assert len(calls) == (1 if W > 1 else 0)
    assert out.get("ds") is None
    for name, r in ref.items():
        if r is not None:
            assert_rel_rms(out[name], r, 1e-5, name)


def test_fused_backward_equals_two_kernels(monkeypatch):
    """Both backward paths at the default tiles over several programs: dx and the weight gradient agree to fp32
    rounding (dx's sums in the same order from fp32 dpre; the weight gradient's rows summed in other orders)."""
    lens = [1, conv_triton.STREAM_ROWS + 3, 2, 40, 3]
    x, w, b, s, cu = _inputs(lens, 1, 5, 4, True, False, seed=6)
    out = {}
    for flag in (False, True):
        monkeypatch.setattr(conv_triton, "BWD_FUSED", flag)
        out[flag] = _run("triton", x, w, b, s, cu, "silu", True)
    for name, r in out[False].items():
        assert_rel_rms(out[True][name], r, 1e-6, name)


def test_backward_default_tiles_long_varlen():
    """The launch's own tiles over several programs: sequence starts, ends and halos across program edges."""
    lens = [1, conv_triton.DPRE_BT - 1, 2, conv_triton.DPRE_BT * conv_triton.DPRE_TILES + 3, 1, 40, 3]
    x, w, b, s, cu = _inputs(lens, 1, 5, 4, False, True, seed=4)
    ref = _run("torch", x, w, b, s, cu, "silu", True)
    out = _run("triton", x, w, b, s, cu, "silu", True)
    for name, r in ref.items():
        assert_rel_rms(out[name], r, 1e-5, name)


def test_dpre_in_x_dtype_within_bf16_tolerance(monkeypatch):
    """``DPRE_IN_X_DTYPE``: dpre stored in bf16 keeps every gradient within the bf16 tolerance (1e-2) of the fp32
    PyTorch path and within 2x the fp32-dpre default's error (dx: 6.3e-3 vs 4.2e-3 here)."""
    x, w, b, s, cu = _inputs([5, 40, 1, 17, 2], 1, 24, 4, True, True, seed=5)
    ref = _run("torch", x, w, b, s, cu, "silu", True)
    bf16 = [t.bfloat16() if t is not None else None for t in (x, w, b, s)]
    default = _run("triton", *bf16, cu, "silu", True)
    monkeypatch.setattr(conv_triton, "DPRE_IN_X_DTYPE", True)
    low = _run("triton", *bf16, cu, "silu", True)
    for name, r in ref.items():
        r = r.detach()
        err_default = float((default[name].detach().float() - r).norm() / r.norm())
        assert_rel_rms(low[name].detach().float(), r, min(1e-2, 2 * err_default), name)


def test_fp64_and_fp16_storage():
    x, w, b, s, cu = _inputs([3, 6], 1, 5, 4, True, True, dtype=torch.float64)
    ref, out = _run("torch", x, w, b, s, cu, "silu", True), _run("triton", x, w, b, s, cu, "silu", True)
    for name in ref:
        assert_rel_rms(out[name], ref[name], 1e-12, name)
    x16, w16, s32 = x.half(), w.half(), s.float()  # fp32 state with fp16 x: rounded to fp16 like the torch path
    y_ref, fs_ref = causal_conv1d(x16, w16, None, "silu", cu, s32, True, backend="torch")
    y, fs = causal_conv1d(x16, w16, None, "silu", cu, s32, True, backend="triton")
    assert y.dtype == torch.float16 and fs.dtype == torch.float32
    assert_rel_rms(y, y_ref, 2e-3, "y fp16")
    assert torch.equal(fs, fs_ref)


def test_state_chains_and_decode_equals_full():
    x, w, b, s, _ = _inputs(None, 2, 6, 4, True, True)
    y_full, fs_full = causal_conv1d(x, w, b, initial_state=s, output_final_state=True, backend="triton")
    y1, s1 = causal_conv1d(x[:, :4], w, b, initial_state=s, output_final_state=True, backend="triton")
    y2, s2 = causal_conv1d(x[:, 4:], w, b, initial_state=s1, output_final_state=True, backend="triton")
    assert_rel_rms(torch.cat([y1, y2], 1), y_full, 1e-6, "chained y")
    assert torch.equal(s2, fs_full) and torch.equal(fs_full[:, :, -1], x[:, -1])
    state = s
    for t in range(x.shape[1]):
        y, new = causal_conv1d_update(x[:, t], state, w, b, backend="triton")
        y_ref, new_ref = causal_conv1d_update(x[:, t], state, w, b, backend="torch")
        assert_rel_rms(y, y_full[:, t], 1e-5, f"decode y[{t}]")
        assert_rel_rms(y, y_ref, 1e-6, f"decode vs torch y[{t}]")
        assert torch.equal(new, new_ref) and new.data_ptr() != state.data_ptr()
        state = new
    assert torch.equal(state, fs_full)


@pytest.mark.parametrize("W,bias,activation", [(2, False, "silu"), (8, True, None), (1, True, "silu")])
def test_decode_widths_match_torch(W, bias, activation):
    x, w, b, s, _ = _inputs(None, 3, 7, W, bias, True)
    state_before = s.clone()
    y, new = causal_conv1d_update(x[:, 0], s, w, b, activation, backend="triton")
    y_ref, new_ref = causal_conv1d_update(x[:, 0], s, w, b, activation, backend="torch")
    assert_rel_rms(y, y_ref, 1e-6, "decode y")
    assert torch.equal(new, new_ref) and torch.equal(s, state_before)


def test_dispatch_env_and_argument(monkeypatch):
    """Which path runs, on CPU tensors (with a GPU too: the interpreter flag lets the Triton path take them)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, w = torch.randn(1, 3, 2), torch.randn(2, 4)

    def marker(*args, **kwargs):
        raise RuntimeError("triton path taken")

    monkeypatch.setattr(conv_triton, "causal_conv1d_triton", marker)
    monkeypatch.setattr(conv_triton, "causal_conv1d_update_triton", marker)
    causal_conv1d(x, w)  # CPU default: PyTorch
    monkeypatch.setenv("KVL_CONV_BACKEND", "triton")
    with pytest.raises(RuntimeError, match="triton path taken"):
        causal_conv1d(x, w)
    with pytest.raises(RuntimeError, match="triton path taken"):
        causal_conv1d_update(x[:, 0], torch.zeros(1, 2, 3), w)
    causal_conv1d(x, w, backend="torch")  # the argument wins over the environment
    monkeypatch.setenv("KVL_CONV_BACKEND", "cuda")
    with pytest.raises(ValueError, match="KVL_CONV_BACKEND"):
        causal_conv1d(x, w)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA or TRITON_INTERPRET=1"):
        causal_conv1d(x, w, backend="triton")


def test_errors_name_shapes():
    with pytest.raises(ValueError, match="non-decreasing"):
        causal_conv1d(torch.randn(1, 4, 3), torch.randn(3, 4), cu_seqlens=torch.tensor([0, 3, 2, 4]))
    with pytest.raises(ValueError, match=r"state must be \[N, D, W-1\] = \(2, 3, 3\)"):
        causal_conv1d(torch.randn(1, 4, 3), torch.randn(3, 4), cu_seqlens=torch.tensor([0, 1, 4]),
                      initial_state=torch.randn(1, 3, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_gpu_large_varlen_and_deterministic(dtype, tol):
    lens = [1, 1000, 63, 2, 4097, 65, 300]
    x, w, b, s, cu = _inputs(lens, 1, 4100, 4, True, True, dtype=dtype)
    xf, wf, bf, sf = (t.float() for t in (x, w, b, s))
    ref = _run("torch", xf, wf, bf, sf, cu, "silu", True)
    out = _run("triton", x, w, b, s, cu, "silu", True)
    for name, r in ref.items():
        assert_rel_rms(out[name].float(), r, tol, name)
    again = _run("triton", x, w, b, s, cu, "silu", True)
    assert torch.equal(again["dw"], out["dw"]) and torch.equal(again["db"], out["db"])
