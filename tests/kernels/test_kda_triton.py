"""KDA Triton kernels vs the fp64 oracle. On a CPU they run under the Triton interpreter (tiny shapes);
``gpu``-marked tests check the issue's full sizes and bf16 tolerances on CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from kda_cases import GATES, make_inputs
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device, rel_rms

from kernels.kda import chunk_kda, fused_recurrent_kda, kda_gate_ref, naive_recurrent_kda
from kernels.kda.prep_triton import qkv_base


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Run Triton on the CPU through the interpreter when there is no GPU (the flag is read at launch)."""
    interpret_without_gpu(monkeypatch)
    monkeypatch.setenv("KVL_KDA_BACKEND", "triton")



def _to(xs, dtype=torch.float32):
    return [None if x is None else x.to(kernel_device(), dtype) for x in xs]


@pytest.mark.parametrize(
    "T,H,HV,K,V,gate,h0",
    [
        (1, 1, 1, 16, 16, "logsig", False),
        (63, 1, 2, 20, 12, "logsig_sharp", True),
        (65, 1, 1, 32, 32, "lower_bound", True),
        (17, 2, 2, 24, 16, "logsig_slow", False),
        (70, 1, 2, 48, 40, "logsig", True),  # several K / V tiles per kernel, ragged ones
    ],
)
def test_triton_fp32_vs_oracle(T, H, HV, K, V, gate, h0):
    q, k, v, g, beta, s0 = make_inputs(1, T, H, HV, K, V, gate=gate, h0=h0)
    o, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    for fn in (chunk_kda, fused_recurrent_kda):
        x = _to([q, k, v, g, beta, s0])
        res = fn(*x[:5], initial_state=x[5], output_final_state=True)
        assert_rel_rms(res[0], o, 1e-5, f"{fn.__name__} o")
        assert_rel_rms(res[1], S, 1e-5, f"{fn.__name__} state")


@pytest.mark.parametrize("fn", [chunk_kda, fused_recurrent_kda])
def test_triton_varlen_gate_l2_and_backward(fn):
    H, K, V = 1, 16, 16  # sequence lengths 1, 66, 9
    cu = torch.tensor([0, 1, 67, 76], dtype=torch.int32)
    q, k, v, raw, beta, s0 = make_inputs(1, 76, H, H, K, V, h0=True, N=3)
    A_log = torch.log(torch.empty(H, dtype=torch.float64).uniform_(1, 16))
    dtb = torch.randn(H * K, dtype=torch.float64)
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, output_final_state=True)
    x = [t.requires_grad_() for t in _to([q * 2, k * 2, v, raw, beta, s0])]
    a_log, dt_bias = _to([A_log, dtb])  # on the inputs' device (a CUDA kernel cannot read a CPU pointer)
    o, S = fn(*x[:5], initial_state=x[5], A_log=a_log, dt_bias=dt_bias, cu_seqlens=cu, **kw)
    g = kda_gate_ref(raw, A_log, dtb)
    o_ref, S_ref = naive_recurrent_kda(
        F.normalize(q, dim=-1, eps=0),
        F.normalize(k, dim=-1, eps=0),
        v,
        g,
        beta,
        initial_state=s0,
        output_final_state=True,
        cu_seqlens=cu,
    )
    assert_rel_rms(o, o_ref, 1e-5, "o")
    assert_rel_rms(S, S_ref, 1e-5, "state")
    if fn is chunk_kda:
        (o.square().sum() + S.sum()).backward()
        y = [t.detach().clone().requires_grad_() for t in x]
        o2, S2 = chunk_kda(
            *y[:5], initial_state=y[5], A_log=a_log, dt_bias=dt_bias, cu_seqlens=cu, backend="torch", **kw
        )
        (o2.square().sum() + S2.sum()).backward()
        for a, b in zip(x, y):
            assert_rel_rms(a.grad, b.grad, 1e-5, "grad")


@pytest.mark.parametrize("through", ["output", "state"])
def test_triton_backward_through_one_output(through):
    """Gradients when only o or only the final state reaches the loss (the training function leaves the other's
    gradient None instead of zero-filling it): the same as the PyTorch path's."""
    q, k, v, raw, beta, s0 = make_inputs(1, 40, 2, 2, 16, 16, h0=True)
    A_log = torch.log(torch.empty(2, dtype=torch.float64).uniform_(1, 16))
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, output_final_state=True)
    grads = []
    for backend in ("triton", "torch"):
        x = [t.detach().clone().requires_grad_() for t in _to([q, k, v, raw, beta, s0])]
        o, S = chunk_kda(*x[:5], initial_state=x[5], A_log=_to([A_log])[0], backend=backend, **kw)
        (o.square().sum() if through == "output" else S.square().sum()).backward()
        grads.append([t.grad for t in x])
    for name, a, b in zip("q k v g beta h0".split(), *grads):
        assert_rel_rms(a, b, 1e-5, f"d{name} through the {through}")


@pytest.mark.parametrize("span_max", [None, -1.0])
def test_triton_diagonal_blocks_fast_and_pairwise(monkeypatch, span_max):
    """The intra kernel factors a diagonal block through its sub-block's first row in K tiles whose gates are mild
    and goes pairwise in tiles with sharp ones: one chunk here holds both (16-column tiles: sharp, mild, near the
    span limit); ``INTRA_SPAN_MAX = -1`` sends every tile pairwise. Both match the oracle; they are different
    computations (not bit-identical)."""
    from kernels.kda import chunk_triton

    if span_max is not None:
        monkeypatch.setattr(chunk_triton, "INTRA_SPAN_MAX", span_max)
    q, k, v, _, beta, s0 = make_inputs(1, 130, 1, 2, 48, 16, h0=True)
    g = torch.cat(
        [-30.0 * torch.rand(1, 130, 2, 16), -0.5 * torch.rand(1, 130, 2, 16), -7.5 * torch.rand(1, 130, 2, 16)], -1
    )
    g = g.double()
    o_ref, S_ref = naive_recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    x = _to([q, k, v, g, beta, s0])
    o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True)
    assert_rel_rms(o, o_ref, 1e-5, "o")
    assert_rel_rms(S, S_ref, 1e-5, "state")
    monkeypatch.setattr(chunk_triton, "INTRA_SPAN_MAX", -1.0 if span_max is None else 60.0)
    o2, _ = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True)
    assert not torch.equal(o, o2), "the fast and pairwise diagonal paths gave bit-identical outputs"


def test_triton_no_nan_strong_decay_and_decode_pool():
    q, k, v, _, beta, s0 = make_inputs(1, 70, 1, 1, 16, 16, dtype=torch.float32, h0=True)
    g = -50.0 * torch.rand(1, 70, 1, 16)
    x = _to([q, k, v, g, beta, s0])
    o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o_ref, _ = naive_recurrent_kda(*(t.double() for t in (q, k, v, g, beta)), initial_state=s0.double())
    assert_rel_rms(o, o_ref, 1e-5, "o")
    pool = torch.randn(4, 1, 16, 16, device=kernel_device())
    idx = torch.tensor([3, 1], device=kernel_device())
    xs = _to(make_inputs(2, 1, 1, 1, 16, 16)[:5])
    ref_o, ref_S = fused_recurrent_kda(*xs, initial_state=pool[idx].clone(), output_final_state=True)
    o1, P = fused_recurrent_kda(*xs, initial_state=pool, output_final_state=True, ssm_state_indices=idx)
    assert P is pool
    assert_rel_rms(o1, ref_o, 1e-6, "pool o")
    assert_rel_rms(pool[idx], ref_S, 1e-6, "pool state")


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 15, 63, 64, 65, 1000])
@pytest.mark.parametrize("D", [64, 100, 128])
@pytest.mark.parametrize("H,HV", [(1, 1), (4, 4), (2, 8)])
def test_gpu_fp32_full_grid(T, D, H, HV):
    for gate in GATES:
        for h0 in (False, True):
            q, k, v, g, beta, s0 = make_inputs(1, T, H, HV, D, D, gate=gate, h0=h0)
            qc, kc, vc, gc, bc, sc = (None if t is None else t.cuda() for t in (q, k, v, g, beta, s0))
            o, S = naive_recurrent_kda(qc, kc, vc, gc, bc, initial_state=sc, output_final_state=True)
            x = _to([q, k, v, g, beta, s0])
            o2, S2 = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True)
            assert_rel_rms(o2, o, 1e-5, f"o {gate} h0={h0}")
            assert_rel_rms(S2, S, 1e-5, f"S {gate} h0={h0}")


@pytest.mark.gpu
@pytest.mark.parametrize("T,D", [(1000, 128), (4096, 128), (333, 100)])
def test_gpu_bf16_tolerances(T, D):
    q, k, v, g, beta, s0 = make_inputs(2, T, 4, 4, D, D, gate="logsig", h0=True)
    q, k, v = (t.bfloat16().double() for t in (q, k, v))
    ref_in = [t.cuda().requires_grad_() for t in (q, k, v, g, beta, s0)]
    o, S = (
        naive_recurrent_kda(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
        if T <= 1000
        else chunk_kda(*ref_in[:5], initial_state=ref_in[5], output_final_state=True, backend="torch")
    )
    do, dS = torch.randn_like(o), torch.randn_like(S)
    ref_g = torch.autograd.grad([o, S], ref_in, [do, dS])
    x = [t.detach().to(dt).requires_grad_() for t, dt in zip(ref_in, [torch.bfloat16] * 3 + [torch.float32] * 3)]
    o2, S2 = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True)
    got = torch.autograd.grad([o2, S2], x, [do.to(o2.dtype), dS.float()])
    assert_rel_rms(o2, o, 5e-3, "o")
    assert_rel_rms(S2, S, 5e-3, "S")
    for name, a, b, tol in zip(
        ["dq", "dk", "dv", "dg", "dbeta", "dh0"], got, ref_g, [8e-3, 8e-3, 8e-3, 2e-2, 2e-2, 8e-3]
    ):
        assert_rel_rms(a, b, tol, name)


@pytest.mark.gpu
def test_gpu_no_nan_long_and_decode_matches_chunk():
    q, k, v, _, beta, _ = make_inputs(1, 65536, 2, 2, 100, 100, dtype=torch.float32)
    g = -50.0 * torch.rand(1, 65536, 2, 100)
    x = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)] + [t.cuda().requires_grad_() for t in (g, beta)]
    o, S = chunk_kda(*x, output_final_state=True)
    (o.float().sum() + S.sum()).backward()
    for t in [o, S] + [t.grad for t in x]:
        assert torch.isfinite(t).all()
    xs = [t.detach()[:, -9:] for t in x]
    o_c, _ = chunk_kda(*xs)
    _, S_prev = chunk_kda(*(t[:, :-1] for t in xs), output_final_state=True)
    o_d, _ = fused_recurrent_kda(*(t[:, -1:] for t in xs), initial_state=S_prev)
    assert_rel_rms(o_d.float(), o_c[:, -1:].float(), 5e-3, "decode vs chunk")
    assert os.environ.get("KVL_KDA_BACKEND") == "triton"


def test_triton_16bit_path_fp16():
    """The 16-bit storage / tensor-core-dot path (what bf16 uses on a GPU), exercised with fp16 because the
    interpreter multiplies bf16 dot operands as raw bits (so ``chunk_kda`` runs bf16 as fp32 there); compared with
    the fp32 PyTorch path on the same rounded inputs."""
    q, k, v, g, beta, s0 = make_inputs(1, 80, 1, 2, 32, 16, gate="logsig", h0=True)
    A_log = torch.log(torch.empty(2).uniform_(1, 16)).to(kernel_device())
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, output_final_state=True)
    x = [t.to(kernel_device(), torch.float16) for t in (q * 3, k, v)] + _to([g, beta, s0])
    o, S = chunk_kda(*x[:5], initial_state=x[5], **kw)
    assert o.dtype == torch.float16
    o2, S2 = chunk_kda(*(t.float() for t in x[:5]), initial_state=x[5], backend="torch", **kw)
    assert_rel_rms(o, o2, 2e-3, "o fp16")
    assert_rel_rms(S, S2, 2e-3, "S fp16")


def test_triton_bf16_is_bf16_accurate():
    """bf16 q, k, v through the Triton path: output, state and gradients of bf16's accuracy against the fp32
    PyTorch path on the same rounded inputs, also under the interpreter, where ``chunk_kda`` widens bf16 inputs to
    fp32 (it multiplies bf16 ``tl.dot`` operands as raw bits, triton-lang/triton#11584: errors ~1e11 before);
    the output keeps v's dtype and the gradients their inputs'."""
    q, k, v, g, beta, s0 = make_inputs(1, 80, 2, 2, 32, 16, gate="logsig", h0=True)
    kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    x = [t.to(kernel_device(), torch.bfloat16).requires_grad_() for t in (q, k, v)] + _to([g, beta, s0])
    o, S = chunk_kda(*x[:5], initial_state=x[5], **kw)
    ref = [t.detach().float().requires_grad_() for t in x[:3]]
    o2, S2 = chunk_kda(*ref, *x[3:5], initial_state=x[5], backend="torch", **kw)
    assert o.dtype == torch.bfloat16
    assert_rel_rms(o, o2, 1e-2, "o bf16")
    assert_rel_rms(S, S2, 1e-2, "S bf16")
    do = torch.randn_like(o2)
    got = torch.autograd.grad(o, x[:3], do.to(o.dtype))
    want = torch.autograd.grad(o2, ref, do)
    for name, a, b in zip("qkv", got, want):
        assert a.dtype == torch.bfloat16
        assert_rel_rms(a, b, 2e-2, f"d{name} bf16")


def _chunk_intermediates_ref(q, k, v, g, beta, scale, h0, cu, C=64):
    """Plain fp64 PyTorch recomputation of the contract's per-chunk tensors (``KDAFwdState``), chunk by chunk."""
    HV, H = v.shape[2], q.shape[2]
    q, k = q[0].repeat_interleave(HV // H, 1), k[0].repeat_interleave(HV // H, 1)  # [T, HV, K]
    v, g, beta = v[0], g[0], beta[0]
    names = ["G", "Gl", "Aqk", "T", "W", "U", "qg", "kg", "h", "vn"]
    out = {n: [] for n in names}
    o = torch.zeros_like(v)
    S_fin = []
    tri = torch.ones(C, C, dtype=torch.bool)
    for i_n, (bos, eos) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        S = h0[i_n].clone()  # [HV, K, V]
        for t0 in range(bos, eos, C):
            n = min(C, eos - t0)
            rows = [x[t0 : t0 + n].transpose(0, 1) for x in (q, k, v, g, beta)]
            qc, kc, vc, gc, bc = (F.pad(x, (0, 0, 0, C - n) if x.dim() == 3 else (0, C - n)) for x in rows)
            G = gc.cumsum(1)
            Gl = G[:, -1]
            dec = torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~tri.tril()[None, :, :, None], 0.0))
            akk = torch.einsum("hid,hjd,hijd->hij", kc, kc, dec) * bc[..., None] * tri.tril(-1)
            aqk = torch.einsum("hid,hjd,hijd->hij", qc, kc, dec) * scale * tri.tril()
            Tm = torch.linalg.inv(torch.eye(C, dtype=q.dtype) + akk)
            W = Tm @ (bc[..., None] * kc * torch.exp(G))
            U = Tm @ (bc[..., None] * vc)
            qg, kg = scale * qc * torch.exp(G), kc * torch.exp(Gl[:, None] - G)
            vn = U - W @ S
            o[t0 : t0 + n] = (qg @ S + aqk @ vn)[:, :n].transpose(0, 1)
            for name, x in zip(names, [G, Gl, aqk, Tm, W, U, qg, kg, S.clone(), vn]):
                out[name].append(x)
            S = torch.exp(Gl)[..., None] * S + kg.transpose(1, 2) @ vn
        S_fin.append(S)
    return {n: torch.stack(x) for n, x in out.items()} | {"o": o[None], "ht": torch.stack(S_fin)}


def test_triton_fwd_intermediates_vs_torch():
    """``chunk_kda_fwd_intermediates`` (core path) vs an fp64 recomputation of every contract tensor: varlen
    with a 5-token sequence and a 70-token one (a ragged last chunk), grouped value heads, h0, fp32."""
    from kernels.kda.chunk_triton import chunk_kda_fwd_intermediates

    cu = torch.tensor([0, 5, 75], dtype=torch.int32)
    q, k, v, g, beta, s0 = make_inputs(1, 75, 1, 2, 20, 12, gate="logsig_sharp", h0=True, N=2)
    scale = 20**-0.5
    ref = _chunk_intermediates_ref(q, k, v, g, beta, scale, s0, cu)
    x = _to([q, k, v, g, beta, s0])
    st = chunk_kda_fwd_intermediates(*x[:5], scale, x[5], cu.to(kernel_device()))
    assert st.cbos.tolist() == [0, 5, 69] and st.clen.tolist() == [5, 64, 6]
    assert st.s0.tolist() == [0, 1] and st.snc.tolist() == [1, 2]
    assert st.G.dtype == torch.float32 and st.T.dtype == torch.float32
    eye = torch.eye(64, dtype=torch.float64)
    for name in ["o", "ht", "G", "Gl", "Aqk", "T", "W", "U", "qg", "kg", "h", "vn"]:
        got, want = getattr(st, name).double().cpu(), ref[name]
        if name == "T":  # the unit diagonal would dominate the error norm
            got, want = got - eye, want - eye
        assert_rel_rms(got, want, 1e-5, name)
    assert (st.Aqk.triu(1) == 0).all() and (st.T.triu(1) == 0).all()


def test_triton_l2_gate_several_k_tiles():
    """In-kernel L2 norm and lower-bound gate with K = 48 (norms and gate over several K tiles), HV = 2H, fp32,
    against the PyTorch path."""
    q, k, v, g, beta, s0 = make_inputs(1, 70, 1, 2, 48, 24, h0=True)
    A_log = torch.log(torch.empty(2, dtype=torch.float64).uniform_(1, 16))
    dtb = torch.randn(2 * 48, dtype=torch.float64)
    x = _to([q * 3, k * 2, v, g, beta, s0, A_log, dtb])
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x[6], dt_bias=x[7], lower_bound=-3.0)
    o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, **kw)
    o2, S2 = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, backend="torch", **kw)
    assert_rel_rms(o, o2, 1e-5, "o")
    assert_rel_rms(S, S2, 1e-5, "S")


@pytest.mark.parametrize("consts", [dict(PREP_BK=16, WU_B=16), dict(INTRA_SPAN_MAX=-1.0, SCORES2_BK=32),
                                    dict(PREP_BK=64), dict(STATE_BV=16), dict(SCORES2_DIAG_INV=0),
                                    dict(PREP_HEADS_FIRST=False, SCORES2_HEADS_FIRST=False, OUT_HEADS_FIRST=False),
                                    dict(SCORES2_NORMS=False)])
def test_tile_constants_agree(monkeypatch, consts):
    """Other prep / W-U tile widths (qg and kg are written K tile by K tile in the W / U loop), the prep kernel's work
    in one tile, the pairwise diagonal blocks with 32-column score tiles, the solve's diagonal inverses by substitution
    (the default: products of powers), two programs per head in the state pass (V = 24 in 16-column blocks), the
    per-(chunk, head) kernels' grids chunks first and the q, k norms from the prep kernel (default: the scores
    kernel's loop), against the PyTorch path (varlen, K = 48 over several tiles, HV = 2H, L2 norm and gate with
    dt_bias, a slow and a fast head, fp32)."""
    from kernels.kda import chunk_triton

    cu = torch.tensor([0, 5, 70, 150], dtype=torch.int32)
    q, k, v, g, beta, s0 = make_inputs(1, 150, 1, 2, 48, 24, h0=True, N=3)
    # one slow head (a chunk's decay ~e^-1, so the state carried between chunks counts) and one fast (e^-100)
    A_log = torch.log(torch.tensor([0.03, 3.0], dtype=torch.float64))
    dtb = torch.randn(2 * 48, dtype=torch.float64)
    x = _to([q * 3, k * 2, v, g, beta, s0, A_log, dtb])
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x[6], dt_bias=x[7],
              initial_state=x[5], output_final_state=True, cu_seqlens=cu.to(x[0].device))
    o0, S0 = chunk_kda(*x[:5], backend="torch", **kw)
    for name, value in consts.items():
        monkeypatch.setattr(chunk_triton, name, value)
    o, S = chunk_kda(*x[:5], **kw)
    assert_rel_rms(o, o0, 1e-5, "o")
    assert_rel_rms(S, S0, 1e-5, "S")


@pytest.mark.parametrize("norms", [False, True])
def test_large_raw_rows_with_sharp_gates_stay_finite(monkeypatch, norms):
    """With ``SCORES2_NORMS`` (the default) the scores kernel accumulates raw (not yet normalised) q, k rows and
    scales by the norms after its loop: entries of 1e12 in tiles whose gates span 55.5 inside a sub-block (the
    diagonal blocks' fast path, whose discarded entries reach |k|^2 e^55.5, overflowing fp32) still give the oracle
    on normalised rows, as with the prep kernel's norms."""
    from kernels.kda import chunk_triton

    monkeypatch.setattr(chunk_triton, "SCORES2_NORMS", norms)
    q, k, v, _, beta, s0 = make_inputs(1, 40, 1, 1, 16, 16, h0=True)
    g = torch.full((1, 40, 1, 16), -3.7, dtype=torch.float64)  # 15 steps: a span of 55.5 <= 60 inside a sub-block
    q, k = q * 1e12, k * 1e12
    qn, kn = F.normalize(q, dim=-1, eps=0.0), F.normalize(k, dim=-1, eps=0.0)
    o_ref, S_ref = naive_recurrent_kda(qn, kn, v, g, beta, initial_state=s0, output_final_state=True)
    x = _to([q, k, v, g, beta, s0])
    o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_rel_rms(o, o_ref, 1e-5, "o")
    assert_rel_rms(S, S_ref, 1e-5, "state")


@pytest.mark.parametrize("diag_inv", [0, 1])
def test_correlated_keys_fp32(monkeypatch, diag_inv):
    """Keys of cosine ~0.99 inside a chunk, beta = 1 and almost no decay (the delta rule's hardest solve: large
    terms cancel in (I + Akk)^-1) stay within 1e-5 of the fp64 oracle with either form of the solve's diagonal
    inverses (the substitution, or products of powers over 8 x 8 halves; over whole 16 x 16 blocks the products lost
    ~1e-4 in fp32)."""
    from kernels.kda import chunk_triton

    monkeypatch.setattr(chunk_triton, "SCORES2_DIAG_INV", diag_inv)
    q, k, v, g, beta, s0 = make_inputs(1, 80, 1, 1, 32, 16, gate="logsig_slow")
    k = F.normalize(k[:, :1] + 0.08 * k, dim=-1)  # every key near the first
    beta = torch.ones_like(beta)
    o, S = naive_recurrent_kda(q, k, v, g * 0.1, beta, output_final_state=True)
    x = _to([q, k, v, g * 0.1, beta])
    o2, S2 = chunk_kda(*x, output_final_state=True)
    assert_rel_rms(o2, o, 1e-5, "o")
    assert_rel_rms(S2, S, 1e-5, "state")


def test_chunk_head_grid():
    """Heads first when asked and the chunks fit a grid dimension past the first (65535), else chunks first."""
    from kernels.kda.state_common import chunk_head_grid

    assert chunk_head_grid(100, 32, True) == ((32, 100), True)
    assert chunk_head_grid(100, 32, False) == ((100, 32), False)
    assert chunk_head_grid(70000, 32, True) == ((70000, 32), False)
    assert chunk_head_grid(65535, 4, True, lead=(2,)) == ((2, 4, 65535), True)


def test_state_block_v_choice(monkeypatch):
    """The state passes' value-column block: a fixed setting capped at V's power of two; else the widest of the
    choices (forward 64 / 16, backward 64 / 32) with at least ``fill`` programs per SM (132 here; 1 by default, 0.6
    as both passes use), else the narrowest; off CUDA the widest. The forward's stages: 2 for 64-column programs that
    outnumber the SMs, else 3."""
    from kernels.kda import state_common

    monkeypatch.setattr(state_common, "sm_count", lambda device: 132)
    cuda = torch.device("cuda", 0)
    pick = state_common.state_block_v
    assert pick(32, 128, 32, cuda) == 32 and pick(64, 48, 1, cuda) == 64 and pick(64, 20, 1, cuda) == 32
    assert pick(None, 128, 8 * 16, cuda) == 64  # 8 x 2048 x 16: 256 programs
    assert pick(None, 128, 66, cuda) == 64 and pick(None, 128, 65, cuda) == 16  # 132 / 130 programs at 64 columns
    assert pick(None, 128, 32, cuda) == 16  # 1 x 8192 x 32
    assert pick(None, 128, 16, cuda) == 16  # 1 x 32768 x 16: 128 programs even at 16
    assert pick(None, 8, 1000, cuda) == 16
    backward = (64, 32)
    assert pick(None, 128, 32, cuda, backward) == 32 and pick(None, 128, 128, cuda, backward) == 64
    assert pick(None, 128, 48, cuda, backward) == 32  # 8 x 4096 x 6: 96 programs at 64 columns
    from kernels.kda import chunk_triton_bwd as cb  # the backward's own choices and fill, as measured (session 27)

    assert pick(None, 128, 48, cuda, cb.BWD_STATE_BV_CHOICES, cb.BWD_STATE_FILL) == 64  # 8 x 4096 x 6
    assert pick(None, 128, 32, cuda, cb.BWD_STATE_BV_CHOICES, cb.BWD_STATE_FILL) == 32  # 1 x 8192 x 32
    assert pick(None, 128, 40, cuda, backward, 0.6) == 64 and pick(None, 128, 39, cuda, backward, 0.6) == 32
    assert pick(None, 128, 1, torch.device("cpu")) == 64
    from kernels.kda import chunk_triton as ct  # the forward's fill and stages, as measured (session 33)

    monkeypatch.setattr(ct, "sm_count", lambda device: 132)
    assert pick(None, 128, 48, cuda, fill=ct.STATE_FILL) == 64  # 8 x 4096 x 6: 96 programs at 64 columns
    assert pick(None, 128, 32, cuda, fill=ct.STATE_FILL) == 16  # 1 x 8192 x 32: 64 programs at 64
    assert ct.state_stages(64, 96, cuda) == ct.STATE_LAUNCH[1] == 3
    assert ct.state_stages(64, 256, cuda) == ct.STATE_STAGES_WIDE_MANY == 2  # 8 x 2048 x 16, 4 x 4096 x 32
    assert ct.state_stages(16, 256, cuda) == 3 and ct.state_stages(64, 256, torch.device("cpu")) == 3


@pytest.mark.parametrize("gate", ["logsig_sharp", "lower_bound"])
def test_fp32_final_state_keeps_fp32_accuracy_with_sharp_gates(gate):
    """fp32 inputs take kg's exponent as a suffix sum of g (``FP32_KG_SUFFIX``): with sharp gates |G| reaches a few
    hundred inside a chunk, and the difference of stored prefix sums (the 16-bit path) put up to ~5e-6 of error on
    the final state of these cases under the interpreter (9e-6 on an H200), against ~3e-7 for the suffix sum."""
    worst = 0.0
    for seed in range(3):
        torch.manual_seed(seed)
        q, k, v, g, beta, _ = make_inputs(1, 63, 1, 1, 64, 64, gate=gate)
        o, S = naive_recurrent_kda(q, k, v, g, beta, output_final_state=True)
        x = _to([q, k, v, g, beta])
        o2, S2 = chunk_kda(*x, output_final_state=True)
        assert_rel_rms(o2, o, 2e-6, f"o seed {seed}")
        worst = max(worst, ((S2.double().cpu() - S).norm() / S.norm()).item())
    assert worst < 1e-6, worst


@pytest.mark.gpu
def test_gpu_fwd_intermediates_full_width():
    """The fused scores / solve / W-U kernel at K = V = 128 (races or layout bugs would show here) vs the fp64
    recomputation of every contract tensor: varlen with a 5-token sequence and ragged chunks, HV = 2H, sharp gate,
    h0, fp32."""
    from kernels.kda.chunk_triton import chunk_kda_fwd_intermediates

    cu = torch.tensor([0, 5, 200, 333], dtype=torch.int32)
    q, k, v, g, beta, s0 = make_inputs(1, 333, 2, 4, 128, 128, gate="logsig_sharp", h0=True, N=3)
    scale = 128**-0.5
    ref = _chunk_intermediates_ref(q, k, v, g, beta, scale, s0, cu)
    x = _to([q, k, v, g, beta, s0])
    st = chunk_kda_fwd_intermediates(*x[:5], scale, x[5], cu.to(kernel_device()))
    eye = torch.eye(64, dtype=torch.float64)
    errs = {}
    for name in ["o", "ht", "Aqk", "T", "W", "U", "vn"]:
        got, want = getattr(st, name).double().cpu(), ref[name]
        if name == "T":  # the unit diagonal would dominate the error norm
            got, want = got - eye, want - eye
        assert torch.isfinite(got).all(), name
        errs[name] = rel_rms(got, want)
    print("fp32 relative RMS vs fp64:", {n: f"{e:.2e}" for n, e in errs.items()})
    # The outputs keep the 1e-5. The sharp gate makes I + Akk ill-conditioned: its inverse T (and W, U,
    # Vnew, built from T) amplify fp32 rounding (T measured 1.004e-5 on an H100 on 2026-11-21), hence 3e-5 there.
    tol = {"o": 1e-5, "ht": 1e-5, "Aqk": 1e-5}
    bad = {n: e for n, e in errs.items() if e > tol.get(n, 3e-5)}
    assert not bad, f"relative RMS above tolerance: {bad}"
    assert (st.Aqk.triu(1) == 0).all()


@pytest.mark.parametrize("B,T,cu", [(2, 37, None), (1, 70, [0, 1, 40, 70])])
def test_triton_qkv_views_read_in_place_equal_contiguous(B, T, cu):
    """q, k, v as views of one [B, T, 3 H K] tensor (the KDA layer's conv output) give exactly the results and
    gradients of contiguous copies: every kernel reading q, k, v takes their token stride (``token_rows``), and the op
    takes the q|k|v tensor itself (``ChunkKDAFunction``'s qkv mode), its backward writing d(qkv) directly."""
    H, K = 2, 16
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    q, k, v, raw, beta, _ = make_inputs(B, T, H, H, K, K)
    A_log = torch.log(torch.empty(H, dtype=torch.float64).uniform_(1, 16)).float().to(kernel_device())
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, cu_seqlens=cu)
    qkv = torch.cat([q, k, v], dim=-1).reshape(B, T, 3 * H * K).float().requires_grad_()
    raw, beta = _to([raw, beta])
    beta.requires_grad_()
    views = [t.reshape(B, T, H, K) for t in qkv.to(kernel_device()).chunk(3, dim=-1)]
    assert not views[0].is_contiguous() and qkv_base(*views) is not None  # the op takes q|k|v itself
    o, _ = chunk_kda(*views, raw, beta, **kw)
    (o * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum().backward()
    qkv2 = qkv.detach().clone().requires_grad_()
    copies = [t.reshape(B, T, H, K).contiguous() for t in qkv2.to(kernel_device()).chunk(3, dim=-1)]
    beta2 = beta.detach().clone().requires_grad_()
    o2, _ = chunk_kda(*copies, raw, beta2, **kw)
    (o2 * torch.linspace(-1, 1, o2.numel(), device=o2.device).view_as(o2)).sum().backward()
    assert torch.equal(o, o2)
    assert torch.equal(qkv.grad, qkv2.grad)
    assert torch.equal(beta.grad, beta2.grad)  # dbeta's V part reads v through the stride
