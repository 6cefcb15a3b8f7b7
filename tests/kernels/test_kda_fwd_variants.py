"""The KDA Triton forward's kernel variants that ``chunk_triton`` keeps for the GPU sweep (module constants:
``FUSED_PREP``, the prep work inside the scores kernel or a kernel of its own), each against the fp64 oracle at
1e-5 (fp32) and against the two-kernel path, on cases that reach every branch: varlen with ragged chunks, K tiles
with sharp gates (the pairwise fallback of the diagonal blocks) beside mild ones, every tile pairwise, the in-kernel
L2 norm and gate over several K tiles, and the training path's gradients. On a CPU under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kda_cases import make_inputs
from kvl_testing import assert_rel_rms

from kernels.kda import chunk_kda, kda_gate_ref, naive_recurrent_kda
from kernels.kda import chunk_triton as ct

VARIANTS = {"two kernels": {"FUSED_PREP": False}, "fused": {"FUSED_PREP": True}}
FIELDS = ("o", "ht", "G", "Gl", "Aqk", "T", "W", "U", "qg", "kg", "h", "vn")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_KDA_BACKEND", "triton")


def _dev():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _set(monkeypatch, name: str) -> None:
    for const, value in VARIANTS[name].items():
        monkeypatch.setattr(ct, const, value)


def _mixed_gate(T: int, HV: int) -> torch.Tensor:
    """Log-decays whose 16-column K tiles are sharp (pairwise diagonal), mild, and moderate (fast path)."""
    return torch.cat([-c * torch.rand(1, T, HV, 16, dtype=torch.float64) for c in (30.0, 0.5, 7.5)], -1)


@pytest.mark.parametrize("span_max", [60.0, -1.0])
def test_fwd_variants_intermediates(monkeypatch, span_max):
    """Every ``KDAFwdState`` tensor of each variant equals the two-kernel path's to 1e-6 and o, ht match the fp64
    oracle to 1e-5: varlen (5 and 70 tokens: a ragged last chunk), HV = 2 H, h0, K = 48 in three tiles."""
    monkeypatch.setattr(ct, "INTRA_SPAN_MAX", span_max)
    cu = torch.tensor([0, 5, 75], dtype=torch.int32)
    q, k, v, _, beta, s0 = make_inputs(1, 75, 1, 2, 48, 12, h0=True, N=2)
    g = _mixed_gate(75, 2)
    o_ref, S_ref = naive_recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    x = [t.to(_dev(), torch.float32) for t in (q, k, v, g, beta, s0)]
    runs = {}
    for name in VARIANTS:
        _set(monkeypatch, name)
        runs[name] = st = ct.chunk_kda_fwd_intermediates(*x[:5], 48**-0.5, x[5], cu.to(_dev()))
        assert_rel_rms(st.o, o_ref, 1e-5, f"{name} o")
        assert_rel_rms(st.ht, S_ref, 1e-5, f"{name} ht")
    base = runs["two kernels"]
    for name, st in runs.items():
        for f in FIELDS:
            assert_rel_rms(getattr(st, f), getattr(base, f), 1e-6, f"{name} {f}")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_fwd_variants_l2_gate_in_kernel(monkeypatch, variant, lower_bound):
    """The inference path (no gradient): in-kernel L2 norm (two 32-column steps, the second masked) and gate over
    K = 48, varlen with a 1-token sequence, against the fp64 oracle on the normalised q, k and gated g."""
    _set(monkeypatch, variant)
    cu = torch.tensor([0, 1, 67, 76], dtype=torch.int32)
    q, k, v, raw, beta, s0 = make_inputs(1, 76, 1, 2, 48, 16, h0=True, N=3)
    A_log = torch.log(torch.empty(2, dtype=torch.float64).uniform_(1, 16))
    dtb = torch.randn(2 * 48, dtype=torch.float64)
    g = kda_gate_ref(raw, A_log, dtb, lower_bound)
    qn, kn = F.normalize(q * 3, dim=-1, eps=0), F.normalize(k * 2, dim=-1, eps=0)
    o_ref, S_ref = naive_recurrent_kda(qn, kn, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    x = [t.to(_dev(), torch.float32) for t in (q * 3, k * 2, v, raw, beta, s0, A_log, dtb)]
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x[6], dt_bias=x[7], lower_bound=lower_bound)
    o, S = chunk_kda(*x[:5], initial_state=x[5], output_final_state=True, cu_seqlens=cu.to(_dev()), **kw)
    assert_rel_rms(o, o_ref, 1e-5, "o")
    assert_rel_rms(S, S_ref, 1e-5, "state")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fwd_variants_training_grads(monkeypatch, variant):
    """The training path (L2 norm and gate outside the core op, sharp gates) under each variant: o against the fp64
    oracle, every gradient against the PyTorch backend's autograd, 1e-5; varlen with a ragged chunk."""
    _set(monkeypatch, variant)
    cu = torch.tensor([0, 9, 79], dtype=torch.int32)
    q, k, v, raw, beta, s0 = make_inputs(1, 79, 1, 2, 32, 16, gate="logsig_sharp", h0=True, N=2)
    A_log = torch.log(torch.empty(2, dtype=torch.float64).uniform_(1, 16))
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, output_final_state=True, cu_seqlens=cu)
    x = [t.to(_dev(), torch.float32).requires_grad_() for t in (q * 2, k, v, raw, beta, s0)]
    o, S = chunk_kda(*x[:5], initial_state=x[5], A_log=A_log.float().to(_dev()), **kw)
    g = kda_gate_ref(raw, A_log, None)
    o_ref, _ = naive_recurrent_kda(F.normalize(q * 2, dim=-1, eps=0), k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    assert_rel_rms(o, o_ref, 1e-5, "o")
    (o.square().sum() + S.sum()).backward()
    y = [t.detach().clone().requires_grad_() for t in x]
    o2, S2 = chunk_kda(*y[:5], initial_state=y[5], A_log=A_log.float().to(_dev()), backend="torch", **kw)
    (o2.square().sum() + S2.sum()).backward()
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), x, y):
        assert_rel_rms(a.grad, b.grad, 1e-5, name)
