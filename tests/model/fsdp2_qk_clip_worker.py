"""Two-process gloo check: QK-Clip's ``qk_clip_`` on FSDP2-sharded weights (``DTensor`` rows) equals one process.

Usage: python tests/model/fsdp2_qk_clip_worker.py
The multimodal ``debug`` model under accelerate's FSDP2 wrapping (as ``fsdp2_attnres_worker.py`` builds it); every
QK-Clip module (MoonViT blocks and MLA layers) scales its heads by a gamma with values below 1, in place on the
shards, and every parameter must then equal a one-process copy clipped the same way, exactly. Prints one line on
rank 0 and exits non-zero on a mismatch or an error.
"""

from __future__ import annotations

import copy
import gc
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp2_attnres_worker import _full, accelerate_fsdp2, build  # noqa: E402


def clip_both() -> tuple[list[str], dict[str, float]]:
    """The QK-Clip modules' names and each parameter's max |FSDP2 - one process| after clipping both copies. The
    FSDP2 model is a local here, gone when this returns, before the process group is destroyed
    (``kimi_vl/train/teardown.py``: a group destroyed under a live wrapper can abort at exit)."""
    ref = build("mm")
    model = accelerate_fsdp2(copy.deepcopy(ref), reshard=True)
    names = []
    with torch.no_grad():
        for (name, m), ref_m in zip(((n, m) for n, m in model.named_modules() if hasattr(m, "qk_clip_")),
                                    (m for m in ref.modules() if hasattr(m, "qk_clip_"))):
            gamma_H = torch.linspace(0.3, 1.0, m.qk_clip_num_heads)
            m.qk_clip_(gamma_H)
            ref_m.qk_clip_(gamma_H)
            names.append(name)
    diff = {n: (_full(p.detach()) - q.detach()).abs().max().item()
            for (n, p), q in zip(model.named_parameters(), ref.parameters())}
    return names, diff


def worker(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    names, diff = clip_both()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"fsdp2 qk_clip_: {len(names)} modules ({', '.join(names)}), max |FSDP2 - one process| "
              f"{max(diff.values()):.3e}")
    if len(names) < 2 or max(diff.values()) > 0:
        raise SystemExit(f"rank {rank}: FSDP2 qk_clip_ differs: {[(n, d) for n, d in diff.items() if d > 0][:5]}")


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
