"""Deferred block-state gradients with the score products in the flush (``kernels/attn_res/defer_triton.py``)
against the per-mix backward kernel adding into gradient sinks and against the fp64 reference. On a CPU the
kernels run under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device, rel_rms

from kernels.attn_res import attn_res_mix_naive, defer_triton, mix_triton

EPS = 1e-6


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_ATTNRES_ADDRESSING", raising=False)


def _block(dtype: torch.dtype, d: int, m: int = 31, num_states: int = 3, seed: int = 21):
    """Four mixes of one block over the same ``num_states`` states: the block's first (no running sum) and three
    with a running sum of their own; each with a query, an output gradient ``dh`` and the later running sum's
    gradient ``g_next`` (the last mix: none)."""
    gen = torch.Generator().manual_seed(seed)
    dev = kernel_device()
    states = [(torch.randn(m, d, generator=gen) * (1 + i)).to(dev, dtype) for i in range(num_states)]
    mixes = []
    for j in range(4):
        srcs = states + ([] if j == 0 else [torch.randn(m, d, generator=gen).to(dev, dtype)])
        u = (0.3 * torch.randn(d, generator=gen)).to(dev)
        _, rstd, alpha = mix_triton.mix_fwd_triton(srcs, u, EPS)
        # h rounded to nearest, as the GPU's forward stores it (the interpreter truncates to bf16, and c = dh . h
        # would inherit that bias)
        h = sum(a[:, None] * x.float() for a, x in zip(alpha, srcs)).to(dtype)
        dh = torch.randn(m, d, generator=gen).to(dev, dtype)
        g_next = None if j in (0, 3) else torch.randn(m, d, generator=gen).to(dev, dtype)
        mixes.append((srcs, u, h, dh, rstd, alpha, g_next))
    return states, mixes


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize(("dtype", "d", "tol"), [(torch.float32, 40, 1e-6), (torch.bfloat16, 768, 1e-2)])
def test_flush_dots_equals_per_mix_sinks(monkeypatch, dtype, d, tol, group):
    """The light backward of each mix (running sum's gradient with the later one added, ``c = dh . h``) and one
    flush (states' gradients into started buffers, the queries' gradients from the states) give what the per-mix
    kernel gives with gradient sinks: the same running-sum, state and query gradients (bf16: fewer roundings), and
    the states' gradients of the fp64 reference; the states one, two (a ragged last group) or all per pass."""
    monkeypatch.setattr(defer_triton, "FLUSH_DOTS_GROUP", group)
    states, mixes = _block(dtype, d)
    c = len(states)
    per_mix = [mix_triton.GradSink() for _ in states]
    task = torch._C._current_graph_task_id()
    started = [torch.randn_like(s) for s in states]  # a later block's mixes started the buffers
    for sink, buf in zip(per_mix, started):
        sink.buf, sink.task = buf.clone(), task
    bufs = [b.clone() for b in started]
    dhs, us, alphas, rstds, cs, du_ref = [], [], [], [], [], []
    for srcs, u, h, dh, rstd, alpha, g_next in reversed(mixes):  # backward order
        sinks = per_mix + [None] * (len(srcs) - c)
        dx_ref, du_mix, _ = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, sinks)
        has_p = len(srcs) > c
        dx, du, big_g = defer_triton.bwd_light(srcs[c] if has_p else None, h, dh, g_next, u,
                                               alpha[c] if has_p else None, rstd[c] if has_p else None)
        g_ref = sum(alpha[n] * (dh.float() * srcs[n].float()).sum(-1) for n in range(len(srcs)))
        assert_rel_rms(big_g, g_ref, 1e-5 if dtype == torch.float32 else 2e-2, "c = dh . h")
        if has_p:
            want = dx_ref[c].float() + (0 if g_next is None else g_next.float())
            assert_rel_rms(dx, want, 1e-6 if dtype == torch.float32 else 1e-2, "running sum's gradient")
        else:
            assert dx is None and du is None
        du_ref.append((du_mix, du))
        for t, lst in ((dh, dhs), (u, us), (alpha, alphas), (rstd, rstds), (big_g, cs)):
            lst.append(t)
    du_states = defer_triton.flush_dots(states, bufs, (1 << c) - 1, dhs, us, alphas, rstds, cs)
    assert du_states.shape == (4, d) and du_states.dtype == torch.float32
    for i, (a, b) in enumerate(zip(per_mix, bufs)):
        assert_rel_rms(b, a.buf, tol, f"state {i}")
    for row, (du_mix, du_own) in enumerate(du_ref):
        got = du_states[row] + (0 if du_own is None else du_own)
        assert_rel_rms(got, du_mix, 1e-5 if dtype == torch.float32 else 2e-2, f"du of mix {row}")
    ref = [started[i].double() + sum(_naive_grad(srcs, u, dh)[i] for srcs, u, _, dh, *_ in mixes)
           for i in range(c)]
    for i, b in enumerate(bufs):
        assert_rel_rms(b.double(), ref[i], tol, f"state {i} vs reference")


def test_flush_dots_starts_buffers_without_adding():
    """``acc_mask`` bit clear: the state's buffer is written, not added to (its old content is ignored)."""
    states, mixes = _block(torch.float32, 24, num_states=2)
    entries = []
    for srcs, u, h, dh, rstd, alpha, _ in mixes[:2]:
        has_p = len(srcs) > 2
        _, _, big_g = defer_triton.bwd_light(srcs[2] if has_p else None, h, dh, None, u,
                                             alpha[2] if has_p else None, rstd[2] if has_p else None)
        entries.append((dh, u, alpha, rstd, big_g))
    lists = [list(t) for t in zip(*entries)]
    got = [torch.full_like(states[0], float("nan")), torch.zeros_like(states[1])]
    ref = [torch.zeros_like(s) for s in states]
    defer_triton.flush_dots(states, got, 0b10, *lists)  # state 0 started fresh (its NaNs unread), state 1 added to
    defer_triton.flush_dots(states, ref, 0b11, *lists)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def _naive_grad(srcs: list[torch.Tensor], u: torch.Tensor, dh: torch.Tensor) -> list[torch.Tensor]:
    """fp64 gradients of ``sum(h * dh)`` for the sources of the naive mix with query ``u`` (gain 1)."""
    xs = [s.detach().double().requires_grad_() for s in srcs]
    h, _ = attn_res_mix_naive(xs, u.double().reshape(1, -1), torch.ones_like(u, dtype=torch.float64), EPS)
    return [g for g in torch.autograd.grad((h * dh.double()).sum(), xs)]


@pytest.mark.gpu
@pytest.mark.parametrize("shared", [0.0, 3.0])
def test_stream_bf16_products_in_the_flush_vs_in_each_mix_on_gpu(monkeypatch, shared):
    """The small flavor's width, bf16, 24 sublayers in blocks of 6 over 4096 tokens, the sublayer outputs sharing a
    component ``shared`` times their spread (close sources: ``c = dh . h`` from the stored ``h`` cancels against the
    products): the stream's gradients (embedding, pseudo-queries, gains) with the products in the flush
    (``FLUSH_DOTS``) within 2.5x (+ 2e-3) of the per-mix products' error against the fp64 naive stream."""
    from kimi_vl.modeling.attn_res import AttnResStream, ResQuery

    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "triton")
    gen = torch.Generator().manual_seed(5)
    d, n, tokens = 768, 24, 4096
    w0 = [0.05 * torch.randn(1, d, generator=gen) for _ in range(n + 1)]
    g0 = [1 + 0.3 * torch.randn(d, generator=gen) for _ in range(n + 1)]
    emb0 = torch.randn(1, tokens, d, generator=gen)
    common = shared * torch.randn(1, tokens, d, generator=gen)
    probe = torch.randn(1, tokens, d, generator=gen)

    def grads(dtype, impl):
        queries = [ResQuery(w.to("cuda", dtype).requires_grad_(), g.to("cuda", dtype).requires_grad_(), 1e-6)
                   for w, g in zip(w0, g0)]
        emb = emb0.to("cuda", dtype).requires_grad_()
        stream = AttnResStream(emb, queries, 6, impl)
        for i in range(n):
            stream.add(i, torch.tanh(stream.input(i)) + common.to("cuda", dtype))
        loss = (stream.final().to(torch.float64) * probe.to("cuda", torch.float64)).sum()
        params = [emb] + [t for q in queries[1:] for t in (q.weight, q.gain)]
        return torch.autograd.grad(loss, params)

    ref = grads(torch.float64, "naive")
    errs = {}
    for dots in (False, True):
        monkeypatch.setattr(mix_triton, "FLUSH_DOTS", dots)
        errs[dots] = [float(rel_rms(a, r)) for a, r in zip(grads(torch.bfloat16, "fused"), ref)]
    print(f"shared {shared}: worst error per mix {max(errs[False]):.3e}, in the flush {max(errs[True]):.3e}")
    for i, (old, new) in enumerate(zip(errs[False], errs[True])):
        assert new <= 2.5 * old + 2e-3, f"gradient {i}: {new:.3e} with the products in the flush, {old:.3e} per mix"
