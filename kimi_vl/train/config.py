"""The run config of a training stage (``pretrain`` or ``sft``), merged strictly from YAML.

Every run config has the top-level ``output_dir``, ``max_steps``, ``seed`` and ``init_from`` keys;
sections hold the model, data, optimizer and loop settings. Ship configs live in
``kimi_vl/configs/<flavor>_<stage>.yaml``; ``kimi-vl configs`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from kimi_vl.optim.builder import OptimConfig
from kimi_vl.runconfig import SHIPPED_CONFIGS as CONFIG_DIR


@dataclass
class ModelSection:
    flavor: str = "debug"
    overrides: dict[str, Any] = field(default_factory=dict)  # any KimiVLConfig field, e.g. residual_mode
    vision_flavor: str | None = "debug"  # None: text-only model (no vision tower)


@dataclass
class DataSection:
    path: str = "synth:tiny"  # a folder written by `kimi-vl data synth`, or synth:PRESET[:SEED] (built once, cached)
    tokenizer: str | None = None  # a transformers tokenizer folder; default <path>/tokenizer
    seq_len: int = 512
    batch_size: int = 4  # packed rows per micro-batch and process
    vision_ratio: float = 0.1  # share of vision documents after injection
    vision_inject_step: int = 0  # 0 = early fusion; later steps give mid/late fusion arms
    text_sources: list[str] = field(default_factory=list)  # empty = every text family of the split
    # sft only: zero_vision = text-only data (chat + image-as-code tool transcripts); image_text = with images
    sft_preset: Literal["zero_vision", "image_text"] = "zero_vision"
    max_patches: int = 1024  # per-image patch budget of the processor
    num_workers: int = 0
    shuffle_buffer: int = 64


@dataclass
class TrainConfig:
    output_dir: str
    max_steps: int
    seed: int = 0
    init_from: str | None = None  # a checkpoint or export to start from
    resume: str = "auto"  # auto | never | path to a checkpoint
    stage: Literal["pretrain", "sft"] = "pretrain"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimConfig = field(default_factory=OptimConfig)
    grad_accum: int = 1
    grad_clip: float = 1.0
    # auto: bf16 autocast on CUDA, fp32 on CPU. bf16_params: bf16 autocast and the model computing with bf16 copies
    # of its fp32 weights, cast once per micro-batch (kimi_vl/train/param_cast.py: bf16 activations and residual
    # stream; fp32 master weights, gradients and optimizer state); not with compile or FSDP2.
    precision: Literal["auto", "fp32", "bf16", "bf16_params"] = "auto"
    keep_fp32_params: list[str] = field(default_factory=lambda: ["A_log", "dt_bias"])  # bf16_params: name suffixes
    activation_checkpointing: bool = False
    # the LM head and its cross entropy as one step that never returns the logits (the model's return_logits=False:
    # kernels.cross_entropy.linear_cross_entropy); the same losses and gradients, one read of the logits and one
    # logits-sized buffer fewer on CUDA. false: logits, then the loss.
    fused_head_loss: bool = True
    compile: bool = False
    # torch.compile of each MoonViT block alone (dynamic shapes: one graph for every packed patch count); the
    # tower is launch-bound in eager mode. Needs a vision tower; not with compile (the whole model) or FSDP2.
    compile_vision: bool = False
    # torch's intra-op CPU threads in each training process. 0 (auto): 1 on a GPU when OMP_NUM_THREADS is unset
    # (the model runs on the GPU; idle OpenMP threads that spin after the few host-side ops compete with the
    # data-loader workers and the launching thread: app16 on one H100 137.4k vs 128.5k / 130.1k tokens/s, session
    # 8), else torch's default. A number sets it.
    cpu_threads: int = 0
    # Python's garbage collector: frozen after setup, automatic collection off, one full collection after every
    # gc_every-th step (kimi_vl/train/pygc.py); 0 keeps Python's automatic collection. Either way a step's time in
    # full collections is logged as gc_s.
    gc_every: int = 0
    # Read a step's metrics (loss, grad norm, QK-Clip stats) only once the next step is queued, so the host prepares
    # the next batch while the GPU finishes the step; a non-finite loss then stops the run one step later (weights
    # on disk are untouched either way). Steps that evaluate, checkpoint, stop or end are read at once.
    defer_metrics: bool = True
    checkpoint_every: int = 0  # 0: only at the end
    keep_last: int = 2
    log_every: int = 1
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 2
    tensorboard: bool = False
    # DDP: parameters without a gradient in a step (the vision tower in a text-only batch or in zero-vision SFT,
    # MoE experts that got no token) are found each step instead of stopping the run
    ddp_find_unused_parameters: bool = True

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.compile and self.compile_vision:
            raise ValueError("compile_vision: the whole model is already compiled (compile: true); set one of them")
        if self.precision == "bf16_params" and self.compile:
            raise ValueError("precision=bf16_params swaps bf16 weight copies into the modules every micro-batch, which "
                             "compile (the whole model) would retrace; use precision=bf16 with compile")
        if self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0 (0: auto), got {self.cpu_threads}")
        if self.gc_every < 0:
            raise ValueError(f"gc_every must be >= 0 (0: Python's automatic collection), got {self.gc_every}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if not 0.0 <= self.data.vision_ratio <= 1.0:
            raise ValueError(f"data.vision_ratio must lie in [0, 1], got {self.data.vision_ratio}")


def list_run_configs() -> list[Path]:
    """The run configs shipped with the suite (``kimi_vl/configs/*.yaml``)."""
    return sorted(CONFIG_DIR.glob("*.yaml"))


def resolve_config_path(name: str) -> Path:
    """A path as given, or the name of a shipped config (with or without ``.yaml``)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = CONFIG_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    if shipped.is_file():
        return shipped
    known = ", ".join(p.stem for p in list_run_configs())
    raise FileNotFoundError(f"run config {name!r} not found (not a file, not a shipped config; shipped: {known})")


T = TypeVar("T")


def load_run_config(cls: type[T], name: str, overrides: Sequence[str], check: Callable[[T], None], prog: str
                    ) -> T | None:
    """A CLI's run config: ``cls`` from a YAML file or a shipped config's name plus ``key=value`` overrides, then
    ``check`` (its input paths). A bad key, value or path is printed as ``prog: message`` and gives ``None`` (the
    command then exits with 2)."""
    import sys

    from kimi_vl.runconfig import ConfigError, load_config

    try:
        cfg = load_config(cls, resolve_config_path(name), overrides)
        check(cfg)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return cfg
