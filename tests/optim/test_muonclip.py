"""MuonClip optimizer: routing, per-block Muon update vs the pure maths, AdamW half, state_dict, schedules."""

from __future__ import annotations

import copy

import pytest
import torch
from optim_tiny_models import TinyLM
from torch import nn

from kimi_vl.optim import MuonClip, OptimConfig, build_optimizer, build_scheduler, route_model, routing_summary
from kimi_vl.optim.muon import momentum_update_, newton_schulz5, rms_match_scale
from kimi_vl.optim.schedules import Schedule, lr_multiplier


def _ids(n: int = 2, t: int = 12) -> torch.Tensor:
    return torch.randint(0, 32, (n, t))


def _train(model: TinyLM, opt: torch.optim.Optimizer, steps: int, sched: object = None) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model.loss(_ids()).backward()
        opt.step()
        if sched is not None:
            sched.step()


def test_routing_decisions() -> None:
    routes = {r.name: r for r, _ in route_model(TinyLM())}
    want_muon = ["layers.0.attn.q_proj.weight", "layers.0.mlp.0.weight", "layers.1.attn.kv_b_proj.weight",
                 "layers.1.mlp.router.weight", "layers.1.mlp.experts_gate_up", "layers.1.mlp.experts_down"]
    want_adamw = ["embed_tokens.weight", "lm_head.weight", "norm.weight", "layers.0.attn.q_proj.bias",
                  "A_log", "dt_bias", "layers.1.attn.kv_a_norm.weight", "layers.0.mlp.0.bias"]
    for n in want_muon:
        assert routes[n].target == "muon", (n, routes[n])
    for n in want_adamw:
        assert routes[n].target == "adamw" and routes[n].weight_decay, (n, routes[n])
    for n in ["layers.0.self_attention_res_proj", "layers.0.self_attention_res_norm.weight"]:
        assert routes[n].target == "adamw" and not routes[n].weight_decay
    assert routes["layers.1.mlp.experts_gate_up"].row_splits == (32, 32)
    assert routes["A_log"].reason == "gate vector" and routes["dt_bias"].reason == "gate vector"


def test_tied_weights_routed_once_and_summary_prints() -> None:
    model = TinyLM()
    model.lm_head.weight = model.embed_tokens.weight
    routes = [r for r, _ in route_model(model)]
    assert [r.name for r in routes].count("embed_tokens.weight") == 1
    assert "lm_head.weight" in next(r for r in routes if r.name == "embed_tokens.weight").aliases
    text = routing_summary(model)
    assert "experts_gate_up" in text and "muon:" in text and "adamw:" in text and "2 attention modules" in text


def test_bad_row_splits_raise() -> None:
    lin = nn.Linear(4, 6)
    lin.muon_row_splits = {"weight": (2, 2)}
    with pytest.raises(ValueError, match="muon_row_splits"):
        route_model(nn.Sequential(lin))


def test_muon_update_is_blockwise_ns() -> None:
    """One step equals the pure maths: momentum, NS per row block, 0.2*sqrt(max) per block, decoupled decay."""
    torch.manual_seed(1)
    model = TinyLM()
    before = copy.deepcopy(model)
    opt = MuonClip.from_model(model, lr=0.01, weight_decay=0.1, ns_dtype=torch.float32, qk_clip=False)
    model.loss(_ids()).backward()
    opt.step()
    for name, p0 in [("layers.1.mlp.experts_gate_up", before.layers[1].mlp.experts_gate_up),
                     ("layers.0.attn.q_proj.weight", before.layers[0].attn.q_proj.weight)]:
        p1 = dict(model.named_parameters())[name]
        grad = p1.grad
        U = momentum_update_(torch.zeros_like(grad), grad, 0.95, True).reshape(-1, *grad.shape[-2:])
        splits = (32, 32) if "experts" in name else (U.shape[-2],)
        want = p0.detach().reshape(U.shape) * (1 - 0.01 * 0.1)
        start = 0
        for rows in splits:
            blk = newton_schulz5(U[:, start:start + rows], dtype=torch.float32)
            want[:, start:start + rows] -= 0.01 * rms_match_scale(rows, U.shape[-1]) * blk
            start += rows
        torch.testing.assert_close(p1.detach(), want.reshape(p1.shape), rtol=1e-5, atol=1e-6)


def test_adamw_group_matches_torch_adamw() -> None:
    model = TinyLM(moe=False)
    ref_model = copy.deepcopy(model)
    opt = MuonClip.from_model(model, adamw_only=True, lr=3e-3, qk_clip=False, foreach=True)
    ref_groups = [
        {"params": [p for n, p in ref_model.named_parameters() if "_res_" not in n], "weight_decay": 0.1},
        {"params": [p for n, p in ref_model.named_parameters() if "_res_" in n], "weight_decay": 0.0},
    ]
    ref = torch.optim.AdamW(ref_groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(3):
        ids = _ids()
        for m, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            m.loss(ids).backward()
            o.step()
    for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert torch.equal(p, q), n


def test_state_dict_round_trip_continues_bit_identically() -> None:
    cfg = OptimConfig(lr=0.02, schedule="cosine", warmup_steps=2, total_steps=10, ns_dtype="float32", qk_clip_tau=5.0)
    model = TinyLM()
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    _train(model, opt, 3, sched)
    model2 = copy.deepcopy(model)
    opt2 = build_optimizer(model2, cfg)
    sched2 = build_scheduler(opt2, cfg)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    sched2.load_state_dict(sched.state_dict())
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 32, (2, 12), generator=g) for _ in range(3)]
    for m, o, s in ((model, opt, sched), (model2, opt2, sched2)):
        for ids in batches:
            o.zero_grad()
            m.loss(ids).backward()
            o.step()
            s.step()
    for (n, p), q in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, q), n
    assert opt.last_qk_stats.to_dict() == opt2.last_qk_stats.to_dict()


def test_zero_grad_and_untouched_params_without_grad() -> None:
    model = TinyLM()
    opt = MuonClip.from_model(model)
    frozen = model.layers[0].self_attention_res_proj.detach().clone()
    _train(model, opt, 2)
    assert torch.equal(frozen, model.layers[0].self_attention_res_proj)  # never used -> no grad -> no step
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert opt.last_muon_stats["muon/ns_matrices_total"] > 0


@pytest.mark.parametrize("name", ["constant", "wsd", "cosine"])
def test_schedules(name: str) -> None:
    s = Schedule(name, warmup_steps=4, total_steps=20, decay_fraction=0.25, min_lr_ratio=0.1)
    m = [lr_multiplier(i, s) for i in range(20)]
    assert m[:4] == [0.25, 0.5, 0.75, 1.0]
    if name == "constant":
        assert all(x == 1.0 for x in m[4:])
    elif name == "wsd":
        assert all(x == 1.0 for x in m[4:15]) and m[15] == 1.0 and 0.1 <= m[19] < m[16] < 1.0
    else:
        assert all(a >= b for a, b in zip(m[4:], m[5:])) and m[4] == 1.0 and m[19] > 0.1
    with pytest.raises(ValueError, match="total_steps"):
        Schedule("cosine", warmup_steps=5, total_steps=5)


def test_scheduler_drives_group_lr() -> None:
    model = TinyLM()
    cfg = OptimConfig(lr=0.1, schedule="wsd", warmup_steps=2, total_steps=4, decay_fraction=0.5)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    assert [g["lr"] for g in opt.param_groups] == [0.05] * len(opt.param_groups)
    _train(model, opt, 2, sched)
    assert all(g["lr"] == 0.1 for g in opt.param_groups)


def test_bad_config_raises() -> None:
    with pytest.raises(ValueError, match="optim.name"):
        build_optimizer(TinyLM(), OptimConfig(name="sgd"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="momentum"):
        MuonClip.from_model(TinyLM(), momentum=1.5)
