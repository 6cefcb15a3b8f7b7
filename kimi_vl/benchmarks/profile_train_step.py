"""Where one training step's time goes: the training app's step, split into phases, against bare fwd+bwd runs.

Builds the :class:`kimi_vl.train.loop.Trainer` from a run config with ``key=value`` overrides, then runs
``--steps`` instrumented steps that mirror ``Trainer.train_step`` (same calls, same order) with timers at the
phase boundaries (``torch.cuda.synchronize`` before every reading on CUDA, so GPU work is charged to the
phase that queued it); each phase is the median over the steps. Nested phases (the vision tower, the MLA mask
build, the QK max-logit passes inside the forward, MuonClip's phases inside the optimizer) are measured with
wrappers and reported inclusive. Then fresh batches go through three *bare* fwd + CE + bwd variants with the
max-logit tracking off and no optimizer: ``full`` (the app's forward: vision + packed documents),
``backbone_packed`` (text backbone with ``cu_seqlens``) and ``backbone_unpacked`` (``[B, L]`` causal rows, the
path ``bench_backbone`` measures). ``--module-steps`` extra steps time each module type's forward; on CUDA the
host synchronisations of one step are counted by call site, and the dynamo graph count shows recompiles.

One command, CPU or GPU; JSON to ``$OUT/profile_train_step.json`` (or ``--out``)::

    python -m kimi_vl.benchmarks.profile_train_step --config kimi_vl/configs/small_pretrain.yaml \\
        data.path=/data/small_subset data.batch_size=4 --steps 6 --warmup 2 --torch-profile
    python -m kimi_vl.benchmarks.profile_train_step --config small_pretrain model.flavor=debug \\
        model.vision_flavor=debug data.path=/tmp/small_subset data.seq_len=512 data.batch_size=2 \\
        data.num_workers=0 precision=fp32 --steps 3 --warmup 1

Under ``accelerate launch`` it runs on every process (DDP collectives included) and rank 0 writes its own
per-process numbers. ``--torch-profile`` also writes the top operators of one step (``torch.profiler``);
``--host-profile`` cProfiles three more steps run as the app runs them (no phase syncs): host time per function.
``--pipeline-steps N`` (default 6) runs the app's own loop for N steps (``Trainer.queue_step``, step k's metrics
read after step k+1 is queued, no phase syncs): its wall time per step, and on CUDA, in N more steps under
``torch.profiler``, the device's busy fraction (below 1: the GPU waits for the host) and where it waits
(``kernels.profiling.idle_gaps``: the holes between kernels by what the host was doing meanwhile); that loop and
its report lines live in ``kimi_vl/benchmarks/app_loop.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kernels.profiling import sync_sites
from kimi_vl.benchmarks.app_loop import app_pipeline, pipeline_lines

PHASES = ("data", "h2d", "forward", "loss", "backward", "clip", "optim", "sched_zero", "moe_bias", "stats")
MODULE_TYPES = ("DecoderLayer", "KDALayer", "MLAttention", "MoE", "Router", "Experts", "SwiGLU", "MoonViTBlock")
NESTED = ("vision_tower", "mask_build", "qk_max_mla", "qk_max_vision", "optim/qk_stats", "optim/adamw",
          "optim/muon", "optim/qk_clip")


class PhaseTimer:
    """Wall-clock (and process CPU time) per named phase, synchronising the device before each reading (CUDA).
    Disabled (``enabled = False``: the app-loop and host-profile runs), its wrapped phases neither record nor
    synchronise (until session 13 they still synchronised: ~40 device synchronisations a step in the
    "unsynchronised" app loop at batch 24)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = {}
        self.cpu_totals: dict[str, float] = {}
        self.stack: list[str] = []  # the phases now open, innermost last
        self.enabled = True
        self.sync = True  # False: no device synchronisation at phase boundaries (host profiling)

    def now(self) -> float:
        if self.cuda and self.sync and self.enabled:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        if self.enabled:
            self.totals[name] = self.totals.get(name, 0.0) + seconds
            self.cpu_totals[name] = self.cpu_totals.get(name, 0.0) + cpu_seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0, c0 = self.now(), time.process_time()
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()
            self.add(name, self.now() - t0, time.process_time() - c0)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def reset(self) -> None:
        self.totals, self.cpu_totals = {}, {}


def instrument(trainer: Any, timer: PhaseTimer) -> Callable[[], None]:
    """Wrap the nested phases in place (vision tower, MLA mask build, the two QK max-logit passes, MuonClip);
    returns the function that undoes it."""
    import kimi_vl.modeling.model as model_mod
    import vision_encoder.attention as vision_attn
    from kimi_vl.modeling import attention as mla_mod

    patched = [(model_mod, "build_mask", "mask_build"), (mla_mod.MLAttention, "_track", "qk_max_mla"),
               (vision_attn, "max_logits_per_head", "qk_max_vision")]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patched]
    for owner, attr, name in patched:
        setattr(owner, attr, timer.wrap(name, getattr(owner, attr)))
    vision = getattr(trainer.unwrapped, "vision_tower", None)
    if vision is not None:
        vision.forward = timer.wrap("vision_tower", vision.forward)
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if hasattr(inner, "phase_hook"):
        last = {"t": 0.0}
        names = {"qk_stats": "optim/qk_stats", "adamw": "optim/adamw", "qk_clip": "optim/qk_clip"}

        def hook(phase: str) -> None:
            t = timer.now()
            if phase != "start":
                timer.add(names.get(phase, "optim/muon"), t - last["t"])
            last["t"] = t
        inner.phase_hook = hook

    def undo() -> None:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
        if vision is not None:
            del vision.forward
        if hasattr(inner, "phase_hook"):
            inner.phase_hook = None
    return undo


def module_forward_times(trainer: Any, batches: Iterator[dict[str, Any]], steps: int) -> dict[str, float]:
    """Forward seconds per step by module type (inclusive; a sync around every module call, so measured in
    extra steps apart from the phase timings): where a forward that is slower than expected spends it."""
    timer = PhaseTimer(trainer.acc.device)
    originals = []
    for module in trainer.unwrapped.modules():
        name = type(module).__name__
        if name in MODULE_TYPES:
            originals.append((module, module.__dict__.get("forward")))
            module.forward = timer.wrap(f"fwd/{name}", module.forward)
    outer = PhaseTimer(trainer.acc.device)
    outer.enabled = False
    try:
        for _ in range(steps):
            profiled_step(trainer, batches, outer)
    finally:
        for module, forward in originals:
            if forward is None:
                del module.forward
            else:
                module.forward = forward
    return {k: v / steps for k, v in sorted(timer.totals.items(), key=lambda kv: -kv[1])}


def count_ops(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer) -> dict[str, int]:
    """ATen operators dispatched in one more step, by innermost phase (a proxy for kernel launches: what a
    launch-bound GPU step pays for). Under the Triton interpreter (``--gpu-path``) each Triton launch counts once,
    under ``PHASE [triton]``, and the interpreter's own tensor work is not counted (``op_count.py``); on a GPU
    Triton launches are not aten operators and are not counted."""
    from kimi_vl.benchmarks.op_count import OpCounter, count_triton_launches

    if os.environ.get("TRITON_INTERPRET") == "1":
        count_triton_launches()

    def phase(name: str) -> str:
        key = timer.stack[-1] if timer.stack else "outside"
        return f"{key} [triton]" if name.startswith("triton:") else key

    enabled, timer.enabled = timer.enabled, False
    try:
        with OpCounter(phase) as counter:
            profiled_step(trainer, batches, timer)
    finally:
        timer.enabled = enabled
    return dict(sorted(counter.counts.items(), key=lambda kv: -kv[1]))


def host_profile(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer, out_dir: Path,
                 steps: int = 3) -> dict[str, Any]:
    """cProfile of ``steps`` more steps run as the app runs them (no synchronisation at phase boundaries), so the
    host's own time per Python function shows where a launch-bound step goes. Writes the top functions by
    cumulative and by own time to ``host_cprofile.txt``; returns the host seconds per step by source file (own
    time, the 25 largest) and the step's wall time under the profiler."""
    import cProfile
    import io
    import pstats

    quiet = PhaseTimer(trainer.acc.device)
    quiet.sync = quiet.enabled = False
    timer.sync, enabled, timer.enabled = False, timer.enabled, False
    prof = cProfile.Profile()
    try:
        if timer.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(steps):
            profiled_step(trainer, batches, quiet)
        prof.disable()
        if timer.cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
    finally:
        timer.sync, timer.enabled = True, enabled
    stats = pstats.Stats(prof)
    by_file: dict[str, float] = {}
    for (path, _, _), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        key = _short_path(path)
        by_file[key] = by_file.get(key, 0.0) + own / steps
    text = io.StringIO()
    for key in ("cumulative", "tottime"):
        text.write(f"== sorted by {key} (seconds over {steps} steps)\n")
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(60)
    if trainer.acc.is_main_process:
        (out_dir / "host_cprofile.txt").write_text(text.getvalue())
    top = dict(sorted(by_file.items(), key=lambda kv: -kv[1])[:25])
    return {"steps": steps, "wall_s_per_step_profiled": wall, "own_s_per_step_by_file": top}


def _short_path(path: str) -> str:
    """A source path relative to the repository or to ``site-packages`` (built-ins keep their ``~`` name)."""
    for marker in ("site-packages/", "/kimi_vl/", "/kernels/", "/vision_encoder/", "/data_pipelines/"):
        if marker in path:
            head = "" if marker == "site-packages/" else marker.strip("/") + "/"
            return head + path.split(marker, 1)[1]
    return path


def profiled_step(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer) -> int:
    """One step of ``Trainer.train_step`` (grad_accum micro-batches) with phase timers; returns its tokens
    (``attention_mask`` sum of this process, as the app counts them)."""
    from kimi_vl.train.loop import MODALITIES, model_inputs
    from kimi_vl.train.loss import breakdown_sums, breakdown_values, mean_loss, token_losses

    cfg, model, acc = trainer.cfg, trainer.model, trainer.acc
    n_tokens, pending = 0, []
    for micro in range(cfg.grad_accum):
        with timer.phase("data"):
            batch = next(batches)
        sync = micro == cfg.grad_accum - 1
        with contextlib.nullcontext() if sync else acc.no_sync(model), trainer.cast_params():
            with timer.phase("h2d"):
                inputs = model_inputs(batch, acc.device, trainer.multimodal)
                labels, pos = batch["labels"].to(acc.device), batch["position_ids"].to(acc.device)
            with timer.phase("forward"), trainer.autocast:
                out = model(**inputs, use_cache=False)
            with timer.phase("loss"):
                loss_BL, mask_BL = token_losses(out.logits, labels, pos)
                loss = mean_loss(loss_BL, mask_BL)
                if acc.num_processes > 1:
                    count = acc.reduce(mask_BL.sum().float(), reduction="sum")
                    loss = (loss_BL * mask_BL).sum() * acc.num_processes / count.clamp(min=1)
                pending += [(breakdown_sums(loss_BL, mask_BL, batch["modality_ids"].to(acc.device), len(MODALITIES)),
                          MODALITIES),
                         (breakdown_sums(loss_BL, mask_BL, batch["source_ids"].to(acc.device),
                                         len(batch["sources"])), batch["sources"])]
            with timer.phase("backward"):
                acc.backward(loss / cfg.grad_accum)
        n_tokens += int(batch["attention_mask"].sum())
    with timer.phase("clip"):
        if cfg.grad_clip > 0:
            float(acc.clip_grad_norm_(model.parameters(), cfg.grad_clip))
    with timer.phase("optim"):
        trainer.optimizer.step()
    with timer.phase("sched_zero"):
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    with timer.phase("moe_bias"):
        trainer._update_moe_bias()
    with timer.phase("stats"):  # the app reads the step's values after the optimizer step is queued
        qk = getattr(getattr(trainer.optimizer, "optimizer", trainer.optimizer), "last_qk_stats", None)
        json.dumps({} if qk is None else qk.to_dict(prefix="qk/"))
        for sums, names in pending:
            breakdown_values(sums, names, "loss")
    return n_tokens


def _text_ids(trainer: Any, batch: dict[str, Any]) -> torch.Tensor:
    """``input_ids`` with the media placeholders replaced by token 0 (the text backbone alone)."""
    ids = batch["input_ids"].to(trainer.acc.device)
    model = trainer.unwrapped
    for name in ("image_token_id", "video_token_id"):
        token = getattr(model, name, None)
        if token is not None:
            ids = ids.masked_fill(ids == token, 0)
    return ids


def bare_step(trainer: Any, batch: dict[str, Any], timer: PhaseTimer, variant: str) -> None:
    """A fwd + plain mean CE + bwd with the max-logit tracking off and no optimizer (grads dropped).

    ``full``: the whole model on the batch (vision tower, packed documents), as the app's forward;
    ``backbone_packed``: the text backbone + head on the same tokens with ``cu_seqlens`` (no vision);
    ``backbone_unpacked``: the same tokens as ``[B, L]`` causal rows, no ``cu_seqlens`` (what ``bench_backbone``
    measures, except for its dtype: the app keeps fp32 weights under the run's autocast, or bf16 copies of them
    with ``precision=bf16_params``).
    """
    import torch.nn.functional as F

    from kimi_vl.train.loop import model_inputs

    acc, model = trainer.acc, trainer.unwrapped
    labels = batch["labels"].to(acc.device)
    with trainer.cast_params():  # precision=bf16_params: the weight copies, as the app makes them
        with timer.phase(f"{variant}/forward"), trainer.autocast:
            if variant == "full":
                logits = model(**model_inputs(batch, acc.device, trainer.multimodal), use_cache=False).logits
            else:
                cu = batch["cu_seqlens"].to(acc.device) if variant == "backbone_packed" else None
                hidden = model.model(input_ids=_text_ids(trainer, batch), cu_seqlens=cu, use_cache=False)
                logits = model.lm_head(hidden.last_hidden_state)
        with timer.phase(f"{variant}/backward"):
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                                   ignore_index=-100)
            loss.backward()
    model.zero_grad(set_to_none=True)


BARE_VARIANTS = ("full", "backbone_packed", "backbone_unpacked")


def bare_round(trainer: Any, batch: dict[str, Any], timer: PhaseTimer) -> dict[str, dict[str, float]]:
    """Every bare variant once on ``batch``: ``{variant: {"wall": {...}, "cpu": {...}}}``."""
    out = {}
    set_tracking(trainer.unwrapped, False)
    try:
        for variant in BARE_VARIANTS:
            timer.reset()
            bare_step(trainer, batch, timer, variant)
            out[variant] = {"wall": dict(timer.totals), "cpu": dict(timer.cpu_totals)}
    finally:
        set_tracking(trainer.unwrapped, True)
    return out


def bare_summary(rounds: list[dict[str, dict[str, float]]], tokens: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tok = statistics.median(tokens)
    for variant in BARE_VARIANTS:
        fwd = statistics.median(r[variant]["wall"][f"{variant}/forward"] for r in rounds)
        bwd = statistics.median(r[variant]["wall"][f"{variant}/backward"] for r in rounds)
        cpu = statistics.median(sum(r[variant]["cpu"].values()) for r in rounds)
        out[variant] = {"step_s": fwd + bwd, "forward_s": fwd, "backward_s": bwd, "tokens_per_s": tok / (fwd + bwd),
                        "cpu_s": cpu}
    return out


def count_syncs(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer) -> dict[str, Any]:
    """CUDA only: host-device synchronisations in one step of this profiler (which reads the step's values at its
    end, as a synchronised timer must) and in one ``Trainer.queue_step`` (the app's own step, whose values are read
    later, after the next step is queued)."""
    timer.enabled = False
    sites = sync_sites(lambda: profiled_step(trainer, batches, timer))
    app_sites = sync_sites(lambda: trainer.queue_step(batches))
    timer.enabled = True
    return {"total": sum(sites.values()), "sites": sites,
            "queue_step_total": sum(app_sites.values()), "queue_step_sites": app_sites}


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def set_tracking(model: torch.nn.Module, on: bool) -> None:
    for m in model.modules():
        if hasattr(m, "track_max_logits"):
            m.track_max_logits = on


def batch_shape(batch: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"input_ids": list(batch["input_ids"].shape)}
    if "cu_seqlens" in batch:
        info["documents"] = int(batch["cu_seqlens"].numel() - 1)
    for key in ("pixel_values", "pixel_values_videos"):
        if key in batch and batch[key] is not None:
            info[f"{key}_patches"] = int(batch[key].shape[0])
    return info


def summarise(per_step: list[dict[str, float]], cpu_step: list[dict[str, float]], tokens: list[int]) -> dict[str, Any]:
    """Median over the instrumented steps of every phase (robust to a shared, noisy host) and of the step."""
    keys = sorted({k for d in per_step for k in d})
    per = {k: statistics.median(d.get(k, 0.0) for d in per_step) for k in keys}
    cpu = {k: statistics.median(d.get(k, 0.0) for d in cpu_step) for k in keys}
    steps_s = [sum(d.get(p, 0.0) for p in PHASES) for d in per_step]
    step_s = statistics.median(steps_s)
    tok = statistics.median(tokens)
    return {"step_s": step_s, "step_s_all": steps_s, "tokens_per_step": tok, "tokens_per_s": tok / step_s,
            "cpu_s": statistics.median(sum(d.get(p, 0.0) for p in PHASES) for d in cpu_step),
            "phase_s": per, "phase_share": {k: per[k] / step_s for k in per}, "phase_cpu_s": cpu}


def torch_profile(trainer: Any, batches: Iterator[dict[str, Any]], timer: PhaseTimer,
                  out_dir: Path) -> dict[str, Any]:
    """One more step under ``torch.profiler``: top operators by device time and by CPU time, and how busy the
    device was (the sum of kernel time over the step's wall time: well under 1 means launch/host bound)."""
    from torch.profiler import ProfilerActivity, profile

    from kernels.profiling import kernel_ms

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if timer.cuda else [])
    t0 = timer.now()
    with profile(activities=acts, record_shapes=False) as prof:
        profiled_step(trainer, batches, timer)
    wall = timer.now() - t0
    events = prof.key_averages()
    tables = {key: events.table(sort_by=key, row_limit=40)
              for key in (("self_device_time_total",) if timer.cuda else ()) + ("self_cpu_time_total",)}
    busy_s = kernel_ms(prof) / 1000 if timer.cuda else 0.0  # kernels only: annotations span kernels counted
    if trainer.acc.is_main_process:
        text = "\n\n".join(f"sorted by {k}\n{t}" for k, t in tables.items())
        (out_dir / "profile_train_step_ops.txt").write_text(text)
    return {"wall_s": wall, "device_busy_s": busy_s, "device_busy_fraction": busy_s / wall if timer.cuda else None,
            "top": {k: t.splitlines()[:30] for k, t in tables.items()}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a run config (path or shipped name)")
    p.add_argument("--steps", type=int, default=3, help="instrumented steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation, allocator)")
    p.add_argument("--module-steps", type=int, default=1,
                   help="extra steps timing each module type's forward (0: skip)")
    p.add_argument("--count-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="count ATen ops per phase in one extra step (default: on CPU only)")
    p.add_argument("--torch-profile", action="store_true", help="also write the top ops of one more step")
    p.add_argument("--host-profile", action="store_true",
                   help="also cProfile 3 more steps run without phase syncs (host time per function)")
    p.add_argument("--gpu-path", action="store_true",
                   help="on a CPU: every kernel through its Triton path under the interpreter (op_count.GPU_PATH_ENV), "
                        "so --count-ops counts what the GPU's host issues")
    p.add_argument("--pipeline-steps", type=int, default=6,
                   help="steps of the app's own unsynchronised loop (then more under torch.profiler on CUDA); "
                        "0: skip")
    p.add_argument("--pipeline-profile-steps", type=int, default=0,
                   help="steps of that loop under torch.profiler (default: as many as --pipeline-steps)")
    p.add_argument("--pipeline-trace", action="store_true",
                   help="also write those profiled steps as a gzipped Chrome trace (pipeline_trace.json.gz)")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else the current folder)")
    p.add_argument("overrides", nargs="*", help="key=value run-config overrides")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.gpu_path:
        from kimi_vl.benchmarks.op_count import use_gpu_path

        use_gpu_path("profile_train_step")
    from kimi_vl.runconfig import load_config
    from kimi_vl.train.config import TrainConfig, resolve_config_path
    from kimi_vl.train.loop import Trainer

    out_dir = Path(args.out or os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="kvl_profile_")
    overrides = [f"output_dir={run_dir}", "resume=never", "tensorboard=false", *args.overrides]
    cfg = load_config(TrainConfig, resolve_config_path(args.config), overrides)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    build_s = time.perf_counter() - t0
    timer = PhaseTimer(trainer.acc.device)
    undo = instrument(trainer, timer)
    try:
        batches = trainer._batches()
        timer.enabled = False
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            profiled_step(trainer, batches, timer)
        bare_round(trainer, next(batches), timer)  # compiles / warms the bare variants too
        warmup_s = time.perf_counter() - t0
        graphs_warm = dynamo_graphs()
        timer.enabled = True
        # app steps and bare rounds alternate, so that a drifting host load hits both alike
        per_step, cpu_step, tokens, rounds, bare_tokens = [], [], [], [], []
        for _ in range(args.steps):
            timer.reset()
            tokens.append(profiled_step(trainer, batches, timer))
            per_step.append(dict(timer.totals))
            cpu_step.append(dict(timer.cpu_totals))
            batch = next(batches)
            bare_tokens.append(int(batch["attention_mask"].sum()))
            rounds.append(bare_round(trainer, batch, timer))
        app = summarise(per_step, cpu_step, tokens)
        nested = {k: app["phase_s"].get(k, 0.0) for k in NESTED}
        graphs_after = dynamo_graphs()
        bare = bare_summary(rounds, bare_tokens)
        result: dict[str, Any] = {
            "config": str(args.config), "overrides": args.overrides, "device": str(trainer.acc.device),
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "world": trainer.acc.num_processes,
            "build_s": build_s, "warmup_s": warmup_s, "steps": args.steps, "batch": batch_shape(batch), "app": app,
            "nested_s": nested, "bare": bare, "app_over_bare_full": app["step_s"] / bare["full"]["step_s"],
            "app_over_backbone_unpacked": app["step_s"] / bare["backbone_unpacked"]["step_s"],
            "dynamo_graphs": {"after_warmup": graphs_warm, "after_steps": graphs_after},
        }
        write = (lambda: (out_dir / "profile_train_step.json").write_text(json.dumps(result, indent=1))) \
            if trainer.acc.is_main_process else (lambda: None)  # under accelerate launch: rank 0's numbers
        write()  # the core numbers first: an optional part that fails below does not lose them
        extras: list[tuple[str, bool, Callable[[], Any]]] = [
            ("ops_per_step", args.count_ops if args.count_ops is not None else not timer.cuda,
             lambda: count_ops(trainer, batches, timer)),
            ("module_fwd_s", args.module_steps > 0, lambda: module_forward_times(trainer, batches, args.module_steps)),
            ("syncs_per_step", timer.cuda, lambda: count_syncs(trainer, batches, timer)),
            ("torch_profile", args.torch_profile, lambda: torch_profile(trainer, batches, timer, out_dir)),
            ("host_profile", args.host_profile, lambda: host_profile(trainer, batches, timer, out_dir)),
            ("pipeline", args.pipeline_steps > 0, lambda: app_pipeline(trainer, batches, timer, args.pipeline_steps,
                                                 args.pipeline_profile_steps or args.pipeline_steps,
                                                 out_dir / "pipeline_trace.json.gz" if args.pipeline_trace else None)),
        ]
        for key, wanted, fn in extras:
            if wanted:
                try:
                    result[key] = fn()
                except Exception as exc:  # noqa: BLE001 - reported in the JSON, the rest still runs
                    result.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"[:2000]
                write()
        if timer.cuda:
            stats = torch.cuda.memory_stats()
            result["alloc_retries"] = int(stats.get("num_alloc_retries", 0))
            result["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        write()
        if trainer.acc.is_main_process:
            print(report(result))
    finally:
        undo()
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def report(r: dict[str, Any]) -> str:
    app, bare = r["app"], r["bare"]
    lines = [f"device {r['device_name']}  batch {r['batch']}  app step {app['step_s'] * 1e3:.1f} ms "
             f"({app['tokens_per_s']:.0f} tok/s, process CPU {app['cpu_s'] * 1e3:.0f} ms); "
             f"dynamo graphs {r['dynamo_graphs']}"]
    for name in BARE_VARIANTS:
        b = bare[name]
        lines.append(f"  bare {name:<18} {b['step_s'] * 1e3:9.1f} ms  (fwd {b['forward_s'] * 1e3:.1f}, "
                     f"bwd {b['backward_s'] * 1e3:.1f}; {b['tokens_per_s']:.0f} tok/s, CPU {b['cpu_s'] * 1e3:.0f} ms)")
    lines.append(f"  {'phase':<18} {'wall ms':>9}  {'share':>6}  {'CPU ms':>9}")
    for name in (*PHASES, *NESTED):
        if name in app["phase_s"]:
            label = ("  " + name) if name in NESTED else name
            lines.append(f"  {label:<18} {app['phase_s'][name] * 1e3:9.1f}  {app['phase_share'][name]:6.1%}  "
                         f"{app['phase_cpu_s'][name] * 1e3:9.1f}")
    for name, sec in r.get("module_fwd_s", {}).items():
        lines.append(f"  module {name:<22} {sec * 1e3:9.1f} ms (forward, inclusive)")
    if "ops_per_step" in r:
        ops = r["ops_per_step"]
        lines.append(f"  ATen ops per step: {sum(ops.values())} = " + ", ".join(f"{k} {v}" for k, v in ops.items()))
    if "syncs_per_step" in r:
        syncs = r["syncs_per_step"]
        lines.append(f"  host syncs per step: {syncs['total']} (this profiler); the app's queue_step: "
                     f"{syncs.get('queue_step_total')} {syncs.get('queue_step_sites')}")
    if "pipeline" in r:
        lines += pipeline_lines(r["pipeline"])
    for key, err in r.get("errors", {}).items():
        lines.append(f"  {key} failed: {err}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
