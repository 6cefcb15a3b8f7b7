"""Model invariants: packed == padded, cached decode == full forward, gradients everywhere, save/load, batching."""

from __future__ import annotations

import pytest
import torch
from backbone_utils import build, tiny_config
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device
from transformers import AutoModelForCausalLM

from kimi_vl import KimiVLCache
from kimi_vl.modeling.cache import output_cache
from kimi_vl.modeling.model import enable_activation_checkpointing

MODES = ["standard", "attnres_block"]


@pytest.mark.parametrize("mode", MODES)
def test_packed_equals_padded(mode):
    cfg = tiny_config(residual_mode=mode)
    model = build(cfg)
    lens = [13, 5, 21]
    docs = [torch.randint(3, cfg.vocab_size, (n,)) for n in lens]
    L = max(lens)
    padded = torch.zeros(len(lens), L, dtype=torch.long)
    mask = torch.zeros(len(lens), L, dtype=torch.long)
    for i, d in enumerate(docs):
        padded[i, : len(d)], mask[i, : len(d)] = d, 1
    packed = torch.cat(docs)[None]
    cu = torch.tensor([0, 13, 18, 39], dtype=torch.int32)
    with torch.no_grad():
        lp = model(padded, attention_mask=mask, use_cache=False).logits
        lk = model(packed, cu_seqlens=cu, use_cache=False).logits[0]
    for i, n in enumerate(lens):
        assert_rel_rms(lk[int(cu[i]): int(cu[i]) + n], lp[i, :n], 1e-5, f"doc {i}")


def test_packed_rows_with_padding_segment_and_loss_boundaries():
    cfg = tiny_config()
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, 10))
    cu = torch.tensor([0, 6, 10, 17, 20], dtype=torch.int32)  # row 0: docs 6 + 4; row 1: doc 7 + padding 3
    with torch.no_grad():
        packed = model(ids, cu_seqlens=cu, labels=ids, use_cache=False)
        alone = model(ids[1:, :7], use_cache=False).logits
    assert packed.logits.shape == (2, 10, cfg.vocab_size)
    assert_rel_rms(packed.logits[1, :7], alone[0], 1e-5, "second row's first doc")
    targets = ids.clone().reshape(-1)
    logits = packed.logits.reshape(-1, cfg.vocab_size)
    keep = [i for i in range(19) if i + 1 not in (6, 10, 17)]
    ref = torch.nn.functional.cross_entropy(logits[keep], targets[[i + 1 for i in keep]])
    assert torch.allclose(packed.loss, ref, atol=1e-6)


@pytest.mark.parametrize(("mode", "cache_mode"), [("standard", "latent"), ("standard", "expanded"),
                                                  ("attnres_block", "latent")])
def test_cached_decode_equals_full_forward(mode, cache_mode):
    cfg = tiny_config(residual_mode=mode, mla_cache_mode=cache_mode)
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, 18))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        for steps in ([10] + [1] * 8, [7, 5, 1, 5]):
            cache, outs, start = None, [], 0
            for n in steps:
                out = model(ids[:, start: start + n], past_key_values=cache, use_cache=True)
                cache, start = output_cache(out), start + n
                outs.append(out.logits)
            assert isinstance(cache, KimiVLCache) and cache.get_seq_length() == 18
            assert_rel_rms(torch.cat(outs, 1), full, 1e-5, f"steps {steps}")


def test_every_parameter_gets_a_gradient():
    cfg = tiny_config(residual_mode="attnres_block", q_lora_rank=8)
    model = build(cfg).train()
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero queries so the AttnRes key norms get gradients too
            for name in ("self_attention_res_proj", "mlp_res_proj"):
                getattr(layer, name).weight.normal_()
        model.model.output_attn_res_proj.weight.normal_()
    ids = torch.randint(3, cfg.vocab_size, (2, 40))
    model(ids, labels=ids, use_cache=False).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    # The first sublayer mixes a single source (the embedding): its softmax is constant, so its query and key
    # norm exist for the checkpoint layout only and rightly get no gradient.
    assert missing == ["model.layers.0.self_attention_res_proj.weight", "model.layers.0.self_attention_res_norm.weight"]


def test_save_load_round_trip_is_bit_exact(tmp_path):
    cfg = tiny_config(residual_mode="attnres_full")
    model = build(cfg)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sorted(sd) == sorted(sd2)
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    ids = torch.randint(3, cfg.vocab_size, (1, 9))
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), loaded.buffers()))  # non-persistent ones too
    with torch.no_grad():  # memory-mapped weights can be aligned differently, which moves CPU matmuls by ~1 ulp
        assert_rel_rms(loaded(ids, use_cache=False).logits, model(ids, use_cache=False).logits, 1e-6, "logits")


def test_tied_embeddings(tmp_path):
    model = build(tiny_config(tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


@pytest.mark.parametrize("tie", [False, True])
def test_embedding_gradient_through_the_triton_backward(monkeypatch, tie):
    """``KVL_EMBEDDING_BACKEND=triton`` (the model's ``TokenEmbedding``; interpreter on a CPU): the same logits and
    every parameter's gradient as PyTorch's embedding backward, also with the LM head tied to the embedding (its two
    gradients summed by autograd)."""
    from backbone_utils import step_under_env

    from kernels import embedding as emb

    calls, backward = [], emb.embedding_backward
    monkeypatch.setattr(emb, "embedding_backward", lambda *a: calls.append(1) or backward(*a))
    interpret_without_gpu(monkeypatch)
    dev = kernel_device()
    model = build(tiny_config(tie_word_embeddings=tie)).to(dev).train()
    ids = torch.randint(3, 97, (2, 40), device=dev)
    runs = step_under_env(model, ids, monkeypatch, "KVL_EMBEDDING_BACKEND", ("torch", "triton"))
    assert len(calls) == 1  # the triton run's one backward
    assert torch.equal(runs["triton"][0], runs["torch"][0])
    assert runs["triton"][1].keys() == runs["torch"][1].keys()
    for name, g in runs["torch"][1].items():
        assert_rel_rms(runs["triton"][1][name], g, 1e-6, name)


@pytest.mark.parametrize("mode", MODES)
def test_batch_generation_equals_one_by_one(mode):
    cfg = tiny_config(residual_mode=mode)
    model = build(cfg)
    prompts = [torch.randint(3, cfg.vocab_size, (n,)) for n in (9, 4, 6)]
    L = max(len(p) for p in prompts)
    ids = torch.full((3, L), cfg.pad_token_id, dtype=torch.long)
    mask = torch.zeros(3, L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], mask[i, L - len(p):] = p, 1
    gen = dict(max_new_tokens=7, do_sample=False, pad_token_id=cfg.pad_token_id, eos_token_id=None)
    batch = model.generate(ids, attention_mask=mask, **gen)[:, L:]
    for i, p in enumerate(prompts):
        single = model.generate(p[None], **gen)[0, len(p):]
        assert torch.equal(batch[i], single), f"prompt {i}"


def test_sampling_is_reproducible_and_greedy_matches_argmax():
    cfg = tiny_config()
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, 5))
    samples = []
    for _ in range(2):
        torch.manual_seed(7)
        samples.append(model.generate(ids, max_new_tokens=5, do_sample=True, top_k=20, temperature=0.9,
                                      eos_token_id=None))
    assert torch.equal(samples[0], samples[1])
    greedy = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    seq = ids
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, model(seq, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(greedy, seq)


def test_inputs_embeds_path_equals_input_ids():
    cfg = tiny_config()
    model = build(cfg)
    ids = torch.randint(3, cfg.vocab_size, (2, 11))
    with torch.no_grad():
        a = model(ids, use_cache=False).logits
        b = model(inputs_embeds=model.get_input_embeddings()(ids), use_cache=False).logits
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="exactly one"):
        model(ids, inputs_embeds=model.get_input_embeddings()(ids))


def test_cache_is_smaller_with_latent_mla_and_constant_for_kda():
    cfg = tiny_config(moe=False)
    model = build(cfg)
    sizes = {}
    for mode in ("latent", "expanded"):
        model.config.mla_cache_mode = mode
        with torch.no_grad():
            cache = output_cache(model(torch.randint(3, 97, (1, 50)), use_cache=True))
        sizes[mode] = cache.nbytes()
        kda = [c for c in cache.layers if hasattr(c, "recurrent_state")]
        assert kda and all(c.recurrent_state.dtype == torch.float32 for c in kda)
    assert sizes["latent"] < sizes["expanded"]


def test_gradient_checkpointing_gives_identical_gradients():
    model = build(tiny_config(residual_mode="attnres_block")).train()
    ids = torch.randint(3, 97, (2, 16))
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            enable_activation_checkpointing(model)
        model.zero_grad()
        model(ids, labels=ids, use_cache=False).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-7) for n in grads[0])


def test_triton_paths_match_torch_paths(monkeypatch):
    """The whole model with every fused Triton kernel (interpreted on a CPU, compiled on a GPU, where the model runs
    on the GPU) == the PyTorch paths: logits, loss and every parameter's gradient (fp32), so that the GPU's default
    dispatch cannot change the maths."""
    interpret_without_gpu(monkeypatch)
    cfg = tiny_config(moe=False)
    ids = torch.randint(3, cfg.vocab_size, (2, 19)).to(kernel_device())

    def run(backend: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for op in ("KDA", "CONV", "NORM", "CE", "MLA_EXPAND"):
            monkeypatch.setenv(f"KVL_{op}_BACKEND", backend)
        model = build(cfg).to(kernel_device()).train()
        out = model(ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}

    logits_ref, grads_ref = run("torch")
    logits, grads = run("triton")
    assert_rel_rms(logits, logits_ref, 1e-5, "logits")
    for name, g in grads_ref.items():
        assert_rel_rms(grads[name], g, 1e-4, name)
