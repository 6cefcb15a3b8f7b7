"""Where a training step's wall time goes beyond its kernels: stretches where the GPU waits for the host.

    python -m kimi_vl.benchmarks.step_timeline [--flavor small] [--seq 4096] [--batch 8] [--steps 4]
        [--rounds 4] [--variants standard attnres_block] [--head-start-ms 300] [--between-ms 0]

For each variant (a ``residual_mode`` of the flavor's hybrid, ``NAME[:ENV=VALUE,...]`` to add environment
settings), rounds interleaved, bf16 on CUDA, the step as ``bench_attnres`` times it (zero_grad, forward with the
loss, backward; no synchronisation between the ``--steps`` steps of a round):

- ``step_ms``: the round's GPU time a step (CUDA events, best round; ``bench_attnres``'s measure);
- ``head_start_ms``: the same steps queued behind a ``torch.cuda._sleep`` of ``--head-start-ms``. The host enqueues
  while the GPU sleeps, so the device starts with work waiting and a stretch where the host is slower than the
  device costs nothing until the queue runs dry (its depth is bounded by the driver): the step's device-bound time.
  ``step_ms - head_start_ms`` is what the host's pace costs the step; ``head_start_step_gpu_ms``: every head-start
  round's GPU time of each step (events at the marks). ``--between-ms`` puts a sleep kernel between consecutive steps
  of those rounds (left out of their times): whether a step run right after another takes longer than one that
  follows an idle GPU;
- per step (median over the best round's steps): host time of the forward and the backward (clock at the marks,
  no synchronisation) and their GPU time (events at the same marks);
- ``lag_ms``: at each decoder layer's forward entry, the forward's end and the backward's end, how far the GPU ran
  behind the host (event time minus host time, both from one synchronised start). Near zero: the GPU had nothing
  queued there and waited for the host. Reported for the first and the last step of the best round.

JSON to ``$OUT/step_timeline.json`` and a table on stdout. ``--smoke`` runs the debug flavor on the CPU (host
clock only) to check the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from kernels.profiling import gpu_holes, kernel_events
from kimi_vl.benchmarks.attnres_common import sleep_cycles_per_ms, with_env
from kimi_vl.benchmarks.bench_attnres import _build, _config


class Marks:
    """Named time marks of one round: the host clock and, on CUDA, an event recorded on the current stream."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.items = cuda, []
        self.active = False

    def mark(self, name: str) -> None:
        if not self.active:
            return
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.items.append((name, time.perf_counter(), event))

    def times(self) -> list[tuple[str, float, float | None]]:
        """``(name, host ms, GPU ms)`` of every mark since the first (call after synchronising)."""
        _, h0, e0 = self.items[0]
        return [(n, 1e3 * (h - h0), None if e is None else e0.elapsed_time(e)) for n, h, e in self.items]


def _hook_layers(model, marks: Marks) -> list:
    def pre_hook(i: int) -> Callable:
        return lambda module, args: marks.mark(f"layer{i}")
    return [layer.register_forward_pre_hook(pre_hook(i)) for i, layer in enumerate(model.model.layers)]


def _step(model, ids: torch.Tensor, marks: Marks) -> None:
    model.zero_grad(set_to_none=True)
    marks.mark("start")
    loss = model(ids, labels=ids, use_cache=False).loss
    marks.mark("forward")
    loss.backward()
    marks.mark("backward")


def run_round(model, ids: torch.Tensor, steps: int, head_start_cycles: int, cuda: bool, between_cycles: int = 0
              ) -> dict:
    """One round of ``steps`` steps (after a synchronisation); with ``head_start_cycles`` behind a sleep kernel, and
    with ``between_cycles`` a sleep kernel between consecutive steps (not counted in the step times)."""
    marks = Marks(cuda)
    hooks = _hook_layers(model, marks)
    try:
        if cuda:
            torch.cuda.synchronize()
        marks.active = True
        marks.mark("base")
        if head_start_cycles:
            torch.cuda._sleep(head_start_cycles)
        marks.mark("awake")
        for k in range(steps):
            if k and between_cycles:
                marks.mark("pause")
                torch.cuda._sleep(between_cycles)
                marks.mark("resume")
            _step(model, ids, marks)
        marks.active = False
        if cuda:
            torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    return summarize_round(marks.times(), steps)


def summarize_round(times: list[tuple[str, float, float | None]], steps: int) -> dict:
    """Per-step host and GPU times and the GPU's lag behind the host at each mark, from ``Marks.times()``."""
    clock = 2 if times[0][2] is not None else 1  # GPU times when there are events, else the host clock
    at = {}
    per_step: list[list[tuple[str, float, float | None]]] = []
    for name, h, g in times:
        if name == "start":
            per_step.append([])
        if per_step:
            per_step[-1].append((name, h, g))
        at.setdefault(name, (h, g))
    awake = at["awake"][clock - 1]
    end = times[-1][clock]
    paused = sum(b[clock] - a[clock] for a, b in zip(times, times[1:]) if a[0] == "pause" and b[0] == "resume")
    out = {"step_ms": (end - awake - paused) / steps, "steps": []}
    for marks in per_step:
        m = {n: (h, g) for n, h, g in marks}
        row = {"host_fwd_ms": m["forward"][0] - m["start"][0], "host_bwd_ms": m["backward"][0] - m["forward"][0]}
        if clock == 2:
            row["gpu_fwd_ms"] = m["forward"][1] - m["start"][1]
            row["gpu_bwd_ms"] = m["backward"][1] - m["forward"][1]
            row["lag_ms"] = {n: g - h for n, h, g in marks}
        out["steps"].append(row)
    return out


def _median(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def parse_variant(spec: str) -> tuple[str, str, dict[str, str]]:
    """``NAME[:ENV=VALUE,...]`` -> (label, residual mode, environment)."""
    name, _, envs = spec.partition(":")
    env = {}
    for pair in filter(None, envs.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"step_timeline: variant {spec!r}: environment settings are ENV=VALUE, got {pair!r}")
        env[key] = value
    if name not in ("standard", "attnres_block", "attnres_full"):
        raise ValueError(f"step_timeline: variant {spec!r}: the residual mode must be standard, attnres_block or "
                         f"attnres_full, got {name!r}")
    return spec, name, env


def run(args) -> dict:
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    variants = [parse_variant(v) for v in args.variants]
    models = {mode: _build(_config(args.flavor, args.layers, mode), device, dtype) for _, mode, _ in variants}
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq), device=device)
    cycles = int(args.head_start_ms * sleep_cycles_per_ms(device)) if cuda and args.head_start_ms > 0 else 0
    between = int(args.between_ms * sleep_cycles_per_ms(device)) if cuda and args.between_ms > 0 else 0
    for _, mode, env in variants:  # warm-up: compile, allocate
        with_env(env, partial(run_round, models[mode], ids, 1, 0, cuda))
    rounds: dict[str, dict[str, list[dict]]] = {label: {"plain": [], "head_start": []} for label, _, _ in variants}
    for _ in range(args.rounds):
        for label, mode, env in variants:
            for kind, c in (("plain", 0), ("head_start", cycles)):
                if kind == "head_start" and not cycles:
                    continue
                rounds[label][kind].append(with_env(env, partial(run_round, models[mode], ids, args.steps, c, cuda,
                                                                 between if kind == "head_start" else 0)))
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "args": vars(args), "head_start_cycles": cycles, "variants": {}}
    for label, _, _ in variants:
        plain = min(rounds[label]["plain"], key=lambda r: r["step_ms"])
        row = {"step_ms": plain["step_ms"], "round_step_ms": [r["step_ms"] for r in rounds[label]["plain"]],
               "host_fwd_ms": _median(plain["steps"], "host_fwd_ms"),
               "host_bwd_ms": _median(plain["steps"], "host_bwd_ms"),
               "gpu_fwd_ms": _median(plain["steps"], "gpu_fwd_ms"),
               "gpu_bwd_ms": _median(plain["steps"], "gpu_bwd_ms"),
               "lag_first_step_ms": plain["steps"][0].get("lag_ms"),
               "lag_last_step_ms": plain["steps"][-1].get("lag_ms")}
        if rounds[label]["head_start"]:
            head = min(rounds[label]["head_start"], key=lambda r: r["step_ms"])
            row["head_start_ms"] = head["step_ms"]
            row["round_head_start_ms"] = [r["step_ms"] for r in rounds[label]["head_start"]]
            row["head_start_step_gpu_ms"] = [[st.get("gpu_fwd_ms", float("nan")) + st.get("gpu_bwd_ms", float("nan"))
                                              for st in r["steps"]] for r in rounds[label]["head_start"]]
        out["variants"][label] = row
    if args.gaps and cuda:
        out["gaps"] = {label: with_env(env, partial(device_gaps, models[mode], ids, cycles, args.gaps))
                       for label, mode, env in variants}
    if args.cprofile:
        out["cprofile"] = {label: with_env(env, partial(host_profile, models[mode], ids, args.cprofile, cuda))
                           for label, mode, env in variants}
    return out


def device_gaps(model, ids: torch.Tensor, head_start_cycles: int, top: int) -> dict:
    """One step queued behind a sleep kernel under ``torch.profiler``: the step's kernel time, the idle time between
    its kernels (all streams merged) and that idle time summed by the kernel that ended each wait (``top`` names).
    The sleep gives the host a lead, so the waits are the device's own (launch gaps), not the host's pace."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        torch.cuda._sleep(head_start_cycles)
        _step(model, ids, Marks(False))
        torch.cuda.synchronize()
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in kernel_events(prof)]
    return gaps_after_sleep(spans, top)


def gaps_after_sleep(spans: list[tuple[float, float, str]], top: int) -> dict:
    """:func:`device_gaps`'s summary of device spans ``(start us, end us, name)``: the spans after the first sleep
    kernel (``torch.cuda._sleep`` runs a kernel named ``spin_kernel``), their kernel time, window, busy and idle time,
    and the idle time summed by the span that ended each wait (the ``top`` largest)."""
    spans = sorted(spans)
    first = next(i for i, (_, _, name) in enumerate(spans) if "sleep" in name.lower() or "spin" in name.lower())
    spans = spans[first + 1:]
    holes, busy, window = gpu_holes(spans, 0.0)
    by_next: dict[str, list[float]] = {}
    for a, b, name in holes:
        by_next.setdefault(name, []).append(b - a)
    rows = sorted(({"next_kernel": n, "idle_ms": sum(v) / 1e3, "waits": len(v), "mean_us": sum(v) / len(v)}
                   for n, v in by_next.items()), key=lambda r: -r["idle_ms"])
    return {"kernels": len(spans), "kernel_ms": sum(e - s for s, e, _ in spans) / 1e3, "window_ms": window / 1e3,
            "busy_ms": busy / 1e3, "idle_ms": (window - busy) / 1e3, "waits": len(holes), "by_next_kernel": rows[:top]}


def host_profile(model, ids: torch.Tensor, top: int, cuda: bool) -> list[dict]:
    """One step under ``cProfile``: the ``top`` functions by own host time (ms), with their call counts."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    marks = Marks(cuda)
    prof.enable()
    _step(model, ids, marks)
    prof.disable()
    if cuda:
        torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    rows = [{"function": f"{Path(f).name}:{line}:{name}", "calls": nc, "own_ms": 1e3 * tt, "cum_ms": 1e3 * ct}
            for (f, line, name), (_, nc, tt, ct, _) in stats.items()]
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def _min_lag(lags: dict[str, float] | None) -> str:
    if not lags:
        return "-"
    name = min(lags, key=lags.get)
    return f"{lags[name]:.2f} ({name})"


def table(results: dict) -> str:
    lines = [f"{results['device']}, torch {results['torch']}, {results['date']}, flavor {results['args']['flavor']}, "
             f"{results['args']['batch']} x {results['args']['seq']}, {results['args']['steps']} steps a round, "
             f"{results['args']['rounds']} rounds", "",
             "| variant | step ms | head-start step ms | host fwd / bwd ms | GPU fwd / bwd ms | "
             "least lag ms, first step | least lag ms, last step |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in results["variants"].items():
        head = f"{r['head_start_ms']:.2f}" if "head_start_ms" in r else "-"
        lines.append(f"| {label} | {r['step_ms']:.2f} | {head} | {r['host_fwd_ms']:.2f} / {r['host_bwd_ms']:.2f} | "
                     f"{r['gpu_fwd_ms']:.2f} / {r['gpu_bwd_ms']:.2f} | {_min_lag(r['lag_first_step_ms'])} | "
                     f"{_min_lag(r['lag_last_step_ms'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--layers", choices=("hybrid", "mla"), default="hybrid")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="steps a round, no synchronisation between them")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["standard", "attnres_block"],
                   help="residual modes, each optionally with environment settings: NAME[:ENV=VALUE,...]")
    p.add_argument("--head-start-ms", type=float, default=300.0,
                   help="the sleep kernel ahead of the head-start rounds (0: no head-start rounds)")
    p.add_argument("--between-ms", type=float, default=0.0,
                   help="head-start rounds: a sleep kernel of this long between consecutive steps (not timed): "
                        "whether a step run right after another is slower than one after an idle GPU")
    p.add_argument("--gaps", type=int, default=0, metavar="TOP",
                   help="also one profiled step of each behind the head start: idle time between kernels, by the "
                        "TOP kernels that ended the waits")
    p.add_argument("--cprofile", type=int, default=0, metavar="TOP",
                   help="also one step of each variant under cProfile: the TOP functions by own host time")
    p.add_argument("--smoke", action="store_true", help="debug flavor on the CPU: checks the script")
    args = p.parse_args(argv)
    if args.smoke:
        args.flavor, args.seq, args.batch, args.steps, args.rounds = "debug", 16, 1, 2, 1
    results = run(args)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "step_timeline.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    for label, row in results["variants"].items():
        if "head_start_step_gpu_ms" in row:
            steps = " | ".join(" ".join(f"{t:.2f}" for t in r) for r in row["head_start_step_gpu_ms"])
            print(f"head-start rounds, GPU ms of each step, {label}: {steps}")
    for label, g in results.get("gaps", {}).items():
        print(f"\nDevice gaps, {label}: {g['kernels']} kernels, {g['kernel_ms']:.2f} ms of kernels, window "
              f"{g['window_ms']:.2f} ms, busy {g['busy_ms']:.2f}, idle {g['idle_ms']:.2f} in {g['waits']} waits; "
              "idle by the kernel that ended the wait (ms, waits, mean us):")
        print("\n".join(f"  {r['idle_ms']:7.3f} {r['waits']:5d} {r['mean_us']:6.1f}  {r['next_kernel'][:90]}"
                        for r in g["by_next_kernel"][:20]))
    for label, rows in results.get("cprofile", {}).items():
        print(f"\ncProfile, {label} (own ms, calls):")
        print("\n".join(f"  {r['own_ms']:8.2f} {r['calls']:7d}  {r['function']}" for r in rows[:15]))


if __name__ == "__main__":
    main()
