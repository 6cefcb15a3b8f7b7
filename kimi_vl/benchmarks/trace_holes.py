"""What the host was doing in a profiled run's GPU holes, from a Chrome trace (``profile_train_step
--pipeline-trace``): every hole between kernels, copies and memsets of at least ``--min-us``, with each host
thread's events that overlap it (CPU ops, CUDA runtime and driver calls, annotations), innermost last.

    python -m kimi_vl.benchmarks.trace_holes TRACE.json.gz --min-us 1000 --top 20
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

from kernels.profiling import gpu_holes

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def holes(events: list[dict], min_us: float) -> list[tuple[float, float, str]]:
    """``(start, end, next GPU event)`` of every idle stretch of the GPU (all streams merged) >= ``min_us``."""
    gpu = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
           if e.get("cat") in GPU and e.get("ph") == "X"]
    return gpu_holes(gpu, min_us)[0]


def host_in(events: list[dict], a: float, b: float) -> dict[int, list[tuple[float, float, str, str]]]:
    """Per host thread, its events overlapping ``[a, b]``: ``(start, dur, cat, name)`` by start."""
    by_tid: dict[int, list] = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST and e.get("ph") == "X":
            s, d = e["ts"], e.get("dur", 0)
            if s < b and s + d > a:
                by_tid[e["tid"]].append((s, d, e["cat"], e["name"]))
    return {t: sorted(v) for t, v in by_tid.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--min-us", type=float, default=1000.0)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--events", type=int, default=12, help="host events shown per thread and hole")
    args = p.parse_args(argv)
    events = load(args.trace)
    found = holes(events, args.min_us)
    print(f"{len(found)} holes >= {args.min_us:.0f} us, {sum(b - a for a, b, _ in found) / 1000:.1f} ms in all")
    for a, b, nxt in sorted(found, key=lambda h: h[0] - h[1])[: args.top]:
        print(f"\n== hole {b - a:.0f} us at {a:.0f}, then {nxt[:70]}")
        for tid, evs in host_in(events, a, b).items():
            longest = sorted(evs, key=lambda e: -min(e[0] + e[1], b) + max(e[0], a))[: args.events]
            print(f"  thread {tid}:")
            for s, d, cat, name in sorted(longest):
                print(f"    {s - a:+9.0f} us  {d:8.0f} us  {cat:<15} {name[:80]}")


if __name__ == "__main__":
    main()
