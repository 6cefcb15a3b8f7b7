"""``return_logits=False``: the model's loss and per-row losses from the head's fused linear + cross entropy
(``kimi_vl.modeling.head.LMHead``) equal those of the logits path, with the same gradients, packed or padded, on
the PyTorch path and through the Triton kernels (the interpreter on a CPU); and the training loop's
``compute_loss`` gives the same loss, breakdown and gradients either way."""

from __future__ import annotations

import contextlib

import pytest
import torch
from backbone_utils import build, tiny_config
from kvl_testing import interpret_without_gpu, kernel_device

from kernels.cross_entropy import cross_entropy
from kimi_vl.modeling.head import IGNORE, LMHead, causal_targets
from kimi_vl.train.loop import compute_loss


def _loss_and_grads(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=labels, use_cache=False, **kw)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[0, 2] = IGNORE
    labels[-1, -3:] = IGNORE
    return labels


@pytest.mark.parametrize("packed", [False, True])
def test_row_loss_head_matches_logits_path(packed):
    model = build(tiny_config(moe=False)).train()
    torch.manual_seed(1)
    ids = torch.randint(3, 97, (1, 24) if packed else (2, 12))
    cu = torch.tensor([0, 9, 17, 24]) if packed else None
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, ids, labels, cu_seqlens=cu)
    out, grads = _loss_and_grads(model, ids, labels, cu_seqlens=cu, return_logits=False)
    assert out.logits is None and ref.row_losses is None
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-6)
    targets = causal_targets(labels, cu)
    want = cross_entropy(ref.logits.detach(), targets, ignore_index=IGNORE, reduction="none")
    torch.testing.assert_close(out.row_losses.detach(), want, rtol=1e-6, atol=1e-6)
    assert (out.row_losses[targets == IGNORE] == 0).all()
    if packed:  # each document's last row predicts nothing
        assert (targets[0, [8, 16, 23]] == IGNORE).all()
    assert grads.keys() == ref_grads.keys() and len(grads) > 10
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_row_loss_head_through_the_triton_kernels(monkeypatch):
    """``KVL_CE_BACKEND=triton``: the fused kernel (interpreted on a CPU) gives the PyTorch path's loss and grads."""
    interpret_without_gpu(monkeypatch)
    model = build(tiny_config(moe=False)).train().to(kernel_device())
    torch.manual_seed(2)
    ids = torch.randint(3, 97, (2, 10), device=kernel_device())
    labels = _labels(ids)
    monkeypatch.setenv("KVL_CE_BACKEND", "torch")
    ref, ref_grads = _loss_and_grads(model, ids, labels, return_logits=False)
    monkeypatch.setenv("KVL_CE_BACKEND", "triton")
    out, grads = _loss_and_grads(model, ids, labels, return_logits=False)
    torch.testing.assert_close(out.row_losses, ref.row_losses, rtol=1e-5, atol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_plain_linear_head_takes_the_same_path():
    """A head set through ``set_output_embeddings`` as a plain ``nn.Linear`` (no targets argument): the row losses
    come from its logits, equal to ``LMHead``'s."""
    model = build(tiny_config(moe=False)).train()
    ids = torch.randint(3, 97, (2, 9))
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, ids, labels, return_logits=False)
    plain = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    with torch.no_grad():
        plain.weight.copy_(model.lm_head.weight)
    model.set_output_embeddings(plain)
    out, grads = _loss_and_grads(model, ids, labels, return_logits=False)
    assert type(model.lm_head) is torch.nn.Linear and out.logits is None
    torch.testing.assert_close(out.row_losses, ref.row_losses, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads["lm_head.weight"], ref_grads["lm_head.weight"], rtol=1e-5, atol=1e-6)


def test_head_under_autocast_computes_in_the_autocast_dtype():
    head = LMHead(16, 37, bias=False)
    x = torch.randn(3, 5, 16)
    targets = torch.randint(0, 37, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = head(x, targets)
        logits = head(x)
    assert logits.dtype == torch.bfloat16 and rows.dtype == torch.float32
    torch.testing.assert_close(rows, cross_entropy(logits, targets, reduction="none"), rtol=0, atol=0)


@pytest.mark.parametrize("return_logits", [True, False])
def test_no_counted_target_gives_zero_loss_and_gradients(return_logits):
    """Labels that are all ignored (a prompt-only batch) give loss 0 and zero gradients on both paths, not NaN."""
    model = build(tiny_config(moe=False)).train()
    ids = torch.randint(3, 97, (2, 12))
    out, grads = _loss_and_grads(model, ids, torch.full_like(ids, IGNORE), return_logits=return_logits)
    assert out.loss.item() == 0.0
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads.values())


def test_return_logits_false_needs_labels_and_all_rows():
    model = build(tiny_config(moe=False))
    ids = torch.randint(3, 97, (1, 8))
    with pytest.raises(ValueError, match="return_logits=False .* needs labels"):
        model(ids, return_logits=False)
    with pytest.raises(ValueError, match="logits_to_keep=1"):
        model(ids, labels=ids, return_logits=False, logits_to_keep=1)
    with pytest.raises(ValueError, match="bias"):
        LMHead(4, 5, bias=True)(torch.randn(2, 4), torch.tensor([0, 1]))


def test_compute_loss_fused_equals_logits_path():
    """The training loop's loss, its per-modality breakdown and the gradients do not depend on ``fused_head``."""
    model = build(tiny_config(moe=False)).train()
    torch.manual_seed(3)
    ids = torch.randint(3, 97, (1, 20))
    labels = _labels(ids)
    positions = torch.cat([torch.arange(7), torch.arange(13)])[None]
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids),
             "cu_seqlens": torch.tensor([0, 7, 20]), "position_ids": positions,
             "modality_ids": (torch.arange(20) % 2)[None], "source_ids": torch.zeros_like(ids), "sources": ["s"]}
    runs, outputs = {}, []
    model.register_forward_hook(lambda module, args, out: outputs.append(out))
    for fused in (True, False):
        model.zero_grad(set_to_none=True)
        loss, parts, count = compute_loss(model, batch, torch.device("cpu"), False, contextlib.nullcontext(),
                                          fused_head=fused)
        loss.backward()
        assert (outputs[-1].logits is None) == fused and (outputs[-1].row_losses is not None) == fused
        runs[fused] = loss.detach(), parts.values(), count, {n: p.grad for n, p in model.named_parameters()
                                                              if p.grad is not None}
    (loss_f, parts_f, count_f, grads_f), (loss_l, parts_l, count_l, grads_l) = runs[True], runs[False]
    torch.testing.assert_close(loss_f, loss_l, rtol=1e-6, atol=1e-6)
    assert int(count_f) == int(count_l) == 20 - 1 - 1 - 3 - 1  # first token, 4 ignored labels, a document start
    assert parts_f.keys() == parts_l.keys() and {"loss/text", "loss/image"} <= parts_f.keys()
    for key in parts_f:
        assert abs(parts_f[key] - parts_l[key]) < 1e-6, key
    for name, g in grads_f.items():
        torch.testing.assert_close(g, grads_l[name], rtol=1e-5, atol=1e-6, msg=name)
