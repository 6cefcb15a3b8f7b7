import torch
import torch.nn.functional as F

from kimi_vl.train.loss import breakdown, mean_loss, token_losses


def test_matches_shifted_cross_entropy():
    logits = torch.randn(2, 6, 11)
    labels = torch.randint(0, 11, (2, 6))
    labels[0, 3] = -100
    loss_BL, mask = token_losses(logits, labels)
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(mean_loss(loss_BL, mask), ref, atol=1e-6)
    assert not mask[:, 0].any() and not mask[0, 3]


def test_document_starts_are_masked_and_breakdown():
    logits = torch.randn(1, 6, 7)
    labels = torch.randint(0, 7, (1, 6))
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    loss_BL, mask = token_losses(logits, labels, pos)
    assert mask.tolist() == [[False, True, True, False, True, True]]
    mod = torch.tensor([[0, 0, 0, 1, 1, 1]])
    out = breakdown(loss_BL, mask, mod, ["text", "image"], "loss")
    assert abs(out["loss/text"] - loss_BL[0, 1:3].mean().item()) < 1e-6
    assert abs(out["loss/image"] - loss_BL[0, 4:6].mean().item()) < 1e-6


def test_breakdown_matches_per_name_means():
    torch.manual_seed(0)
    loss_BL = torch.rand(3, 50) * 5
    mask = torch.rand(3, 50) > 0.3
    ids = torch.randint(0, 6, (3, 50))  # id 5 is outside the names and must be ignored
    names = ["a", "b", "c", "d", "e"]
    ids[ids == 3] = 2  # "d" never occurs
    out = breakdown(loss_BL, mask, ids, names, "loss/src")
    want = {f"loss/src/{n}": loss_BL[mask & (ids == i)].double().mean().item()
            for i, n in enumerate(names) if (mask & (ids == i)).any()}
    assert out.keys() == want.keys() and "loss/src/d" not in out
    for key, value in want.items():
        assert abs(out[key] - value) < 1e-9
    assert breakdown(loss_BL, mask, None, names, "x") == {} and breakdown(loss_BL, mask, ids, [], "x") == {}
