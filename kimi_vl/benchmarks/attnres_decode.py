"""The decode half of ``bench_attnres.py``: block AttnRes against the standard residual in greedy decode.

- :func:`bench_decode_variants`: wall-clock decode through ``generate``'s path (launch-bound at batch 1);
- :func:`bench_graph_decode`: each step replayed as a CUDA graph (``kimi_vl.generation.GraphDecoder``), the GPU
  time of a token, with the input norms fused into the residual's kernels (both residuals) and without;
- :func:`bench_stream_cost`: the residual stream alone, host microseconds per token and per launch;
- :func:`decode_lines`: their table rows.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from kernels.profiling import diff_by_name
from kimi_vl import KimiVLConfig
from kimi_vl.benchmarks.attnres_common import profile_step, sync, with_env
from kimi_vl.benchmarks.bench_backbone import bench_decode


def _decode_variants(layers: str) -> dict[str, tuple[str, dict[str, str], bool]]:
    """name -> (residual mode, environment, autograd on)."""
    variants = {"standard": ("standard", {}, False), "attnres_block": ("attnres_block", {}, False)}
    if layers == "mla":
        variants["attnres_two_phase_torch"] = ("attnres_block", {"KVL_ATTNRES_TWO_PHASE": "torch"}, False)
    return variants


def bench_decode_variants(models: dict, cfg: KimiVLConfig, layers: str, args, device: torch.device) -> dict:
    """Greedy decode seconds per token of each variant (best of ``rounds``), overheads against the standard
    residual under the same autograd setting: of the best rounds, and the median of the per-round ratios."""
    if device.type != "cuda":
        return {"skipped": "decode timing needs CUDA"}
    variants = _decode_variants(layers)
    best = {v: float("inf") for v in variants}
    ratios = []  # attnres_block / standard within each round: slow drifts of the machine cancel
    for _ in range(args.rounds):
        seconds = {}
        for v, (res, env, grad) in variants.items():
            with torch.set_grad_enabled(grad):
                row = with_env(env, partial(bench_decode, models[res], cfg, args.decode_context, 1,
                                             args.decode_steps))
            seconds[v] = row["step_s"]
            best[v] = min(best[v], row["step_s"])
        ratios.append(seconds["attnres_block"] / seconds["standard"])
    for model in models.values():
        model.train()
    out = {"context": args.decode_context, "steps": args.decode_steps,
           **{f"{v}_tokens_per_s": 1 / s for v, s in best.items()},
           "overhead_pct": 100 * (best["attnres_block"] / best["standard"] - 1),
           "round_ratios": ratios, "overhead_median_pct": 100 * (statistics.median(ratios) - 1)}
    if "attnres_two_phase_torch" in best:
        out["two_phase_torch_overhead_pct"] = 100 * (best["attnres_two_phase_torch"] / best["standard"] - 1)
    return out


GRAPH_VARIANTS = {"standard": ("standard", "1"), "attnres_block": ("attnres_block", "1"),
                  "standard_unfused": ("standard", "0"), "attnres_block_unfused": ("attnres_block", "0")}


def bench_graph_decode(models: dict, cfg: KimiVLConfig, args, device: torch.device) -> dict:
    """Batch-1 greedy decode with each step replayed as a CUDA graph (``kimi_vl.generation.GraphDecoder``), standard
    vs block AttnRes: seconds per token over ``decode_steps`` replays (greedy pick outside the graph), rounds
    interleaved; overhead of the best rounds and the median of the per-round ratios. A replayed step costs the host
    one launch, so this times the GPU work that wall-clock decode without graphs hides under launch overhead.

    Both residuals run twice (:data:`GRAPH_VARIANTS`): with ``KVL_FUSED_NORM=1`` (the default: the standard
    residual's add and the next input norm in one kernel, AttnRes's norms inside its two-phase kernels), the
    headline ``overhead_*``, and with ``KVL_FUSED_NORM=0`` (separate norm launches in both), ``unfused_overhead_*``."""
    from kimi_vl.generation import GraphDecoder

    steps, rounds = args.decode_steps, args.graph_rounds
    graph = device.type == "cuda"  # on a CPU the same static-cache steps run eagerly (a check of this code only)
    sync = torch.cuda.synchronize if graph else (lambda: None)
    capacity = args.decode_context + steps * (rounds + 1) + 8 + 4
    ids = torch.randint(0, cfg.vocab_size, (1, args.decode_context), device=device)
    decoders, tokens = {}, {}
    for name, (res, fused) in GRAPH_VARIANTS.items():
        models[res].eval()

        def start(name=name, res=res) -> None:  # the env is read while capturing, so it holds for the replays
            decoders[name] = GraphDecoder(models[res], 1, capacity, use_graph=graph)
            tokens[name] = decoders[name].prefill(ids, chunk=8192).argmax(-1)
            for _ in range(steps):  # warm: one untimed round
                tokens[name] = decoders[name].step(tokens[name]).argmax(-1)

        with_env({"KVL_FUSED_NORM": fused}, start)
    best = {name: float("inf") for name in GRAPH_VARIANTS}
    ratios: dict[str, list[float]] = {"": [], "unfused_": []}
    for _ in range(rounds):
        seconds = {}
        for name, dec in decoders.items():
            sync()
            t0 = time.perf_counter()
            tok = tokens[name]
            for _ in range(steps):
                tok = dec.step(tok).argmax(-1)
            sync()
            seconds[name] = (time.perf_counter() - t0) / steps
            tokens[name] = tok
            best[name] = min(best[name], seconds[name])
        for tag in ratios:
            ratios[tag].append(seconds[f"attnres_block{tag and '_unfused'}"] / seconds[f"standard{tag and '_unfused'}"])
    out = {"context": args.decode_context, "steps": steps, "rounds": rounds, "capacity": capacity,
           **{f"{name}_tokens_per_s": 1 / sec for name, sec in best.items()},
           "fused_norm_gain_pct": {res: 100 * (best[f"{res}_unfused"] / best[res] - 1)
                                   for res in ("standard", "attnres_block")}}
    for tag, rs in ratios.items():
        suffix = tag and "_unfused"
        out[f"{tag}overhead_pct"] = 100 * (best[f"attnres_block{suffix}"] / best[f"standard{suffix}"] - 1)
        out[f"{tag}round_ratios"] = rs
        out[f"{tag}overhead_median_pct"] = 100 * (statistics.median(rs) - 1)
    if args.profile:  # the kernels of 4 eager steps on the same static caches (a kernel's GPU time is the graph's)
        def four_steps(dec: GraphDecoder) -> None:
            with torch.no_grad():
                for _ in range(4):
                    dec._forward_step()

        times = {name: with_env({"KVL_FUSED_NORM": GRAPH_VARIANTS[name][1]}, partial(profile_step,
                                                                                  partial(four_steps, dec)))
                 for name, dec in decoders.items()}
        out["kernel_diff"] = diff_by_name(times["standard"], times["attnres_block"], top=args.profile_top)
        out["kernel_diff_unfused"] = diff_by_name(times["standard_unfused"], times["attnres_block_unfused"],
                                                  top=args.profile_top)
        out["kernel_diff_standard_fused"] = diff_by_name(times["standard_unfused"], times["standard"],
                                                         top=args.profile_top)
    for model in models.values():
        model.train()
    return out


def bench_stream_cost(cfg: KimiVLConfig, device: torch.device, dtype: torch.dtype, tokens: int = 300,
                      rounds: int = 5, launches: int = 2000) -> dict:
    """The residual stream alone in a batch-1 decode step of ``cfg`` (no model): per sublayer ``input(i, norm)`` then
    ``add(i, out)`` with fixed outputs, then the final input, for the standard residual and the buffered Triton
    two-phase block AttnRes stream, under ``no_grad``. Per token: host microseconds with no synchronisation
    inside the loop (decode is launch-bound, so this is what a token's residual work costs the host) and the
    wall time with a synchronisation after every token (host + GPU latency); best of ``rounds``, interleaved. Also
    the host cost of one launch: ``torch.add`` into a preallocated output vs one phase-2 kernel, called directly
    (``two_phase_triton._Launch``) and through the JIT."""
    from kimi_vl.modeling.attn_res import AttnResStream, ResQuery, StandardStream
    from kimi_vl.modeling.norm import RMSNorm

    d, n_sub, block = cfg.hidden_size, cfg.num_sublayers, cfg.attnres_block_size
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 1, d, generator=gen).to(device, dtype)
    outs = [torch.randn(1, 1, d, generator=gen).to(device, dtype) for _ in range(n_sub)]
    queries = [ResQuery(torch.randn(1, d, generator=gen).to(device), torch.ones(d, device=device), 1e-6)
               for _ in range(n_sub + 1)]
    norm = RMSNorm(d).to(device, dtype)
    makers = {"standard": lambda: StandardStream(emb),
              "attnres_block": lambda: AttnResStream(emb, queries, block, "two_phase")}

    def token(make) -> torch.Tensor:
        stream = make()
        for i in range(n_sub):
            stream.input(i, norm)
            stream.add(i, outs[i])
        return stream.final(norm)

    def timed(make, sync_each: bool) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(tokens):
            token(make)
            if sync_each:
                sync(device)
        host = time.perf_counter() - t0
        sync(device)
        return 1e6 * host / tokens

    best: dict[str, float] = {}
    with torch.no_grad():
        for make in makers.values():
            token(make)  # compile and warm
        for _ in range(rounds):
            for name, make in makers.items():
                for sync_each, key in ((False, "host_us"), (True, "synced_us")):
                    best[f"{name}_{key}"] = min(best.get(f"{name}_{key}", float("inf")), timed(make, sync_each))
        best |= _launch_cost(device, dtype, d, queries, block, launches)
    for key in ("host_us", "synced_us"):
        best[f"overhead_{key}_pct"] = 100 * (best[f"attnres_block_{key}"] / best[f"standard_{key}"] - 1)
    return {"sublayers": n_sub, "block_size": block, "tokens": tokens, "rounds": rounds, **best}


def _launch_cost(device: torch.device, dtype: torch.dtype, d: int, queries: list, block: int, n: int = 2000
                 ) -> dict[str, float]:
    """Host microseconds per launch, no synchronisation in the loop: ``torch.add(out=)`` and one phase-2 kernel."""
    from kimi_vl.modeling.attn_res import BufferedTwoPhase

    x, y, z = (torch.randn(1, 1, d, device=device, dtype=dtype) for _ in range(3))
    two = BufferedTwoPhase(x, queries, block)
    two.input(0)  # phase 1 of block 0: the phase-2 buffers hold values

    calls = {"add": lambda: torch.add(x, y, out=z), "phase2": lambda: two.run.phase2(1, 1, 1, 1e-6, None, False, z)}
    out = {}
    for name, fn in [*calls.items(), ("phase2_jit", calls["phase2"])]:
        out[f"launch_{name}_us"] = with_env({"KVL_FAST_LAUNCH": "0" if name == "phase2_jit" else "1"},
                                            partial(_host_us, fn, device, n))
    return out


def _host_us(fn, device: torch.device, n: int) -> float:
    """Host microseconds per call of ``fn`` over ``n`` calls after one warm call (no synchronisation inside)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = 1e6 * (time.perf_counter() - t0) / n
    sync(device)
    return us


def decode_lines(layers: str, dec: dict, what: str = "decode") -> list[str]:
    if "overhead_pct" not in dec:
        return []
    lines = [f"| {layers} | {what} @ {dec['context']} (no_grad): standard {dec['standard_tokens_per_s']:.1f} vs "
             f"two-phase Triton {dec['attnres_block_tokens_per_s']:.1f} tok/s | | | {dec['overhead_pct']:+.1f}%"
             " | | | |"]
    if "overhead_median_pct" in dec:
        lines.append(f"| {layers} | {what}, median of {len(dec['round_ratios'])} per-round ratios | | | "
                     f"{dec['overhead_median_pct']:+.1f}% | | | |")
    if "unfused_overhead_pct" in dec:
        gain = dec["fused_norm_gain_pct"]
        lines.append(f"| {layers} | {what}, separate norm launches (KVL_FUSED_NORM=0): standard "
                     f"{dec['standard_unfused_tokens_per_s']:.1f} vs {dec['attnres_block_unfused_tokens_per_s']:.1f} "
                     f"tok/s (median of rounds {dec['unfused_overhead_median_pct']:+.1f}%; the fused norms gain "
                     f"{gain['standard']:+.1f}% / {gain['attnres_block']:+.1f}%) | | | "
                     f"{dec['unfused_overhead_pct']:+.1f}% | | | |")
    if "two_phase_torch_overhead_pct" in dec:
        lines.append(f"| {layers} | decode, two-phase PyTorch form: {dec['attnres_two_phase_torch_tokens_per_s']:.1f} "
                     f"tok/s | | | {dec['two_phase_torch_overhead_pct']:+.1f}% | | | |")
    return lines
