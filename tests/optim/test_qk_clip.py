"""QK-Clip post-conditions on tiny MHA and MLA modules implementing the INTERFACES.md protocol."""

from __future__ import annotations

import copy

import pytest
import torch
from optim_tiny_models import TinyLM, TinyMHA, TinyMLA

from kernels.qk_max import max_logits_per_head
from kimi_vl.optim import MuonClip, QKClipper, find_qk_clip_modules
from kimi_vl.optim.qk_clip import qk_clip_gamma


def _recomputed_max(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        q, k, scale = m.qk(x)
        return max_logits_per_head(q, k, scale, causal=True)


def _rows(t: torch.Tensor, heads: torch.Tensor, per_head: int) -> torch.Tensor:
    return t.detach().view(-1, per_head, *t.shape[1:])[heads]


def test_gamma() -> None:
    s = torch.tensor([float("-inf"), 5.0, 10.0, 40.0, float("nan")])
    assert torch.equal(qk_clip_gamma(s, 10.0), torch.tensor([1.0, 1.0, 1.0, 0.25, 1.0]))


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("through_optimizer", [False, True])
def test_clip_postcondition(kind: str, through_optimizer: bool) -> None:
    torch.manual_seed(3)
    m = TinyMHA(16, 4) if kind == "mha" else TinyMLA(16, 4)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)  # large logits
    x = torch.randn(2, 10, 16)
    s0 = _recomputed_max(m, x)
    tau = float(s0.median())  # about half of the heads exceed tau
    before = copy.deepcopy(m)
    if through_optimizer:  # lr = 0: the only change is the clip
        opt = MuonClip.from_model(m, lr=0.0, qk_clip_tau=tau)
        m(x).sum().backward()
        opt.step()
        stats = opt.last_qk_stats
    else:
        clipper = QKClipper(find_qk_clip_modules(m), tau)
        m(x)
        stats = clipper.step()
    clipped = s0 > tau
    assert 0 < int(clipped.sum()) < 4 and stats.clipped_heads == [int(clipped.sum())]
    assert stats.max_logit[0] == pytest.approx(float(s0.max()), rel=1e-6)
    s1 = _recomputed_max(m, x)
    assert (s1[clipped] <= tau * (1 + 1e-3)).all() and (s1[clipped] >= tau * (1 - 1e-3)).all()
    assert torch.equal(s1[~clipped], s0[~clipped])
    assert torch.isneginf(m.max_logits_H).all() and m.track_max_logits
    keep = ~clipped
    if kind == "mha":
        for lin in ("q_proj", "k_proj"):
            for t in ("weight", "bias"):
                a, b = getattr(getattr(before, lin), t), getattr(getattr(m, lin), t)
                assert torch.equal(_rows(a, keep, 4), _rows(b, keep, 4))
                assert not torch.equal(_rows(a, clipped, 4), _rows(b, clipped, 4))
        untouched = ("v_proj", "o_proj")
    else:
        assert torch.equal(_rows(before.q_proj.weight, keep, 10), _rows(m.q_proj.weight, keep, 10))
        assert torch.equal(_rows(before.kv_b_proj.weight, keep, 12), _rows(m.kv_b_proj.weight, keep, 12))
        v_rows = lambda lin: lin.weight.detach().view(4, 12, -1)[:, 6:]  # noqa: E731
        assert torch.equal(v_rows(before.kv_b_proj), v_rows(m.kv_b_proj))
        untouched = ("kv_a_proj", "o_proj")  # kv_a_proj holds the shared k_rope rows
    for lin in untouched:
        assert torch.equal(getattr(before, lin).weight, getattr(m, lin).weight), lin


def test_mla_rope_rows_scale_by_gamma() -> None:
    m = TinyMLA(16, 2)
    before = m.q_proj.weight.detach().clone().view(2, 10, 16)
    m.qk_clip_(torch.tensor([0.25, 1.0]))
    after = m.q_proj.weight.detach().view(2, 10, 16)
    torch.testing.assert_close(after[0, :6], before[0, :6] * 0.5)
    torch.testing.assert_close(after[0, 6:], before[0, 6:] * 0.25)
    assert torch.equal(after[1], before[1])


def test_max_over_micro_batches_and_disabled_clip_only_logs() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = MuonClip.from_model(model, lr=0.0, qk_clip=False, qk_clip_tau=1e-3)
    a, b = torch.randint(0, 32, (2, 9)), torch.randint(0, 32, (2, 9))
    model.loss(a).backward()
    m0 = model.layers[0].attn.max_logits_H.clone()
    model.loss(b).backward()
    m1 = model.layers[0].attn.max_logits_H.clone()
    assert torch.equal(m1, torch.maximum(m0, m1)) and (m1 >= m0).all()
    w = model.layers[0].attn.q_proj.weight.detach().clone()
    opt.step()
    assert torch.equal(w, model.layers[0].attn.q_proj.weight)  # tracking only
    d = opt.last_qk_stats.to_dict()
    assert d["qk_clip/max_logit/layers.0.attn"] == pytest.approx(float(m1.max()))
    assert d["qk_clip/clipped_heads"] == 4.0 and set(d) >= {"qk_clip/max_logit", "qk_clip/clipped_heads/layers.1.attn"}
