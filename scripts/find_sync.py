"""Where a training step of a flavor synchronises the host with the GPU: one warm step's forward, then its backward,
each run with ``torch.cuda.set_sync_debug_mode("error")``, printing the Python traceback of the first
synchronising call in each (or that there is none). GPU only.

    python scripts/find_sync.py --flavor small --seq 4096 --batch 8
"""

from __future__ import annotations

import argparse
import traceback
from collections.abc import Callable

import torch

from kimi_vl import KimiVLConfig, KimiVLForCausalLM


def raise_on_sync(phase: str, fn: Callable[[], object]) -> None:
    """Run ``fn`` with synchronisations raising; report the first one's traceback, or none."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        print(f"{phase}: no synchronisation")
    except RuntimeError as err:
        print(f"{phase}: {err}")
        traceback.print_exc()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--residual-mode", default="standard")
    args = p.parse_args()
    cfg = KimiVLConfig.from_flavor(args.flavor, residual_mode=args.residual_mode)
    model = KimiVLForCausalLM(cfg).cuda().to(torch.bfloat16).train()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")

    def loss() -> torch.Tensor:
        return model(ids, labels=ids, use_cache=False).loss

    loss().backward()  # warm: compilation, allocator
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    raise_on_sync("forward", loss)
    model.zero_grad(set_to_none=True)
    out = loss()
    raise_on_sync("backward", out.backward)


if __name__ == "__main__":
    main()
