"""The built-in synthetic multimodal world: seeded scenes with ground truth, tasks, text, video, tool use.

Public API:
- :func:`build_dataset` / :data:`PRESETS` / :func:`split_shards` / :func:`read_manifest` (``build.py``);
- :func:`generate_sample` (one sample from ``(preset, seed, split, family, index)``);
- :data:`FAMILIES` / :func:`register_family` / :class:`SampleFamily` (``families.py``) to add sample kinds;
- :func:`eval_items` / :func:`check_answer` (``tasks.py``): held-out verifiable tasks for eval and RL;
- :class:`ImageHandle` / :func:`run_tool_code` (``image_ops.py``): the zero-vision tool environment.
"""

from data_pipelines.synth.build import (
    GENERATOR_VERSION,
    PRESETS,
    Preset,
    build_dataset,
    generate_sample,
    get_preset,
    read_manifest,
    split_shards,
)
from data_pipelines.synth.common import Media, Sample, sample_seed
from data_pipelines.synth.families import FAMILIES, FamilyContext, SampleFamily, get_family, register_family
from data_pipelines.synth.image_ops import ImageHandle, run_tool_code

__all__ = [
    "FAMILIES", "GENERATOR_VERSION", "PRESETS", "FamilyContext", "ImageHandle", "Media", "Preset", "Sample",
    "SampleFamily", "build_dataset", "generate_sample", "get_family", "get_preset", "read_manifest",
    "register_family", "run_tool_code", "sample_seed", "split_shards",
]
