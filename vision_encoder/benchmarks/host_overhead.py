"""Host overhead of one MoonViT forward and forward + backward on a many-chunk packed batch (CPU).

The GPU profile (``profile_moonvit``) shows the encoder host-bound: its wall time is the Python and dispatcher
cost of hundreds of small launches, not GPU work. That cost can be measured without a GPU: a *narrow* encoder
(``--width`` 48, 6 heads, 12 layers like ``small``; image sides of 2 or 4 patches, ``--max-side``) keeps the CPU
arithmetic small, so the host time below is dominated by the per-op overhead that the GPU run pays too. Counted per
call: ATen operators dispatched (all, and those that are not views: views launch no kernel) with a
``TorchDispatchMode``, and the host time (median and minimum of ``--iters``, without the counting mode): wall, and
the thread's CPU time, which a busy shared machine disturbs less. Each
call builds its batch's index tables afresh (the cache is cleared: an app step meets a new grid); the op counts are
also given with the tables cached. bf16
autocast like the training app; masked attention (one SDPA call per layer, as varlen is on the GPU). The CPU's masked
SDPA itself is not cheap (it scores all P^2 pairs), so the wall time is also taken with only that call replaced by a
one-op stand-in (``stub``: same shapes, same autograd graph around it): the host overhead without the attention
arithmetic.

    python -m vision_encoder.benchmarks.host_overhead                 # 40 images + 4 video chunks
    python -m vision_encoder.benchmarks.host_overhead --chunks 40,4 --json out.json
    KVL_ROPE_BACKEND=triton TRITON_INTERPRET=1 python -m vision_encoder.benchmarks.host_overhead   # op counts of
        # the fused RoPE path, each (interpreted) Triton launch counted as one op; no timings
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from vision_encoder.attention import MoonViTAttention
from vision_encoder.benchmarks.profile_moonvit import chunk_mix
from vision_encoder.config import moonvit_config
from vision_encoder.model import MoonViT


class OpCounter(TorchDispatchMode):
    """Counts the ATen operators dispatched while active, by name; ``views`` counts the aliasing ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        self.views += bool(func.is_view)
        return func(*args, **(kwargs or {}))


class CountedLaunch:
    """Stands in for a Triton kernel under ``TRITON_INTERPRET=1``: each launch counts as ONE op of the active
    :class:`OpCounter` (as it is one kernel on a GPU) and the interpreter's own tensor traffic is not counted."""

    def __init__(self, kernel, counter_box: list) -> None:
        self.kernel, self.counter_box = kernel, counter_box

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.counter_box:
                self.counter_box[0].ops[f"triton:{self.kernel.__name__}"] += 1
            with _disable_current_modes():
                return self.kernel[grid](*args, **kwargs)
        return launch


COUNTERS: list[OpCounter] = []  # the active counter, seen by CountedLaunch


def count_triton_launches() -> bool:
    """With ``KVL_ROPE_BACKEND=triton`` (interpreted on this CPU) wrap the RoPE kernel in :class:`CountedLaunch`."""
    if os.environ.get("KVL_ROPE_BACKEND") != "triton":
        return False
    from kernels.rope2d import rope_triton

    rope_triton._rope_kernel = CountedLaunch(rope_triton._rope_kernel, COUNTERS)
    return True


def stub_sdpa(q_THD: torch.Tensor, k_THD: torch.Tensor, v_THD: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``MoonViTAttention._sdpa`` with the SDPA call replaced by one ``addcmul`` (timing only: not attention)."""
    q, k, v = (t.transpose(0, 1)[None] for t in (q_THD, k_THD, v_THD))
    return torch.addcmul(v, q, k, value=1e-3)[0].transpose(0, 1)


def clear_tables() -> None:
    """Forget the cached host tables (``packed_tables``), as every step of the app meets a new grid."""
    try:
        from vision_encoder.packed_tables import host_tables
    except ImportError:  # the encoder before the host-built tables had no cache
        return
    host_tables.cache_clear()


def step(model: MoonViT, px: torch.Tensor, grid: torch.Tensor, backward: bool, cold: bool = True) -> None:
    if cold:
        clear_tables()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(px, grid).projected
    if backward:
        out.float().square().mean().backward()


def count_ops(model: MoonViT, px: torch.Tensor, grid: torch.Tensor, backward: bool) -> dict:
    """Ops of one call with the tables built (cold: what an app step pays) and with them cached (warm: the ops
    that reach the device; the difference is the host-side table build on small CPU tensors)."""
    res = {}
    for cold in (True, False):
        step(model, px, grid, backward, cold=cold)  # warms the cache for the warm count
        with OpCounter() as counter:
            COUNTERS[:] = [counter]
            step(model, px, grid, backward, cold=cold)
        COUNTERS.clear()
        total = sum(counter.ops.values())
        key = "" if cold else "_warm"
        res |= {f"aten_ops{key}": total, f"non_view_ops{key}": total - counter.views}
        if cold:
            res["top_ops"] = counter.ops.most_common(12)
    return res


def host_ms(model: MoonViT, px: torch.Tensor, grid: torch.Tensor, backward: bool, iters: int) -> dict:
    """Per call: wall ms and this thread's CPU ms (median, min). The thread CPU time is the steadier figure on a
    shared machine (time spent descheduled does not count); with one intra-op thread it is all the work."""
    for _ in range(2):
        step(model, px, grid, backward)
    walls, cpus = [], []
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        step(model, px, grid, backward)
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - t0)
    return {"wall_ms": [1000 * statistics.median(walls), 1000 * min(walls)],
            "cpu_ms": [1000 * statistics.median(cpus), 1000 * min(cpus)]}


def timings(model: MoonViT, px: torch.Tensor, grid: torch.Tensor, backward: bool, iters: int) -> dict:
    """:func:`host_ms` with the real masked SDPA and with :func:`stub_sdpa` in its place."""
    res = {"host_ms": host_ms(model, px, grid, backward, iters)}
    sdpa = MoonViTAttention.__dict__["_sdpa"]
    MoonViTAttention._sdpa = staticmethod(stub_sdpa)
    try:
        res["host_ms_stub_attention"] = host_ms(model, px, grid, backward, iters)
    finally:
        MoonViTAttention._sdpa = sdpa
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="40,4", help="IMAGES,VIDEO_CHUNKS (profile_moonvit.chunk_mix)")
    ap.add_argument("--max-side", type=int, default=4)
    ap.add_argument("--width", type=int, default=48)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = moonvit_config("small", hidden_size=args.width, intermediate_size=2 * args.width, out_hidden_size=64,
                         attention_backend="masked")
    model = MoonViT(cfg).train()
    images, _, videos = args.chunks.partition(",")
    grid = chunk_mix(int(images), int(videos or 0), args.max_side)
    px = torch.randn(int(grid.prod(-1).sum()), 3, 14, 14)
    res = {"torch": torch.__version__, "threads": args.threads, "width": args.width, "layers": cfg.num_layers,
           "patches": px.shape[0], "chunks": grid.shape[0], "variants": {}}
    interpreted = count_triton_launches()  # ops only: interpreted kernels take no meaningful time
    res["rope_backend"] = "triton (interpreted: op counts only)" if interpreted else "torch"
    for backward in (False, True):
        name = "fwd+bwd" if backward else "fwd"
        res["variants"][name] = count_ops(model, px, grid, backward)
        if not interpreted:
            res["variants"][name] |= timings(model, px, grid, backward, args.iters)
    print(f"MoonViT width {args.width}, {cfg.num_layers} layers, {res['patches']} patches in {res['chunks']} chunks, "
          f"{args.threads} thread(s)")
    print("| call | ATen ops (cached tables) | non-view ops (cached tables) | CPU ms (median / min) | same, stub "
          "attention | wall ms, stub attention |\n| --- | --- | --- | --- | --- | --- |")
    for name, r in res["variants"].items():
        cells = "n/a | n/a | n/a"
        if "host_ms" in r:
            times = [r["host_ms"]["cpu_ms"], r["host_ms_stub_attention"]["cpu_ms"],
                     r["host_ms_stub_attention"]["wall_ms"]]
            cells = " | ".join(f"{med:.1f} / {low:.1f}" for med, low in times)
        print(f"| {name} | {r['aten_ops']} ({r['aten_ops_warm']}) | {r['non_view_ops']} ({r['non_view_ops_warm']}) | "
              f"{cells} |")
    print("most frequent (fwd+bwd):", res["variants"]["fwd+bwd"]["top_ops"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
