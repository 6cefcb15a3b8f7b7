"""KDA manual backward: the PyTorch reference (``chunk_bwd_torch.py``) against autograd through the fp64 oracle,
the Triton backward kernels (``chunk_triton_bwd.py``, interpreter on a CPU) against the PyTorch reference, and
(``gpu``-marked) the wired bf16 backward against the fp64 oracle."""

from __future__ import annotations

import pytest
import torch
from kda_cases import make_inputs
from kvl_testing import assert_rel_rms

from kernels.kda.chunk_bwd_torch import chunk_kda_bwd_torch, chunk_kda_fwd_state_torch
from kernels.kda.naive import naive_recurrent_kda

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _oracle_grads(q, k, v, g, beta, s0, scale, cu, with_dht):
    """Autograd through the fp64 token loop: (o, final state, do, dht, grads of q k v g beta [h0])."""
    xs = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta)]
    h0 = s0.detach().clone().requires_grad_() if s0 is not None else None
    o, S = naive_recurrent_kda(*xs, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    do = torch.randn_like(o)
    dS = torch.randn_like(S) if with_dht else None
    outs, gin = ([o, S], [do, dS]) if with_dht else ([o], [do])
    wrt = xs + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(outs, wrt, gin)
    return o, S, do, dS, grads


@pytest.mark.parametrize(
    "B,T,H,HV,K,V,gate,h0,dht,cu",
    [
        (1, 70, 1, 2, 8, 6, "logsig_sharp", True, True, None),
        (2, 130, 2, 4, 12, 8, "lower_bound", False, True, None),
        (1, 76, 1, 1, 8, 8, "logsig", True, False, [0, 1, 67, 76]),
        (1, 81, 2, 2, 8, 4, "logsig_slow", False, True, [0, 64, 64, 65, 81]),
        (1, 1, 1, 1, 4, 4, "logsig", True, True, None),
    ],
)
def test_torch_manual_bwd_vs_oracle_fp64(B, T, H, HV, K, V, gate, h0, dht, cu):
    cu = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    N = B if cu is None else cu.numel() - 1
    q, k, v, g, beta, s0 = make_inputs(B, T, H, HV, K, V, gate=gate, h0=h0, N=N)
    scale = K**-0.5
    o, S, do, dS, ref = _oracle_grads(q, k, v, g, beta, s0, scale, cu, dht)
    st = chunk_kda_fwd_state_torch(q, k, v, g, beta, scale, s0, cu)
    assert_rel_rms(st.o, o, 1e-10, "o")
    assert_rel_rms(st.ht, S, 1e-10, "ht")
    got = chunk_kda_bwd_torch(q, k, v, g, beta, scale, st, do, dS)
    for name, a, b in zip(NAMES, got, ref):
        assert_rel_rms(a, b, 1e-10, name)
    if s0 is None:
        assert got.dh0.abs().max() > 0  # dh0 is still produced (the gradient a zero state would get)


def test_torch_manual_bwd_no_nan_strong_decay():
    q, k, v, _, beta, s0 = make_inputs(1, 100, 1, 1, 8, 8, h0=True)
    g = -50.0 * torch.rand(1, 100, 1, 8, dtype=torch.float64)
    o, S, do, dS, ref = _oracle_grads(q, k, v, g, beta, s0, 0.3, None, True)
    qf, kf, vf, gf, bf, sf = (t.float() for t in (q, k, v, g, beta, s0))
    st = chunk_kda_fwd_state_torch(qf, kf, vf, gf, bf, 0.3, sf, None)
    got = chunk_kda_bwd_torch(qf, kf, vf, gf, bf, 0.3, st, do.float(), dS.float())
    for name, a, b in zip(NAMES, got, ref):  # fp32 autograd through chunk_torch (C = 64) gets dg to 2.1e-5 here
        assert_rel_rms(a, b, 5e-5 if name == "dg" else 1e-5, name)


def _interp(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("dtype,tol,state_bv,ee,dh16,dvn16", [(torch.float32, 1e-5, 32, "never", False, False),
                                                              (torch.float16, 2e-3, 32, "never", False, False),
                                                              (torch.float32, 1e-5, 16, "never", True, True),
                                                              (torch.float32, 1e-5, None, "never", False, False),
                                                              (torch.float16, 2e-3, 32, "16bit", False, True),
                                                              (torch.float16, 2e-3, None, "16bit", True, False),
                                                              (torch.float16, 2e-3, None, "16bit", True, True)])
def test_triton_bwd_vs_torch_manual(monkeypatch, dtype, tol, state_bv, ee, dh16, dvn16):
    """Triton reverse state pass and the chained backward vs the PyTorch manual backward on the same (Triton) forward
    intermediates; varlen with a 1-token sequence and a ragged tail, HV > H, h0 and dht present; V = 48 in blocks of
    16, 32 or (``None``: the choice, off CUDA 64) value columns per reverse-state program. The fp16 cases also check
    that dq, dk, dv come back in the inputs' dtype; ``ee``: ``BWD_EE_FROM_G`` (kg's exponent in the inter-chunk
    kernel as G_last - G instead of a suffix sum of g); ``dh16`` / ``dvn16``: ``BWD_DH_16BIT`` / ``BWD_DVN_16BIT``
    (dH / dVnew and dY in the 16-bit inputs' dtype; fp32 inputs keep fp32)."""
    dev = _interp(monkeypatch)
    from kernels.kda import chunk_triton_bwd

    monkeypatch.setattr(chunk_triton_bwd, "BWD_STATE_BV", state_bv)
    monkeypatch.setattr(chunk_triton_bwd, "BWD_EE_FROM_G", ee)
    monkeypatch.setattr(chunk_triton_bwd, "BWD_DH_16BIT", dh16)
    monkeypatch.setattr(chunk_triton_bwd, "BWD_DVN_16BIT", dvn16)
    from kernels.kda.chunk_bwd_torch import bwd_state_pass_torch, to_chunks
    from kernels.kda.chunk_triton import chunk_kda_fwd_intermediates
    from kernels.kda.chunk_triton_bwd import bwd_state_pass_triton, chunk_kda_bwd_triton

    cu = torch.tensor([0, 1, 70, 80], dtype=torch.int32, device=dev)
    q, k, v, g, beta, s0 = make_inputs(1, 80, 1, 2, 16, 48, gate="logsig_sharp", h0=True, N=3)
    q, k, v = (x.to(dev, dtype) for x in (q, k, v))
    g, beta, s0 = (x.to(dev, torch.float32) for x in (g, beta, s0))
    st = chunk_kda_fwd_intermediates(q, k, v, g, beta, 0.25, s0, cu)
    do = torch.randn(1, 80, 2, 48, device=dev).to(dtype)
    dht = torch.randn(3, 2, 16, 48, device=dev)
    st32 = st._replace(**{f: getattr(st, f).float() for f in ("qg", "kg", "W", "Aqk", "h", "vn")})
    got = bwd_state_pass_triton(st, do, dht)
    assert got[1].dtype == (dtype if dh16 else torch.float32), "dH's dtype"
    assert got[0].dtype == (dtype if dvn16 else torch.float32), "dVnew's dtype"
    ref = bwd_state_pass_torch(st32, to_chunks(do.float(), st.cbos, st.clen, 2), dht)
    for name, a, b in zip(("dvn", "dH", "dh0"), got, ref):
        assert_rel_rms(a, b, tol, name)
    got = chunk_kda_bwd_triton(q, k, v, g, beta, 0.25, st, do, dht)
    assert (got.dq.dtype, got.dk.dtype, got.dv.dtype, got.dg.dtype) == (dtype, dtype, dtype, torch.float32)
    ref = chunk_kda_bwd_torch(q.float(), k.float(), v.float(), g, beta, 0.25, st32, do.float(), dht)
    for name, a, b in zip(NAMES, got, ref):
        assert_rel_rms(a, b, tol, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_training_path_recomputes_the_gate_only_where_read(monkeypatch, dtype):
    """The training backward recomputes the fp32 log-decay (``gate_fwd``) only where the core backward reads it
    (``bwd_reads_g``: fp32 inputs, whose inter kernel takes kg's exponent as a suffix sum of g); with 16-bit inputs
    it passes None and the gradients still match the PyTorch path's (in-kernel L2 norm and gate with dt_bias, h0,
    both outputs' gradients)."""
    dev = _interp(monkeypatch)
    from kernels.kda import chunk_kda, chunk_triton

    calls = []
    real = chunk_triton.gate_fwd
    monkeypatch.setattr(chunk_triton, "gate_fwd", lambda *a: calls.append(1) or real(*a))
    q, k, v, _, beta, s0 = make_inputs(1, 70, 2, 2, 32, 24, h0=True)
    raw = torch.randn(1, 70, 2, 32, dtype=torch.float64)
    A_log = torch.log(torch.empty(2, dtype=torch.float64).uniform_(1, 16))
    dtb = torch.randn(2 * 32, dtype=torch.float64)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)
    grads = {}
    for backend, dts in (("triton", [dtype] * 4 + [torch.float32] * 4), ("torch", [torch.float32] * 8)):
        x = [t.to(dev, dt).requires_grad_() for t, dt in zip((3 * q, 2 * k, v, raw, beta, s0, A_log, dtb), dts)]
        o, S = chunk_kda(*x[:5], initial_state=x[5], A_log=x[6], dt_bias=x[7], backend=backend, **kw)
        gen = torch.Generator().manual_seed(1)
        do, dS = (torch.randn(t.shape, generator=gen).to(dev, t.dtype) for t in (o, S))
        grads[backend] = torch.autograd.grad([o, S], x, [do, dS])
    assert len(calls) == (1 if dtype == torch.float32 else 0)
    names = ("dq", "dk", "dv", "dg_raw", "dbeta", "dh0", "dA_log", "ddt_bias")
    for name, a, b in zip(names, grads["triton"], grads["torch"]):  # (dA_log: a sum over every token and channel)
        assert_rel_rms(a, b, (5e-5 if name == "dA_log" else 1e-5) if dtype == torch.float32 else 2e-2, name)


def test_triton_bwd_strong_decay_grouped_heads(monkeypatch):
    """Fused Triton backward with -50 log-decays (finite, dg <= 5e-5 vs the fp32 PyTorch manual backward), two q/k
    heads of two value heads each, K = 40 (two key-channel blocks, the second masked) and V = 20 (masked)."""
    dev = _interp(monkeypatch)
    from kernels.kda.chunk_triton import chunk_kda_fwd_intermediates
    from kernels.kda.chunk_triton_bwd import chunk_kda_bwd_triton

    q, k, v, _, beta, s0 = make_inputs(1, 70, 2, 4, 40, 20, h0=True)
    q, k, v, beta, s0 = (x.to(dev, torch.float32) for x in (q, k, v, beta, s0))
    g = -50.0 * torch.rand(1, 70, 4, 40, device=dev)
    st = chunk_kda_fwd_intermediates(q, k, v, g, beta, 0.3, s0, None)
    do = torch.randn(1, 70, 4, 20, device=dev)
    got = chunk_kda_bwd_triton(q, k, v, g, beta, 0.3, st, do, None)
    ref = chunk_kda_bwd_torch(q, k, v, g, beta, 0.3, st, do, None)
    for name, a, b in zip(NAMES, got, ref):
        assert torch.isfinite(a).all(), name
        assert_rel_rms(a, b, 5e-5 if name == "dg" else 1e-5, name)


@pytest.mark.parametrize(("unroll", "bk"), [(1, 32), (4, 32), (1, 64)])
def test_triton_bwd_diagonal_fast_and_pairwise(monkeypatch, unroll, bk):
    """The pairwise kernel's diagonal blocks join its dots where the gates are mild and go pairwise where they are
    sharp: key channels 0-31 hold sharp gates, 32-63 mild and moderate ones, over a ragged chunk. Both, and every
    block forced pairwise (``BWD_SPAN_MAX = -1``), match the PyTorch manual backward; with 32 key channels a program
    (``bk``, ``BWD_PAIR_BK``) one program's block takes each path, so the two settings are different computations
    (not bit-identical); with 64 the sharp channels send the whole block pairwise. ``unroll``: ``BWD_PAIR_UNROLL``,
    the pairwise path's steps unrolled."""
    dev = _interp(monkeypatch)
    from kernels.kda import chunk_triton_bwd

    monkeypatch.setattr(chunk_triton_bwd, "BWD_PAIR_UNROLL", (unroll, unroll))
    monkeypatch.setattr(chunk_triton_bwd, "BWD_PAIR_BK", bk)
    from kernels.kda.chunk_triton import chunk_kda_fwd_intermediates
    from kernels.kda.chunk_triton_bwd import chunk_kda_bwd_triton

    q, k, v, _, beta, s0 = make_inputs(1, 100, 1, 2, 64, 16, h0=True)
    q, k, v, beta, s0 = (x.to(dev, torch.float32) for x in (q, k, v, beta, s0))
    sharp, mild, moderate = (-c * torch.rand(1, 100, 2, w, device=dev) for c, w in ((30.0, 32), (0.5, 16), (7.5, 16)))
    g = torch.cat([sharp, mild, moderate], -1)
    st = chunk_kda_fwd_intermediates(q, k, v, g, beta, 0.3, s0, None)
    do = torch.randn(1, 100, 2, 16, device=dev)
    dht = torch.randn(1, 2, 64, 16, device=dev)
    ref = chunk_kda_bwd_torch(q, k, v, g, beta, 0.3, st, do, dht)
    runs = []
    for span in (chunk_triton_bwd.BWD_SPAN_MAX, -1.0):
        monkeypatch.setattr(chunk_triton_bwd, "BWD_SPAN_MAX", span)
        got = chunk_kda_bwd_triton(q, k, v, g, beta, 0.3, st, do, dht)
        for name, a, b in zip(NAMES, got, ref):
            assert_rel_rms(a, b, 5e-5 if name == "dg" else 1e-5, f"{name} (span_max {span})")
        runs.append(got)
    if bk == 32:
        assert not torch.equal(runs[0].dq, runs[1].dq), "fast and pairwise diagonal paths gave bit-identical dq"


def _fp64_ref_outputs(ref_in, T):
    """o, final state of the fp64 reference (token loop up to T = 1000, chunk form above) on the core inputs."""
    from kernels.kda.chunk_torch import chunk_kda_torch

    if T <= 1000:
        return naive_recurrent_kda(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
    qe, ke = (t.repeat_interleave(2, 2) for t in ref_in[:2])
    return chunk_kda_torch(qe, ke, *ref_in[2:5], 128**-0.5, ref_in[5], chunk_size=64)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [63, 1000, 4096])
def test_gpu_bf16_grads_vs_fp64_oracle(T):
    """The core op (q, k normalised, g the log-decay; Triton forward and backward) in bf16 against autograd through
    the fp64 reference on the same bf16-rounded inputs (chunk form in fp64 above T = 1000)."""
    from kernels.kda import chunk_kda

    q, k, v, g, beta, s0 = make_inputs(2, T, 2, 4, 128, 128, gate="logsig", h0=True)
    q, k, v = (t.bfloat16().double() for t in (q, k, v))
    ref_in = [t.cuda().requires_grad_() for t in (q, k, v, g, beta, s0)]
    o, S = _fp64_ref_outputs(ref_in, T)
    do, dS = torch.randn_like(o), torch.randn_like(S)
    ref = torch.autograd.grad([o, S], ref_in, [do, dS])
    x = [t.detach().to(dt).requires_grad_() for t, dt in zip(ref_in, [torch.bfloat16] * 3 + [torch.float32] * 3)]
    o2, S2 = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, backend="triton")
    got = torch.autograd.grad([o2, S2], x, [do.to(o2.dtype), dS.float()])
    for name, a, b, tol in zip(NAMES, got, ref, [8e-3, 8e-3, 8e-3, 2e-2, 2e-2, 8e-3]):
        assert_rel_rms(a, b, tol, name)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [63, 4096])
def test_gpu_bf16_training_path_with_kimi_flags(T):
    """What the benchmark times and the model runs: in-kernel L2 norm and gate (``ChunkKDAFunction``: the prep
    kernel normalises and gates, the backward recomputes and chains both) in bf16, raw q, k, g_raw bf16, against
    autograd through ``l2norm_ref``, ``kda_gate_ref`` and the fp64 reference on the same rounded inputs; the
    gradients of q, k, v, g_raw, beta, h0, A_log and dt_bias."""
    from kernels.kda import chunk_kda
    from kernels.kda.naive import kda_gate_ref, l2norm_ref

    q, k, v, _, beta, s0 = make_inputs(2, T, 2, 4, 128, 128, h0=True)
    raw = torch.randn(2, T, 4, 128, dtype=torch.float64)
    q, k, v, raw = (t.bfloat16().double() for t in (2 * q, 3 * k, v, raw))
    A_log = torch.log(torch.empty(4, dtype=torch.float64).uniform_(1, 16)).float().double()
    dtb = torch.randn(4 * 128, dtype=torch.float64).float().double()
    leaves = [t.cuda().requires_grad_() for t in (q, k, v, raw, beta, s0, A_log, dtb)]
    core = [l2norm_ref(leaves[0]), l2norm_ref(leaves[1]), leaves[2], kda_gate_ref(leaves[3], leaves[6], leaves[7])]
    o, S = _fp64_ref_outputs(core + leaves[4:6], T)
    do, dS = torch.randn_like(o), torch.randn_like(S)
    ref = torch.autograd.grad([o, S], leaves, [do, dS])
    dts = [torch.bfloat16] * 4 + [torch.float32] * 4
    x = [t.detach().to(dt).requires_grad_() for t, dt in zip(leaves, dts)]
    o2, S2 = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                       use_gate_in_kernel=True, A_log=x[6], dt_bias=x[7], backend="triton")
    assert_rel_rms(o2, o, 5e-3, "o")
    assert_rel_rms(S2, S, 5e-3, "state")
    got = torch.autograd.grad([o2, S2], x, [do.to(o2.dtype), dS.float()])
    names = ("dq", "dk", "dv", "dg_raw", "dbeta", "dh0", "dA_log", "ddt_bias")
    for name, a, b, tol in zip(names, got, ref, [8e-3] * 3 + [2e-2] * 2 + [8e-3] + [2e-2] * 2):
        assert_rel_rms(a, b, tol, name)
