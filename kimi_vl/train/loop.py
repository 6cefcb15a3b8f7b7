"""The training loop shared by every stage (``pretrain``, ``sft``), launched in-process or by accelerate.

One step = ``grad_accum`` micro-batches per process -> clip -> optimizer (MuonClip: Muon + AdamW +
QK-Clip) -> scheduler -> MoE bias update. Metrics go to ``metrics.jsonl`` (and TensorBoard); held-out
losses on the eval split every ``eval_every`` steps; atomic checkpoints every ``checkpoint_every``
steps and at the end; SIGTERM finishes the step, checkpoints and exits; a NaN loss stops the run
naming the step, keeping the last good checkpoint. The end of a stage writes ``<output_dir>/final``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, set_seed

from kernels.host_ints import remember
from kimi_vl.logs import MetricsWriter, print0, progress
from kimi_vl.modeling.flops import FlopModel
from kimi_vl.modeling.model import enable_activation_checkpointing
from kimi_vl.optim.builder import build_optimizer, build_scheduler
from kimi_vl.optim.qk_clip import QKClipStats
from kimi_vl.runconfig import save_config, to_dict
from kimi_vl.train import build
from kimi_vl.train.checkpoint import (
    architecture,
    export_pretrained,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from kimi_vl.train.config import TrainConfig
from kimi_vl.train.faults import GracefulStop, NonFiniteGuard
from kimi_vl.train.loss import align_row_losses, breakdown_sums, breakdown_values, mean_loss, token_losses
from kimi_vl.train.param_cast import ParamCaster
from kimi_vl.train.pygc import ScheduledGC
from kimi_vl.train.teardown import end_run

MODEL_KEYS = ("input_ids", "attention_mask", "cu_seqlens", "position_ids", "pixel_values", "image_grid_thw",
              "pixel_values_videos", "video_grid_thw")
MODALITIES = ("text", "image", "video")


class LoaderPosition:
    """Checkpointable handle on the resumable loader (registered with accelerate)."""

    def __init__(self, loader: Any):
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])


def model_inputs(batch: dict[str, Any], device: torch.device, multimodal: bool) -> dict[str, Any]:
    keys = MODEL_KEYS if multimodal else MODEL_KEYS[:4]
    # the grids stay on the host: the vision tower reads them there (a device copy would cost two synchronisations)
    inputs = {k: batch[k] if k.endswith("grid_thw") else batch[k].to(device, non_blocking=True)
              for k in keys if k in batch}
    cu = batch.get("cu_seqlens")
    if cu is not None and cu.device.type == "cpu" and inputs["cu_seqlens"].device.type != "cpu":
        remember(inputs["cu_seqlens"], [int(x) for x in cu.tolist()])  # the layers' host reads need no sync
    return inputs


def compute_loss(model: torch.nn.Module, batch: dict[str, Any], device: torch.device, multimodal: bool,
                 autocast: contextlib.AbstractContextManager, accelerator: Accelerator | None = None,
                 fused_head: bool = True) -> tuple[torch.Tensor, LossParts, torch.Tensor]:
    """Next-token loss of a packed batch, its breakdown (still on the device: read it with ``.values()`` once the
    step's backward is queued), and its number of target tokens (a device scalar).

    With ``accelerator`` over several processes the loss is ``local sum * world / global count`` so
    that DDP's gradient average weighs every target token of the global batch equally (and equals
    one process running the concatenated batch). Nothing here reads a device value on the host.

    ``fused_head``: the model returns per-row losses from its head's fused linear + cross entropy instead of the
    logits (``return_logits=False``; the same values and gradients, one read of the logits fewer on CUDA).
    """
    inputs = model_inputs(batch, device, multimodal)
    labels, position_ids = batch["labels"].to(device, non_blocking=True), inputs["position_ids"]
    head = {"labels": labels, "return_logits": False} if fused_head else {}
    with autocast:
        out = model(**inputs, use_cache=False, **head)
    if fused_head:
        loss_BL, mask_BL = align_row_losses(out.row_losses, labels, position_ids)
    else:
        loss_BL, mask_BL = token_losses(out.logits, labels, position_ids)
    loss = mean_loss(loss_BL, mask_BL)
    if accelerator is not None and accelerator.num_processes > 1:
        count = accelerator.reduce(mask_BL.sum().float(), reduction="sum")
        loss = (loss_BL * mask_BL).sum() * accelerator.num_processes / count.clamp(min=1)

    def sums(key: str, n: int) -> torch.Tensor | None:
        return breakdown_sums(loss_BL, mask_BL, batch[key].to(device, non_blocking=True), n)

    parts = LossParts([(sums("modality_ids", len(MODALITIES)), MODALITIES, "loss"),
                       (sums("source_ids", len(batch["sources"])), batch["sources"], "loss/src")])
    return loss, parts, mask_BL.sum()


class LossParts(list):
    """The loss breakdown of one micro-batch as device sums (:func:`breakdown_sums`), its names and prefixes."""

    def tensors(self) -> list[torch.Tensor]:
        return [sums_2K for sums_2K, _, _ in self if sums_2K is not None]

    def with_tensors(self, tensors: Iterable[torch.Tensor]) -> LossParts:
        """The same breakdown with :meth:`tensors` replaced, in order (e.g. by their host copies); from an iterator
        it takes only as many as it needs."""
        it = iter(tensors)
        return LossParts([(None if sums is None else next(it), names, prefix) for sums, names, prefix in self])

    def values(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for sums_2K, names, prefix in self:
            out.update(breakdown_values(sums_2K, names, prefix))
        return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[dict[str, Any]], device: torch.device, multimodal: bool,
             autocast: contextlib.AbstractContextManager) -> dict[str, float]:
    """Token-weighted held-out loss overall, per modality and per task family (data source)."""
    was_training = model.training
    model.eval()
    sums: dict[str, list[float]] = {}
    for batch in batches:
        with autocast:
            out = model(**model_inputs(batch, device, multimodal), use_cache=False)
        loss_BL, mask_BL = token_losses(out.logits, batch["labels"].to(device), batch["position_ids"].to(device))
        groups = {"eval/loss": mask_BL}
        for ids_key, names in (("modality_ids", MODALITIES), ("source_ids", batch["sources"])):
            ids = batch[ids_key].to(device)
            for i, name in enumerate(names):
                groups[f"eval/{name}/loss"] = mask_BL & (ids == i)
        for key, m in groups.items():
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += float(loss_BL[m].sum())
            acc[1] += float(m.sum())
    model.train(was_training)
    return {k: s / n for k, (s, n) in sums.items() if n > 0}


def _autocast(accelerator: Accelerator, precision: str) -> contextlib.AbstractContextManager:
    use_bf16 = precision in ("bf16", "bf16_params") or (precision == "auto" and accelerator.device.type == "cuda")
    if use_bf16:
        return torch.autocast(accelerator.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class QueuedStep:
    """A step queued on the device (:meth:`Trainer.queue_step`): its values being copied to the host (``ready``:
    the copy's CUDA event, None on the CPU) and what the host already knows."""

    t0: float  # when the step started, time.perf_counter()
    losses: torch.Tensor  # [grad_accum] host copy
    grad_norm: torch.Tensor | None  # [1] host copy
    parts: list[LossParts]  # host copies
    ready: torch.cuda.Event | None
    n_tokens: int
    flops: float
    skipped: dict[str, int]
    moe: dict[str, float]
    qk: QKClipStats | None  # reads its own host copy when first used
    muon: dict[str, float]
    lr: float
    tokens_total: int
    data_s: float = 0.0  # host seconds spent waiting for the step's batches (the loader falling behind)


def _start_host_copy(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
    """Host copies of small device tensors, started without waiting (pinned, non-blocking) and an event that marks
    their arrival; on the CPU the tensors themselves."""
    if not tensors or tensors[0].device.type != "cuda":
        return [t.detach() for t in tensors], None
    host = [t.detach().to("cpu", non_blocking=True) for t in tensors]
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def _batch_flops(flops: FlopModel, batch: dict[str, Any]) -> float:
    """Model FLOPs of one micro-batch (kimi_vl.modeling.flops: the backbone benchmark's formula plus the
    vision tower's patches)."""
    n_tokens = int(batch["attention_mask"].sum())
    n_patches = sum(int(batch[k].shape[0]) for k in ("pixel_values", "pixel_values_videos") if k in batch)
    n_images = sum(int(batch[k].shape[0]) for k in ("image_grid_thw", "video_grid_thw") if k in batch)
    return flops.step(int(batch["input_ids"].shape[-1]), n_tokens, n_patches, n_images)


def _peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return 989e12 if "H100" in name or "H200" in name else None


def compile_vision_blocks(model: torch.nn.Module, fsdp2: bool = False) -> int:
    """``compile_vision``: ``torch.compile(dynamic=True)`` of every MoonViT block in place (regional compilation:
    the encoder's own layout code and the QK max-logit pass stay eager); returns the number of blocks."""
    tower = getattr(model, "vision_tower", None)
    if tower is None:
        raise ValueError("compile_vision: the model has no vision tower (a text-only flavor); set it to false")
    if fsdp2:
        raise ValueError("compile_vision: not supported with FSDP2 (the sharding hooks would be traced); "
                         "use DDP or set it to false")
    for block in tower.blocks:
        block.compile(dynamic=True)
    return len(tower.blocks)


def set_cpu_threads(requested: int, on_gpu: bool) -> int:
    """Apply ``TrainConfig.cpu_threads`` (0 = auto: 1 on a GPU unless ``OMP_NUM_THREADS`` is set); returns the
    thread count in effect."""
    if requested > 0:
        torch.set_num_threads(requested)
    elif on_gpu and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    return torch.get_num_threads()


class Trainer:
    """Holds the state of one run; :meth:`run` trains until ``max_steps`` or a stop request."""

    def __init__(self, cfg: TrainConfig, accelerator: Accelerator | None = None):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        # broadcast_buffers=False: each rank keeps its own QK-Clip max-logit buffers (the optimizer
        # all-reduces them); DDP's default would overwrite them with rank 0's at every forward.
        ddp = DistributedDataParallelKwargs(broadcast_buffers=False,
                                            find_unused_parameters=cfg.ddp_find_unused_parameters)
        self.acc = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(), log_with="tensorboard" if cfg.tensorboard else None,
            project_dir=str(self.out), kwargs_handlers=[ddp])
        set_seed(cfg.seed)
        set_cpu_threads(cfg.cpu_threads, self.acc.device.type == "cuda")
        self.tokenizer = build.build_tokenizer(cfg)
        self.processor = build.build_processor(cfg)
        self.multimodal = self.processor is not None
        model = build.build_model(cfg, self.tokenizer)  # an incompatible init_from stops here, before the output
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.flop_model = FlopModel.of(model)  # parameter counts read once, before any sharding
        optimizer = build_optimizer(model, cfg.optim)
        scheduler = build_scheduler(optimizer, cfg.optim)
        self.loader = build.build_train_loader(cfg, self.tokenizer, self.processor, self.acc.process_index,
                                               self.acc.num_processes)
        self.model, self.optimizer, self.scheduler = self.acc.prepare(model, optimizer, scheduler)
        if cfg.compile:
            self.model = torch.compile(self.model)
        if cfg.compile_vision:
            compile_vision_blocks(self.unwrapped, fsdp2=bool(getattr(self.acc, "is_fsdp2", False)))
        self.position = LoaderPosition(self.loader)
        self.acc.register_for_checkpointing(self.position)
        self.autocast = _autocast(self.acc, cfg.precision)
        self.cast_params = self._param_caster(cfg)
        self.metrics = MetricsWriter(self.out, accelerator=self.acc if cfg.tensorboard else None)
        if cfg.tensorboard:
            self.acc.init_trackers("tb", config={k: str(v) for k, v in to_dict(cfg).items()})
        self.step = 0
        self.tokens = 0
        self.interrupted: str | None = None  # the signal that stopped the run early, if any
        self._eval_batches: list[dict[str, Any]] | None = None

    def _param_caster(self, cfg: TrainConfig):
        """``precision: bf16_params``: a :class:`ParamCaster` over the unwrapped model, else a no-op context."""
        if cfg.precision != "bf16_params":
            return contextlib.nullcontext
        if getattr(self.acc, "is_fsdp2", False) or self.acc.distributed_type.name == "FSDP":
            raise ValueError("precision=bf16_params (small_pretrain.yaml's default) is for one process or DDP; under "
                             "FSDP2 pass precision=bf16 (bf16 autocast over the sharded fp32 weights)")
        return ParamCaster(self.unwrapped, torch.bfloat16, cfg.keep_fp32_params)

    @property
    def unwrapped(self) -> torch.nn.Module:
        return self.acc.unwrap_model(self.model)

    def resume(self) -> None:
        path = resolve_resume(self.cfg.resume, self.out)
        if path is None:
            return
        state = load_checkpoint(self.acc, path, architecture(self.unwrapped.config))
        self.step, self.tokens = int(state["step"]), int(state.get("tokens", 0))
        print0(f"[train] resumed from {path} at step {self.step}")
        now = self._settings()
        changed = {k: (v, now.get(k)) for k, v in state.get("settings", {}).items() if now.get(k) != v}
        if changed:
            print0("[train] note: this run's settings differ from the checkpoint's: "
                   + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items()))

    def _settings(self) -> dict[str, Any]:
        """What a resumed run may change but should be told about: the shape of a step's batch."""
        data = self.cfg.data
        return {"data.batch_size": data.batch_size, "data.seq_len": data.seq_len, "grad_accum": self.cfg.grad_accum}

    def _batches(self) -> Iterator[dict[str, Any]]:
        while True:
            yielded = False
            for batch in self.loader:
                yielded = True
                yield batch
            if not yielded:
                raise RuntimeError(f"data.path={self.cfg.data.path!r}: the training loader produced no batch")

    def train_step(self, batches: Iterator[dict[str, Any]]) -> dict[str, Any]:
        """One optimizer step and its metrics (waits for the step to finish on the device)."""
        queued = self.queue_step(batches)
        return self.step_metrics(queued, time.perf_counter() - queued.t0)

    def queue_step(self, batches: Iterator[dict[str, Any]]) -> QueuedStep:
        """One optimizer step, queued on the device without waiting for it: the values to log are being copied to
        the host (:meth:`step_metrics` reads them). MoE balancing is the exception: it reads the expert load."""
        cfg, model = self.cfg, self.model
        t0 = time.perf_counter()
        losses, parts, n_tokens, flops = [], [], 0, 0.0
        skipped = {"data/corrupt": 0, "data/dropped": 0}
        data_s = 0.0
        for micro in range(cfg.grad_accum):
            t_data = time.perf_counter()
            batch = next(batches)
            data_s += time.perf_counter() - t_data
            sync = micro == cfg.grad_accum - 1
            with contextlib.nullcontext() if sync else self.acc.no_sync(model), self.cast_params():
                loss, loss_parts, _ = compute_loss(model, batch, self.acc.device, self.multimodal, self.autocast,
                                                   self.acc, cfg.fused_head_loss)
                self.acc.backward(loss / cfg.grad_accum)
            losses.append(loss.detach())
            parts.append(loss_parts)
            n_tokens += int(batch["attention_mask"].sum())  # a host tensor: no synchronisation
            flops += _batch_flops(self.flop_model, batch)
            state = batch.get("loader_state", {})
            skipped = {"data/corrupt": state.get("corrupt", 0), "data/dropped": state.get("dropped", 0)}
        grad_norm = self.acc.clip_grad_norm_(model.parameters(), cfg.grad_clip) if cfg.grad_clip > 0 else None
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        moe = self._update_moe_bias()
        n_tokens *= self.acc.num_processes
        self.tokens += n_tokens
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        if grad_norm is not None and hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        elif grad_norm is not None and not isinstance(grad_norm, torch.Tensor):  # some back ends return a float
            grad_norm = torch.tensor(float(grad_norm))
        scalars = [torch.stack(losses)] + ([grad_norm.detach().reshape(1)] if grad_norm is not None else [])
        host, ready = _start_host_copy(scalars + [t for p in parts for t in p.tensors()])
        rest = iter(host[len(scalars):])
        host_parts = [p.with_tensors(rest) for p in parts]  # each takes its own tensors, in order
        return QueuedStep(t0, host[0], host[1] if grad_norm is not None else None, host_parts, ready, n_tokens,
                          flops, skipped, moe, getattr(inner, "last_qk_stats", None),
                          dict(getattr(inner, "last_muon_stats", {}) or {}), self.scheduler.get_last_lr()[0],
                          self.tokens, data_s)

    def step_metrics(self, queued: QueuedStep, dt: float) -> dict[str, Any]:
        """The metrics of a queued step, ``dt`` its wall time; waits for its values' copy only (the device may be
        running a later step)."""
        cfg = self.cfg
        if queued.ready is not None:
            queued.ready.synchronize()
        total = sum(x / cfg.grad_accum for x in queued.losses.tolist())
        parts_sum: dict[str, float] = {}
        for parts in queued.parts:
            for k, v in parts.values().items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v / cfg.grad_accum
        qk = {} if queued.qk is None else queued.qk.to_dict(prefix="qk/")
        metrics: dict[str, Any] = {"loss": total, **parts_sum, "lr": queued.lr, "tokens": queued.tokens_total,
                                   "tokens_per_s": queued.n_tokens / dt, "step_time_s": dt,
                                   "data_wait_s": queued.data_s, **queued.skipped,
                                   **queued.moe, **qk, **queued.muon}
        if queued.grad_norm is not None:
            metrics["grad_norm"] = float(queued.grad_norm)
        peak = _peak_flops(self.acc.device)
        if peak:
            metrics["mfu"] = queued.flops / dt / peak  # this process's FLOPs over its own GPU's peak
        if self.acc.device.type == "cuda":  # the caching allocator's own counter: no synchronisation
            metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.acc.device) / 2**30
        return metrics

    def _update_moe_bias(self) -> dict[str, float]:
        """Aux-loss-free balancing from the *global* expert load: sum the per-rank counts first."""
        model = self.unwrapped
        if not hasattr(model, "update_moe_bias"):
            return {}
        if self.acc.num_processes > 1:
            for module in model.modules():
                counts = getattr(module, "tokens_per_expert", None)
                if isinstance(counts, torch.Tensor):
                    counts.copy_(self.acc.reduce(counts, reduction="sum"))
        return model.update_moe_bias()

    def eval_metrics(self) -> dict[str, float]:
        if self._eval_batches is None:
            self._eval_batches = build.eval_batches(self.cfg, self.tokenizer, self.processor)
        return evaluate(self.model, self._eval_batches, self.acc.device, self.multimodal, self.autocast)

    def checkpoint(self) -> Path:
        state = {"tokens": self.tokens, "architecture": architecture(self.unwrapped.config),
                 "settings": self._settings()}
        return save_checkpoint(self.acc, self.out, self.step, state, self.cfg.keep_last)

    def export(self) -> Path:
        final = self.out / "final"
        # FSDP2 shards the parameters (save_pretrained cannot read them): every rank joins the gather of a full
        # state dict, which rank 0 writes
        state_dict = self.acc.get_state_dict(self.model) if getattr(self.acc, "is_fsdp2", False) else None
        if self.acc.is_main_process:
            export_pretrained(self.unwrapped, final, self.tokenizer, state_dict=state_dict)
        self.acc.wait_for_everyone()
        return final

    def _record(self, guard: NonFiniteGuard, bar: Any, queued: QueuedStep, step: int, gc_s: float | None,
                dt: float, evaluate: bool = False) -> None:
        """Read step ``step``'s metrics, stop on a non-finite loss, add the held-out ones, log, advance the bar."""
        metrics = self.step_metrics(queued, dt)
        if gc_s is not None:
            metrics["gc_s"] = gc_s
        guard.check(step, metrics["loss"], metrics)
        if evaluate:
            metrics.update(self.eval_metrics())
        if step % self.cfg.log_every == 0 or step == self.cfg.max_steps:
            self.metrics.log(step, metrics)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}")

    def run(self) -> Path:
        """Train to ``max_steps``; return the export folder. After SIGTERM/SIGINT: the checkpoint written,
        with :attr:`interrupted` set to the signal's name."""
        cfg = self.cfg
        self.resume()
        guard = NonFiniteGuard()
        batches = self._batches()
        bar = progress(total=cfg.max_steps, initial=self.step, desc=f"{cfg.stage} {self.out.name}")
        # With defer_metrics, step N's values are read once step N+1 is queued, so the host prepares the next batch
        # (data, vision tower layout, launches) while the device still runs step N. Steps that evaluate, checkpoint,
        # stop or end are read at once.
        pending: tuple[QueuedStep, int, float | None] | None = None
        with GracefulStop() as stop, ScheduledGC(cfg.gc_every) as pygc:
            while self.step < cfg.max_steps:
                try:
                    queued = self.queue_step(batches)
                except BaseException:  # a failing step (OOM, a data error) must not lose the previous step's row
                    if pending is not None:
                        with contextlib.suppress(Exception):
                            self._record(guard, bar, *pending, dt=time.perf_counter() - pending[0].t0)
                    raise
                self.step += 1
                gc_s = pygc.after_step(self.step)
                if pending is not None:
                    self._record(guard, bar, *pending, dt=queued.t0 - pending[0].t0)
                    pending = None
                last = self.step == cfg.max_steps
                evaluate_now = bool(cfg.eval_every and self.step % cfg.eval_every == 0) or last
                checkpoint_now = bool(cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) and not last
                if cfg.defer_metrics and not (evaluate_now or checkpoint_now or last or stop.requested):
                    pending = (queued, self.step, gc_s)
                    continue
                self._record(guard, bar, queued, self.step, gc_s, dt=time.perf_counter() - queued.t0,
                             evaluate=evaluate_now)
                if checkpoint_now:
                    self.checkpoint()
                if stop.requested:
                    print0(f"[train] {stop.requested} at step {self.step}: checkpointing and exiting "
                           "(run the same command again to resume)")
                    bar.close()
                    self.interrupted = stop.requested
                    return self.checkpoint()
        bar.close()
        self.checkpoint()
        return self.export()

    def close(self) -> None:
        """End the run: finish the trackers and, over several processes, destroy the process group once the DDP
        wrapper is gone (``teardown.end_run`` says why the order matters). The trainer cannot train afterwards."""
        self.model = self.optimizer = self.scheduler = None  # the prepared objects: the wrapper must die first
        end_run(self.acc)


def train(cfg: TrainConfig, accelerator: Accelerator | None = None) -> Path:
    """Run ``cfg`` to its end; the export folder. A caller's ``accelerator`` is left open (its process group
    included), one made here is closed (:meth:`Trainer.close`)."""
    trainer = Trainer(cfg, accelerator)
    final = trainer.run()
    if accelerator is None:
        trainer.close()
    return final
