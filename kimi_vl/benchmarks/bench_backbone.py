"""GPU speed of the Kimi Linear backbone against an all-global-attention model of the same size (issues 5, 6).

One command, JSON to ``$OUT/bench_backbone.json`` plus a markdown table on stdout:

    python -m kimi_vl.benchmarks.bench_backbone [--flavor small] [--quick]

Measured in one run, bf16 weights, CUDA events after warm-up:
- training (forward + backward, no optimizer step) tokens/s and MFU at each ``--train-seqs`` length, for
  ``hybrid`` (the flavor's 3:1 KDA:MLA layout), ``full_attn`` (every layer MLA) and ``hybrid_attnres``
  (block AttnRes), with peak memory: ``--iters`` steps right after a synchronisation (the first of them runs at
  the host's pace until the launch queue fills), and again queued behind a GPU sleep of ``--head-start-ms``
  (device-bound, the pace of a training loop that never waits for the GPU, as ``kimi_vl.train.loop``);
- decode tokens/s (batch ``--decode-batch``, greedy steps after a cached prefill) and cache bytes per token at
  each ``--decode-contexts`` length, for the same variants.
MFU = achieved model FLOP/s / ``--peak-tflops`` (989 = H100 SXM dense bf16). Model FLOPs per token:
:func:`kimi_vl.modeling.flops.lm_flops_per_token` (the training app's MFU uses the same function): 6 x
(non-embedding parameters + LM head) + attention/KDA terms (causal MLA: 6 H (dq + dv) T / 2 per layer;
KDA: 3 x H (6 K^2 + 3 C K + C^2) per layer, C = 64, from ``../shared/REFERENCE.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernels.profiling import kernel_events, sync_sites
from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.benchmarks.attnres_common import sleep_cycles_per_ms
from kimi_vl.modeling.cache import output_cache
from kimi_vl.modeling.flops import lm_flops_per_token

HEADS = ("fused", "logits")


def variant_config(flavor: str, variant: str) -> KimiVLConfig:
    cfg = KimiVLConfig.from_flavor(flavor)
    n = cfg.num_hidden_layers
    if variant == "full_attn":
        return KimiVLConfig.from_flavor(flavor, layer_types=["mla"] * n)
    if variant == "hybrid_attnres":
        return KimiVLConfig.from_flavor(flavor, residual_mode="attnres_block")
    return cfg


def _time_cuda(fn, warmup: int, iters: int, sleep_cycles: int = 0) -> tuple[float, list[float]]:
    """Mean seconds per call of ``fn`` over ``iters`` back-to-back calls after ``warmup``, and each call's own
    seconds (events between the calls; no synchronisation inside the run). ``sleep_cycles``: the calls queue behind
    a ``torch.cuda._sleep`` of that many cycles, so the host enqueues ahead and they run device-bound (as in a
    training loop that does not wait for the GPU each step); else they start right after a synchronisation and the
    first runs at the host's pace until the queue fills."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    events[0].record()
    for i in range(iters):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    each = [a.elapsed_time(b) / 1000 for a, b in zip(events, events[1:])]
    return sum(each) / iters, each


def train_step(model, ids: torch.Tensor, head: str = "fused") -> Callable[[], None]:
    """One forward + backward of the next-token loss on ``ids`` (no optimizer step). ``head``: ``fused`` (the
    training app's default: the head's fused linear + cross entropy, ``return_logits=False``) or ``logits``."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")

    def step():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids, use_cache=False, return_logits=head == "logits").loss.backward()

    return step


def bench_train(model, cfg, seq: int, batch: int, peak: float, iters: int, sleep_cycles: int = 0,
                head: str = "fused") -> dict:
    """Training step time, tokens/s, MFU and peak memory; with ``sleep_cycles`` also the device-bound step
    (``_time_cuda``) and its MFU."""
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    model.train()
    step = train_step(model, ids, head)

    torch.cuda.reset_peak_memory_stats()
    sec, each = _time_cuda(step, warmup=2, iters=iters)
    tps = batch * seq / sec
    flops = lm_flops_per_token(model, seq) * batch * seq
    res = {"seq": seq, "batch": batch, "step_s": sec, "step_s_each": each, "tokens_per_s": tps,
           "mfu": flops / sec / (peak * 1e12), "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    if sleep_cycles:
        sec_d, each_d = _time_cuda(step, warmup=0, iters=iters, sleep_cycles=sleep_cycles)
        res.update(step_s_device_bound=sec_d, step_s_each_device_bound=each_d,
                   mfu_device_bound=flops / sec_d / (peak * 1e12))
    return res


# kernel-name patterns -> category, first match wins (Triton kernels keep their Python names)
CATEGORIES = (
    ("kda", r"^_(prep|scores2|state|output|gate_fwd|gate_bwd|l2_fwd|l2_bwd|bwd_dy|bwd_inter|bwd_intra_pair|bwd_state)"
            r"_kernel$"),
    ("short_conv", r"^_(fwd|dpre|dx|conv_bwd_stream|final_state|dstate|update)_kernel$"),
    ("loss", r"^_ce_(fwd|bwd|fwd_grad|fwd_grad_row)_kernel$|^_scale_rows_kernel$|SoftMax|nll_loss|cross_entropy"),
    ("norm/act", r"^_(norm_fwd|norm_bwd|norm_bwd_rows|silu_mul_fwd|silu_mul_bwd)_kernel$"),
    ("swiglu gemm", r"^_(gate_up_silu|down_silu_bwd)_kernel$"),  # KVL_SWIGLU_IMPL=fused: GEMM + activation
    ("attn_res", r"attn_res"),
    ("attention", r"flex_attention|flash|fmha|attention"),
    ("embedding", r"^_embed_(rows|join)_kernel$|embedding|compute_grad_weight|sum_and_scatter|RadixSort"),
    ("gemm", r"nvjet|gemm|cutlass|xmma|sm90_|sm80_|cublas"),
    ("copy/cast", r"copy|Memcpy|Memset|cat_|CatArray"),
    ("reduce", r"reduce|softmax|norm|cross_entropy|nll"),
    ("elementwise", r"elementwise|triton_poi|vectorized|unrolled"),
)


def categorise(name: str) -> str:
    return next((cat for cat, pat in CATEGORIES if re.search(pat, name)), "other")


def profile_train(model, cfg, seq: int, batch: int, top: int = 30, head: str = "fused") -> dict:
    """GPU time of one training step (after warm-up) by kernel, and by :data:`CATEGORIES`, in ms."""
    from torch.profiler import ProfilerActivity, profile

    step = train_step(model, torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda"), head)

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for ev in kernel_events(prof):
        k = kernels.setdefault(ev.name, [0.0, 0])
        k[0] += ev.device_time_total / 1000
        k[1] += 1
    cats: dict[str, float] = {}
    for name, (ms, _) in kernels.items():
        cats[categorise(name)] = cats.get(categorise(name), 0.0) + ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    syncs = sync_sites(step)
    return {"seq": seq, "batch": batch, "gpu_ms": sum(cats.values()), "sync_sites": syncs,
            "categories_ms": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": n[:120], "ms": ms, "calls": c, "category": categorise(n)}
                            for n, (ms, c) in ranked[:top]]}


def profile_table(variant: str, prof: dict) -> str:
    total = prof["gpu_ms"]
    lines = ["", f"profile {variant}, seq {prof['seq']} x batch {prof['batch']}: {total:.1f} ms of GPU kernels",
             "| category | ms | share |", "| --- | --- | --- |"]
    lines += [f"| {c} | {ms:.2f} | {ms / total:.1%} |" for c, ms in prof["categories_ms"].items()]
    lines += ["", "| kernel | category | calls | ms |", "| --- | --- | --- | --- |"]
    lines += [f"| {k['name'][:70]} | {k['category']} | {k['calls']} | {k['ms']:.2f} |" for k in prof["top_kernels"]]
    syncs = prof.get("sync_sites", {})
    lines += ["", f"host-device synchronisations in a step: {sum(syncs.values())}"
              + "".join(f"; {site} x{n}" for site, n in syncs.items())]
    return "\n".join(lines)


@torch.no_grad()  # as generate() runs: no autograd graph, and AttnRes takes its two-phase inference path
def bench_decode(model, cfg, context: int, batch: int, steps: int) -> dict:
    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, context), device="cuda")
    cache, chunk = None, 8192
    for s in range(0, context, chunk):  # chunked prefill bounds the activation memory at long context
        cache = output_cache(model(ids[:, s: s + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1))
    nbytes = cache.nbytes()
    tok = ids[:, -1:]
    for _ in range(2):  # warm-up steps on a copy-free path: the decode kernels' first launches compile them
        out = model(tok, past_key_values=cache, use_cache=True)
        cache, tok = output_cache(out), out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(tok, past_key_values=cache, use_cache=True)
        cache, tok = output_cache(out), out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / steps
    return {"context": context, "batch": batch, "step_s": sec, "tokens_per_s": batch / sec,
            "cache_bytes_per_token": nbytes / (batch * context)}


def bench_graph_decode(model, cfg, context: int, batch: int, steps: int) -> dict:
    """Greedy decode with every step replayed as one CUDA graph over a static cache (``kimi_vl.generation``): the
    GPU time of a token instead of the host's launch time. The static MLA cache attends its whole capacity
    (context + steps + a margin) under a mask."""
    from kimi_vl.generation import GraphDecoder

    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, context), device="cuda")
    dec = GraphDecoder(model, batch, context + 2 * steps + 8, use_graph=True)
    tok = dec.prefill(ids, chunk=8192).argmax(-1)
    for _ in range(steps // 2):  # warm
        tok = dec.step(tok).argmax(-1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = dec.step(tok).argmax(-1)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / steps
    del dec
    return {"context": context, "batch": batch, "step_s": sec, "tokens_per_s": batch / sec, "graph": True}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--train-seqs", type=int, nargs="*", default=[4096, 32768], help="none: no training runs")
    p.add_argument("--train-tokens", type=int, default=32768, help="tokens per training step (batch = this / seq)")
    p.add_argument("--decode-contexts", type=int, nargs="*", default=[32768, 131072], help="none: no decode runs")
    p.add_argument("--decode-batch", type=int, default=1)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--graph-decode", action="store_true",
                   help="also decode with each step replayed as a CUDA graph (kimi_vl.generation.GraphDecoder)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--head-start-ms", type=float, default=300.0,
                   help="also time the training steps queued behind a GPU sleep this long (device-bound; 0: not)")
    p.add_argument("--variants", nargs="+", default=["hybrid", "full_attn", "hybrid_attnres"])
    p.add_argument("--quick", action="store_true", help="short sequences, for a smoke run")
    p.add_argument("--profile", action="store_true",
                   help="also profile one training step per variant at the first --train-seqs length: GPU time by "
                        "kernel category and the top kernels (torch.profiler)")
    p.add_argument("--profile-top", type=int, default=30, help="with --profile: kernels listed by time (JSON, table)")
    p.add_argument("--head", choices=HEADS, default="fused",
                   help="the training steps' LM head + loss: fused (return_logits=False, the training app's default) "
                        "or logits (logits, then the loss)")
    args = p.parse_args()
    if args.quick:
        args.train_seqs, args.decode_contexts, args.decode_steps, args.iters = [1024], [4096], 8, 2
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flavor": args.flavor,
               "date": time.strftime("%Y-%m-%d"), "head": args.head, "train": {}, "decode": {}}
    cycles = int(args.head_start_ms * sleep_cycles_per_ms(torch.device("cuda"))) if args.head_start_ms > 0 else 0
    for variant in args.variants:
        cfg = variant_config(args.flavor, variant)
        model = KimiVLForCausalLM(cfg).to("cuda", torch.bfloat16)
        results["train"][variant] = [bench_train(model, cfg, s, max(1, args.train_tokens // s), args.peak_tflops,
                                                 args.iters, cycles, args.head) for s in args.train_seqs]
        if args.profile and args.train_seqs:
            seq = args.train_seqs[0]
            batch = max(1, args.train_tokens // seq)
            results.setdefault("profile", {})[variant] = profile_train(model, cfg, seq, batch, args.profile_top,
                                                                       args.head)
        model.zero_grad(set_to_none=True)
        results["decode"][variant] = [bench_decode(model, cfg, c, args.decode_batch, args.decode_steps)
                                      for c in args.decode_contexts]
        if args.graph_decode:
            results.setdefault("graph_decode", {})[variant] = [
                bench_graph_decode(model, cfg, c, args.decode_batch, args.decode_steps) for c in args.decode_contexts]
        del model
        torch.cuda.empty_cache()
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_backbone.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    for variant, prof in results.get("profile", {}).items():
        print(profile_table(variant, prof))


def table(results: dict) -> str:
    lines = [f"{results['device']}, flavor {results['flavor']}, torch {results['torch']}, {results['date']}", "",
             "| variant | seq | tokens/s | MFU | MFU device-bound | peak GiB |",
             "| --- | --- | --- | --- | --- | --- |"]
    for v, rows in results["train"].items():
        for r in rows:
            bound = f"{r['mfu_device_bound']:.1%}" if "mfu_device_bound" in r else ""
            lines.append(f"| {v} | {r['seq']} | {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {bound} | "
                         f"{r['peak_mem_gib']:.1f} |")
    for key, what in (("step_s_each", "steps (ms)"), ("step_s_each_device_bound", "device-bound steps (ms)")):
        lines += ["", f"{what}: " + "; ".join(f"{v} {r['seq']}: " + " ".join(f"{t * 1e3:.1f}" for t in r[key])
                                              for v, rows in results["train"].items() for r in rows if key in r)]
    lines += ["", "| variant | context | decode tokens/s | cache bytes/token |", "| --- | --- | --- | --- |"]
    for v, rows in results["decode"].items():
        lines += [f"| {v} | {r['context']} | {r['tokens_per_s']:,.1f} | {r['cache_bytes_per_token']:,.0f} |"
                  for r in rows]
    if results.get("graph_decode"):
        lines += ["", "| variant | context | CUDA-graph decode tokens/s |", "| --- | --- | --- |"]
        for v, rows in results["graph_decode"].items():
            lines += [f"| {v} | {r['context']} | {r['tokens_per_s']:,.1f} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
