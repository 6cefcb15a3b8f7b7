"""Parity with transformers' kimi_linear (the published reference) through the explicit key map, both ways."""

from __future__ import annotations

import pytest
import torch
from backbone_utils import build, tiny_config
from kvl_testing import rel_rms
from transformers import KimiLinearForCausalLM

from kimi_vl.convert import config_to_hf, convert_from_hf, convert_to_hf, state_dict_from_hf, state_dict_to_hf

CASES = [
    dict(moe=False),
    dict(moe=True),
    dict(moe=True, n_group=2, topk_group=1, q_lora_rank=12),
]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=["dense", "moe", "moe-groups-qlora"])
def test_ours_to_hf_logits_and_greedy(case, seed):
    cfg = tiny_config(**case)
    ours = build(cfg, seed)
    theirs = convert_to_hf(ours).eval()
    ids = torch.randint(3, cfg.vocab_size, (2, 70), generator=torch.Generator().manual_seed(seed))
    assert rel_rms(_logits(ours, ids), _logits(theirs, ids)) <= 1e-5
    gen = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(ours.generate(ids[:, :7], **gen), theirs.generate(ids[:, :7], **gen))


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("moe", [False, True])
def test_hf_to_ours_logits_and_greedy(moe, seed):
    torch.manual_seed(seed)
    theirs = KimiLinearForCausalLM(config_to_hf(tiny_config(moe=moe))).eval()
    ours = convert_from_hf(theirs).eval()
    ids = torch.randint(3, 97, (1, 40), generator=torch.Generator().manual_seed(seed))
    assert rel_rms(_logits(ours, ids), _logits(theirs, ids)) <= 1e-5
    gen = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(ours.generate(ids[:, :5], **gen), theirs.generate(ids[:, :5], **gen))


def test_key_map_round_trip_is_lossless():
    sd = build(tiny_config(moe=True)).state_dict()
    back = state_dict_from_hf(state_dict_to_hf(sd))
    assert sorted(back) == sorted(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_to_hf_refuses_what_kimi_linear_cannot_express():
    with pytest.raises(ValueError, match="residual_mode"):
        config_to_hf(tiny_config(residual_mode="attnres_block"))
    with pytest.raises(ValueError, match="kda_gate_lower_bound"):
        config_to_hf(tiny_config(kda_gate_lower_bound=-5.0))


def test_convert_cli_round_trip(tmp_path):
    from kimi_vl.cli import main

    theirs = KimiLinearForCausalLM(config_to_hf(tiny_config(moe=True))).eval()
    theirs.save_pretrained(tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    back = KimiLinearForCausalLM.from_pretrained(tmp_path / "back")
    sd, sd2 = theirs.state_dict(), back.state_dict()
    assert sorted(sd) == sorted(sd2) and all(torch.equal(sd[k], sd2[k]) for k in sd)
