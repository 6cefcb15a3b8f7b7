"""GPU cost of Attention Residuals (issue 6): the mix alone, and block AttnRes in a whole training step and in decode.

One command, JSON to ``$OUT/bench_attnres.json`` (written after each section) plus markdown tables on stdout:

    python -m kimi_vl.benchmarks.bench_attnres [--flavor small] [--seq 4096] [--batch 8]

Measured in one run, bf16, CUDA events after warm-up:
- ``mix``: the AttnRes mix alone at the flavor's width over ``batch x seq`` tokens for ``N`` sources:
  stacked reference (``naive``), the PyTorch autograd function (``function``), the fused Triton kernel with the
  sources as pointer arguments (``triton``, the default for ``N <= 8``) and with the first version's pinned
  address table (``triton_table``, ``KVL_ATTNRES_ADDRESSING=table``): forward, backward alone (``autograd.grad``
  over a retained graph) and forward+backward, with the Triton kernel's effective bandwidth (ideal bytes: the
  forward reads N sources and writes h; the backward reads N sources and dh and writes N gradients) and its
  backward / forward time ratio. N = 1 2 4 7 9 by default (9 takes the address table).
- ``bwd_sweep`` (with ``--bwd-sweep``): the Triton forward and backward kernels alone under each configuration
  of ``SWEEPS`` (warps, rows per tile, chunks, register cap, programs per SM), with the error against the
  default.
- ``train``: forward + backward (no optimizer step) of the flavor at ``seq`` with ``standard`` vs
  ``attnres_block`` residuals (same run, rounds interleaved, best round kept), for all-MLA layers
  (``attn_ratio 0:1``, so the step is not bound by KDA) and for the flavor's hybrid; AttnRes through the
  Triton kernel (pointer arguments, gradient sinks for the block states, their gradients formed once per block;
  also once per mix, ``KVL_ATTNRES_DEFER_GRAD=0``; for all-MLA also without the sinks,
  ``KVL_ATTNRES_GRAD_SINK=0``, and the first version: address table, no sinks, ``KVL_ATTNRES_ADDRESSING=table``;
  for both also every mix kernel launched through Triton's JIT, ``KVL_FAST_LAUNCH=0`` (``attnres_triton_jit``;
  the hybrid runs standard, AttnRes and this one); the PyTorch function is timed in ``mix`` only). Reports step
  time, overhead %, the step's peak memory above the resident weights, and the memory of the stored block states
  for scale. On CUDA each round is also timed queued behind a ``--head-start-ms`` sleep kernel, so that the host
  enqueues ahead and the step is device-bound (``step_s_device_bound``, ``overhead_device_bound_pct``): steadier
  than the plain rounds, which a host close to the device's pace scatters (session 30, ``step_timeline.py``).
- ``kernel_diff`` (with ``--profile``): one profiled step each of ``standard`` and ``attnres_triton``, the time
  and calls per GPU kernel name (``aten::`` ops' CPU time on a CPU run) and the names that differ most: where an
  AttnRes step's extra time goes; ``kernel_diff_defer`` (all-MLA) the same between ``attnres_triton_nodefer`` and
  ``attnres_triton``.
- ``decode``: greedy decode tokens/s after a cached prefill of ``--decode-context``, under ``torch.no_grad()``
  as in ``generate()``: standard vs the buffered Triton two-phase AttnRes stream (for all-MLA also the PyTorch
  two-phase form, ``KVL_ATTNRES_TWO_PHASE=torch``). (The first benchmark decoded with autograd on, so AttnRes
  took the training mix kernel, and its pinned address table, for every sublayer.)
The decode parts (``decode``, ``--graph-decode``, ``--stream-cost``) live in ``attnres_decode.py``.
``--budget-s`` skips the hybrid when the run is already past it (recorded in the JSON); ``--smoke`` runs tiny
sizes on the CPU to check the script itself (``TRITON_INTERPRET=1 python -m ... --smoke``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from kernels.attn_res import attn_res_mix, attn_res_mix_naive
from kernels.benchmarks.constants import overridden, set_constants
from kernels.profiling import diff_by_name
from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.benchmarks.attnres_common import (
    profile_step,
    restore_env,
    sleep_cycles_per_ms,
    with_env,
)
from kimi_vl.benchmarks.attnres_decode import bench_decode_variants, bench_graph_decode, bench_stream_cost, decode_lines
from kimi_vl.benchmarks.bench_backbone import HEADS, train_step


def _triton_table(xs: list[torch.Tensor], w: torch.Tensor, g: torch.Tensor):
    old = os.environ.get("KVL_ATTNRES_ADDRESSING")
    os.environ["KVL_ATTNRES_ADDRESSING"] = "table"
    try:
        return attn_res_mix(xs, w, g, 1e-5, backend="triton")
    finally:
        restore_env("KVL_ATTNRES_ADDRESSING", old)


MIX_IMPLS: dict[str, Callable] = {
    "naive": lambda xs, w, g: attn_res_mix_naive(xs, w, g, 1e-5),
    "function": lambda xs, w, g: attn_res_mix(xs, w, g, 1e-5, backend="torch"),
    "triton": lambda xs, w, g: attn_res_mix(xs, w, g, 1e-5, backend="triton"),
    "triton_table": _triton_table,
}


def time_per_iter(fn: Callable[[], None], warmup: int, iters: int, device: torch.device, sleep_cycles: int = 0
                  ) -> float:
    """Seconds per call of ``fn`` (CUDA events on a GPU, wall clock otherwise). ``sleep_cycles`` (GPU): the calls are
    queued behind a ``torch.cuda._sleep`` of that many cycles, so the host enqueues ahead and they run device-bound
    (the events start after the sleep)."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def _mix_times(impl: Callable, xs: list[torch.Tensor], w: torch.Tensor, g: torch.Tensor, dh: torch.Tensor,
               device: torch.device, iters: int) -> tuple[float, float, float]:
    """Milliseconds of one forward, of one forward + backward, and of one backward alone (``autograd.grad`` over a
    retained graph: the kernel, the query-gradient sum and autograd's own work) of the mix ``impl``."""
    inputs = [*xs, w, g]
    fwd = time_per_iter(lambda: impl(xs, w, g), 2, iters, device)
    fwd_bwd = time_per_iter(lambda: torch.autograd.grad(impl(xs, w, g)[0], inputs, dh), 2, iters, device)
    h = impl(xs, w, g)[0]
    bwd = time_per_iter(lambda: torch.autograd.grad(h, inputs, dh, retain_graph=True), 2, iters, device)
    return 1e3 * fwd, 1e3 * fwd_bwd, 1e3 * bwd


def _mix_inputs(tokens: int, d: int, n: int, device: torch.device, dtype: torch.dtype):
    xs = [torch.randn(tokens, d, device=device, dtype=dtype, requires_grad=True) for _ in range(n)]
    w = (0.05 * torch.randn(1, d, device=device)).to(dtype).requires_grad_()
    g = torch.ones(d, device=device, dtype=dtype, requires_grad=True)
    return xs, w, g, torch.randn(tokens, d, device=device, dtype=dtype)


def bench_mix(tokens: int, d: int, ns: list[int], device: torch.device, dtype: torch.dtype, iters: int) -> list[dict]:
    rows = []
    for n in ns:
        xs, w, g, dh = _mix_inputs(tokens, d, n, device, dtype)
        elem = xs[0].element_size() * tokens * d
        row = {"n": n, "tokens": tokens, "d": d, "ideal_fwd_bytes": (n + 1) * elem,
               "ideal_bwd_bytes": (2 * n + 1) * elem}
        for name, impl in MIX_IMPLS.items():
            try:
                row[f"{name}_fwd_ms"], row[f"{name}_fwd_bwd_ms"], row[f"{name}_bwd_ms"] = _mix_times(
                    impl, xs, w, g, dh, device, iters)
            except Exception as err:  # keep the other rows: one failing implementation is itself a result
                row[f"{name}_fwd_ms"] = row[f"{name}_fwd_bwd_ms"] = row[f"{name}_bwd_ms"] = float("nan")
                row[f"{name}_error"] = f"{type(err).__name__}: {err}"[:2000]
        bwd_ms = row["triton_bwd_ms"]
        row["triton_fwd_gbps"] = row["ideal_fwd_bytes"] / row["triton_fwd_ms"] / 1e6
        row["triton_bwd_gbps"] = row["ideal_bwd_bytes"] / bwd_ms / 1e6 if bwd_ms > 0 else float("nan")
        row["triton_bwd_over_fwd"] = bwd_ms / row["triton_fwd_ms"]
        rows.append(row)
        del xs, dh
    return rows


# Kernel configurations timed by --bwd-sweep (module constants of kernels/attn_res/mix_triton.py; the first entry
# of each list is the module's default). Each entry sets the named constants for its timing only.
SWEEPS: dict[str, list[dict[str, int | None]]] = {
    "forward": [
        {},
        {"FWD_NUM_WARPS": 8},
        {"FWD_THREAD_ELEMS": 12},
        {"FWD_THREAD_ELEMS": 48},
        {"FWD_MAX_CHUNKS": 8},
        {"FWD_PREFETCH": 2},
        {"FWD_PREFETCH": 8},
        {"FWD_PREFETCH": 8, "FWD_THREAD_ELEMS": 12},
    ],
    "backward": [  # session 30: 12 elements a thread take 109-163 registers (ptxas sm_90a), so 4 programs an SM fit;
        # slower alone (N = 3 / 5: 0.119-0.135 / 0.231-0.309 ms against 0.113 / 0.184) and in the model
        {},
        {"BWD_NUM_WARPS": 8},
        {"BWD_THREAD_ELEMS": 12},
        {"BWD_THREAD_ELEMS": 48},
        {"BWD_PROGRAMS_PER_SM": 3},
        {"BWD_PROGRAMS_PER_SM": 4, "BWD_THREAD_ELEMS": 12},
        {"BWD_PROGRAMS_PER_SM": 4, "BWD_THREAD_ELEMS": 12, "BWD_PREFETCH": 2},
        {"BWD_PROGRAMS_PER_SM": 4, "BWD_THREAD_ELEMS": 12, "BWD_PREFETCH": 1},
        {"BWD_PROGRAMS_PER_SM": 8, "BWD_THREAD_ELEMS": 12, "BWD_PREFETCH": 2},
        {"BWD_STAGES": 1},  # session 31: the loop over tiles software-pipelined (2 stages, the default) or not
        {"BWD_STAGES": 3},
        {"BWD_PROGRAMS_PER_SM": 1},
    ],
    "flush": [
        {},
        {"FLUSH_GROUP": 1, "FLUSH_THREAD_ELEMS": 24},
        {"FLUSH_GROUP": 4, "FLUSH_THREAD_ELEMS": 24},
        {"FLUSH_GROUP": 2, "FLUSH_THREAD_ELEMS": 12},
        {"FLUSH_GROUP": 8, "FLUSH_THREAD_ELEMS": 12},
        {"FLUSH_GROUP": 8, "FLUSH_THREAD_ELEMS": 24},
    ],
}
SWEEP_ROUNDS = 3  # the --bwd-sweep's configurations are timed round-robin, this many rounds (median)
FLUSH_MIXES = 6  # the flush sweep: this many mixes' deferred gradients (the small flavor's block) into N - 1 sources


def bench_bwd_sweep(tokens: int, d: int, ns: list[int], device: torch.device, dtype: torch.dtype,
                    iters: int, kernels: tuple[str, ...] = ("forward", "backward", "flush"),
                    match: str = "") -> list[dict]:
    """The Triton forward (``mix_fwd_triton``), backward (``mix_bwd_triton``: kernel + query-gradient sum) and
    deferred-gradient flush (``flush_triton``: ``FLUSH_MIXES`` mixes into N - 1 shared sources) kernels alone under
    each entry of :data:`SWEEPS`, with the error against the default configuration (relative RMS over all outputs)
    and the bandwidth of the ideal traffic (forward: N sources read, h written; backward: N sources and dh read, N
    gradients written; flush: the shared sources read and written, each mix's dh read once). ``match``: only the
    configurations whose text holds it (and the default)."""
    from kernels.attn_res import mix_triton as mt

    rows = []
    for n in ns:
        xs, w, g, dh = _mix_inputs(tokens, d, n, device, dtype)
        srcs = [x.detach() for x in xs]
        u = (w.float().reshape(-1) * g.float()).contiguous()
        _, rstd, alpha = mt.mix_fwd_triton(srcs, u, 1e-5)
        calls = {"forward": (partial(mt.mix_fwd_triton, srcs, u, 1e-5), n + 1),
                 "backward": (partial(mt.mix_bwd_triton, srcs, u, dh, rstd, alpha), 2 * n + 1)}
        if n > 1:  # the block's flush: n - 1 shared sources read and written, FLUSH_MIXES dh read
            shared = srcs[: n - 1]
            bufs = [torch.empty_like(x) for x in shared]
            coefs = [torch.rand(n - 1, 3, tokens, device=device) for _ in range(FLUSH_MIXES)]
            dhs = [torch.randn_like(dh) for _ in range(FLUSH_MIXES)]  # distinct tiles, as in a block
            calls["flush"] = (partial(_flush, mt, shared, bufs, dhs, [u] * FLUSH_MIXES, coefs),
                              2 * (n - 1) + FLUSH_MIXES)
        for kernel, (fn, passes) in calls.items():
            if kernel not in kernels:
                continue
            ref, kernel_rows = None, []
            for cfg in (c for c in SWEEPS[kernel] if not c or match in str(c)):
                row, flat = _sweep_row(mt, kernel, cfg, fn, n, tokens, d, srcs[0].element_size(), ref)
                kernel_rows.append(row)
                ref = flat if ref is None else ref
            _time_rows(mt, kernel_rows, fn, passes * srcs[0].element_size() * tokens * d, iters, device)
            rows += kernel_rows
        del xs, dh, srcs
    return rows


def _flush(mt, shared: list[torch.Tensor], bufs: list[torch.Tensor], dhs: list[torch.Tensor],
           us: list[torch.Tensor], coefs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flush_triton`` into fresh contents of ``bufs`` (no accumulation), returned for the error check."""
    mt.flush_triton(shared, bufs, 0, dhs, us, coefs)
    return bufs


@contextlib.contextmanager
def _constants(mt, cfg: dict):
    """``mix_triton``'s constants set to ``cfg`` inside the block (its row-layout cache cleared on both sides)."""
    try:
        with overridden([(mt, k, v) for k, v in cfg.items()]):
            mt._row_blocks.cache_clear()
            yield
    finally:
        mt._row_blocks.cache_clear()


def _sweep_row(mt, kernel: str, cfg: dict, fn: Callable, n: int, tokens: int, d: int, elem: int,
               ref: torch.Tensor | None) -> tuple[dict, torch.Tensor | None]:
    """One configuration of one kernel, run once (compiled) with its error against ``ref``: the row and the flattened
    outputs (``None`` on an error). :func:`_time_rows` times the rows afterwards."""
    row: dict = {"kernel": kernel, "n": n, "tokens": tokens, "d": d, "config": dict(cfg) or "default"}
    flat = None
    try:
        with _constants(mt, cfg):
            out = fn()
            tensors = (*out[0], out[1]) if kernel == "backward" else out
            flat = torch.cat([t.float().reshape(-1) for t in tensors])
            row["rel_err_vs_default"] = 0.0 if ref is None else ((flat - ref).norm() / ref.norm()).item()
            prefix = {"forward": "FWD", "backward": "BWD", "flush": "FLUSH"}[kernel]  # all three: the row layout
            row["block_t_chunk_ch"] = mt._row_blocks(d, elem, *(getattr(mt, f"{prefix}_{k}") for k in
                                                                 ("NUM_WARPS", "MAX_CHUNKS", "THREAD_ELEMS")))
    except Exception as err:  # a configuration that fails to compile or run is itself a result
        row["error"] = f"{type(err).__name__}: {err}"[:2000]
    return row, flat


def _time_rows(mt, rows: list[dict], fn: Callable, traffic_bytes: int, iters: int, device: torch.device) -> None:
    """Time the rows' configurations (those without an error) round-robin, ``SWEEP_ROUNDS`` rounds: each row gets
    the median ``ms``, ``ms_rounds`` and the bandwidth of ``traffic_bytes``. Timed one after another, the first
    configuration (the default) came out up to 20% slower than the same configuration timed later (H200, session 24
    call1: 0.114 against 0.095 ms), so no configuration is timed in one block any more."""
    timed = [r for r in rows if "error" not in r]
    for _ in range(SWEEP_ROUNDS):
        for row in timed:
            cfg = {} if row["config"] == "default" else row["config"]
            with _constants(mt, cfg):
                row.setdefault("ms_rounds", []).append(1e3 * time_per_iter(fn, 2, iters, device))
    for row in timed:
        row["ms"] = statistics.median(row["ms_rounds"])
        row["gbps"] = traffic_bytes / row["ms"] / 1e6


def _config(flavor: str, layers: str, residual: str) -> KimiVLConfig:
    """The flavor with ``residual``; ``layers == "mla"`` replaces every KDA layer by MLA (``attn_ratio 0:1``)."""
    mla = {"attn_ratio": "0:1", "layer_types": None} if layers == "mla" else {}
    return KimiVLConfig.from_flavor(flavor, residual_mode=residual, **mla)


def _build(cfg: KimiVLConfig, device: torch.device, dtype: torch.dtype) -> KimiVLForCausalLM:
    torch.manual_seed(0)
    return KimiVLForCausalLM(cfg).to(device, dtype).train()


def _step_peak_gib(step: Callable[[], None], device: torch.device) -> float:
    """Peak memory of one step above what was allocated before it (weights; gradients are freed first)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def _mixes(num_sublayers: int, block_size: int) -> list[tuple[int, bool, int | None]]:
    """The step's AttnRes mixes in order: ``(completed states read, reads a partial sum, block)``, the block
    ``None`` for the output's mix. Mix i (1..L) feeds sublayer i + 1; the first sublayer reads the embedding alone."""
    return [(i // block_size + 1, i % block_size != 0, i // block_size if i < num_sublayers else None)
            for i in range(1, num_sublayers + 1)]


def mix_traffic(num_sublayers: int, block_size: int, state_bytes: int) -> dict[str, float]:
    """HBM bytes (GB) the step's AttnRes mixes must move at least, from the block structure alone: per mix over
    ``N`` sources, forward reads N states and writes h; backward reads N states and dh and writes N gradients
    (the second read of the sources in backward is counted as an L2 hit). A completed block state read by ``c``
    mixes costs ``c - 1`` extra gradient accumulations: autograd's out-of-place add (read 2, write 1 state) without
    gradient sinks, an in-kernel read-add-write (read 1 more) with them. The first sublayer reads the embedding
    alone (no mix); ``standard`` has no mixes, and the partial sums' adds cost what PreNorm's adds cost.
    Deferred (``KVL_ATTNRES_DEFER_GRAD=1``): a block's mix reads dh and its N states and writes only the partial
    sum's gradient; the block's flush reads its S mixes' dh, and per completed state the state and its buffer, and
    writes the buffer (the output's mix, not deferred, started every buffer)."""
    uses: dict[int, int] = {}
    blocks: dict[int, tuple[int, int]] = {}  # block -> (mixes, completed states)
    fwd = bwd = deferred = 0
    for completed, psum, block in _mixes(num_sublayers, block_size):
        n = completed + psum
        fwd += (n + 1) * state_bytes
        bwd += (2 * n + 1) * state_bytes
        for c in range(completed):
            uses[c] = uses.get(c, 0) + 1
        if block is None:
            deferred += (2 * n + 1) * state_bytes
        else:
            deferred += (1 + n + psum) * state_bytes
            blocks[block] = (blocks.get(block, (0, 0))[0] + 1, completed)
    deferred += sum(s + 3 * c for s, c in blocks.values()) * state_bytes
    extra = sum(c - 1 for c in uses.values()) * state_bytes
    return {"forward": fwd / 1e9, "backward_sinks": (bwd + extra) / 1e9, "backward_deferred": deferred / 1e9,
            "ms_at_2.5TBps_deferred": (fwd + deferred) / 2.5e9,
            "backward_no_sinks": (bwd + 3 * extra) / 1e9, "ms_at_2.5TBps_sinks": (fwd + bwd + extra) / 2.5e9,
            "ms_at_2.5TBps_no_sinks": (fwd + bwd + 3 * extra) / 2.5e9}


def restructured_traffic(num_sublayers: int, block_size: int, state_bytes: int) -> dict[str, float]:
    """HBM traffic (GB, same counting as :func:`mix_traffic`) of two restructurings of block AttnRes training that
    are not built, beside today's forward and deferred backward, to say what each could save before building it.

    ``forward_two_phase``: per block, phase 1 reads each completed state once for all the block's mixes and writes
    one partial output per mix in the states' dtype (the block's first mix, with no partial sum yet, writes h
    itself); phase 2 reads a mix's partial output and the partial sum and writes h.
    ``backward_h_identity``: the softmax gradient's ``sum_i alpha_i (dh . x_i)`` is ``dh . h``, so a mix's
    backward needs only the partial sum, its h and dh (it writes the partial sum's gradient), and everything that
    involves the completed states moves to the block's flush, which then also reads the block's h tiles (a block's
    first mix has no backward of its own); its numerics fail with the stored bf16 h (``attnres_h_identity``).
    Each block takes whichever form moves less (with few completed states, today's); the output's mix is as today
    in both."""
    today = mix_traffic(num_sublayers, block_size, 10**9)  # in state passes
    fwd, bwd = today["forward"], today["backward_deferred"]
    fwd2, bwd2 = fwd, bwd
    blocks: dict[int, list[tuple[int, bool]]] = {}  # block -> [(sources, has a partial sum)] of its mixes
    for completed, psum, block in _mixes(num_sublayers, block_size):
        if block is not None:
            blocks.setdefault(block, []).append((completed + psum, psum))
    for b, mixes in blocks.items():  # each block takes the cheaper form; the output's mix is unchanged
        c, s = b + 1, len(mixes)
        today_f, today_b = sum(n + 1 for n, _ in mixes), sum(1 + n + p for n, p in mixes) + s + 3 * c
        fwd2 += min(today_f, c + sum(4 if p else 1 for _, p in mixes)) - today_f
        bwd2 += min(today_b, sum(4 for _, p in mixes if p) + 2 * s + 3 * c) - today_b
    gb = state_bytes / 1e9
    return {"forward": fwd * gb, "forward_two_phase": fwd2 * gb, "backward_deferred": bwd * gb,
            "backward_h_identity": bwd2 * gb, "ms_saved_at_2.5TBps": (fwd - fwd2 + bwd - bwd2) * state_bytes / 2.5e9}


def bench_train_group(flavor: str, layers: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    """Standard vs block AttnRes (Triton kernel, and PyTorch function) for one layer layout, rounds interleaved."""
    cfgs = {r: _config(flavor, layers, r) for r in ("standard", "attnres_block")}
    models = {r: _build(c, device, dtype) for r, c in cfgs.items()}
    if args.decode_only:
        out = {"decode": bench_decode_variants(models, cfgs["standard"], layers, args, device)}
        if args.graph_decode:
            out["graph_decode"] = bench_graph_decode(models, cfgs["standard"], args, device)
        return out
    ids = torch.randint(0, cfgs["standard"].vocab_size, (args.batch, args.seq), device=device)
    triton = {"KVL_ATTNRES_BACKEND": "triton"}
    variants = {"standard": ("standard", {}), "attnres_triton": ("attnres_block", triton),
                "attnres_triton_nodefer": ("attnres_block", triton | {"KVL_ATTNRES_DEFER_GRAD": "0"}),
                "attnres_triton_nosink": ("attnres_block", triton | {"KVL_ATTNRES_GRAD_SINK": "0"}),
                "attnres_triton_table": ("attnres_block", triton | {"KVL_ATTNRES_ADDRESSING": "table"}),
                "attnres_triton_jit": ("attnres_block", triton | {"KVL_FAST_LAUNCH": "0"})}
    if layers != "mla":
        variants = {v: variants[v] for v in ("standard", "attnres_triton", "attnres_triton_jit")}
    iters = args.iters if layers == "mla" else args.hybrid_iters
    per_round = {v: [] for v in variants}
    behind = {v: [] for v in variants}  # the same steps queued behind a sleep kernel: device-bound
    cycles = int(args.head_start_ms * sleep_cycles_per_ms(device)) if device.type == "cuda" else 0
    peak = {}
    steps = {v: train_step(models[res], ids, args.head) for v, (res, _) in variants.items()}
    for v, (_, env) in variants.items():
        peak[v] = with_env(env, partial(_step_peak_gib, steps[v], device))
        with_env(env, partial(time_per_iter, steps[v], 1, 1, device))
    for _ in range(args.rounds):
        for v, (_, env) in variants.items():
            per_round[v].append(with_env(env, partial(time_per_iter, steps[v], 0, iters, device)))
            if cycles:
                behind[v].append(with_env(env, partial(time_per_iter, steps[v], 0, iters, device, cycles)))
    best = {v: min(t) for v, t in per_round.items()}
    cfg = cfgs["attnres_block"]
    n_blocks = -(-cfg.num_sublayers // cfg.attnres_block_size)
    block_state_gib = n_blocks * args.batch * args.seq * cfg.hidden_size * torch.finfo(dtype).bits / 8 / 2**30
    state_bytes = args.batch * args.seq * cfg.hidden_size * torch.finfo(dtype).bits // 8
    out = {"layers": cfgs["standard"].layer_types, "seq": args.seq, "batch": args.batch, "iters": iters,
           "rounds": args.rounds, "block_states_gib": block_state_gib,
           "mix_traffic_gb": mix_traffic(cfg.num_sublayers, cfg.attnres_block_size, state_bytes),
           "restructured_traffic_gb": restructured_traffic(cfg.num_sublayers, cfg.attnres_block_size, state_bytes),
           "variants": {}}
    for v in variants:
        out["variants"][v] = {"step_s": best[v], "tokens_per_s": args.batch * args.seq / best[v],
                              "overhead_pct": 100 * (best[v] / best["standard"] - 1),
                              "round_overhead_pct": [100 * (t / s - 1) for t, s in zip(per_round[v],
                                                                                      per_round["standard"])],
                              "step_peak_gib": peak[v], "peak_overhead_pct": 100 * (peak[v] / peak["standard"] - 1)}
        if cycles:
            bound = min(behind[v])
            out["variants"][v] |= {
                "step_s_device_bound": bound, "overhead_device_bound_pct": 100 * (bound / min(behind["standard"]) - 1),
                "round_overhead_device_bound_pct": [100 * (t / s - 1) for t, s in zip(behind[v], behind["standard"])]}
    if args.profile:
        profiled = [v for v in ("standard", "attnres_triton", "attnres_triton_nodefer") if v in variants]
        times = {v: with_env(variants[v][1], partial(profile_step, steps[v])) for v in profiled}
        out["kernel_diff"] = diff_by_name(times["standard"], times["attnres_triton"], top=args.profile_top)
        if "attnres_triton_nodefer" in times:
            out["kernel_diff_defer"] = diff_by_name(times["attnres_triton_nodefer"], times["attnres_triton"],
                                                    top=args.profile_top)
    dec = bench_decode_variants(models, cfgs["standard"], layers, args, device) if args.decode_steps > 0 else {}
    out["decode"] = dec
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _guarded(fn: Callable[..., dict], *args) -> dict:
    """``fn(*args)``, or ``{"skipped": the error}`` so that one failing section leaves the others' results."""
    try:
        return fn(*args)
    except Exception as err:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"skipped": f"error: {type(err).__name__}: {err}"[:2000]}


def _save(results: dict) -> None:
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_attnres.json").write_text(json.dumps(results, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sources", type=int, nargs="+", default=[1, 2, 4, 7, 9])
    p.add_argument("--mix-iters", type=int, default=10)
    p.add_argument("--iters", type=int, default=5, help="timed steps per round, all-MLA model")
    p.add_argument("--hybrid-iters", type=int, default=2, help="timed steps per round, hybrid model")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--head-start-ms", type=float, default=300.0,
                   help="training step: each round also timed queued behind a sleep kernel this long (device-bound "
                        "rounds: the host enqueues ahead; see step_timeline.py), 0: not")
    p.add_argument("--head", choices=HEADS, default="fused",
                   help="the training steps' LM head + loss (bench_backbone's --head; fused: the app's default)")
    p.add_argument("--decode-context", type=int, default=4096)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--no-hybrid", action="store_true")
    p.add_argument("--layouts", nargs="*", choices=("mla", "hybrid"), default=["mla", "hybrid"],
                   help="training-step layer layouts (all-MLA, the flavor's KDA/MLA hybrid)")
    p.add_argument("--budget-s", type=float, default=50.0, help="skip the hybrid when the run is past this")
    p.add_argument("--bwd-sweep", action="store_true",
                   help="also time the Triton forward and backward kernels alone under each configuration of SWEEPS")
    p.add_argument("--sweep-kernels", nargs="+", choices=("forward", "backward", "flush"),
                   default=["forward", "backward", "flush"], help="which kernels --bwd-sweep times")
    p.add_argument("--sweep-match", default="", metavar="TEXT",
                   help="--bwd-sweep times only the configurations whose text holds TEXT (and the default)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one step of standard and attnres_triton: the kernels whose time differs most")
    p.add_argument("--profile-top", type=int, default=15)
    p.add_argument("--decode-only", action="store_true", help="train section: decode timing only")
    p.add_argument("--graph-decode", action="store_true",
                   help="with --decode-only: also decode with each step replayed as a CUDA graph, both residuals "
                        "with their input norms fused (KVL_FUSED_NORM=1) and separate")
    p.add_argument("--graph-rounds", type=int, default=12, help="interleaved rounds of the graph decode")
    p.add_argument("--stream-cost", action="store_true",
                   help="also the residual stream's host time per decoded token alone (standard vs two-phase AttnRes)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a constant of kernels/attn_res/mix_triton.py for the whole run (VALUE a Python literal), "
                        "e.g. --set BWD_PROGRAMS_PER_SM=4")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (debug flavor), checks the script")
    args = p.parse_args()
    _set_mix_constants(args.set)
    t0 = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--smoke runs the Triton kernel on the CPU: set TRITON_INTERPRET=1 before starting")
    if args.smoke:
        args.flavor, args.seq, args.batch, args.sources, args.mix_iters = "debug", 32, 2, [1, 3], 1
        args.iters, args.hybrid_iters, args.rounds, args.decode_steps = 1, 1, 1, 0
    d = KimiVLConfig.from_flavor(args.flavor).hidden_size
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
               "flavor": args.flavor, "dtype": str(dtype), "date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    if args.stream_cost:
        cfg = KimiVLConfig.from_flavor(args.flavor)
        results["stream_cost"] = bench_stream_cost(cfg, device, dtype, *((3, 1, 5) if args.smoke else ()))
        _save(results)
    results["mix"] = bench_mix(args.batch * args.seq, d, args.sources, device, dtype, args.mix_iters)
    _save(results)
    if args.bwd_sweep:
        ns = [n for n in args.sources if 1 < n <= 8]
        results["bwd_sweep"] = bench_bwd_sweep(args.batch * args.seq, d, ns, device, dtype, args.mix_iters,
                                               tuple(args.sweep_kernels), args.sweep_match)
        _save(results)
    results["train"] = {}
    if "mla" in args.layouts:
        results["train"]["mla"] = _guarded(bench_train_group, args.flavor, "mla", args, device, dtype)
        _save(results)
    elapsed = time.perf_counter() - t0
    if "hybrid" in args.layouts and (args.no_hybrid or elapsed > args.budget_s):
        results["train"]["hybrid"] = {"skipped": f"--no-hybrid or past the budget ({elapsed:.0f} s)"}
    elif "hybrid" in args.layouts:
        results["train"]["hybrid"] = _guarded(bench_train_group, args.flavor, "hybrid", args, device, dtype)
    results["wall_s"] = time.perf_counter() - t0
    _save(results)
    print(table(results))


def _set_mix_constants(pairs: list[str]) -> None:
    """Apply ``--set NAME=VALUE`` pairs to ``kernels.attn_res.mix_triton`` for the run."""
    from kernels.attn_res import mix_triton as mt

    set_constants(mt, pairs, "bench_attnres")


def _kernel_diff_lines(layers: str, rows: list[dict]) -> list[str]:
    """The profiled kernels whose time differs most between standard and attnres_triton, as table rows."""
    lines = []
    for r in rows:
        lines.append(f"| {layers} | profile: {r['name'][:70]} ({r['base_calls']} -> {r['other_calls']} calls) | "
                     f"{r['base_ms']:.3f} -> {r['other_ms']:.3f} ms | | {r['diff_ms']:+.3f} ms | | | |")
    return lines


def table(results: dict) -> str:
    lines = [f"{results['device']}, flavor {results['flavor']}, {results['dtype']}, torch {results['torch']}, "
             f"{results['date']}, {results['wall_s']:.0f} s", "",
             "| N | naive fwd / bwd / fwd+bwd ms | function fwd / bwd / fwd+bwd ms | triton fwd / bwd / fwd+bwd ms "
             "| triton_table fwd / bwd / fwd+bwd ms | triton fwd / bwd GB/s | triton bwd / fwd |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["mix"]:
        cells = [f"{r[f'{i}_fwd_ms']:.3f} / {r[f'{i}_bwd_ms']:.3f} / {r[f'{i}_fwd_bwd_ms']:.3f}" for i in MIX_IMPLS]
        gbps = f"{r['triton_fwd_gbps']:,.0f} / {r['triton_bwd_gbps']:,.0f}"
        lines.append(f"| {r['n']} | " + " | ".join(cells) + f" | {gbps} | {r['triton_bwd_over_fwd']:.2f} |")
    if "bwd_sweep" in results:
        lines += ["", "| N | kernel | config | ms | GB/s | rel. err. vs default |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in results["bwd_sweep"]:
            head = f"| {r['n']} | {r['kernel']} | {r['config']} |"
            if "error" in r:
                lines.append(f"{head} error: {r['error'][:80]} | | |")
            else:
                lines.append(f"{head} {r['ms']:.3f} | {r['gbps']:,.0f} | {r['rel_err_vs_default']:.1e} |")
    if "stream_cost" in results:
        c = results["stream_cost"]
        lines += ["", f"Residual stream alone, one decoded token ({c['sublayers']} sublayers, blocks of "
                  f"{c['block_size']}, no_grad): standard {c['standard_host_us']:.0f} us host / "
                  f"{c['standard_synced_us']:.0f} us synced; two-phase block AttnRes "
                  f"{c['attnres_block_host_us']:.0f} / "
                  f"{c['attnres_block_synced_us']:.0f} us; host per launch: torch.add {c['launch_add_us']:.1f} us, "
                  f"phase 2 {c['launch_phase2_us']:.1f} us (through the JIT: {c['launch_phase2_jit_us']:.1f} us)"]
    lines += ["", "| layers | variant | step ms | tokens/s | overhead (best rounds) | overhead by round "
              "| step peak GiB | peak overhead |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for layers, group in results["train"].items():
        if "skipped" in group:
            lines.append(f"| {layers} | skipped: {group['skipped']} | | | | | | |")
            continue
        for v, r in group.get("variants", {}).items():
            rounds = " ".join(f"{x:+.1f}" for x in r.get("round_overhead_pct", []))
            lines.append(f"| {layers} | {v} | {1e3 * r['step_s']:.1f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['overhead_pct']:+.1f}% | {rounds} | {r['step_peak_gib']:.2f} | "
                         f"{r['peak_overhead_pct']:+.1f}% |")
            if "step_s_device_bound" in r:
                rounds = " ".join(f"{x:+.1f}" for x in r["round_overhead_device_bound_pct"])
                lines.append(f"| {layers} | {v}, device-bound | {1e3 * r['step_s_device_bound']:.1f} | | "
                             f"{r['overhead_device_bound_pct']:+.1f}% | {rounds} | | |")
        lines += decode_lines(layers, group.get("decode", {}))
        lines += decode_lines(layers, group.get("graph_decode", {}), "CUDA-graph decode")
        graph = group.get("graph_decode", {})
        lines += _kernel_diff_lines(f"{layers} (4 decode steps)", graph.get("kernel_diff", []))
        lines += _kernel_diff_lines(f"{layers} (4 decode steps, separate norms)", graph.get("kernel_diff_unfused", []))
        lines += _kernel_diff_lines(f"{layers} (4 decode steps, standard: fused add + norm against separate)",
                                    graph.get("kernel_diff_standard_fused", []))
        if "variants" not in group:  # --decode-only
            continue
        lines += _kernel_diff_lines(layers, group.get("kernel_diff", []))
        lines += _kernel_diff_lines(f"{layers} (deferred vs per-mix gradients)", group.get("kernel_diff_defer", []))
        lines.append(f"| {layers} | (stored block states: {group['block_states_gib']:.2f} GiB) | | | | | | |")
        t = group["mix_traffic_gb"]
        lines.append(f"| {layers} | (mix traffic floor: {t['forward']:.1f} GB fwd + {t['backward_sinks']:.1f} GB bwd "
                     f"= {t['ms_at_2.5TBps_sinks']:.1f} ms at 2.5 TB/s; no sinks {t['ms_at_2.5TBps_no_sinks']:.1f} ms; "
                     f"deferred {t['backward_deferred']:.1f} GB bwd, {t['ms_at_2.5TBps_deferred']:.1f} ms)"
                     " | | | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
