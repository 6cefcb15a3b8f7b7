"""Static-cache decode (``kimi_vl.generation.GraphDecoder``): the same logits and tokens as the dynamic cache.

CPU: the static cache run eagerly (fixed-shape buffers, device-index writes, masked full-buffer attention).
GPU (``gpu`` mark): the step captured as a CUDA graph and replayed.
"""

from __future__ import annotations

import pytest
import torch

from kimi_vl.generation import GraphDecoder
from kimi_vl.modeling.cache import StaticKimiVLCache, output_cache
from tests.model.backbone_utils import build, tiny_config

MODES = ["standard", "attnres_block", "attnres_full"]


def _left_padded(cfg, lengths: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), cfg.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, cfg.vocab_size, (n,), generator=gen)
        mask[i, width - n:] = 1
    return ids, mask


@pytest.mark.parametrize("cache_mode", ["latent", "expanded"])
@pytest.mark.parametrize("mode", MODES)
def test_static_steps_equal_dynamic_steps(mode, cache_mode):
    cfg = tiny_config(moe=False, residual_mode=mode, mla_cache_mode=cache_mode)
    model = build(cfg)
    ids, mask = _left_padded(cfg, (7, 4, 5))
    steps = torch.randint(3, cfg.vocab_size, (3, 6), generator=torch.Generator().manual_seed(1))
    dec = GraphDecoder(model, batch_size=3, capacity=16, use_graph=False)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache = output_cache(out)
        static_first = dec.prefill(ids, mask)
        torch.testing.assert_close(static_first, out.logits[:, -1], rtol=1e-5, atol=1e-6)  # lm_head on 1 row
        for t in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
            ref = model(input_ids=steps[:, t:t + 1], attention_mask=mask, cache=cache, use_cache=True).logits[:, -1]
            got = dec.step(steps[:, t])
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=f"step {t}")
    assert dec.cache.length == 7 + steps.shape[1]
    assert int(dec.cache.position) == dec.cache.length


@pytest.mark.parametrize("mode", ["standard", "attnres_block"])
def test_greedy_generate_equals_transformers_generate(mode):
    cfg = tiny_config(moe=False, residual_mode=mode)
    model = build(cfg)
    ids, mask = _left_padded(cfg, (6, 3))
    want = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                          pad_token_id=cfg.pad_token_id)
    dec = GraphDecoder(model, batch_size=2, capacity=32, use_graph=False)
    assert torch.equal(dec.generate(ids, mask, max_new_tokens=8), want)
    # a second prompt reuses the decoder (and its cache buffers)
    ids2, mask2 = _left_padded(cfg, (2, 5), seed=3)
    want2 = model.generate(ids2, attention_mask=mask2, max_new_tokens=4, do_sample=False, eos_token_id=None,
                           pad_token_id=cfg.pad_token_id)
    assert torch.equal(dec.generate(ids2, mask2, max_new_tokens=4), want2)


def test_sampling_and_eos():
    cfg = tiny_config(moe=False)
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0))
    dec = GraphDecoder(model, batch_size=2, capacity=24, use_graph=False)
    runs = [dec.generate(ids, max_new_tokens=6, do_sample=True, top_k=5, temperature=0.8,
                         generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (2, 10)
    greedy = dec.generate(ids, max_new_tokens=6)
    eos = int(greedy[0, 5])  # row 0's second new token ends it: it is padded after that
    out = dec.generate(ids, max_new_tokens=6, eos_token_id=eos, pad_token_id=cfg.pad_token_id)
    assert out[0, 5] == eos and (out[0, 6:] == cfg.pad_token_id).all()
    # a stop criterion (transformers' StoppingCriteria form): row 1 ends after its third new token
    calls = []

    def stop(ids_BT: torch.Tensor) -> torch.Tensor:
        calls.append(ids_BT.shape[1])
        return torch.tensor([False, ids_BT.shape[1] >= 7])

    out = dec.generate(ids, max_new_tokens=6, stop=stop, pad_token_id=cfg.pad_token_id)
    assert torch.equal(out[:, :7], greedy[:, :7]) and (out[1, 7:] == cfg.pad_token_id).all()
    assert torch.equal(out[0], greedy[0]) and calls == [5, 6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="needs pad_token_id"):
        dec.generate(ids, max_new_tokens=2, stop=stop)


def test_errors_name_the_problem():
    cfg = tiny_config(moe=False)
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (1, 5))
    dec = GraphDecoder(model, batch_size=1, capacity=8, use_graph=False)
    with pytest.raises(RuntimeError, match="prefill first"):
        dec.step(ids[:, 0])
    with pytest.raises(ValueError, match="B=1"):
        dec.prefill(ids.repeat(2, 1))
    with pytest.raises(ValueError, match="L >= 1"):
        dec.prefill(ids[:, :0])
    with pytest.raises(ValueError, match="exceed the capacity 8"):
        dec.generate(ids, max_new_tokens=4)
    dec.prefill(ids)
    for _ in range(3):
        dec.step(ids[:, 0])
    with pytest.raises(ValueError, match="full"):
        dec.step(ids[:, 0])
    with pytest.raises(ValueError, match="one token per row"):
        model(input_ids=ids[:, :2], cache=dec.cache, use_cache=True)
    with pytest.raises(ValueError, match="MoE"):
        GraphDecoder(build(tiny_config(moe=True)), 1, 8, use_graph=True)


def test_reorder_keeps_addresses():
    cfg = tiny_config(moe=False)
    model = build(cfg)
    ids, mask = _left_padded(cfg, (3, 5))
    with torch.no_grad():
        cache = StaticKimiVLCache.from_prefill(cfg, output_cache(model(input_ids=ids, attention_mask=mask,
                                                                      use_cache=True)), 12, mask)
    before = [(t.data_ptr(), t.clone()) for layer in cache.layers for t in layer.tensors()]
    cache.reorder_cache(torch.tensor([1, 0]))
    for (ptr, old), t in zip(before, [t for layer in cache.layers for t in layer.tensors()]):
        assert t.data_ptr() == ptr and torch.equal(t, old.flip(0))
    assert torch.equal(cache.key_mask_BS[:, :5], mask.flip(0).bool())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["standard", "attnres_block"])
def test_graph_replay_equals_eager(mode):
    cfg = tiny_config(moe=False, residual_mode=mode, attn_backend="auto")
    model = build(cfg).cuda()
    ids, mask = _left_padded(cfg, (9, 6, 7))
    ids, mask = ids.cuda(), mask.cuda()
    eager = GraphDecoder(model, 3, 40, use_graph=False)
    graph = GraphDecoder(model, 3, 40, use_graph=True)
    want = eager.generate(ids, mask, max_new_tokens=20)
    assert torch.equal(graph.generate(ids, mask, max_new_tokens=20), want)
    assert torch.equal(graph.generate(ids, mask, max_new_tokens=20), want)  # replays on a reloaded cache
    steps = torch.randint(3, cfg.vocab_size, (3, 5), device="cuda")
    eager.prefill(ids, mask), graph.prefill(ids, mask)
    for t in range(steps.shape[1]):
        torch.testing.assert_close(graph.step(steps[:, t]).clone(), eager.step(steps[:, t]), rtol=0, atol=0)


def test_chunked_prefill_equals_whole():
    cfg = tiny_config(moe=False, residual_mode="attnres_block")
    model = build(cfg)
    ids, mask = _left_padded(cfg, (9, 5))
    whole = GraphDecoder(model, 2, 24, use_graph=False).generate(ids, mask, max_new_tokens=5)
    dec = GraphDecoder(model, 2, 24, use_graph=False)
    first = dec.prefill(ids, mask, chunk=4)
    assert first.shape == (2, cfg.vocab_size)
    tokens = [first.argmax(-1)]
    for _ in range(4):
        tokens.append(dec.step(tokens[-1]).argmax(-1))
    assert torch.equal(torch.stack(tokens, 1), whole[:, 9:])


def test_decoder_slot_keeps_one_decoder_per_batch_size():
    """lm-eval's length groups alternate full batches with a smaller last one: each size keeps its decoder (and on
    CUDA its graph); the least recently used goes past ``keep``; a longer request rebuilds its size's decoder."""
    from kimi_vl.generation import DecoderSlot

    model = build(tiny_config(moe=False))
    slot = DecoderSlot(model, use_graph=False, round_to=16, keep=2)
    eight, three = slot.get(8, 10), slot.get(3, 10)
    assert slot.get(8, 16) is eight and eight.capacity == 16 and slot.current is eight
    assert slot.get(3, 17) is not three  # capacity 16 < 17: rebuilt at 32
    assert slot.get(3, 5).capacity == 32
    slot.get(1, 5)  # a third size: 8, the least recently used, goes
    assert sorted(slot.decoders) == [1, 3] and slot.get(8, 5) is not eight
    with pytest.raises(ValueError, match="keep must be >= 1"):
        DecoderSlot(model, use_graph=False, keep=0)
