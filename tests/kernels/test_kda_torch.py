"""KDA: oracles agree with each other; the PyTorch chunked path and the dispatch vs the fp64 oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kda_cases import GATES, make_inputs
from kvl_testing import assert_rel_rms, rel_rms

from kernels.kda import chunk_kda, fused_recurrent_kda, kda_gate_ref, naive_chunk_kda, naive_recurrent_kda

f32 = lambda *xs: [None if x is None else x.float() for x in xs]


@pytest.mark.parametrize("T", [1, 15, 64, 65])
def test_naive_chunk_equals_recurrence(T):
    q, k, v, g, beta, h0 = make_inputs(1, T, 2, 4, 12, 10, gate="logsig_sharp", h0=True)
    o, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, S2 = naive_chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=16)
    assert rel_rms(o2, o) < 1e-12 and rel_rms(S2, S) < 1e-12


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("T,H,HV,K,V", [(1, 1, 1, 16, 16), (63, 2, 8, 20, 12), (130, 4, 4, 24, 40)])
@pytest.mark.parametrize("h0", [False, True])
def test_torch_chunk_vs_oracle(T, H, HV, K, V, gate, h0):
    q, k, v, g, beta, s0 = make_inputs(1, T, H, HV, K, V, gate=gate, h0=h0)
    o, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    for fn in (chunk_kda, fused_recurrent_kda):
        o2, S2 = fn(*f32(q, k, v, g, beta), initial_state=f32(s0)[0], output_final_state=True, backend="torch")
        assert o2.dtype == torch.float32 and S2.dtype == torch.float32
        assert_rel_rms(o2, o, 1e-5, f"{fn.__name__} o")
        assert_rel_rms(S2, S, 1e-5, f"{fn.__name__} state")


def test_torch_chunk_long_and_batched():
    q, k, v, g, beta, s0 = make_inputs(2, 1000, 1, 2, 64, 64, gate="logsig", h0=True)
    o, S = naive_chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    o2, S2 = chunk_kda(*f32(q, k, v, g, beta), initial_state=s0.float(), output_final_state=True, backend="torch")
    assert_rel_rms(o2, o, 1e-5, "o")
    assert_rel_rms(S2, S, 1e-5, "state")


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
@pytest.mark.parametrize("gate", GATES)
def test_torch_chunk_sizes_agree_with_oracle(chunk_size, gate):
    """The CPU default (16: pairwise decays only) and the sub-blocked forms (32, 64) compute one function."""
    from kernels.kda.chunk_torch import chunk_kda_torch

    q, k, v, g, beta, s0 = make_inputs(2, 100, 3, 3, 20, 12, gate=gate, h0=True)
    o, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    o2, S2 = chunk_kda_torch(*f32(q, k, v, g, beta), q.shape[-1] ** -0.5, s0.float(), chunk_size=chunk_size)
    assert_rel_rms(o2, o, 1e-5, f"o (chunk {chunk_size})")
    assert_rel_rms(S2, S, 1e-5, f"state (chunk {chunk_size})")


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_in_kernel_gate_and_l2norm(lower_bound):
    B, T, H, K, V = 1, 40, 2, 16, 8
    q, k, v, _, beta, _ = make_inputs(B, T, H, H, K, V)
    q, k = q * 3, k * 3
    raw = torch.randn(B, T, H, K, dtype=torch.float64) * 3
    A_log = torch.log(torch.empty(H, dtype=torch.float64).uniform_(1, 16))
    dt_bias = torch.randn(H * K, dtype=torch.float64)
    g = kda_gate_ref(raw, A_log, dt_bias, lower_bound)
    assert (g <= 0).all()
    if lower_bound is not None:
        assert (g >= lower_bound).all()
    qn, kn = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    o, _ = naive_recurrent_kda(qn, kn, v, g, beta)
    o2, _ = chunk_kda(
        *f32(q, k, v, raw, beta),
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        A_log=A_log.float(),
        dt_bias=dt_bias.float(),
        lower_bound=lower_bound,
        backend="torch",
    )
    assert_rel_rms(o2, o, 1e-5, "o")


def test_softplus_switches_to_identity_above_20():
    raw = torch.tensor([25.0, 0.0], dtype=torch.float64).view(1, 1, 1, 2)
    g = kda_gate_ref(raw, torch.zeros(1, dtype=torch.float64))
    assert g[0, 0, 0, 0].item() == -25.0
    assert abs(g[0, 0, 0, 1].item() + F.softplus(torch.tensor(0.0)).item()) < 1e-7


def _varlen_case(lens, H=2, HV=4, K=12, V=10, h0=True):
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return cu, make_inputs(1, T, H, HV, K, V, gate="logsig", h0=h0, N=len(lens))


@pytest.mark.parametrize("fn", [chunk_kda, fused_recurrent_kda])
def test_varlen_equals_per_sequence_fwd_bwd(fn):
    lens = [1, 70, 5, 64, 0, 17]
    cu, (q, k, v, g, beta, s0) = _varlen_case(lens)
    inputs = [x.float().requires_grad_() for x in (q, k, v, g, beta, s0)]
    o, S = fn(*inputs[:5], initial_state=inputs[5], cu_seqlens=cu, output_final_state=True, backend="torch")
    (o.square().sum() + S.square().sum()).backward()
    grads = [x.grad.clone() for x in inputs]
    for n in range(len(lens)):
        a, b = int(cu[n]), int(cu[n + 1])
        part = [x.detach()[:, a:b].clone().requires_grad_() for x in inputs[:5]]
        s_n = inputs[5].detach()[n : n + 1].clone().requires_grad_()
        o_n, S_n = fn(*part, initial_state=s_n, output_final_state=True, backend="torch")
        (o_n.square().sum() + S_n.square().sum()).backward()
        assert torch.allclose(o[:, a:b], o_n, atol=1e-5) and torch.allclose(S[n], S_n[0], atol=1e-5)
        for gv, p in zip(grads[:5], part):
            expected = torch.zeros_like(p) if p.grad is None else p.grad  # empty sequence: no graph to q, k, ...
            assert torch.allclose(gv[:, a:b], expected, atol=1e-4)
        assert torch.allclose(grads[5][n], s_n.grad[0], atol=1e-4)


def test_no_nan_with_strong_decay():
    q, k, v, _, beta, s0 = make_inputs(1, 200, 1, 2, 24, 8, dtype=torch.float32, h0=True)
    g = -50.0 * torch.rand(1, 200, 2, 24)
    g[:, ::7] = -50.0
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta, s0)]
    o, S = chunk_kda(*inputs[:5], initial_state=inputs[5], output_final_state=True, backend="torch")
    (o.sum() + S.sum()).backward()
    for t in [o, S] + [x.grad for x in inputs]:
        assert torch.isfinite(t).all()
    o_ref, _ = naive_recurrent_kda(*(x.detach().double() for x in inputs[:5]), initial_state=s0.detach().double())
    assert_rel_rms(o, o_ref, 1e-5, "o")


def test_decode_equals_chunk_last_token():
    q, k, v, g, beta, s0 = (x.float() for x in make_inputs(3, 33, 2, 2, 16, 16, h0=True))
    o, S = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, backend="torch")
    _, S_prev = chunk_kda(
        *(x[:, :-1] for x in (q, k, v, g, beta)), initial_state=s0, output_final_state=True, backend="torch"
    )
    o1, S1 = fused_recurrent_kda(
        *(x[:, -1:] for x in (q, k, v, g, beta)), initial_state=S_prev, output_final_state=True, backend="torch"
    )
    assert_rel_rms(o1, o[:, -1:], 1e-5, "decode o")
    assert_rel_rms(S1, S, 1e-5, "decode state")


def test_state_pool_indices():
    q, k, v, g, beta, _ = (x if x is None else x.float() for x in make_inputs(3, 1, 1, 2, 8, 8))
    pool = torch.randn(5, 2, 8, 8)
    before = pool.clone()
    idx = torch.tensor([4, 0, 2])
    o, S = fused_recurrent_kda(
        q, k, v, g, beta, initial_state=pool, output_final_state=True, ssm_state_indices=idx, backend="torch"
    )
    o_ref, S_ref = fused_recurrent_kda(
        q, k, v, g, beta, initial_state=before[idx], output_final_state=True, backend="torch"
    )
    assert S is pool and torch.allclose(o, o_ref) and torch.allclose(pool[idx], S_ref)
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


def test_gradcheck_fp64_tiny():
    q, k, v, g, beta, s0 = make_inputs(1, 19, 1, 2, 4, 3, h0=True)
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta, s0)]

    def run(q, k, v, g, beta, s0):
        return chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, backend="torch")

    assert torch.autograd.gradcheck(run, inputs, eps=1e-6, atol=1e-6)
    o, S = run(*inputs)
    o_ref, S_ref = naive_recurrent_kda(*inputs[:5], initial_state=inputs[5], output_final_state=True)
    gr = torch.autograd.grad((o * o_ref.detach()).sum() + S.sum(), inputs)
    gr_ref = torch.autograd.grad((o_ref * o_ref.detach()).sum() + S_ref.sum(), inputs)
    for a, b in zip(gr, gr_ref):
        assert rel_rms(a, b) < 1e-10


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.update(k=a["k"][:, :, :1]), "k shape"),
        (lambda a: a.update(v=a["v"].repeat(1, 1, 2, 1)[:, :, :3]), "multiple of H"),
        (lambda a: a.update(g=a["g"][..., :3]), "g shape"),
        (lambda a: a.update(beta=a["beta"][..., None]), "beta shape"),
        (lambda a: a.update(cu_seqlens=torch.tensor([0, 5, 3, 8])), "non-decreasing"),
        (lambda a: a.update(cu_seqlens=torch.tensor([0, 4])), "end at T"),
        (lambda a: a.update(initial_state=torch.zeros(2, 2, 4, 4)), "initial_state shape"),
        (lambda a: a.update(use_gate_in_kernel=True), "A_log"),
        (lambda a: a.update(backend="cuda"), "backend"),
    ],
)
def test_validation_errors_name_shapes(change, match):
    q, k, v, g, beta, _ = (x if x is None else x.float() for x in make_inputs(1, 8, 2, 2, 4, 4))
    args = dict(q=q, k=k, v=v, g=g, beta=beta)
    change(args)
    with pytest.raises(ValueError, match=match):
        chunk_kda(**args)
