"""Attention Residuals: fused == naive (fwd/bwd), two-phase == naive, convexity, step-0 equivalence, generation."""

from __future__ import annotations

import pytest
import torch
from backbone_utils import build, step_under_env, tiny_config
from kvl_testing import assert_rel_rms, rel_rms

from kimi_vl.modeling.attn_res import (
    AttnResMix,
    AttnResStream,
    BufferedTwoPhase,
    ResQuery,
    StandardStream,
    mix,
    mix_naive,
)


def run_stream(stream, outs: list[torch.Tensor], norms: list | None = None) -> torch.Tensor:
    """Every sublayer's input (through ``norms[i]`` when given) and the final mix of ``stream`` fed ``outs``,
    stacked (cloned: the buffered stream may hand inputs in one reused buffer)."""
    got = []
    for i, out in enumerate(outs):
        got.append(stream.input(i, *([norms[i]] if norms else [])).clone())
        stream.add(i, out)
    got.append(stream.final(*([norms[-1]] if norms else [])).clone())
    return torch.stack(got)

def _query(d: int, scale: float = 1.0, dtype=torch.float32) -> ResQuery:
    return ResQuery(weight=(torch.randn(1, d) * scale).to(dtype).requires_grad_(),
                    gain=(1 + 0.3 * torch.randn(d)).to(dtype).requires_grad_(), eps=1e-6)


def _sources(n: int, shape=(2, 5, 24), dtype=torch.float32) -> list[torch.Tensor]:
    return [(torch.randn(shape) * (1 + i)).to(dtype).requires_grad_() for i in range(n)]


def test_fused_mix_equals_naive_forward_and_backward():
    sources, q = _sources(5), _query(24)
    h_ref, a_ref = mix_naive(sources, q)
    h, a = mix(sources, q)
    assert_rel_rms(h, h_ref, 1e-6, "h")
    assert_rel_rms(a, a_ref, 1e-6, "alpha")
    dh = torch.randn_like(h)
    ref = torch.autograd.grad(h_ref, [*sources, q.weight, q.gain], dh)
    got = torch.autograd.grad(h, [*sources, q.weight, q.gain], dh)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert_rel_rms(g, r, 1e-5, f"grad {i}")


def test_fused_mix_gradcheck_fp64():
    sources = _sources(3, (1, 3, 6), torch.float64)
    q = _query(6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda w, g, *s: AttnResMix.apply(w, g, 1e-6, *s)[0],
                                    (q.weight, q.gain, *sources))


def test_fused_mix_bf16_sources():
    sources, q = _sources(4, dtype=torch.bfloat16), _query(24)
    h, _ = mix(sources, q)
    h_ref, _ = mix_naive(sources, q)
    assert h.dtype == torch.bfloat16
    assert_rel_rms(h, h_ref, 2e-2, "bf16")


def test_mix_is_convex_per_element():
    sources, q = _sources(6), _query(24, scale=3.0)
    h, alpha = mix(sources, q)
    stack = torch.stack(sources).detach()
    assert torch.allclose(alpha.sum(0), torch.ones_like(alpha[0]), atol=1e-6) and (alpha >= 0).all()
    assert (h >= stack.min(0).values - 1e-5).all() and (h <= stack.max(0).values + 1e-5).all()


@pytest.mark.parametrize(("num_sublayers", "block_size"), [(7, 3), (6, 2), (5, 1), (4, 8)])
def test_two_phase_equals_naive_stream(num_sublayers, block_size):
    """Includes each block's first sublayer, a ragged last block (7 = 3+3+1) and the output mix."""
    d = 16
    queries = [_query(d) for _ in range(num_sublayers + 1)]
    outs = [torch.randn(2, 3, d) * (i + 1) for i in range(num_sublayers)]
    emb = torch.randn(2, 3, d)
    results = {}
    for impl in ("naive", "fused", "two_phase"):
        results[impl] = run_stream(AttnResStream(emb, queries, block_size, impl), outs).detach()
    assert_rel_rms(results["fused"], results["naive"], 1e-6, "fused")
    assert_rel_rms(results["two_phase"], results["naive"], 1e-6, "two-phase")


@pytest.mark.parametrize("mode", ["attnres_full", "attnres_block"])
def test_step0_equivalence_with_standard_residual(mode):
    eps = 1e-12  # norms see sums (standard) vs means (AttnRes): equal up to eps only
    std_model = build(tiny_config(rms_norm_eps=eps), seed=3).train()
    res_model = build(tiny_config(rms_norm_eps=eps, residual_mode=mode), seed=3).train()
    missing, unexpected = res_model.load_state_dict(std_model.state_dict(), strict=False)
    assert not unexpected and all("_res_" in k for k in missing) and missing
    ids = torch.randint(3, 97, (2, 30))
    outs = {}
    for name, model in (("standard", std_model), (mode, res_model)):
        out = model(ids, labels=ids, use_cache=False)
        out.loss.backward()
        outs[name] = out.logits.detach()
    assert_rel_rms(outs[mode], outs["standard"], 1e-5, "logits")
    std_params = dict(std_model.named_parameters())
    for name, p in res_model.named_parameters():
        if "_res_" in name:
            continue
        assert_rel_rms(p.grad, std_params[name].grad, 1e-4, name)
    queries = [p for n, p in res_model.named_parameters() if n.endswith("_res_proj.weight")
               and n != "model.layers.0.self_attention_res_proj.weight"]
    assert queries and all(q.grad.abs().sum() > 0 for q in queries)


@pytest.mark.parametrize("mode", ["attnres_full", "attnres_block"])
def test_generate_with_two_phase_matches_naive_full_forward(mode):
    model = build(tiny_config(residual_mode=mode))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attention_res_proj.weight.normal_()
            layer.mlp_res_proj.weight.normal_()
    ids = torch.randint(3, 97, (2, 6))
    out = model.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=None)
    model.model.attnres_impl = "naive"
    with torch.no_grad():
        ref = model(out, use_cache=False).logits
    model.model.attnres_impl = "two_phase"
    with torch.no_grad():
        two = model(out, use_cache=False).logits
    assert_rel_rms(two, ref, 1e-6, "two-phase model")
    assert torch.equal(ref[:, 5:-1].argmax(-1), out[:, 6:])


def test_diagnostics_are_recorded():
    model = build(tiny_config(residual_mode="attnres_block"))
    model.model.record_diagnostics = True
    model(torch.randint(3, 97, (1, 8)), use_cache=False)
    diag = model.model.last_diagnostics
    assert len(diag["alpha"]) == 2 * 4 + 1 and len(diag["sublayer_output_rms"]) == 8
    assert len(diag["block_output_rms"]) == 2  # blocks of 3 sublayers: 3 + 3 (+ ragged 2 still partial)
    first = diag["alpha"][0]
    assert first["num_sources"] == 1 and first["embed_weight"] == pytest.approx(1.0)
    assert all(0 <= a["max_weight"] <= 1 and a["entropy"] >= 0 for a in diag["alpha"])


@pytest.mark.parametrize(("num_sublayers", "block_size", "tol"), [(5, 2, 1e-5), (10, 1, 5e-5), (11, 4, 3e-5)])
def test_stream_with_triton_kernel_equals_naive(monkeypatch, num_sublayers, block_size, tol):
    """The fused stream through the Triton kernel (interpreter on CPU), forward and gradients, with and without
    gradient sinks and with the block's deferred source gradients: a ragged last block; full AttnRes with up to
    11 sources, so the late mixes take the address table (no sinks) while the early ones use sinks on the same
    sources."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    d = 20
    queries = [ResQuery(torch.randn(1, d, device=dev).requires_grad_(), (1 + 0.3 * torch.randn(d, device=dev))
                        .requires_grad_(), 1e-6) for _ in range(num_sublayers + 1)]
    emb = torch.randn(2, 3, d, device=dev, requires_grad=True)
    grads = {}
    flushes = _count_flushes(monkeypatch)
    for impl, backend, sink, defer in (("naive", "torch", "0", "0"), ("fused", "triton", "1", "0"),
                                       ("nosink", "triton", "0", "0"), ("defer", "triton", "1", "1")):
        monkeypatch.setenv("KVL_ATTNRES_BACKEND", backend)
        monkeypatch.setenv("KVL_ATTNRES_GRAD_SINK", sink)
        monkeypatch.setenv("KVL_ATTNRES_DEFER_GRAD", defer)
        stream = AttnResStream(emb, queries, block_size, impl if impl in ("naive", "fused") else "fused")
        assert (stream.sinks is not None) == (impl in ("fused", "defer"))
        for i in range(num_sublayers):
            stream.add(i, torch.tanh(stream.input(i)) * (i + 1))
        out = stream.final()
        params = [emb] + [t for q in queries[1:] for t in (q.weight, q.gain)]  # sublayer 0 reads emb alone
        grads[impl] = (out.detach(), torch.autograd.grad((out * torch.linspace(-1, 1, d, device=dev)).sum(), params))
    for impl in ("fused", "nosink", "defer"):  # fp32 rounding through 10 chained sublayers reaches ~2e-5
        assert_rel_rms(grads[impl][0], grads["naive"][0], 1e-6, f"{impl} output")
        for i, (a, b) in enumerate(zip(grads[impl][1], grads["naive"][1])):
            assert_rel_rms(a, b, tol, f"{impl} grad {i}")
    for other in ("nosink", "defer"):  # same kernels, other accumulation
        for i, (a, b) in enumerate(zip(grads["fused"][1], grads[other][1])):
            assert_rel_rms(a, b, 1e-5, f"sink vs {other}, grad {i}")
    # one flush per block (full AttnRes, blocks of one mix, defers nothing)
    assert len(flushes) == (0 if block_size == 1 else -(-num_sublayers // block_size))
    if block_size == 4:  # backward order: the ragged block of 3, a full one, the first (its sublayer 0 reads emb alone)
        assert flushes == [3, 4, 3]


def _count_flushes(monkeypatch) -> list:
    """Record each ``mix_autograd.flush_deferred`` call's number of mixes."""
    from kernels.attn_res import mix_autograd

    calls, flush = [], mix_autograd.flush_deferred
    monkeypatch.setattr(mix_autograd, "flush_deferred", lambda src, sinks, block, task: (
        calls.append(len(block.entries)), flush(src, sinks, block, task)))
    return calls


@pytest.mark.parametrize("defer", ["0", "1"])
def test_grad_sinks_accumulate_in_place_and_survive_a_second_backward(monkeypatch, defer):
    """Block states read by several mixes get one gradient buffer, added to in the backward kernel (the mix
    that runs backward last hands it to autograd); two backward passes over one graph give the same grads, also
    after a pass over part of the graph that left a buffer (and deferred gradients) unreturned."""
    from kernels.attn_res import mix_triton

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "triton")
    monkeypatch.delenv("KVL_ATTNRES_GRAD_SINK", raising=False)
    monkeypatch.setenv("KVL_ATTNRES_DEFER_GRAD", defer)
    monkeypatch.setenv("KVL_ATTNRES_CHAIN_GRAD", "0")  # its in-place adds: test_chained_running_sums
    flushes = _count_flushes(monkeypatch)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("KVL_FAST_LAUNCH", "0")  # every launch through the JIT's run, which the spy wraps
    masks, launch = [], mix_triton._attn_res_bwd_args_kernel.run

    def spy(*args, **kwargs):
        masks.append(args[25])  # acc_mask, after 16 pointers and 10 scalars/pointers
        return launch(*args, **kwargs)

    monkeypatch.setattr(mix_triton._attn_res_bwd_args_kernel, "run", spy)
    d = 24
    queries = [ResQuery(torch.randn(1, d, device=dev).requires_grad_(), torch.ones(d, device=dev), 1e-6)
               for _ in range(7)]
    emb = torch.randn(2, 3, d, device=dev, requires_grad=True)
    stream = AttnResStream(emb, queries, 2, "fused")
    for i in range(6):
        stream.add(i, torch.sin(stream.input(i) * (i + 1)))
    loss = (stream.final() * torch.linspace(-1, 1, d, device=dev)).sum()
    first = torch.autograd.grad(loss, [emb, queries[3].weight], retain_graph=True)
    # deferred: the output's mix starts the buffers, the blocks' flushes add to them
    assert any(m != 0 for m in masks) == (defer == "0"), "no mix accumulated into a shared buffer"
    assert all(s.buf is None for s in stream.sinks), "a sink kept its buffer after the backward pass"
    assert flushes == ([2, 2, 1] if defer == "1" else [])  # blocks of 2, backward order (sublayer 0 mixes nothing)
    partial = torch.autograd.grad(loss, [queries[5].weight], retain_graph=True)  # skips the early mixes
    second = torch.autograd.grad(loss, [emb, queries[3].weight])
    for a, b in zip(first, second):
        assert_rel_rms(a, b, 1e-7, "second backward")
    assert partial[0].abs().sum() > 0


@pytest.mark.parametrize("defer", ["0", "1"])
def test_chained_running_sums(monkeypatch, defer):
    """``KVL_ATTNRES_CHAIN_GRAD=1``: each mix with a running sum gets the next running sum's gradient and its kernel
    adds the sum's own into it, once for every sublayer after a block's first (the last sublayer's sum, read only by
    the output's mix, has no next); the gradients equal those of autograd's adds (``0``), also in a second backward
    over the graph and after a partial one."""
    from kernels.attn_res import mix_autograd

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "triton")
    monkeypatch.setenv("KVL_ATTNRES_DEFER_GRAD", defer)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    chained, backward = [], mix_autograd.AttnResMixTriton.backward

    def spy(ctx, dh, dalpha, d_next):
        chained.append(d_next is not None)
        return backward(ctx, dh, dalpha, d_next)

    monkeypatch.setattr(mix_autograd.AttnResMixTriton, "backward", staticmethod(spy))
    d, n, block = 24, 8, 3
    gen = torch.Generator().manual_seed(3)
    queries = [ResQuery(torch.randn(1, d, generator=gen).to(dev).requires_grad_(), torch.ones(d, device=dev), 1e-6)
               for _ in range(n + 1)]
    emb = torch.randn(2, 3, d, generator=gen).to(dev).requires_grad_()
    grads = {}
    for chain in ("0", "1"):
        monkeypatch.setenv("KVL_ATTNRES_CHAIN_GRAD", chain)
        chained.clear()
        stream = AttnResStream(emb, queries, block, "fused")
        for i in range(n):
            stream.add(i, torch.sin(stream.input(i) * (i + 1)))
        loss = (stream.final() * torch.linspace(-1, 1, d, device=dev)).sum()
        params = [emb] + [q.weight for q in queries[1:]]
        first = torch.autograd.grad(loss, params, retain_graph=True)
        counts = sum(chained)
        torch.autograd.grad(loss, [queries[6].weight], retain_graph=True)  # the late mixes only
        grads[chain] = (first, torch.autograd.grad(loss, params), counts)
    # blocks 0-2, 3-5, 6-7: the mixes with a running sum are those of sublayers 1, 2, 4, 5, 7 (each sublayer's output
    # then makes the next sum) and the output's (its sum has no next)
    assert grads["0"][2] == 0 and grads["1"][2] == 5
    for chain in ("0", "1"):
        for a, b in zip(grads[chain][0], grads[chain][1]):
            assert_rel_rms(b, a, 1e-7, f"second backward, chain {chain}")
    for i, (a, b) in enumerate(zip(grads["1"][0], grads["0"][0])):
        assert_rel_rms(a, b, 1e-6, f"chained vs added, gradient {i}")


def _triton_two_phase(monkeypatch) -> str:
    """Force the buffered Triton two-phase form (interpreter on a CPU); returns the device to use."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_ATTNRES_TWO_PHASE", "triton")
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("num_sublayers", "block_size", "dtype", "tol"),
                         [(7, 3, torch.float32, 1e-6), (6, 3, torch.float32, 1e-6), (3, 1, torch.float32, 1e-6),
                          (4, 8, torch.float32, 1e-6),
                          (5, 2, torch.bfloat16, 2e-2)])
def test_buffered_triton_two_phase_equals_naive_stream(monkeypatch, num_sublayers, block_size, dtype, tol):
    """Block firsts, a ragged last block (7 = 3+3+1, 5 = 2+2+1), whole blocks only (6 = 3+3: the output mix is a
    phase 1), full AttnRes (block size 1), one block only (4 < 8), the output mix."""
    dev = _triton_two_phase(monkeypatch)
    d = 40  # not a power of two
    queries = [ResQuery(torch.randn(1, d, device=dev), 1 + 0.3 * torch.randn(d, device=dev), 1e-6)
               for _ in range(num_sublayers + 1)]
    outs = [(torch.randn(2, 3, d, device=dev) * (i + 1)).to(dtype) for i in range(num_sublayers)]
    emb = torch.randn(2, 3, d, device=dev).to(dtype)
    results = {}
    with torch.no_grad():
        for impl in ("naive", "two_phase"):
            stream = AttnResStream(emb, queries, block_size, impl)
            assert (stream._buffered is not None) == (impl == "two_phase")
            results[impl] = run_stream(stream, outs).float()
    assert_rel_rms(results["two_phase"], results["naive"], tol, "buffered two-phase")


def test_buffered_two_phase_reads_the_live_query_parameters(monkeypatch):
    """The two-phase kernels form ``u = w * gain`` from the parameters' addresses (``attn_res.query_table``, kept
    per set of addresses): after an in-place update the same table serves the next forward, which sees the new
    values; a non-contiguous pseudo-query falls back to a table over ``stacked_u``."""
    from kimi_vl.modeling.attn_res import query_table

    dev = _triton_two_phase(monkeypatch)
    d = 24
    queries = [ResQuery(torch.randn(1, d, device=dev), 1 + 0.3 * torch.randn(d, device=dev), 1e-6) for _ in range(5)]
    outs = [torch.randn(1, 2, d, device=dev) * (i + 1) for i in range(4)]
    emb = torch.randn(1, 2, d, device=dev)

    def run(impl: str) -> torch.Tensor:
        return run_stream(AttnResStream(emb, queries, 2, impl), outs)

    with torch.no_grad():
        table = query_table(queries)
        assert_rel_rms(run("two_phase"), run("naive"), 1e-6, "before the update")
        for q in queries:
            q.weight.mul_(-3.0)
            q.gain.add_(0.5)
        assert query_table(queries) is table
        assert_rel_rms(run("two_phase"), run("naive"), 1e-6, "after an in-place update")
        strided = [ResQuery(torch.randn(d, 2, device=dev)[:, 0], q.gain, q.eps) for q in queries]
        assert query_table(strided).num == len(queries)  # from stacked_u


def test_buffered_two_phase_scratch_input_reuses_one_buffer(monkeypatch):
    """With a norm to feed (the model's path), the buffered stream writes every sublayer's h into one buffer (one
    allocation per forward instead of one per sublayer in decode); the normed inputs equal those of fresh buffers."""
    dev = _triton_two_phase(monkeypatch)
    d = 24
    queries = [ResQuery(torch.randn(1, d, device=dev), 1 + 0.3 * torch.randn(d, device=dev), 1e-6) for _ in range(6)]
    outs = [torch.randn(2, 3, d, device=dev) * (i + 1) for i in range(5)]
    emb = torch.randn(2, 3, d, device=dev)
    norm = torch.nn.RMSNorm(d, eps=1e-6).to(dev)
    with torch.no_grad():
        fresh, scratch, ptrs = [], [], set()
        for use_scratch, got in ((False, fresh), (True, scratch)):
            stream = AttnResStream(emb, queries, 2, "two_phase")
            for i, out in enumerate(outs):
                h = stream._buffered.input(i, scratch=use_scratch)
                if use_scratch:
                    ptrs.add(h.data_ptr())
                got.append(norm(h))
                stream.add(i, out)
            got.append(stream.final(norm))
    assert len(ptrs) == 1
    assert_rel_rms(torch.stack(scratch), torch.stack(fresh), 0.0, "normed inputs")


@pytest.mark.parametrize(("num_sublayers", "block_size", "tokens", "dtype", "tol"),
                         [(7, 3, 1, torch.float32, 1e-6), (7, 3, 70, torch.float32, 1e-6),
                          (5, 2, 1, torch.bfloat16, 4e-3), (5, 2, 70, torch.bfloat16, 4e-3)])
def test_buffered_two_phase_fused_norm_equals_norm_after(monkeypatch, num_sublayers, block_size, tokens, dtype, tol):
    """``KVL_FUSED_NORM=1``: the phase kernels apply the sublayer's RMSNorm themselves; the inputs equal the
    unfused stream's norm(h) through the Triton norm kernel (the decode kernel at 1 token, the tiled phase 1 at 70
    tokens; a ragged last block and the output mix). The interpreter's bf16 casts differ from PyTorch's CPU ones,
    hence the Triton norm as the reference."""
    from kimi_vl.modeling.norm import RMSNorm

    dev = _triton_two_phase(monkeypatch)
    monkeypatch.setenv("KVL_NORM_BACKEND", "triton")
    d = 40
    gen = torch.Generator().manual_seed(5)
    queries = [ResQuery(torch.randn(1, d, generator=gen).to(dev), (1 + 0.3 * torch.randn(d, generator=gen)).to(dev),
                        1e-6) for _ in range(num_sublayers + 1)]
    outs = [(torch.randn(1, tokens, d, generator=gen) * (i + 1)).to(dev, dtype) for i in range(num_sublayers)]
    emb = torch.randn(1, tokens, d, generator=gen).to(dev, dtype)
    norms = [RMSNorm(d, eps=1e-5).to(dev, dtype) for _ in range(num_sublayers + 1)]
    with torch.no_grad():
        for n in norms:
            n.weight.uniform_(0.5, 1.5)
        calls = []
        for n in norms:
            n.register_forward_hook(lambda *_: calls.append(1))
        results = {}
        for fused in ("0", "1"):
            monkeypatch.setenv("KVL_FUSED_NORM", fused)
            calls.clear()
            results[fused] = run_stream(AttnResStream(emb, queries, block_size, "two_phase"), outs, norms).float()
            assert len(calls) == (0 if fused == "1" else num_sublayers + 1)  # fused: no norm module runs
    assert_rel_rms(results["1"], results["0"], tol, "fused norm")
    if dev == "cpu":  # the interpreter sums in the same order in both kernels: bit-equal
        assert torch.equal(results["1"], results["0"])


def _stream_case(monkeypatch, dtype, seed: int, d: int = 40, n: int = 5):
    """The Triton norm (the interpreter without a GPU) and a standard stream's case: device, n sublayer outputs,
    the embeddings, a norm factory with n + 1 gains in [0.5, 1.5], and the generator for further draws."""
    from kimi_vl.modeling.norm import RMSNorm

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_NORM_BACKEND", "triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    outs = [(torch.randn(2, 3, d, generator=gen) * (i + 1)).to(dev, dtype) for i in range(n)]
    emb = torch.randn(2, 3, d, generator=gen).to(dev, dtype)
    gains = [torch.empty(d).uniform_(0.5, 1.5, generator=gen) for _ in range(n + 1)]

    def norms() -> list:
        mods = [RMSNorm(d, eps=1e-5).to(dev, dtype) for _ in gains]
        with torch.no_grad():
            for m, w in zip(mods, gains):
                m.weight.copy_(w)
        return mods

    return dev, outs, emb, norms, gen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_standard_stream_fused_add_norm_equals_separate(monkeypatch, dtype):
    """``KVL_FUSED_NORM=1`` without autograd on the Triton norm: each output is added by the next input's norm
    kernel (``add_rms_norm``); inputs, final output and the stream itself equal the separate add and norm, bit for
    bit (bf16 in the interpreter, whose casts truncate where PyTorch's add rounds: to bf16 precision). With
    ``KVL_FUSED_NORM=0`` the stream adds at once (under autograd: the next test)."""
    dev, outs, emb, make_norms, _ = _stream_case(monkeypatch, dtype, 8)
    norms = make_norms()
    results, pending = {}, {}
    with torch.no_grad():
        for fused in ("0", "1"):
            monkeypatch.setenv("KVL_FUSED_NORM", fused)
            stream, got = StandardStream(emb), []
            for i, out in enumerate(outs):
                got.append(stream.input(i, norms[i]))
                stream.add(i, out)
                pending[fused] = stream._pending is not None
            got.append(stream.final(norms[-1]))
            results[fused] = torch.stack(got + [stream.x])
    assert pending == {"0": False, "1": True}
    if dtype == torch.float32 or dev == "cuda":
        assert torch.equal(results["1"], results["0"])
    else:
        assert_rel_rms(results["1"].float(), results["0"].float(), 1e-2, "fused add + norm, bf16 interpreter")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_standard_stream_fused_add_norm_training(monkeypatch, dtype):
    """Under autograd ``KVL_FUSED_NORM=1`` holds each output back too (``AddNormFunction``): the sublayer inputs and
    the gradients of the embeddings, of every sublayer output and of every norm gain match the separate add and
    norm (fp32 to 1e-5; bf16 to its roundings: the fused backward adds the stream's gradient before rounding)."""
    dev, outs0, emb0, make_norms, gen = _stream_case(monkeypatch, dtype, 9)
    dys = [torch.randn(emb0.shape, generator=gen).to(dev, dtype) for _ in range(len(outs0) + 1)]
    results = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("KVL_FUSED_NORM", fused)
        norms = make_norms()
        emb = emb0.clone().requires_grad_(True)
        outs = [o.clone().requires_grad_(True) for o in outs0]
        stream, got, held = StandardStream(emb), [], []
        for i, out in enumerate(outs):
            x = stream.input(i, norms[i])
            got.append(x)
            stream.add(i, out * x.mean())  # the output depends on its input, as a sublayer's does
            held.append(stream._pending is not None)
        got.append(stream.final(norms[-1]))
        torch.autograd.backward(got, dys)
        grads = [emb.grad] + [o.grad for o in outs] + [nm.weight.grad for nm in norms]
        results[fused] = (torch.stack(got).detach(), grads, held)
    n = len(outs0)
    assert results["1"][2] == [True] * n and results["0"][2] == [False] * n
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_rel_rms(results["1"][0].float(), results["0"][0].float(), tol, "inputs")
    for j, (a, b) in enumerate(zip(results["1"][1], results["0"][1])):
        assert_rel_rms(a.float(), b.float(), tol, f"grad {j}")


def test_two_phase_backend_choice(monkeypatch):
    from kimi_vl.modeling.attn_res import two_phase_backend

    x = torch.zeros(2, 8)
    monkeypatch.delenv("KVL_ATTNRES_TWO_PHASE", raising=False)
    with torch.no_grad():
        assert two_phase_backend(x) == ("triton" if x.is_cuda else "torch")
        monkeypatch.setenv("KVL_ATTNRES_TWO_PHASE", "triton")
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            two_phase_backend(x)
        monkeypatch.setenv("KVL_ATTNRES_TWO_PHASE", "cuda")
        with pytest.raises(ValueError, match="KVL_ATTNRES_TWO_PHASE"):
            two_phase_backend(x)
    monkeypatch.setenv("KVL_ATTNRES_TWO_PHASE", "triton")
    assert two_phase_backend(x) == "torch"  # autograd on: the kernels have no backward


def test_generate_with_triton_two_phase_matches_naive_full_forward(monkeypatch):
    """Prefill and decode through the cache with the buffered Triton two-phase stream (block AttnRes; full
    AttnRes is block size 1, covered by the stream test)."""
    device = _triton_two_phase(monkeypatch)
    model = build(tiny_config(residual_mode="attnres_block")).to(device)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attention_res_proj.weight.normal_()
            layer.mlp_res_proj.weight.normal_()
    ids = torch.randint(3, 97, (2, 6), device=device)
    out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    model.model.attnres_impl = "naive"
    with torch.no_grad():
        ref = model(out, use_cache=False).logits
    assert torch.equal(ref[:, 5:-1].argmax(-1), out[:, 6:])
    calls = []
    monkeypatch.setattr(BufferedTwoPhase, "add", lambda self, i, o, _add=BufferedTwoPhase.add: (calls.append(i),
                                                                                             _add(self, i, o)))
    model.model.attnres_impl = "two_phase"
    with torch.no_grad():
        two = model(out, use_cache=False).logits
    assert len(calls) == model.config.num_sublayers
    assert_rel_rms(two, ref, 1e-6, "buffered two-phase model")


@pytest.mark.gpu
@pytest.mark.parametrize(("shared", "norms"), [(0.0, False), (3.0, False), (0.0, True), (3.0, True)])
def test_training_stream_bf16_gradients_against_fp64_on_gpu(monkeypatch, shared, norms):
    """The training stream's gradients (embedding, every pseudo-query and key gain; with ``norms`` also every
    sublayer's input RMSNorm gain, the mixes of up to 4 sources then fused with their norm) in bf16 through the Triton
    kernels (sinks, deferred block states, chained running sums) against the fp64 naive stream: the small flavor's
    width, 24 sublayers in blocks of 6 over 4096 tokens, the sublayer outputs sharing a component ``shared`` times
    their spread (close sources). A bound on the bf16 path's accuracy: session 34 found a design that passed every
    fp32 test and was 2.5x further from fp64 here (``mix_autograd.DeferredBlock``)."""
    from kimi_vl.modeling.norm import RMSNorm

    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "triton")
    gen = torch.Generator().manual_seed(5)
    d, n, tokens = 768, 24, 4096
    w0 = [0.05 * torch.randn(1, d, generator=gen) for _ in range(n + 1)]
    g0 = [1 + 0.3 * torch.randn(d, generator=gen) for _ in range(n + 1)]
    nw0 = [1 + 0.3 * torch.randn(d, generator=gen) for _ in range(n + 1)]
    emb0 = torch.randn(1, tokens, d, generator=gen)
    common = shared * torch.randn(1, tokens, d, generator=gen)
    probe = torch.randn(1, tokens, d, generator=gen, dtype=torch.float64)

    def grads(dtype, impl):
        queries = [ResQuery(w.to("cuda", dtype).requires_grad_(), g.to("cuda", dtype).requires_grad_(), 1e-6)
                   for w, g in zip(w0, g0)]
        emb = emb0.to("cuda", dtype).requires_grad_()
        mods = [RMSNorm(d, eps=1e-6).to("cuda", dtype) for _ in range(n + 1)] if norms else []
        for m, w in zip(mods, nw0):
            m.weight.data.copy_(w)
        stream = AttnResStream(emb, queries, 6, impl)
        for i in range(n):
            stream.add(i, torch.tanh(stream.input(i, *mods[i:i + 1])) + common.to("cuda", dtype))
        loss = (stream.final(*mods[-1:]).double() * probe.cuda()).sum()
        return torch.autograd.grad(loss, [emb] + [t for q in queries[1:] for t in (q.weight, q.gain)]
                                   + [m.weight for m in mods])

    ref = grads(torch.float64, "naive")
    errs = [float(rel_rms(a, r)) for a, r in zip(grads(torch.bfloat16, "fused"), ref)]
    worst = max(range(len(errs)), key=errs.__getitem__)
    print(f"shared {shared}, norms {norms}: embedding {errs[0]:.2e}, median {sorted(errs)[len(errs) // 2]:.2e}, "
          f"worst {errs[worst]:.2e} (gradient {worst})")
    # session 34 calls 5-6 (H200): embedding 7.3e-3 / 3.0e-2, worst 6.0e-2 / 5.7e-2 (independent / close sources); the
    # reverted design of call2: worst 1.6e-1
    assert errs[0] <= 5e-2 and max(errs) <= 0.1, errs


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4096])
def test_buffered_two_phase_bf16_small_flavor_width_on_gpu(tokens):
    """Decode (one token) and prefill sizes at the small flavor's width, bf16, 4 blocks of 6 sublayers."""
    d, num_sublayers, block_size = 768, 24, 6
    queries = [ResQuery(0.1 * torch.randn(1, d, device="cuda"), 1 + 0.3 * torch.randn(d, device="cuda"), 1e-6)
               for _ in range(num_sublayers + 1)]
    outs = [torch.randn(1, tokens, d, device="cuda", dtype=torch.bfloat16) for _ in range(num_sublayers)]
    emb = torch.randn(1, tokens, d, device="cuda", dtype=torch.bfloat16)
    results = {}
    with torch.no_grad():
        for impl in ("naive", "two_phase"):
            stream = AttnResStream(emb, queries, block_size, impl)
            assert (stream._buffered is not None) == (impl == "two_phase")
            results[impl] = run_stream(stream, outs).float()
    assert_rel_rms(results["two_phase"], results["naive"], 2e-2, "buffered two-phase bf16")


def _triton_attnres_model(monkeypatch) -> tuple:
    """The tiny dense block-AttnRes model on the Triton mix kernels (interpreter on a CPU) with random pseudo-queries
    (so that the mixes are not uniform), and its device."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = build(tiny_config(moe=False, residual_mode="attnres_block")).to(dev).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_res_proj.weight"):
                p.normal_()
    return model, dev


def test_deferred_source_gradients_in_the_model(monkeypatch):
    """``KVL_ATTNRES_DEFER_GRAD=1`` (Triton kernels; interpreter on a CPU): the same logits and every parameter's
    gradient as the per-mix gradient sinks, with random pseudo-queries so that the mixes are not uniform; one
    flush per block."""
    model, dev = _triton_attnres_model(monkeypatch)
    flushes = _count_flushes(monkeypatch)
    ids = torch.randint(3, 97, (2, 12), device=dev)
    runs = step_under_env(model, ids, monkeypatch, "KVL_ATTNRES_DEFER_GRAD", ("0", "1"))
    sublayers, block = model.config.num_sublayers, model.config.attnres_block_size
    assert len(flushes) == -(-sublayers // block)
    assert torch.equal(runs["1"][0], runs["0"][0])
    assert runs["1"][1].keys() == runs["0"][1].keys()
    for name, g in runs["0"][1].items():
        assert_rel_rms(runs["1"][1][name], g, 1e-5, name)
    monkeypatch.setenv("KVL_ATTNRES_DEFER_GRAD", "yes")
    with pytest.raises(ValueError, match="KVL_ATTNRES_DEFER_GRAD"):
        model(ids, use_cache=False)


@pytest.mark.parametrize("max_sources", [4, 2])
def test_mix_with_its_norm_in_the_model(monkeypatch, max_sources):
    """``KVL_ATTNRES_MIX_NORM=1`` (Triton kernels; interpreter on a CPU): the mixes of up to ``MAX_SOURCES`` sources
    apply their sublayer's input RMSNorm in their kernels (every mix of the tiny config at 4, those of the later
    blocks not at 2); the logits and every parameter's gradient equal the mix followed by the norm's module (``0``),
    with deferral and chained running sums on; a bad flag is refused."""
    from kernels.attn_res import mix_autograd, mix_norm_triton

    monkeypatch.setattr(mix_norm_triton, "MAX_SOURCES", max_sources)
    model, dev = _triton_attnres_model(monkeypatch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and not name.endswith("_res_norm.weight"):
                p.uniform_(0.5, 1.5)  # the sublayer norms' gains: not all ones
    fused, forward = [], mix_autograd.AttnResMixNormTriton.forward

    def spy(ctx, *args):
        fused.append(len(args) - 7)  # the sources' count
        return forward(ctx, *args)

    monkeypatch.setattr(mix_autograd.AttnResMixNormTriton, "forward", staticmethod(spy))
    ids = torch.randint(3, 97, (2, 12), device=dev)
    runs = step_under_env(model, ids, monkeypatch, "KVL_ATTNRES_MIX_NORM", ("0", "1"))
    sublayers = model.config.num_sublayers  # 8 in blocks of 3: 8 mixes (the first sublayer reads
    # emb alone; the output has one), three of them over 2 sources, three over 3, two over 4
    assert len(fused) == (sublayers if max_sources == 4 else 3) and max(fused) <= max_sources
    assert_rel_rms(runs["1"][0], runs["0"][0], 1e-6, "logits")
    assert runs["1"][1].keys() == runs["0"][1].keys()
    for name, g in runs["0"][1].items():  # 3e-5: the fused backward's h is rebuilt as sum_n alpha_n x_n, the separate
        # norm's is the forward's online-softmax sum; the pseudo-queries' gradients (sums over tokens that cancel) see
        # that ulp-level difference most (1.05e-5 at worst on this model)
        assert_rel_rms(runs["1"][1][name], g, 3e-5, name)
    monkeypatch.setenv("KVL_ATTNRES_MIX_NORM", "yes")
    with pytest.raises(ValueError, match="KVL_ATTNRES_MIX_NORM"):
        model(ids, use_cache=False)
