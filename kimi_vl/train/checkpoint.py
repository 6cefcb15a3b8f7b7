"""Atomic, resumable checkpoints and end-of-stage exports.

Layout under a run's ``output_dir``::

    checkpoints/step_00000100/      accelerate state (model, optimizer, scheduler, RNG, registered
                                    objects such as the data-loader position) + trainer_state.json
    checkpoints/latest              name of the newest complete checkpoint
    final/                          export loadable with ``from_pretrained`` after ``import kimi_vl``
    config.yaml                     the resolved run config

A checkpoint is written to ``step_X.tmp`` and renamed only when complete, so a crash mid-write leaves
the previous checkpoint as the newest one; ``keep_last`` older ones are pruned after the rename.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CKPT_DIR = "checkpoints"
STATE_FILE = "trainer_state.json"
_STEP_RE = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or does not fit the current run."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first (``.tmp`` leftovers of a crash are ignored)."""
    root = Path(output_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_RE.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_RE.match(p.name).group(1)))


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def resolve_resume(resume: str | None, output_dir: str | os.PathLike) -> Path | None:
    """``"auto"`` -> newest checkpoint of this run (or None); ``None``/``"never"`` -> None; else a path."""
    if resume in (None, "", "never", "none"):
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"resume={resume!r}: no {STATE_FILE} in {path} (not a checkpoint of this suite)")
    return path


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(accelerator: Any, output_dir: str | os.PathLike, step: int, trainer_state: Mapping[str, Any],
                    keep_last: int = 2) -> Path:
    """Save the accelerate state plus ``trainer_state`` atomically; return the checkpoint folder."""
    root = Path(output_dir) / CKPT_DIR
    final = root / checkpoint_name(step)
    tmp = root / (checkpoint_name(step) + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_json_atomic(tmp / STATE_FILE, {"step": step, **trainer_state})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        (root / "latest.tmp").write_text(final.name)
        os.replace(root / "latest.tmp", root / "latest")
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: str | os.PathLike,
                    architecture: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Restore the accelerate state from ``path`` and return its trainer state. With ``architecture`` (see
    :func:`architecture`), a checkpoint that recorded another one is refused naming the fields, before any tensor
    is loaded (checkpoints from before the record are loaded unchecked)."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (missing {STATE_FILE})")
    state = json.loads(state_file.read_text())
    if architecture is not None and "architecture" in state:
        check_compatible(state["architecture"], dict(architecture), f"{path} (resume)")
    accelerator.load_state(str(path))
    return state


ARCH_KEYS = ("hidden_size", "num_hidden_layers", "layer_types", "vocab_size", "residual_mode", "num_experts")


def architecture(config: Any) -> dict[str, Any]:
    """The fields of a model config that decide its parameter shapes (JSON-ready; ``layer_types`` as a list)."""
    arch = {k: getattr(config, k, None) for k in ARCH_KEYS}
    arch["layer_types"] = list(arch["layer_types"]) if arch["layer_types"] is not None else None
    arch["vision"] = getattr(config, "vision_config", None) is not None
    return arch


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], source: str) -> None:
    """Raise if two architecture descriptions differ; name every differing field."""
    keys = sorted(set(saved) | set(current))
    diffs = [f"{k}: checkpoint={saved.get(k)!r} run={current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]
    if diffs:
        raise CheckpointError(f"checkpoint {source} has an incompatible architecture:\n  " + "\n  ".join(diffs))


def export_pretrained(model: Any, out_dir: str | os.PathLike, tokenizer: Any = None, processor: Any = None,
                      extra_files: Mapping[str, str] | None = None,
                      state_dict: Mapping[str, Any] | None = None) -> Path:
    """Write a ``from_pretrained``-loadable folder atomically (tmp folder, then rename). ``state_dict``: the
    weights to write instead of the model's own (a full state dict gathered from FSDP2-sharded parameters)."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, **({"state_dict": dict(state_dict)} if state_dict is not None else {}))
    for obj in (tokenizer, processor):
        if obj is not None:
            obj.save_pretrained(tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
