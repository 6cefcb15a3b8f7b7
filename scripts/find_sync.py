"""Where a training step of a flavor synchronises the host with the GPU: runs one warm step with
``torch.cuda.set_sync_debug_mode("error")`` and prints the Python traceback of each synchronising call (the
step is repeated with that call's site allowed, up to ``--max`` sites). GPU only.

    python scripts/find_sync.py --flavor small --seq 4096 --batch 8
"""

from __future__ import annotations

import argparse
import traceback

import torch

from kimi_vl import KimiVLConfig, KimiVLForCausalLM


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

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids, use_cache=False).loss.backward()

    step()
    torch.cuda.synchronize()
    for phase in ("forward", "backward"):
        model.zero_grad(set_to_none=True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = model(ids, labels=ids, use_cache=False).loss if phase == "forward" else None
            if phase == "backward":
                torch.cuda.set_sync_debug_mode("default")
                loss = model(ids, labels=ids, use_cache=False).loss
                torch.cuda.set_sync_debug_mode("error")
                loss.backward()
            print(f"{phase}: no synchronisation")
        except RuntimeError as err:
            print(f"{phase}: {err}")
            traceback.print_exc()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
