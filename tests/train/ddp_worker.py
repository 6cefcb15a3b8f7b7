"""Worker for test_ddp.py: train 2 steps on fixed batches, each rank taking its share of the rows.

Run as ``ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N ddp_worker.py DATA BATCHES OUT [VISION_FLAVOR [PRECISION]]``;
with a vision flavor the model carries a vision tower that the text-only batches never use (DDP must not stop on
it); PRECISION is the run config's ``precision`` (default fp32), or ``fp64_params``: fp32 with the ``bf16_params``
weight copies made in fp64 instead (exact, to test their gradient path under DDP).
"""

import faulthandler
import gc
import sys
from pathlib import Path

import torch

from kimi_vl.runconfig import load_config
from kimi_vl.train.config import TrainConfig
from kimi_vl.train.loop import Trainer
from kimi_vl.train.param_cast import ParamCaster


def select_rows(batch: dict, start: int, stop: int) -> dict:
    """Rows ``[start, stop)`` of a packed text batch, with ``cu_seqlens`` re-based to those rows."""
    L = batch["input_ids"].shape[1]
    out = {k: v[start:stop] for k, v in batch.items() if torch.is_tensor(v) and v.dim() == 2}
    cu = batch["cu_seqlens"].long()
    cu = cu[(cu >= start * L) & (cu <= stop * L)] - start * L
    out["cu_seqlens"] = cu.to(torch.int32)
    out["sources"] = batch["sources"]
    return out


def main(data: str, batches_file: str, out: str, vision_flavor: str = "null", precision: str = "fp32") -> None:
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails in 5 min with every thread's stack in stderr
    cast64 = precision == "fp64_params"
    precision = "fp32" if cast64 else precision
    cfg = load_config(TrainConfig, "kimi_vl/configs/debug_pretrain.yaml", [
        f"data.path={data}", f"output_dir={out}", f"model.vision_flavor={vision_flavor}", "data.seq_len=64",
        "data.batch_size=2", "optim.name=muonclip", "optim.ns_dtype=float32", "eval_batches=1",
        f"precision={precision}"])
    tr = Trainer(cfg)
    if cast64:  # the bf16_params mechanism with an exact (fp64) copy: checks its gradient plumbing under DDP
        tr.cast_params = ParamCaster(tr.unwrapped, torch.float64)
    rank, world = tr.acc.process_index, tr.acc.num_processes
    batches = torch.load(batches_file)
    rows = batches[0]["input_ids"].shape[0] // world
    mine = iter([select_rows(b, rank * rows, (rank + 1) * rows) for b in batches])
    losses = [tr.train_step(mine)["loss"] for _ in batches]
    if rank == 0:
        state = {k: v.detach().clone() for k, v in tr.unwrapped.state_dict().items()}
        torch.save({"state": state, "losses": losses}, Path(out) / "result.pt")
    tr.close()  # the order that cannot deadlock (kimi_vl/train/teardown.py): checked, since this test once hung there
    assert not torch.distributed.is_initialized(), "Trainer.close left the process group alive"
    alive = [o for o in gc.get_objects() if isinstance(o, torch.nn.parallel.DistributedDataParallel)]
    assert not alive, f"Trainer.close left {len(alive)} DDP wrapper(s) alive"


if __name__ == "__main__":
    main(*sys.argv[1:6])
