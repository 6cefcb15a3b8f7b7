"""What the 2-process gloo workers of tests/optim share: the command line, a free port, the process group."""

from __future__ import annotations

import gc
import os
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def init_gloo(rank: int, world: int, port: int, timeout_s: int) -> None:
    """One CPU thread per process and the gloo group on 127.0.0.1:``port``."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def end_gloo() -> None:
    """Destroy the group the safe way round (``kimi_vl/train/teardown.py``): the caller's wrapped models are gone
    (locals of a returned function; ``gc.collect`` frees their reference cycles) and every rank has arrived, so no
    FSDP / DDP object frees the group under gloo's worker threads. Destroying it earlier aborted a rank at exit
    (``terminate called without an active exception``) in about one 2-process run of ten on a loaded 2-core VM."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a plain tensor as it is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def spawn_main(worker: Callable[..., None], all_cases: Sequence[str]) -> None:
    """``python WORKER.py CASE|all [WORLD]``: ``worker(rank, world, cases, port)`` in WORLD processes (default 2)."""
    cases = list(all_cases) if sys.argv[1] == "all" else [sys.argv[1]]
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, cases, port), nprocs=world, join=True)
