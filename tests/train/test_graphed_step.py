"""``kimi_vl.train.graphed_step.GraphedTrainStep``: a training forward + backward replayed as one CUDA graph gives
the eager step's loss and gradients (GPU), and refuses what it cannot replay with errors that name it (CPU)."""

from __future__ import annotations

import pytest
import torch

from kimi_vl.train.graphed_step import GraphedTrainStep
from tests.model.backbone_utils import build, tiny_config


def test_refuses_a_cpu_model():
    model = build(tiny_config(moe=False))
    with pytest.raises(ValueError, match="CUDA device, got cpu"):
        GraphedTrainStep(model)


@pytest.mark.gpu
@pytest.mark.parametrize("residual_mode", ["standard", "attnres_block"])
def test_replays_equal_eager_steps_on_gpu(residual_mode):
    """Three batches through the graph (the first captures) give the eager step's loss and every parameter's
    gradient; a zero_grad(set_to_none=True) between calls does not lose the gradients; a batch of another shape is
    refused with the field named."""
    model = build(tiny_config(moe=False, residual_mode=residual_mode)).cuda().train()
    with pytest.raises(ValueError, match="warmup"):
        GraphedTrainStep(model, warmup=0)
    graphed = GraphedTrainStep(model)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(3, 97, (2, 24), generator=gen).cuda()
        model.zero_grad(set_to_none=True)
        eager_loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        eager_loss.backward()
        eager = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        loss = graphed(input_ids=ids, labels=ids, use_cache=False)
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-6, atol=1e-6)
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert got.keys() == eager.keys()
        for n, g in eager.items():
            torch.testing.assert_close(got[n], g, rtol=1e-5, atol=1e-6, msg=n)
    assert graphed.captures == 1
    with pytest.raises(ValueError, match="field 'input_ids' is torch.int64 \\(2, 25\\)"):
        graphed(input_ids=torch.zeros(2, 25, dtype=torch.long, device="cuda"), labels=ids, use_cache=False)
    with pytest.raises(ValueError, match="field 'use_cache' is True"):
        graphed(input_ids=ids, labels=ids, use_cache=True)
