"""AttnRes mix: fused Triton kernel (``kernels/attn_res/mix_triton.py``) and the PyTorch autograd function vs
the stacked reference, forward and backward. On a CPU the kernel runs under the Triton interpreter (tiny
shapes); the ``gpu`` test checks the small flavor's width in bf16 on CUDA."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels import colsum
from kernels.attn_res import AttnResMix, attn_res_mix, attn_res_mix_naive, mix_autograd, mix_triton, resolve_backend

EPS = 1e-6
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1e-2, 2e-2)}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Run Triton on the CPU through the interpreter when there is no GPU (the flag is read at launch)."""
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_ATTNRES_BACKEND", raising=False)
    monkeypatch.delenv("KVL_ATTNRES_ADDRESSING", raising=False)


def _inputs(n: int, shape: tuple[int, ...], d: int, dtype=torch.float32, q_scale: float = 1.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    dev = kernel_device()
    xs = [(torch.randn(*shape, d, generator=gen) * (1 + i)).to(dev, dtype).requires_grad_() for i in range(n)]
    # scores ~ q_scale * 3: peaked but not saturated (at |s| ~ 30 fp32 score rounding alone moves alpha by 1e-5)
    w = (torch.randn(1, d, generator=gen) * q_scale * 3 / d**0.5).to(kernel_device()).requires_grad_()
    g = (1 + 0.3 * torch.randn(d, generator=gen)).to(kernel_device()).requires_grad_()
    return xs, w, g


def _check_against_naive(xs, w, g, backend: str, tol_fwd: float, tol_bwd: float) -> None:
    """The mix against the stacked reference run in fp64 on the same (rounded) inputs."""
    h, alpha = attn_res_mix(xs, w, g, EPS, backend=backend)
    wide = [t.detach().double().requires_grad_() for t in (*xs, w, g)]
    h_ref, alpha_ref = attn_res_mix_naive(wide[:-2], wide[-2], wide[-1], EPS)
    assert h.dtype == xs[0].dtype and alpha.dtype == torch.float32
    assert_rel_rms(h, h_ref, tol_fwd, "h")
    assert_rel_rms(alpha, alpha_ref, 1e-6, "alpha")
    dh = torch.randn_like(h)
    got = torch.autograd.grad(h, [*xs, w, g], dh)
    ref = torch.autograd.grad(h_ref, wide, dh.double())
    names = [f"dx{i}" for i in range(len(xs))] + ["dweight", "dgain"]
    for name, a, t, r in zip(names, got, (*xs, w, g), ref):
        assert a.dtype == t.dtype, name
        assert_rel_rms(a, r, tol_bwd, name)


@pytest.mark.parametrize(
    ("n", "shape", "d"),
    [
        (1, (5,), 48),        # one source: h = x, alpha = 1, no query gradient
        (2, (300,), 50),      # D not a power of two; 5 token tiles over 4 grid-stride programs
        (3, (2, 7), 1000),    # wide rows (1 x 1024 block, 4 tokens a tile), ragged last tile
        (9, (2, 33), 96),     # many sources
    ],
)
def test_triton_fp32_equals_naive(n, shape, d):
    xs, w, g = _inputs(n, shape, d)
    _check_against_naive(xs, w, g, "triton", *TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_precision_equals_naive(dtype):
    xs, w, g = _inputs(4, (3, 21), 80, dtype=dtype, q_scale=2.0, seed=1)
    _check_against_naive(xs, w, g, "triton", *TOL[dtype])


@pytest.mark.parametrize("n", [1, 4])
def test_torch_function_equals_naive(n):
    xs, w, g = _inputs(n, (2, 9), 40, q_scale=2.0, seed=2)
    _check_against_naive(xs, w, g, "torch", *TOL[torch.float32])


def test_torch_function_gradcheck_fp64():
    xs = [torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    w = torch.randn(1, 6, dtype=torch.float64, requires_grad=True)
    g = (1 + 0.3 * torch.randn(6, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda w_, g_, *s: AttnResMix.apply(w_, g_, EPS, *s)[0], (w, g, *xs))


def test_zero_query_gives_uniform_weights_and_a_query_gradient():
    xs, w, g = _inputs(3, (4, 5), 24, seed=3)
    with torch.no_grad():
        w.zero_()
    h, alpha = attn_res_mix(xs, w, g, EPS, backend="triton")
    assert torch.allclose(alpha, torch.full_like(alpha, 1 / 3), atol=1e-6)
    assert_rel_rms(h, sum(xs) / 3, 1e-6, "uniform mix")
    dw, = torch.autograd.grad(h, [w], torch.randn_like(h))
    assert dw.abs().sum() > 0


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_mix_is_convex_per_element(backend):
    xs, w, g = _inputs(6, (3, 11), 36, q_scale=3.0, seed=4)
    h, alpha = attn_res_mix(xs, w, g, EPS, backend=backend)
    stack = torch.stack(xs).detach()
    assert torch.allclose(alpha.sum(0), torch.ones_like(alpha[0]), atol=1e-6) and (alpha >= 0).all()
    assert (h >= stack.min(0).values - 1e-5).all() and (h <= stack.max(0).values + 1e-5).all()


def test_triton_writes_every_output(monkeypatch):
    """Outputs are allocated NaN-filled: a tile or a source the kernels skip would show up."""
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(mix_triton.torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(mix_triton.torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(float("nan")))
    xs, w, g = _inputs(3, (301,), 50, seed=5)
    _check_against_naive(xs, w, g, "triton", *TOL[torch.float32])


def test_mixed_dtypes_are_cast_to_the_first_source():
    xs, w, g = _inputs(3, (2, 5), 32, seed=6)
    xs[1] = xs[1].detach().double().requires_grad_()
    h, _ = attn_res_mix(xs, w, g, EPS, backend="triton")
    assert h.dtype == torch.float32
    dx1, = torch.autograd.grad(h.sum(), [xs[1]])
    assert dx1.dtype == torch.float64


def test_backend_resolution(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU tensor on the Triton backend (conftest sets it without a GPU)
    x = torch.zeros(2, 8)
    assert resolve_backend(x, "torch") == "torch" and resolve_backend(x, "triton") == "triton"
    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "torch")
    assert resolve_backend(x) == "torch"
    monkeypatch.setenv("KVL_ATTNRES_BACKEND", "cuda")
    with pytest.raises(ValueError, match="KVL_ATTNRES_BACKEND"):
        resolve_backend(x)
    monkeypatch.delenv("KVL_ATTNRES_BACKEND")
    assert resolve_backend(x) == ("triton" if x.is_cuda else "torch")
    with pytest.raises(ValueError, match="float64"):
        resolve_backend(x.double(), "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        resolve_backend(x, "triton")


def test_invalid_inputs_name_the_shapes():
    w, g = torch.zeros(1, 8), torch.ones(8)
    with pytest.raises(ValueError, match="at least one"):
        attn_res_mix([], w, g, EPS)
    with pytest.raises(ValueError, match=r"sources\[1\] is \(2, 9\)"):
        attn_res_mix([torch.zeros(2, 8), torch.zeros(2, 9)], w, g, EPS)
    with pytest.raises(ValueError, match="gain"):
        attn_res_mix([torch.zeros(2, 8)], w, torch.ones(7), EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_triton_bf16_small_flavor_width_on_gpu(n):
    xs, w, g = _inputs(n, (2, 2048), 768, dtype=torch.bfloat16, q_scale=0.5, seed=7)
    _check_against_naive(xs, w, g, "triton", *TOL[torch.bfloat16])


def test_triton_unaligned_source_address():
    """A source starting 4 bytes into its storage takes the kernels' unaligned path."""
    xs, w, g = _inputs(3, (2, 9), 40, seed=8)
    flat = torch.zeros(xs[1].numel() + 1, device=kernel_device())
    flat[1:] = xs[1].detach().reshape(-1)
    xs[1] = flat[1:].view_as(xs[1]).requires_grad_()
    assert not mix_triton._aligned([xs[1]])
    _check_against_naive(xs, w, g, "triton", *TOL[torch.float32])


@pytest.mark.parametrize("addressing", ["args", "table"])
@pytest.mark.parametrize("n", [2, mix_triton.MAX_ARGS])
def test_triton_both_addressings_equal_naive(monkeypatch, addressing, n):
    """Pointer arguments (``n <= MAX_ARGS``, unused slots skipped) and the address table give the reference."""
    monkeypatch.setenv("KVL_ATTNRES_ADDRESSING", addressing)
    assert mix_triton.use_args(n) == (addressing == "args")
    xs, w, g = _inputs(n, (2, 13), 40, q_scale=2.0, seed=9)
    _check_against_naive(xs, w, g, "triton", *TOL[torch.float32])


@pytest.mark.parametrize(
    ("n", "shape", "d", "dtype"),
    [
        (1, (5,), 48, torch.float32),       # one source: h = x
        (2, (300,), 50, torch.float32),     # D not a power of two: one 64-wide chunk, masked columns
        (mix_triton.MAX_ARGS, (2, 13), 40, torch.float32),
        (3, (3, 7), 768, torch.float32),    # the small flavor's width: 3 chunks, ragged last tile
        (5, (3, 7), 768, torch.bfloat16),
    ],
)
def test_triton_forward_layouts_agree(monkeypatch, n, shape, d, dtype):
    """The pointer-argument forward (warp-owned rows of chunks, ``N`` a compile-time constant) gives the reference,
    and the same outputs as the address table's forward (one power-of-two tile a token) to rounding."""
    xs, w, g = _inputs(n, shape, d, dtype=dtype, q_scale=2.0, seed=13)
    _check_against_naive(xs, w, g, "triton", *TOL[dtype])
    h_rows, alpha_rows = attn_res_mix(xs, w, g, EPS, backend="triton")
    monkeypatch.setenv("KVL_ATTNRES_ADDRESSING", "table")
    assert not mix_triton.use_args(n)
    h_tile, alpha_tile = attn_res_mix(xs, w, g, EPS, backend="triton")
    assert_rel_rms(h_rows, h_tile, TOL[dtype][0], "h rows vs table tile")
    assert_rel_rms(alpha_rows, alpha_tile, 1e-6, "alpha rows vs table tile")


def test_triton_many_sources_fall_back_to_the_table(monkeypatch):
    monkeypatch.delenv("KVL_ATTNRES_ADDRESSING", raising=False)
    assert mix_triton.use_args(mix_triton.MAX_ARGS) and not mix_triton.use_args(mix_triton.MAX_ARGS + 1)
    monkeypatch.setenv("KVL_ATTNRES_ADDRESSING", "pinned")
    with pytest.raises(ValueError, match="KVL_ATTNRES_ADDRESSING"):
        mix_triton.use_args(2)


def _phase_ref(v: torch.Tensor, u: torch.Tensor, eps: float):
    """fp64 phase 1 of queries ``u [S, D]`` over slots ``v [N, M, D]``: o, m, l."""
    v, u = v.double(), u.double()
    s = torch.einsum("nmd,sd->snm", v, u) * torch.rsqrt(v.pow(2).mean(-1) + eps)
    m = s.amax(1)
    p = torch.exp(s - m[:, None])
    return torch.einsum("snm,nmd->smd", p, v), m, p.sum(1)


@pytest.mark.parametrize("layout", ["rows", "tiled"])
@pytest.mark.parametrize("first", [True, False])
def test_two_phase_kernels_equal_reference(monkeypatch, first, layout):
    """phase 1 (with the pending output absorbed into the last completed slot, in place or from a running sum in
    another slot) and phase 2, fp32 vs fp64; phase 1 in both layouts (few tokens: one program per token, or per
    token and query where race-free; else per tile of tokens)."""
    from kernels.attn_res import two_phase_triton
    from kernels.attn_res.two_phase_triton import phase1_triton, phase2_triton

    monkeypatch.setattr(two_phase_triton, "ROWS_MAX_TOKENS", 0 if layout == "tiled" else 64)

    gen = torch.Generator().manual_seed(10)
    k_slots, m, d, eps = 4, 9, 40, 1e-6
    v = (torch.randn(k_slots, m, d, generator=gen) * torch.arange(1, k_slots + 1)[:, None, None]).to(kernel_device())
    u = (torch.randn(5, d, generator=gen)).to(kernel_device())
    pend = torch.randn(m, d, generator=gen).to(kernel_device())
    expect = v.clone()
    expect[1] = pend if first else expect[1] + pend
    o, mx, l, h0 = phase1_triton(v, 2, u, 1, 3, eps, pend, first)  # queries 1..3 over slots 0, 1
    assert_rel_rms(v, expect, 1e-7, "absorbed slot")
    o_ref, m_ref, l_ref = _phase_ref(expect[:2], u[1:4], eps)
    scale = torch.exp(mx.double() - m_ref)  # o, l are relative to the kernel's own running max
    assert_rel_rms(mx, m_ref, 1e-6, "m")
    assert_rel_rms(o.double() / l.double()[..., None], o_ref / l_ref[..., None], 1e-6, "o / l")
    assert_rel_rms(l.double() * scale, l_ref, 1e-6, "l")
    assert_rel_rms(h0, (o_ref / l_ref[..., None])[0], 1e-6, "h of the first query")
    pend2 = torch.randn(m, d, generator=gen).to(kernel_device())
    h = phase2_triton(o, mx, l, 2, v, 2, u, 3, eps, pend2, True)  # query 3's partial sum (slot 2) = pend2
    assert_rel_rms(v[2], pend2, 0.0, "slot 2")
    full = _phase_ref(torch.cat([expect[:2], pend2[None]]), u[3:4], eps)
    assert_rel_rms(h, (full[0] / full[2][..., None])[0], 1e-6, "h after the merge")
    run = two_phase_triton.TwoPhaseLauncher(expect.clone(), u, 4)  # fewer queries than the launcher holds
    h1 = run.phase1(3, 2, 2, eps, None, False)
    o_ref, m_ref, l_ref = _phase_ref(expect[:3], u[2:4], eps)
    assert_rel_rms(run.o[:2].double() / run.l[:2].double()[..., None], o_ref / l_ref[..., None], 1e-6, "n_q < max")
    assert_rel_rms(h1, (o_ref / l_ref[..., None])[0], 1e-6, "h, n_q < max")
    src_v = expect.clone()  # the running sum in a slot of its own (slot 3), completed into slot 2
    o, mx, l, h2 = phase1_triton(src_v, 3, u, 1, 3, eps, pend, first, src_slot=3)
    done = expect.clone()
    done[2] = pend if first else expect[3] + pend
    assert_rel_rms(src_v, done, 1e-7, "completed slot (running sum read from slot 3, which is left as it was)")
    o_ref, m_ref, l_ref = _phase_ref(done[:3], u[1:4], eps)
    assert_rel_rms(o.double() / l.double()[..., None], o_ref / l_ref[..., None], 1e-6, "o / l, src_slot")
    assert_rel_rms(h2, (o_ref / l_ref[..., None])[0], 1e-6, "h, src_slot")
    with pytest.raises(ValueError, match="n_src"):
        phase1_triton(v, 5, u, 0, 1, eps)
    with pytest.raises(ValueError, match="src_slot"):
        phase1_triton(v, 2, u, 0, 1, eps, pend, False, src_slot=4)
    with pytest.raises(ValueError, match="pending"):
        phase2_triton(o, mx, l, 1, v, 2, u, 2, eps, pend2.double(), False)


@pytest.mark.parametrize(("dtype", "n"), [(torch.float32, 3), (torch.bfloat16, 7)])
def test_triton_small_flavor_width_three_chunks(dtype, n):
    """D = 768: the backward splits a row into 3 chunks of 256 (a count that is not a power of two, no padding);
    21 tokens leave a ragged last tile."""
    xs, w, g = _inputs(n, (3, 7), 768, dtype=dtype, q_scale=0.5, seed=11)
    _check_against_naive(xs, w, g, "triton", *TOL[dtype])


def test_triton_common_offset_sources():
    """Sources sharing a component 100x their own spread: ``ds_n = alpha_n (dh . x_n - sum_j alpha_j dh . x_j)``
    subtracts large, close dot products. The source gradients stay at fp32 accuracy; the query gradients of this
    near-degenerate mix lose digits in fp32 whatever the form (the previous kernel's ``dh . (x_n - h)`` form and the
    PyTorch function, both fp32, were measured at 1e-3 to 3e-3 here too), so they get a looser bound."""
    gen = torch.Generator().manual_seed(12)
    common = 100 * torch.randn(2, 19, 96, generator=gen)
    xs = [(common + torch.randn(2, 19, 96, generator=gen)).to(kernel_device()).requires_grad_() for _ in range(4)]
    w = (torch.randn(1, 96, generator=gen) * 3 / 96**0.5).to(kernel_device()).requires_grad_()
    g = torch.ones(96, device=kernel_device(), requires_grad=True)
    dh = torch.randn(2, 19, 96, generator=gen).to(kernel_device())
    h, _ = attn_res_mix(xs, w, g, EPS, backend="triton")
    wide = [t.detach().double().requires_grad_() for t in (*xs, w, g)]
    h_ref, _ = attn_res_mix_naive(wide[:-2], wide[-2], wide[-1], EPS)
    got = torch.autograd.grad(h, [*xs, w, g], dh)
    ref = torch.autograd.grad(h_ref, wide, dh.double())
    for i in range(4):
        assert_rel_rms(got[i], ref[i], 1e-5, f"dx{i}")
    assert_rel_rms(got[4], ref[4], 1e-2, "dweight")
    assert_rel_rms(got[5], ref[5], 1e-2, "dgain")


@pytest.mark.parametrize("config", [{"BWD_NUM_WARPS": 4}, {"BWD_THREAD_ELEMS": 48}, {"BWD_MAX_CHUNKS": 1},
                                    {"BWD_MAXNREG": 128, "BWD_PROGRAMS_PER_SM": 16},
                                    {"BWD_PREFETCH": 1, "FWD_PREFETCH": 1}, {"BWD_PREFETCH": 2, "FWD_PREFETCH": 2},
                                    {"BWD_PREFETCH": 1, "BWD_THREAD_ELEMS": 12, "BWD_PROGRAMS_PER_SM": 4},
                                    {"BWD_STAGES": 1}, {"BWD_STAGES": 3, "BWD_PROGRAMS_PER_SM": 1}])
@pytest.mark.parametrize("addressing", ["args", "table"])
def test_triton_backward_configurations_equal_naive(monkeypatch, config, addressing):
    """The backward's module constants (what the benchmark's ``--bwd-sweep`` varies; with the forward's prefetch
    depth too) all give the reference."""
    monkeypatch.setenv("KVL_ATTNRES_ADDRESSING", addressing)
    for name, value in config.items():
        monkeypatch.setattr(mix_triton, name, value)
    xs, w, g = _inputs(3, (37,), 300, q_scale=2.0, seed=13)
    _check_against_naive(xs, w, g, "triton", *TOL[torch.float32])


def test_backward_stages_fit_the_shared_memory_budget(monkeypatch):
    """The backward pipelines its loop only while the staged tiles fit ``BWD_STAGE_BYTES``: the small flavor's
    mixes (bf16, D = 768, up to 7 sources) do; 8 sources, fp32 rows or a 16384-wide row fall back to one stage
    instead of failing to launch."""
    monkeypatch.setattr(mix_triton, "BWD_STAGES", 2)
    layout = mix_triton._row_blocks(768, 2, mix_triton.BWD_NUM_WARPS, mix_triton.BWD_MAX_CHUNKS,
                                    mix_triton.BWD_THREAD_ELEMS)
    assert [mix_triton.bwd_stages(n, *layout, 2) for n in (2, 5, 7, 8)] == [2, 2, 2, 1]
    assert mix_triton.bwd_stages(5, *layout, 4) == 1
    wide = mix_triton._row_blocks(16384, 2, mix_triton.BWD_NUM_WARPS, mix_triton.BWD_MAX_CHUNKS,
                                  mix_triton.BWD_THREAD_ELEMS)
    assert mix_triton.bwd_stages(2, *wide, 2) == 1


def test_triton_backward_adds_into_a_sink_buffer():
    """A source with a started sink: the kernel adds its gradient to the buffer (bit n of ``acc_mask``)."""
    xs, w, g = _inputs(3, (29,), 40, seed=14)
    srcs = [x.detach() for x in xs]
    u = (w.detach().reshape(-1) * g.detach()).contiguous()
    _, rstd, alpha = mix_triton.mix_fwd_triton(srcs, u, EPS)
    dh = torch.randn_like(srcs[0])
    plain, du, _ = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha)
    sink = mix_triton.GradSink()
    first, _, _ = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [None, sink, None])
    start = first[1].clone()
    second, du2, _ = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [None, sink, None])
    assert second[1] is sink.buf and first[1] is sink.buf
    assert_rel_rms(start, plain[1], 0.0, "sink's first gradient")
    assert_rel_rms(second[1], start + plain[1], 1e-6, "accumulated gradient")
    assert_rel_rms(second[0], plain[0], 0.0, "source without a sink")
    assert_rel_rms(du2, du, 0.0, "du")


@pytest.mark.parametrize("flush_group", [1, 2, 4])
@pytest.mark.parametrize(("dtype", "d", "tol"), [(torch.float32, 40, 1e-6), (torch.bfloat16, 768, 1e-2)])
def test_deferred_gradients_equal_per_mix_sinks(monkeypatch, dtype, d, tol, flush_group):
    """Four mixes share three sources (completed block states) and each has its own fourth (a partial sum). The
    first to run backward (a later block's) adds its gradients into both sets of sinks, so that the flush then adds
    to started buffers; the other three defer theirs (``mix_bwd_triton(defer=...)``, then one ``flush_deferred``,
    its sources one, two (a ragged last group) or all per pass over the mixes). That gives what adding each mix's
    gradient into the sinks gives (bf16: fewer roundings), the same partial-sum and query gradients, and empties the
    block."""
    monkeypatch.setattr(mix_triton, "FLUSH_GROUP", flush_group)
    gen = torch.Generator().manual_seed(21)
    dev = kernel_device()
    shared = [(torch.randn(31, d, generator=gen) * (1 + i)).to(dev, dtype) for i in range(3)]
    mixes = []
    for _ in range(4):
        srcs = shared + [torch.randn(31, d, generator=gen).to(dev, dtype)]
        u = (0.3 * torch.randn(d, generator=gen)).to(dev)
        _, rstd, alpha = mix_triton.mix_fwd_triton(srcs, u, EPS)
        mixes.append((srcs, u, torch.randn(31, d, generator=gen).to(dev, dtype), rstd, alpha))
    task = torch._C._current_graph_task_id()
    per_mix, deferred = [mix_triton.GradSink() for _ in shared], [mix_triton.GradSink() for _ in shared]
    block = mix_autograd.DeferredBlock()
    srcs, u, dh, rstd, alpha = mixes[-1]
    mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [*per_mix, None])
    mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [*deferred, None])
    started = [s.buf.clone() for s in deferred]
    for srcs, u, dh, rstd, alpha in reversed(mixes[:-1]):  # backward order
        dx_a, du_a, coef_a = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [*per_mix, None])
        dx_b, du_b, coef_b = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [*deferred, None], defer=0b111)
        assert coef_a is None and coef_b.shape == (4, 3, 31) and dx_b[:3] == [None, None, None]
        assert_rel_rms(dx_b[3], dx_a[3], 0.0, "partial sum's gradient")
        assert_rel_rms(du_b, du_a, 1e-6, "du")
        block.add(task, dh, u, coef_b)
    assert all(torch.equal(s.buf, b) for s, b in zip(deferred, started)), "a deferring mix touched a sink"
    mix_autograd.flush_deferred(shared, deferred, block, task)
    assert block.entries == []
    for i, (a, b) in enumerate(zip(per_mix, deferred)):
        assert_rel_rms(b.buf, a.buf, tol, f"shared source {i}")
    ref = [sum(_naive_grad(srcs, u, dh)[i] for srcs, u, dh, *_ in mixes) for i in range(3)]
    for i, b in enumerate(deferred):
        assert_rel_rms(b.buf.float(), ref[i], tol, f"shared source {i} vs reference")


def _naive_grad(srcs: list[torch.Tensor], u: torch.Tensor, dh: torch.Tensor) -> list[torch.Tensor]:
    """fp64 gradients of ``sum(h * dh)`` for the sources of the naive mix with query ``u`` (gain 1)."""
    xs = [s.detach().double().requires_grad_() for s in srcs]
    h, _ = attn_res_mix_naive(xs, u.double().reshape(1, -1), torch.ones_like(u, dtype=torch.float64), EPS)
    return [g.float() for g in torch.autograd.grad((h * dh.double()).sum(), xs)]


@pytest.mark.gpu
def test_two_phase_launcher_calls_compiled_kernels_directly_on_gpu(monkeypatch):
    """After a kernel's first launch for a specialisation, ``TwoPhaseLauncher`` calls the compiled kernel without
    the JIT (decode is launch-bound): the same outputs and block states as launching through the JIT every time."""
    from kernels.attn_res import two_phase_triton as tp

    gen = torch.Generator().manual_seed(31)
    v0 = torch.randn(3, 4, 768, generator=gen).cuda().to(torch.bfloat16)
    u = torch.randn(6, 768, generator=gen).cuda()
    pend = [torch.randn(4, 768, generator=gen).cuda().to(torch.bfloat16) for _ in range(4)]
    results = {}
    for fast in (False, True):
        monkeypatch.setenv("KVL_FAST_LAUNCH", "1" if fast else "0")
        run = tp.TwoPhaseLauncher(v0.clone(), u, 3)
        hs = [run.phase1(2, 0, 3, 1e-6, None, False)]
        hs += [run.phase2(1, 2, 1, 1e-6, pend[0], True), run.phase2(2, 2, 2, 1e-6, pend[1], False)]
        hs += [run.phase1(3, 3, 3, 1e-6, pend[2], False), run.phase2(1, 2, 4, 1e-6, pend[3], True)]
        results[fast] = (torch.stack(hs), run.v.clone())
        assert len(run._phase2.runners) == (2 if fast else 0)  # PEND_FIRST true and false, reused once
    assert torch.equal(results[True][0], results[False][0]) and torch.equal(results[True][1], results[False][1])


@pytest.mark.gpu
def test_mix_kernels_called_directly_after_their_first_launch_on_gpu(monkeypatch):
    """The training mix's kernels (forward, backward, column sum, flush) reuse their compiled kernels after the first
    launch of a specialisation (``kernels.fast_launch``): the same results as the JIT every time, one runner per
    specialisation, and a new one for a source at an address that is not 16-byte aligned."""
    dev = kernel_device()
    xs = [torch.randn(4097, 768, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    u, dh = torch.randn(768, device=dev), torch.randn(4097, 768, device=dev, dtype=torch.bfloat16)
    launches = (mix_triton._FWD_ROWS, mix_triton._BWD_ARGS, colsum._COLSUM, mix_triton._FLUSH)
    for launch in launches:
        launch.runners.clear()

    def run(srcs):
        h, rstd, alpha = mix_triton.mix_fwd_triton(srcs, u, EPS)
        dxs, du, coef = mix_triton.mix_bwd_triton(srcs, u, dh, rstd, alpha, [mix_triton.GradSink(), None, None],
                                                  defer=0b1)
        buf = torch.zeros_like(srcs[0])
        mix_triton.flush_triton(srcs[:1], [buf], 1, [dh], [u], [coef])
        return h, alpha, dxs[1], dxs[2], du, buf

    results = {}
    for fast in ("0", "1", "1"):
        monkeypatch.setenv("KVL_FAST_LAUNCH", fast)
        results.setdefault(fast, []).append(run(xs))
    assert [len(launch.runners) for launch in launches] == [1, 1, 1, 1]
    for got in results["1"]:
        for a, b in zip(got, results["0"][0]):
            assert torch.equal(a, b)
    odd = torch.empty(4097 * 768 + 1, device=dev, dtype=torch.bfloat16)[1:].view(4097, 768).copy_(xs[0])
    h, _, _ = mix_triton.mix_fwd_triton([odd, *xs[1:]], u, EPS)
    assert len(mix_triton._FWD_ROWS.runners) == 2 and torch.equal(h, results["0"][0][0])


def test_chain_passes_the_last_source_through_only_without_a_copy():
    """``attn_res_mix(chain=True)`` returns the last source itself (same storage) when the kernel reads it in place,
    ``None`` when it would read a cast copy or on the PyTorch path; a running sum built from it gets the same
    gradients as one built from the source (the kernel adds the source's gradient into the sum's in place)."""
    xs, w, g = _inputs(3, (2, 5), 40, seed=41)
    for chain in (False, True):
        h, alpha, *passed = attn_res_mix(xs, w, g, EPS, backend="triton", chain=chain)
        assert len(passed) == int(chain)
    h, _, passed = attn_res_mix(xs, w, g, EPS, backend="triton", chain=True)
    assert passed is not None and passed.data_ptr() == xs[-1].data_ptr() and passed.shape == xs[-1].shape
    out = torch.randn_like(xs[-1])
    probe = torch.randn_like(xs[-1])
    grads = []
    for use_passed in (True, False):
        h, _, passed = attn_res_mix(xs, w, g, EPS, backend="triton", chain=True)
        nxt = (passed if use_passed else xs[-1]) + out
        grads.append(torch.autograd.grad((h * probe).sum() + (nxt * probe.flip(0)).sum(), [*xs, w, g]))
    for i, (a, b) in enumerate(zip(*grads)):
        assert_rel_rms(a, b, 1e-6, f"gradient {i}")
    cast = [*xs[:-1], xs[-1].detach().double().requires_grad_()]
    assert attn_res_mix(cast, w, g, EPS, backend="triton", chain=True)[2] is None
    assert attn_res_mix(xs, w, g, EPS, backend="torch", chain=True)[2] is None
