"""The training app's own loop, measured as it runs (``profile_train_step --pipeline-steps``): step k + 1 queued
before step k's values are read, no synchronisation at phase boundaries. Wall time and tokens per step, the host's
wait for batches, on CUDA the allocators' growth (pinned host blocks: ``cudaHostAlloc`` in the loader's pin thread
holds a driver lock the main thread's launches wait on), then a few steps under ``torch.profiler``: the device's
busy fraction and where it idled (``kernels.profiling.idle_gaps``), optionally as a gzipped Chrome trace
(``kimi_vl.benchmarks.trace_holes`` reads it)."""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kimi_vl.benchmarks.profile_train_step import PhaseTimer


def alloc_counters() -> dict[str, float]:
    """Cumulative CUDA allocator counters: pinned host blocks created (``cudaHostAlloc``, which holds a driver lock
    that other threads' launches wait on) and the time in those calls, device segments created, and retries
    (a failed ``cudaMalloc`` that freed the cache and synchronised the device)."""
    dev = torch.cuda.memory_stats()
    return {**_host_counters(), "device_allocs": float(dev.get("num_device_alloc", 0)),
            "alloc_retries": float(dev.get("num_alloc_retries", 0))}


def _host_counters() -> dict[str, float]:
    """The pinned host allocator's part of :func:`alloc_counters` (small: read after every step of the loop)."""
    host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    return {"host_allocs": float(host.get("num_host_alloc", 0)),
            "host_alloc_ms": float(host.get("host_alloc_time.total", 0)) / 1000,
            "host_alloc_mb": float(host.get("allocated_bytes.allocated", 0)) / 2**20}


def app_pipeline(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer, steps: int,
                 profile_steps: int, trace_path: Path | None = None) -> dict[str, Any]:
    """The app's own loop for ``steps`` steps, unsynchronised (queue step k + 1, then read step k): wall time,
    tokens per step and (CUDA) the allocator counters' growth over them; on CUDA then ``profile_steps`` more under
    ``torch.profiler`` for the device's busy time per step and where it idled (``trace_path``: also a gzipped Chrome
    trace of them, host threads and CUDA runtime calls included)."""
    from torch.profiler import ProfilerActivity, profile

    from kernels.profiling import idle_gaps, kernel_ms

    waits: list[float] = []
    trace: list[tuple[float, float, float]] = []  # per step: queued at (s), pinned blocks and MB created so far

    def run(steps: int) -> tuple[float, int]:
        tokens, pending = 0, None
        waits.clear()
        trace.clear()
        if timer.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            queued = trainer.queue_step(batches)
            tokens += queued.n_tokens
            waits.append(queued.data_s)
            if timer.cuda:
                c = _host_counters()
                trace.append((queued.t0 - t0, c["host_allocs"], c["host_alloc_mb"]))
            if pending is not None:
                trainer.step_metrics(pending, queued.t0 - pending.t0)
            pending = queued
        trainer.step_metrics(pending, time.perf_counter() - pending.t0)
        if timer.cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps, tokens // steps

    enabled, timer.enabled = timer.enabled, False
    try:
        before = alloc_counters() if timer.cuda else {}
        wall, tokens = run(steps)
        out: dict[str, Any] = {"steps": steps, "wall_s_per_step": wall, "tokens_per_step": tokens,
                               "tokens_per_s": tokens / wall, "data_wait_s": list(waits)}
        if timer.cuda:
            out["allocator"] = {k: v - before[k] for k, v in alloc_counters().items()}
            out["allocator_trace"] = [(t, n - before["host_allocs"], mb - before["host_alloc_mb"])
                                      for t, n, mb in trace]
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall_p, _ = run(profile_steps)
            if trace_path is not None and trainer.acc.is_main_process:
                _export_trace(prof, trace_path)
            busy = kernel_ms(prof) / 1000 / profile_steps
            out.update(profiled_steps=profile_steps, profiled_wall_s_per_step=wall_p, device_busy_s_per_step=busy,
                       device_busy_fraction=busy / wall_p, idle_gaps=idle_gaps(prof, min_us=20.0, top=12))
    finally:
        timer.enabled = enabled
    return out


def _export_trace(prof: Any, path: Path) -> None:
    """``prof``'s Chrome trace gzipped at ``path`` (a few steps' trace is hundreds of MB as text)."""
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def pipeline_lines(pipe: dict[str, Any]) -> list[str]:
    """The report's lines for :func:`app_pipeline`'s result: time per step, busy fraction, where the GPU waited."""
    busy = pipe.get("device_busy_fraction")
    lines = [f"  app loop, unsynchronised ({pipe['steps']} steps): {pipe['wall_s_per_step'] * 1e3:.1f} ms "
             f"a step ({pipe['tokens_per_s']:.0f} tok/s)"
             + (f"; device busy {busy:.0%} under the profiler" if busy is not None else "")]
    if pipe.get("data_wait_s"):
        waits = pipe["data_wait_s"]
        lines.append(f"  waiting for the loader: {sum(waits) / len(waits) * 1e3:.1f} ms a step on average, "
                     f"{sum(w > 0.01 for w in waits)} of {len(waits)} steps waited > 10 ms "
                     f"(max {max(waits) * 1e3:.0f} ms)")
    if "allocator" in pipe:
        a = pipe["allocator"]
        lines.append(f"  allocator over those steps: {a['host_allocs']:.0f} pinned blocks created "
                     f"({a.get('host_alloc_mb', 0):.0f} MB, {a['host_alloc_ms']:.1f} ms in cudaHostAlloc), "
                     f"{a['device_allocs']:.0f} device segments, {a['alloc_retries']:.0f} retries")
    trace = pipe.get("allocator_trace") or []
    for a in range(0, len(trace) - 1, 10):  # windows of 10 steps: step time, pinned blocks created
        b = min(a + 10, len(trace) - 1)
        (ta, na, ma), (tb, nb, mb) = trace[a], trace[b]
        lines.append(f"    steps {a + 1}-{b}: {(tb - ta) / (b - a) * 1e3:.1f} ms a step, {nb - na:.0f} pinned blocks "
                     f"({mb - ma:.0f} MB)")
    gaps = pipe.get("idle_gaps")
    if gaps and gaps["holes"]:
        lines.append(f"  GPU idle under the profiler: {gaps['idle_ms']:.1f} of {gaps['window_ms']:.1f} ms, "
                     f"{gaps['holes']} holes >= 20 us ({gaps['holes_ms']:.1f} ms); by what the host was in:")
        lines += [f"    {ms:8.2f} ms  {name[:90]}" for name, ms in gaps["idle_by_host"][:8]]
        lines.append("  by annotation: " + ", ".join(f"{name[:40]} {ms:.1f} ms"
                                                   for name, ms in gaps["idle_by_phase"][:6]))
        lines.append("  largest: " + "; ".join(
            f"{g['us']:.0f} us in {g['host'][:40]} before {g['next_kernel'][:30]}" for g in gaps["gaps"][:5]))
    return lines
