"""Fast Muon-step paths: copy-free Newton-Schulz, Triton kernels (CPU interpreter), fused AdamW, host syncs."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from optim_tiny_models import TinyLM
from torch.overrides import TorchFunctionMode

from kimi_vl.optim import MuonClip
from kimi_vl.optim.muon import newton_schulz5_reference, ns_iterate


@pytest.mark.parametrize("shape", [(3, 32, 32), (2, 24, 80), (2, 80, 24)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 4e-2)])
def test_copy_free_ns_matches_fp64(shape: tuple[int, ...], dtype: torch.dtype, tol: float) -> None:
    """``X <- (B + aI) X`` with the natural layout for tall matrices is the same polynomial as the baddbmm form."""
    G = torch.randn(*shape)
    want = torch.stack([newton_schulz5_reference(g) for g in G])
    X = (G / G.norm(dim=(-2, -1), keepdim=True)).to(dtype)
    got = ns_iterate(X, 5, natural_layout=True, copy_free=True)
    assert got.shape == G.shape and got.is_contiguous() and got.dtype == dtype
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < tol, f"{shape} {dtype}: rel err {err:.2e}"


_INTERPRETED = r"""
import copy, sys, torch
sys.path.insert(0, "tests/optim")
from optim_tiny_models import TinyLM
from kimi_vl.optim import MuonClip
from kernels.muon.fused import (MomentumGroup, apply_update, apply_update_group, apply_update_reference,
                                 momentum_launch, momentum_to_batch, momentum_to_batch_reference, partial_blocks)
torch.manual_seed(0)

# kernels vs references: E = 2 matrices of 37 x 61 (not a multiple of the block), fp32 state, bf16/fp32 batch
for out_dtype in (torch.float32, torch.bfloat16):
    for nesterov in (True, False):
        g, buf = torch.randn(2, 37, 61), torch.randn(2, 37, 61)
        K = partial_blocks(37 * 61)
        outs, parts, bufs = [], [], []
        for fn in (momentum_to_batch, momentum_to_batch_reference):
            b, out = buf.clone(), torch.full((2, 37, 61), float("nan"), dtype=out_dtype)
            part = torch.full((2, K), float("nan"))
            fn(g, b, out, part, 0.95, nesterov)
            outs.append(out.float()); parts.append(part.sum(1)); bufs.append(b)
        torch.testing.assert_close(bufs[0], bufs[1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-2 if out_dtype == torch.bfloat16 else 1e-6, atol=1e-6)
        torch.testing.assert_close(parts[0], parts[1], rtol=1e-5, atol=1e-5)
p, O = torch.randn(5, 333), torch.randn(5, 333).bfloat16()
p1, p2 = p.clone(), p.clone()
apply_update(p1, O, 0.02, 0.1, 1.7)
apply_update_reference(p2, O, 0.02, 0.1, 1.7)
torch.testing.assert_close(p1, p2, rtol=1e-6, atol=1e-7)

# grouped launches == one launch per parameter, bit for bit (matrices of different sizes, E = 1 and E = 3)
for nesterov in (True, False):
    shapes = [(1, 37, 61), (3, 8, 300), (1, 64, 64)]
    gs = [torch.randn(s) for s in shapes]
    runs = []
    for grouped in (False, True):
        bufs = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
        outs = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
        parts = [torch.full((s[0], partial_blocks(s[1] * s[2])), float("nan")) for s in shapes]
        group = MomentumGroup(0.95, nesterov)
        for g, b, o, pt in zip(gs, bufs, outs, parts):
            args = (g, b, o, pt, pt.shape[0], pt.shape[1])
            group.add(*args) if grouped else momentum_launch(*args, 0.95, nesterov)
        group.launch()
        runs.append(bufs + [o.float() for o in outs] + parts)
    assert all(torch.equal(a, b) for a, b in zip(*runs)), "grouped momentum differs"
ps = [torch.randn(4, 50), torch.randn(3000), torch.randn(7, 7)]
Os = [torch.randn(p.shape).bfloat16() for p in ps]
one, grp = [p.clone() for p in ps], [p.clone() for p in ps]
for p, O, s in zip(one, Os, (1.0, 0.5, 2.0)):
    apply_update(p, O, 0.02, 0.1, s)
apply_update_group([(p, O, 0.02, 0.1, s) for p, O, s in zip(grp, Os, (1.0, 0.5, 2.0))])
assert all(torch.equal(a, b) for a, b in zip(one, grp)), "grouped apply differs"


def one_step(fused, ns_dtype, model, grads):
    m = copy.deepcopy(model)
    opt = MuonClip.from_model(m, fused=fused, ns_dtype=ns_dtype, lr=0.02, weight_decay=0.1, qk_clip=False)
    for step_grads in grads:
        for p, gr in zip(m.parameters(), step_grads):
            p.grad = None if gr is None else gr.clone()
        opt.step()
    return [(n, p.detach() - q.detach()) for (n, p), q in zip(m.named_parameters(), model.parameters())]


# whole optimizer, fp32 Newton-Schulz: fused == exact up to fp32 rounding (row splits, experts, tall/wide, 2 steps)
model = TinyLM()
grads = []
for _ in range(2):
    model.zero_grad()
    model.loss(torch.randint(0, 32, (2, 12))).backward()
    grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
for (n, d1), (_, d2) in zip(one_step(True, torch.float32, model, grads), one_step(False, torch.float32, model, grads)):
    err = ((d1 - d2).norm() / d2.norm().clamp_min(1e-30)).item()
    assert err < 1e-4, f"fp32 NS: {n} fused vs exact {err:.2e}"

# bf16 Newton-Schulz on well-conditioned Gaussian gradients: fused bf16 vs exact fp32 within bf16 tolerance
wide = torch.nn.Sequential(torch.nn.Linear(96, 40, bias=False), torch.nn.Linear(40, 96, bias=False),
                           torch.nn.Linear(96, 96, bias=False))
grads = [[torch.randn_like(p) for p in wide.parameters()]]
for (n, d1), (_, d2) in zip(one_step(True, torch.bfloat16, wide, grads), one_step(False, torch.float32, wide, grads)):
    err = ((d1 - d2).norm() / d2.norm()).item()
    assert err < 4e-2, f"bf16 NS: {n} fused vs exact fp32 {err:.2e}"
print("ok")
"""


def test_triton_kernels_and_fused_step_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=240, env=env,
                          cwd=root)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-4000:]


def test_fused_adamw_half_equals_torch_fused_adamw_exactly() -> None:
    model = TinyLM(moe=False)
    ref_model = copy.deepcopy(model)
    opt = MuonClip.from_model(model, adamw_only=True, lr=3e-3, qk_clip=False, adamw_fused=True)
    ref_groups = [
        {"params": [p for n, p in ref_model.named_parameters() if "_res_" not in n], "weight_decay": 0.1},
        {"params": [p for n, p in ref_model.named_parameters() if "_res_" in n], "weight_decay": 0.0},
    ]
    ref = torch.optim.AdamW(ref_groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for _ in range(3):
        ids = torch.randint(0, 32, (2, 12))
        for m, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            m.loss(ids).backward()
            o.step()
    for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert torch.equal(p, q), n


class _CountHostReads(TorchFunctionMode):
    """Counts the tensor calls that read values back to the host (a device sync on a GPU)."""

    NAMES = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if name in self.NAMES:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def test_step_reads_back_to_the_host_once() -> None:
    """No read inside a step: QK-Clip's stats copy is started (one ``cpu``; non-blocking on a GPU) and read once,
    when the stats are first used; the clip itself is applied on the device. None in Muon, AdamW (fused) or per
    layer."""
    model = TinyLM()
    opt = MuonClip.from_model(model, fused=False, adamw_fused=True, qk_clip_tau=0.5)
    for _ in range(2):
        opt.zero_grad()
        model.loss(torch.randint(0, 32, (2, 12))).backward()
        with _CountHostReads() as counter:
            opt.step()
        assert dict(counter.calls) == {"cpu": 1}, dict(counter.calls)
        with _CountHostReads() as counter:
            opt.last_qk_stats.to_dict()
            opt.last_qk_stats.to_dict()
        assert dict(counter.calls) == {"tolist": 1}, dict(counter.calls)
    assert sum(opt.last_qk_stats.clipped_heads) > 0


@pytest.mark.gpu
def test_fused_step_on_cuda_matches_exact() -> None:
    """Compiled Triton kernels + copy-free NS on CUDA: fp32 NS equals the exact path; bf16 within bf16 tolerance."""
    torch.manual_seed(0)
    shapes = [(256, 256), (704, 256), (256, 704), (3, 64, 128)]
    base = [torch.randn(s, device="cuda") * 0.02 for s in shapes]
    grads = [torch.randn(s, device="cuda") for s in shapes]

    def update(ns_dtype: torch.dtype, fused: bool) -> list[torch.Tensor]:
        ps = [(f"w{i}" if len(s) == 2 else f"experts_{i}", torch.nn.Parameter(b.clone()))
              for i, (s, b) in enumerate(zip(shapes, base))]
        opt = MuonClip([{"params": ps, "use_muon": True}], lr=1e-2, ns_dtype=ns_dtype, fused=fused)
        for _ in range(2):
            for (_, p), g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        return [p.detach() - b for (_, p), b in zip(ps, base)]

    exact = update(torch.float32, False)
    for got, want in zip(update(torch.float32, True), exact):
        assert ((got - want).norm() / want.norm()).item() < 1e-4
    for got, want in zip(update(torch.bfloat16, True), exact):
        assert ((got - want).norm() / want.norm()).item() < 4e-2


@pytest.mark.gpu
def test_graphed_newton_schulz_equals_eager() -> None:
    """``ns_cuda_graph``: step 1 eager, step 2 captures, later steps replay; with new gradients every step the
    parameters' total change equals the eager path's (same ops on the same data; the tolerance only allows cuBLAS
    to pick other algorithms under capture, a replay of stale data would be off by tens of percent), one graph."""
    torch.manual_seed(0)
    shapes = [(256, 256), (704, 256), (256, 704), (3, 64, 128), (256, 256)]
    base = [torch.randn(s, device="cuda") * 0.02 for s in shapes]
    grads = [[torch.randn(s, device="cuda") for s in shapes] for _ in range(5)]

    def run(graphed: bool) -> tuple[list[torch.Tensor], MuonClip]:
        ps = [(f"w{i}" if len(s) == 2 else f"experts_{i}", torch.nn.Parameter(b.clone()))
              for i, (s, b) in enumerate(zip(shapes, base))]
        opt = MuonClip([{"params": ps, "use_muon": True}], lr=1e-2, fused=True, ns_cuda_graph=graphed)
        for step_grads in grads:
            for (_, p), g in zip(ps, step_grads):
                p.grad = g.clone()
            opt.step()
        return [p.detach() - b for (_, p), b in zip(ps, base)], opt

    eager, _ = run(False)
    graphed, opt = run(True)
    assert opt._graphed_ns.captures == 1 and not opt._graphed_ns.disabled
    for got, want in zip(graphed, eager):
        assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_graphed_ns_falls_back_to_eager_when_capture_fails(monkeypatch) -> None:
    """A failed capture warns once and leaves every step eager, with the eager results (CPU: capture is faked)."""
    from kimi_vl.optim.muon_step import GraphedNS, normalise_

    class _FailingCapture:
        def __init__(self, graph, capture_error_mode="global"):
            assert capture_error_mode == "thread_local"

        def __enter__(self):
            raise RuntimeError("operation not permitted when stream is capturing")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", _FailingCapture)
    key = (8, 16, 5, torch.float32)
    batches = {key: torch.empty(3, 8, 16)}
    partials = {key: torch.empty(3, 1)}
    ns_fn = lambda k, G: ns_iterate(G, k[2], natural_layout=True, copy_free=True)  # noqa: E731
    graphed = GraphedNS()
    for step in range(3):
        G = torch.randn(3, 8, 16)
        batches[key].copy_(G)
        partials[key].copy_(G.square().sum(dim=(1, 2))[:, None])
        if step == 1:
            with pytest.warns(UserWarning, match="capturing Newton-Schulz as a CUDA graph failed"):
                got = graphed(batches, partials, ns_fn)
        else:
            got = graphed(batches, partials, ns_fn)
        ref_batches, ref_partials = {key: G.clone()}, {key: partials[key].clone()}
        normalise_(ref_batches, ref_partials)
        torch.testing.assert_close(got[key], ns_fn(key, ref_batches[key]), rtol=0, atol=0)
    assert graphed.captures == 0 and "not permitted" in graphed.disabled
