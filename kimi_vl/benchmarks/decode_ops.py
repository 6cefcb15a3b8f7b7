"""Host work per decoded token, counted on a CPU: aten operators and Triton launches of one cached decode step.

Batch-1 decode of the small models is launch-bound on a GPU (session 6: 44-70 tokens/s at 4096 context, ~20 ms a
token for ~300 kernels), so the number of operators the host issues per token is what decode speed follows, and
it can be counted without a GPU. With ``--gpu-path`` every kernel dispatch takes the Triton path the GPU takes (KDA,
norms, short conv, AttnRes two-phase) through the Triton interpreter; a Triton launch counts as one operation and
the interpreter's own tensor work is not counted. Without it the CPU paths run (PyTorch KDA, norms, two-phase).

    python -m kimi_vl.benchmarks.decode_ops --flavor small --gpu-path   # JSON to $OUT/decode_ops.json + a table

Reported per residual mode (``standard``, ``attnres_block``): operators per token, of which Triton launches, the
most frequent operators, and the AttnRes - standard difference by operator.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.benchmarks.op_count import OpCounter, use_gpu_path
from kimi_vl.modeling.cache import output_cache


def ops_per_token(flavor: str, residual_mode: str, prompt: int = 32, seed: int = 0) -> dict[str, Any]:
    """One warm cached decode step of ``flavor`` at batch 1 after a ``prompt``-token prefill, counted."""
    torch.manual_seed(seed)
    cfg = KimiVLConfig.from_flavor(flavor, residual_mode=residual_mode)
    model = KimiVLForCausalLM(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (1, prompt))
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, tok = output_cache(out), out.logits[:, -1:].argmax(-1)
        out = model(tok, cache=cache, use_cache=True)  # warm: first-call work is not per token
        tok = out.logits[:, -1:].argmax(-1)
        counter = OpCounter()
        t0 = time.perf_counter()
        with counter:
            model(tok, cache=cache, use_cache=True)
        wall = time.perf_counter() - t0
    counts = dict(counter.counts)
    return {"residual_mode": residual_mode, "ops": sum(counts.values()), "triton_launches": counter.launches(),
            "wall_s_counted": wall, "counts": counts}


def table(results: dict[str, Any]) -> str:
    rows = results["modes"]
    lines = [f"{results['flavor']}, {'GPU kernel path (interpreter)' if results['gpu_path'] else 'CPU path'}, "
             f"{results['date']}", "", "| residual | ops per token | Triton launches | most frequent |",
             "| --- | --- | --- | --- |"]
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in collections.Counter(r["counts"]).most_common(6))
        lines.append(f"| {r['residual_mode']} | {r['ops']} | {r['triton_launches']} | {top} |")
    if len(rows) == 2:
        a, b = (collections.Counter(r["counts"]) for r in rows)
        diff = {k: b[k] - a[k] for k in sorted(a.keys() | b.keys()) if b[k] != a[k]}
        lines += ["", f"{rows[1]['residual_mode']} - {rows[0]['residual_mode']}: {rows[1]['ops'] - rows[0]['ops']:+d} "
                  f"ops ({100 * (rows[1]['ops'] / rows[0]['ops'] - 1):+.1f}%): {diff}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--gpu-path", action="store_true", help="count the GPU's kernel path through the interpreter")
    p.add_argument("--prompt", type=int, default=32)
    args = p.parse_args(argv)
    if args.gpu_path:
        use_gpu_path("decode_ops")
    results = {"flavor": args.flavor, "gpu_path": args.gpu_path, "date": time.strftime("%Y-%m-%d"),
               "torch": torch.__version__, "modes": [ops_per_token(args.flavor, m, args.prompt)
                                                     for m in ("standard", "attnres_block")]}
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_ops.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return results


if __name__ == "__main__":
    main()
