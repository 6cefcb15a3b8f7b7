"""One absorbed-MLA decode step's attention over a latent cache, by implementation (GPU; JSON to
``$OUT/bench_mla_decode.json`` and a table): the heads folded into one SDPA head (what ``MLAttention._absorbed``
does), the heads expanded over a shared cache (the earlier form), and explicit batched matmuls (scores in bf16, or
in fp32 where ``torch.bmm`` takes ``out_dtype``). Each is checked against an fp32 reference.

    python -m kimi_vl.benchmarks.bench_mla_decode --contexts 4096 32768 131072
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F


def _folded(q_BHE, key_BSE, value_BSR, mask_B11S, scale):
    b, h, e = q_BHE.shape
    return F.scaled_dot_product_attention(q_BHE[:, None], key_BSE[:, None], value_BSR[:, None], attn_mask=mask_B11S,
                                          scale=scale)[:, 0]


def _expanded(q_BHE, key_BSE, value_BSR, mask_B11S, scale):
    b, h, e = q_BHE.shape
    s = key_BSE.shape[1]
    k = key_BSE[:, None].expand(b, h, s, e)
    v = value_BSR[:, None].expand(b, h, s, value_BSR.shape[-1])
    return F.scaled_dot_product_attention(q_BHE[:, :, None], k, v, attn_mask=mask_B11S, scale=scale)[:, :, 0]


def _bmm(q_BHE, key_BSE, value_BSR, mask_B11S, scale, fp32_scores: bool = False):
    if fp32_scores:
        scores = torch.bmm(q_BHE, key_BSE.transpose(1, 2), out_dtype=torch.float32)
    else:
        scores = torch.bmm(q_BHE, key_BSE.transpose(1, 2)).float()
    scores = (scores * scale).masked_fill(~mask_B11S[:, 0], float("-inf"))
    return torch.bmm(scores.softmax(-1).to(value_BSR.dtype), value_BSR)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768, 131072])
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--rope", type=int, default=64)
    args = p.parse_args()
    from triton.testing import do_bench

    dev, dt = "cuda", torch.bfloat16
    impls = {"folded_sdpa": _folded, "expanded_sdpa": _expanded, "bmm_bf16_scores": _bmm,
             "bmm_fp32_scores": lambda *a: _bmm(*a, fp32_scores=True)}
    rows = []
    for s in args.contexts:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, args.heads, args.rank + args.rope, device=dev, dtype=dt, generator=g)
        key = torch.randn(1, s, args.rank + args.rope, device=dev, dtype=dt, generator=g)
        value = key[..., :args.rank]
        mask = torch.ones(1, 1, 1, s, dtype=torch.bool, device=dev)
        mask[..., -7:] = False
        scale = (args.rank + args.rope) ** -0.5
        ref = _bmm(q.float(), key.float(), value.float(), mask, scale)
        for name, fn in impls.items():
            try:
                inputs = (q, key, value, mask, scale)
                out = fn(*inputs)
                err = float((out.float() - ref).norm() / ref.norm())
                ms = do_bench(lambda fn=fn, inputs=inputs: fn(*inputs), warmup=5, rep=50)
                rows.append({"context": s, "impl": name, "us": 1e3 * ms, "rel_err": err,
                             "cache_GBps": key.numel() * 2 / (ms * 1e-3) / 1e9})
            except Exception as e:  # noqa: BLE001 - a missing out_dtype is a result here
                rows.append({"context": s, "impl": name, "error": f"{type(e).__name__}: {str(e)[:120]}"})
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_mla_decode.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                               "torch": torch.__version__, "rows": rows}, indent=2))
    print("| context | impl | us | cache GB/s | rel err vs fp32 |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['context']} | {r['impl']} | {r['error']} | | |")
        else:
            print(f"| {r['context']} | {r['impl']} | {r['us']:.1f} | {r['cache_GBps']:.0f} | {r['rel_err']:.1e} |")


if __name__ == "__main__":
    main()
