"""The KDA forward in pieces along time (``kernels/kda/pieces.py``): the same kernels over subsets of the chunks, the
state pass chained through each piece's final states, must give exactly the one-piece forward and its gradients. On a
CPU the pieces run in order under the Triton interpreter; the ``gpu`` test runs them on three streams and inside a
CUDA graph."""

from __future__ import annotations

import pytest
import torch
from kda_cases import make_inputs
from kvl_testing import interpret_without_gpu, kernel_device

from kernels.kda import chunk_kda, pieces
from kernels.kda.pieces import fwd_pieces, piece_bounds, piece_tables


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.setenv("KVL_KDA_BACKEND", "triton")


def _run(monkeypatch, n_pieces, x, **kw):
    """o, final state and the inputs' gradients of chunk_kda at ``FWD_PIECES = n_pieces``."""
    monkeypatch.setattr(pieces, "FWD_PIECES", n_pieces)
    xs = [t.detach().clone().requires_grad_() for t in x]
    o, S = chunk_kda(*xs[:5], initial_state=xs[5], output_final_state=True, **kw)
    (o.float().square().sum() + S.sum()).backward()
    return [o.detach(), S.detach()] + [t.grad for t in xs]


@pytest.mark.parametrize("dtype,flags,weights",
                         [(torch.float32, False, {}), (torch.bfloat16, True, {3: (2.0, 1.0, 1.0)})])
def test_pieces_equal_one_piece(monkeypatch, dtype, flags, weights):
    """Two sequences of 4 chunks (the last one 8 tokens) in 3 pieces of 1, 1 and 2 chunks (``PIECE_WEIGHTS[3]`` (2,
    1, 1): 2, 1 and 1), with an initial state: o, the final state and every gradient bit-equal to the forward in one
    piece (the same kernels on the same chunks). With the Kimi flags (in-kernel L2 norm and gate) in bf16, without
    them in fp32."""
    monkeypatch.setattr(pieces, "PIECE_WEIGHTS", weights)
    dev = kernel_device()
    q, k, v, g, beta, s0 = make_inputs(2, 200, 1, 2, 16, 16, h0=True)
    x = [t.to(dev, dtype) for t in (q, k, v)] + [t.to(dev, torch.float32) for t in (g, beta, s0)]
    kw = {}
    if flags:
        kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  A_log=torch.tensor([0.1, 1.0], device=dev), dt_bias=torch.randn(2 * 16, device=dev))
    ref = _run(monkeypatch, 1, x, **kw)
    got = _run(monkeypatch, 3, x, **kw)
    names = ["o", "final state", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    for name, a, b in zip(names, got, ref):
        assert torch.equal(a, b), f"{name}: pieces differ from one piece by {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("weights,sizes", [({}, [6, 9, 6, 9]), ({4: (4.0, 3.0, 2.0, 1.0)}, [12, 9, 6, 3]),
                                           ({2: (1.0, 3.0)}, [6, 9, 6, 9])])
def test_piece_tables_cover_every_chunk_once(monkeypatch, weights, sizes):
    """3 sequences of 10 chunks in 4 pieces: near-equal (2, 3, 2 and 3 chunks of each sequence), by
    ``PIECE_WEIGHTS[4]`` (4, 3, 2, 1), or near-equal again when the weights are for another piece count."""
    monkeypatch.setattr(pieces, "PIECE_WEIGHTS", weights)
    tab = piece_tables(3, 10, 4, torch.device("cpu"))
    assert [c.numel() for c in tab.cidx] == sizes
    assert sorted(torch.cat(tab.cidx).tolist()) == list(range(30))
    for cidx, s0, nc in zip(tab.cidx, tab.s0, tab.nc):  # each sequence's chunks of a piece: s0 .. s0 + nc - 1
        want = torch.cat([torch.arange(a, a + n) for a, n in zip(s0.tolist(), nc.tolist())])
        assert cidx.tolist() == want.tolist()


def test_piece_bounds():
    assert piece_bounds(10, 4) == (0, 2, 5, 7, 10)  # j * 10 // 4
    assert piece_bounds(4, 3) == (0, 1, 2, 4)
    assert piece_bounds(3, 3) == (0, 1, 2, 3)  # every piece keeps a chunk
    assert all(min(b - a for a, b in zip(bs, bs[1:])) >= 1 for n in range(1, 40) for p in range(1, n + 1)
               for bs in [piece_bounds(n, p)])
    with pytest.raises(ValueError, match="3 pieces for 2 chunks"):
        piece_bounds(2, 3)
    assert piece_bounds(10, 4, (1.0,) * 4) == (0, 2, 5, 7, 10)  # equal weights: the near-equal pieces
    assert piece_bounds(128, 2, (7.0, 3.0)) == (0, 89, 128)
    assert piece_bounds(4, 3, (100.0, 1.0, 1.0)) == (0, 2, 3, 4)  # every piece keeps a chunk
    assert piece_bounds(3, 3, (0.1, 0.1, 0.1)) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="weights"):
        piece_bounds(10, 3, (1.0, 1.0))
    with pytest.raises(ValueError, match="weights"):
        piece_bounds(10, 2, (1.0, 0.0))


def test_fwd_pieces_rule(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(pieces, "FWD_PIECES", 8)
    assert fwd_pieces(5, 16, 128, cpu) == 5  # at most one a chunk
    assert fwd_pieces(None, 16, 128, cpu) == 1  # varlen: one piece
    monkeypatch.setattr(pieces, "FWD_PIECES", None)
    assert fwd_pieces(512, 16, 128, cpu) == 1  # the shape rule only on a GPU
    monkeypatch.setattr(pieces, "sm_count", lambda device: 132)
    monkeypatch.setattr(pieces, "PIECE_STATE_BV", 32)
    gpu = torch.device("cuda")
    assert fwd_pieces(512, 16, 128, gpu) == pieces.PIECES_MANY  # 64 programs of 32 columns: under half the SMs
    assert fwd_pieces(512, 33, 128, gpu) == pieces.PIECES_FEW  # 132: one an SM
    assert fwd_pieces(512, 34, 128, gpu) == 1  # 136: more state programs than SMs
    assert fwd_pieces(pieces.PIECE_MIN_CHUNKS * 3, 16, 128, gpu) == 3  # one a PIECE_MIN_CHUNKS chunks at most


@pytest.mark.gpu
@pytest.mark.parametrize("weights", [{}, {4: (4.0, 3.0, 2.0, 1.0)}])
def test_gpu_pieces_equal_one_piece_and_capture(monkeypatch, weights):
    """At 1 x 8192 x 4 (128 chunks) in 4 pieces (near-equal, or by ``PIECE_WEIGHTS``) on the GPU's three streams:
    bit-equal o, state and gradients to one piece, and a CUDA graph of the pieced forward replays to the same o."""
    monkeypatch.setattr(pieces, "PIECE_WEIGHTS", weights)
    q, k, v, g, beta, s0 = make_inputs(1, 8192, 4, 4, 128, 128, h0=True, dtype=torch.float32)
    x = [t.cuda().bfloat16() for t in (q, k, v)] + [t.cuda() for t in (g, beta, s0)]
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=torch.rand(4, device="cuda"),
              dt_bias=torch.randn(4 * 128, device="cuda"))
    ref = _run(monkeypatch, 1, x, **kw)
    got = _run(monkeypatch, 4, x, **kw)
    for name, a, b in zip(["o", "state", "dq", "dk", "dv", "dg", "dbeta", "dh0"], got, ref):
        assert torch.equal(a, b), name
    xs = [t.detach() for t in x]
    fwd = lambda: chunk_kda(*xs[:5], initial_state=xs[5], output_final_state=True, **kw)  # noqa: E731
    fwd()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, _ = fwd()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, ref[0])
