"""``precision: bf16_params`` (kimi_vl/train/param_cast.py): bf16 weight copies swapped in for a micro-batch."""

import copy

import pytest
import torch
from test_ddp import run_worker, text_batches
from test_train_loop import config, losses

from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.train.config import TrainConfig
from kimi_vl.train.loop import Trainer
from kimi_vl.train.param_cast import ParamCaster

FP32_KEPT = ("A_log", "dt_bias")


def _model(**overrides) -> KimiVLForCausalLM:
    torch.manual_seed(0)
    cfg = KimiVLConfig.from_flavor("debug", residual_mode="attnres_block", tie_word_embeddings=True, **overrides)
    model = KimiVLForCausalLM(cfg).train()
    with torch.no_grad():  # AttnRes queries start at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("_res_proj.weight"):
                p.normal_(0, 0.5)
    return model


def _loss_and_grads(model, ids, caster=None):
    model.zero_grad(set_to_none=True)
    with caster() if caster is not None else torch.enable_grad():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fp32_copies_give_the_plain_gradients():
    """With an fp32 'low' dtype the swap is an exact copy: the loss and every gradient equal the plain run's, the
    tied embedding included (one parameter in two slots)."""
    model = _model()
    ids = torch.randint(0, model.config.vocab_size, (2, 33))
    ref_loss, ref = _loss_and_grads(model, ids)
    loss, got = _loss_and_grads(model, ids, ParamCaster(model, torch.float32))
    assert torch.equal(loss, ref_loss)
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name


def test_bf16_copies_equal_a_bf16_model():
    """Inside the context the modules hold bf16 copies (``A_log``/``dt_bias`` stay fp32) and the fp32 parameters
    get, as fp32, exactly the gradients of a model converted to bf16; outside, the Parameters are back."""
    model = _model()
    ids = torch.randint(0, model.config.vocab_size, (2, 33))
    low = copy.deepcopy(model)
    for name, p in low.named_parameters():
        if name.split(".")[-1] not in FP32_KEPT:
            p.data = p.data.to(torch.bfloat16)
    want_loss, want = _loss_and_grads(low, ids)
    caster = ParamCaster(model, torch.bfloat16, FP32_KEPT)
    with caster():
        inside = dict(model.named_parameters())
    assert {str(t.dtype) for n, t in inside.items() if n.split(".")[-1] not in FP32_KEPT} == {"torch.bfloat16"}
    assert {t.dtype for n, t in inside.items() if n.split(".")[-1] in FP32_KEPT} == {torch.float32}
    loss, got = _loss_and_grads(model, ids, caster)
    assert all(isinstance(p, torch.nn.Parameter) and p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys()
    for name, g in got.items():
        assert g.dtype == torch.float32, name
        assert torch.equal(g, want[name].float()), name


def test_frozen_and_unused_parameters_get_no_gradient():
    model = _model()
    model.model.embed_tokens.weight.requires_grad_(False)  # tied: the head is frozen too
    extra = torch.nn.Parameter(torch.ones(3))
    model.register_parameter("unused", extra)
    caster = ParamCaster(model, torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    _, grads = _loss_and_grads(model, ids, caster)
    assert "model.embed_tokens.weight" not in grads and "unused" not in grads
    assert extra.grad is None and model.model.embed_tokens.weight.grad is None
    assert "model.layers.0.mlp.down_proj.weight" in grads


def test_train_loop_bf16_params_on_cpu(tiny_data, tmp_path):
    """The app with ``precision=bf16_params`` (CPU bf16 autocast, images in the batches) follows the bf16-autocast
    run closely and leaves fp32 weights; refused together with ``compile``."""
    media = ["max_steps=4", "data.seq_len=512", "data.vision_ratio=0.5", "model.overrides={residual_mode: "
             "attnres_block}"]
    tr = Trainer(config(tiny_data, tmp_path / "p", *media, "precision=bf16_params"))
    tr.run()
    train_bf16 = Trainer(config(tiny_data, tmp_path / "a", *media, "precision=bf16"))
    train_bf16.run()
    got, want = losses(tmp_path / "p"), losses(tmp_path / "a")
    assert got == pytest.approx(want, rel=1e-2)
    assert got[-1] < got[0]
    assert {p.dtype for p in tr.unwrapped.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="bf16_params"):
        TrainConfig(output_dir="x", max_steps=1, precision="bf16_params", compile=True)


def test_two_process_ddp_with_weight_copies_and_an_unused_vision_tower(tiny_data, tmp_path):
    """Under DDP (find_unused_parameters) the copies' one autograd node still lets the idle vision tower go
    without a gradient and trains like one process on the doubled batch. The copies are fp64 here (an exact
    cast, so the fp32 run's tolerance applies; bf16 would hide a wrong gradient in rounding noise)."""
    text_batches(tiny_data, tmp_path / "batches.pt")
    one = run_worker(1, tiny_data, tmp_path / "batches.pt", tmp_path / "one", "debug", "fp64_params")
    two = run_worker(2, tiny_data, tmp_path / "batches.pt", tmp_path / "two", "debug", "fp64_params")
    plain = run_worker(1, tiny_data, tmp_path / "batches.pt", tmp_path / "plain", "debug", "fp32")
    for name, w in one["state"].items():
        if w.is_floating_point():
            scale = max(1.0, w.abs().max().item())
            assert (two["state"][name] - w).abs().max().item() <= 1e-4 * scale, name
            assert (plain["state"][name] - w).abs().max().item() <= 1e-4 * scale, name
