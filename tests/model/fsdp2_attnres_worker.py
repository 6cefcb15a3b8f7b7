"""Two-process gloo check (issue 9): the AttnRes model under accelerate's FSDP2 wrapping equals one process.

Usage: python tests/model/fsdp2_attnres_worker.py {lm,mm} {reshard,keep}
Applies ``accelerate.utils.fsdp_utils.fsdp2_prepare_model`` itself (``fully_shard`` per ``DecoderLayer``, the
embedding, a tail unit of the "final norm" and ``lm_head``, then the root) to the ``debug`` flavor with
``residual_mode=attnres_block`` (``lm``: KimiVLForCausalLM, ``mm``: KimiVLForConditionalGeneration), runs one
forward + backward per rank on its half of the batch, and compares each rank's loss and the reduced gradients
with a one-process copy. ``reshard``/``keep``: the layers' ``reshard_after_forward``. Prints one line on rank 0
and exits non-zero on a mismatch.
"""

from __future__ import annotations

import copy
import gc
import os
import socket
import sys
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LOSS_TOL, GRAD_TOL = 1e-5, 1e-4


def build(kind: str) -> torch.nn.Module:
    from kimi_vl.configuration import KimiVLConfig
    from kimi_vl.modeling.model import KimiVLForCausalLM
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

    torch.manual_seed(0)
    if kind == "mm":
        cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", 500, 501),
                                       residual_mode="attnres_block")
        model = KimiVLForConditionalGeneration(cfg)
    else:
        model = KimiVLForCausalLM(KimiVLConfig.from_flavor("debug", residual_mode="attnres_block"))
    with torch.no_grad():  # the zero-initialised queries would hide which parameters the mix reads
        for name, p in model.named_parameters():
            if name.endswith("_res_proj.weight"):
                p.normal_(0.0, 0.5)
    return model


def accelerate_fsdp2(model: torch.nn.Module, reshard: bool) -> torch.nn.Module:
    """What ``accelerate launch --config_file configs/accelerate/fsdp2.yaml`` does to the model."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["DecoderLayer"],
                                            reshard_after_forward=reshard, state_dict_type="SHARDED_STATE_DICT")
    acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None, mixed_precision="no",
                          is_main_process=dist.get_rank() == 0, device=torch.device("cpu"))
    return fsdp2_prepare_model(acc, model)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run(rank: int, world: int, kind: str, reshard: bool) -> tuple[float, float]:
    """``(max |loss - one-process loss|, max relative grad error)``."""
    base = build(kind)
    ref = copy.deepcopy(base)
    model = accelerate_fsdp2(base, reshard)
    ids = torch.randint(0, 400, (2 * world, 16), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids[2 * rank:2 * rank + 2], labels=ids[2 * rank:2 * rank + 2]).loss
    loss.backward()
    ref_losses = []
    for r in range(world):  # FSDP2 averages the ranks' gradients: the reference sums loss / world
        part = ref(input_ids=ids[2 * r:2 * r + 2], labels=ids[2 * r:2 * r + 2]).loss
        (part / world).backward()
        ref_losses.append(part.item())
    worst_grad = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if (p.grad is None) != (q.grad is None):
            raise SystemExit(f"rank {rank}: {name}: gradient is None in only one of FSDP2 / one process")
        if p.grad is not None:
            g, r = _full(p.grad), q.grad
            worst_grad = max(worst_grad, ((g - r).norm() / r.norm().clamp_min(1e-12)).item())
    with torch.no_grad():  # the training app's held-out eval: no grad, so the one process takes two-phase AttnRes
        mine = ids[2 * rank:2 * rank + 2]
        eval_diff = abs(model(input_ids=mine, labels=mine).loss.item() - ref(input_ids=mine, labels=mine).loss.item())
    return max(abs(loss.item() - ref_losses[rank]), eval_diff), worst_grad


def worker(rank: int, world: int, kind: str, reshard: bool, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    dloss, dgrad = run(rank, world, kind, reshard)
    if rank == 0:
        print(f"fsdp2 attnres {kind} reshard_after_forward={reshard}: |loss - one process| {dloss:.3e}, "
              f"max relative grad error {dgrad:.3e}")
    gc.collect()  # the FSDP2 model (a local of run) gone, every rank here, before the group goes (teardown.py)
    dist.barrier()
    dist.destroy_process_group()
    if dloss > LOSS_TOL or dgrad > GRAD_TOL:
        raise SystemExit(f"rank {rank}: FSDP2 differs from one process (loss {dloss:.3e}, grad {dgrad:.3e})")


def main() -> None:
    kind, reshard = sys.argv[1], sys.argv[2] == "reshard"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, kind, reshard, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
