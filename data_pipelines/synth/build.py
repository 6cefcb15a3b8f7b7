"""Build a synthetic dataset on disk: presets, deterministic generation, shards and a manifest.

Layout: ``DIR/{split}/{stream}-{i:06d}.tar`` (split: ``train``, ``eval``; stream: ``vision``, ``text``)
and ``DIR/manifest.json`` (counts, bytes, seed, generator version, per-shard sha256, content hash).
Each sample's seed comes from ``(seed, split, family, index)`` (:func:`~data_pipelines.synth.common.sample_seed`),
the sample order inside a split is a seeded shuffle, and worker processes return samples in order, so
the same ``(preset, seed)`` gives byte-identical shards and manifest whatever ``workers`` is (on the same
Python / Pillow / PyAV versions, which the manifest records).

Every preset holds a few rendered web pages (``page``: screenshot -> HTML, ``page_video``: scroll video -> HTML;
``data_pipelines/web``, headless Chromium); their families register on first use, so importing this module
starts no browser. ``web_tiny`` / ``web_small`` hold pages only (the page-to-HTML recipes).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import multiprocessing as mp
import os
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from data_pipelines.shards import ShardWriter
from data_pipelines.synth.common import Sample, sample_seed
from data_pipelines.synth.families import FAMILIES, FamilyContext, SampleFamily, get_family

GENERATOR_VERSION = "1.0.0"
STREAMS = ("vision", "text")


@dataclass(frozen=True)
class Preset:
    """Samples per family per split, plus the knobs of :class:`FamilyContext` and shard limits."""

    name: str
    train: dict[str, int]
    eval: dict[str, int]
    image_sides: tuple[int, int]
    video_sides: tuple[int, int]
    video_frames: tuple[int, int]
    video_fps: int = 8
    shard_max_count: int = 1000
    shard_max_bytes: int = 256 * 2**20
    extra: dict[str, Any] = field(default_factory=dict)

    def scaled(self, factor: float) -> Preset:
        """The same preset with every count multiplied by ``factor`` (at least 1 per family)."""
        scale = lambda d: {k: max(1, int(round(v * factor))) for k, v in d.items()}  # noqa: E731
        return replace(self, train=scale(self.train), eval=scale(self.eval))


def _counts(scale: int, eval_scale: int) -> tuple[dict[str, int], dict[str, int]]:
    base = {"shapes": 40, "ocr": 24, "chart": 24, "document": 16, "video": 12, "interleaved": 12, "chat": 24,
            "text_mirror": 40, "prose": 40, "tool_sft": 40, **PAGE_COUNTS[0]}
    ev = {"shapes": 16, "ocr": 8, "chart": 8, "document": 8, "video": 8, "text_mirror": 24, **PAGE_COUNTS[1]}
    return {k: v * scale for k, v in base.items()}, {k: v * eval_scale for k, v in ev.items()}


# Rendered web pages (REFERENCE.md section 7; Chromium, ~0.2-0.3 s per sample): a few in every preset, and
# page-only presets for the page-to-HTML recipe (kimi_vl/configs/{tiny,small}_web.yaml).
PAGE_COUNTS = ({"page": 6, "page_video": 6}, {"page": 4, "page_video": 4})
WEB_PRESET_SIDES = dict(image_sides=(56, 448), video_sides=(64, 128), video_frames=(8, 16))


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", *_counts(1, 1), image_sides=(56, 448), video_sides=(64, 128), video_frames=(8, 16),
                   shard_max_count=100),
    "small": Preset("small", *_counts(30, 12), image_sides=(56, 672), video_sides=(64, 224), video_frames=(8, 32),
                    shard_max_count=1000),
    "large": Preset("large", *_counts(3000, 120), image_sides=(56, 900), video_sides=(64, 320), video_frames=(8, 64),
                    shard_max_count=2000),
    "web_tiny": Preset("web_tiny", {"page": 96, "page_video": 48}, {"page": 8, "page_video": 8},
                       **WEB_PRESET_SIDES, shard_max_count=200),
    "web_small": Preset("web_small", {"page": 3000, "page_video": 1500}, {"page": 50, "page_video": 50},
                        **WEB_PRESET_SIDES, shard_max_count=1000),
}
# The same with key-value retrieval documents added (experiment 6's long-context task; data_pipelines/synth/
# retrieval.py): the default presets stay as they are, so their goldens and caches do not change.
RETRIEVAL_COUNTS = ({"retrieval": 60}, {"retrieval": 8})
for _name in ("tiny", "small"):
    _p = PRESETS[_name]
    PRESETS[f"{_name}_retrieval"] = replace(
        _p.scaled(1.0), name=f"{_name}_retrieval",
        train={**_p.train, **{k: v * (1 if _name == "tiny" else 30) for k, v in RETRIEVAL_COUNTS[0].items()}},
        eval={**_p.eval, **{k: v * (1 if _name == "tiny" else 12) for k, v in RETRIEVAL_COUNTS[1].items()}})
# Families registered on first use (importing them would pull in the browser driver): name -> registrar.
LAZY_FAMILIES = {"page": "data_pipelines.web.family:register_page_families",
                 "page_video": "data_pipelines.web.family:register_page_families",
                 "page_video_interactive": "data_pipelines.web.family:register_page_families"}


def family_for(name: str) -> SampleFamily:
    """The registered family ``name``, registering a lazy one (e.g. the Chromium-rendered pages) first."""
    if name in LAZY_FAMILIES and name not in FAMILIES:
        module, func = LAZY_FAMILIES[name].split(":")
        getattr(importlib.import_module(module), func)()
    return get_family(name)


# Tokenizer vocabulary trained with each preset (by `kimi-vl data synth` and `synth:PRESET` data paths).
DEFAULT_VOCAB = {"tiny": 4096, "small": 8192, "large": 16384, "web_tiny": 4096, "web_small": 8192,
                 "tiny_retrieval": 4096, "small_retrieval": 8192}


def default_vocab(preset: str) -> int:
    """The tokenizer size that goes with ``preset`` (8192 for presets not listed)."""
    return DEFAULT_VOCAB.get(preset, 8192)


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def plan(preset: Preset, split: str, seed: int) -> list[tuple[str, int]]:
    """The ``(family, index)`` list of a split in writing order (a seeded shuffle)."""
    counts = preset.train if split == "train" else preset.eval
    items = [(fam, i) for fam in sorted(counts) for i in range(counts[fam])]
    random.Random(f"{seed}/{split}/order").shuffle(items)
    return items


def generate_sample(preset: Preset, seed: int, split: str, family: str, index: int) -> Sample:
    """One sample, fully determined by its arguments."""
    s = sample_seed(seed, split, family, index)
    ctx = FamilyContext(split, index, s, preset.image_sides, preset.video_sides, preset.video_frames,
                        preset.video_fps)
    sample = family_for(family).make(random.Random(s), ctx)
    sample.meta = {"seed": s, "split": split, "index": index, "key": sample_key(split, family, index)}
    return sample


def sample_key(split: str, family: str, index: int) -> str:
    return f"{split}_{family}_{index:08d}"


def to_raw(sample: Sample) -> dict[str, Any]:
    """A sample as webdataset members: ``json`` (record), ``txt`` (plain text), one member per media file, and
    ``html`` for samples whose spec carries a page's HTML."""
    raw: dict[str, Any] = {"__key__": sample.meta["key"],
                           "json": json.dumps(sample.record(), sort_keys=True, separators=(",", ":")),
                           "txt": sample.plain_text()}
    for media in sample.media:
        raw[media.name] = media.data
    if isinstance(sample.spec.get("html"), str):  # web pages: the ground-truth HTML as its own member
        raw["html"] = sample.spec["html"]
    return raw


def _work(args: tuple[Preset, int, str, str, int]) -> tuple[str, str, dict[str, Any], list[str]]:
    sample = generate_sample(*args)
    return sample.family, sample.stream, to_raw(sample), [q["category"] for q in sample.qa]


def progress(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    env = os.environ.get("KVL_PROGRESS")
    disable = (env in ("0", "false", "")) if env is not None else (bool(os.environ.get("CI")) or
                                                                   not sys.stderr.isatty())
    return tqdm(total=total, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def _results(tasks: list, workers: int) -> Iterator[tuple[str, str, dict[str, Any], list[str]]]:
    if workers <= 1:
        yield from map(_work, tasks)
        return
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_work, tasks, chunksize=4)


def write_split(out: Path, preset: Preset, seed: int, split: str, workers: int = 1) -> dict[str, Any]:
    """Generate and write one split; returns its manifest entry."""
    tasks = [(preset, seed, split, fam, i) for fam, i in plan(preset, split, seed)]
    writers = {s: ShardWriter(out / split, s, preset.shard_max_count, preset.shard_max_bytes) for s in STREAMS}
    counts, categories = Counter(), Counter()
    bar = progress(len(tasks), f"synth {split}")
    for family, stream, raw, cats in _results(tasks, workers):
        writers[stream].write(raw)
        counts[family] += 1
        categories.update(cats)
        bar.update(1)
    bar.close()
    return split_entry(out, writers, counts, categories)


def split_entry(out: Path, writers: dict[str, ShardWriter], counts: Counter, categories: Counter) -> dict[str, Any]:
    """One split's manifest entry from its closed-now stream writers (``stream -> ShardWriter``), the samples per
    family and the questions per QA category (paths relative to the dataset folder ``out``)."""
    streams = {}
    for name, writer in writers.items():
        shards = writer.close()
        streams[name] = {"samples": sum(s.count for s in shards), "bytes": sum(s.bytes for s in shards),
                         "shards": [{"path": os.path.relpath(s.path, out), "count": s.count, "bytes": s.bytes,
                                     "sha256": s.sha256} for s in shards]}
    return {"counts": dict(sorted(counts.items())), "qa_categories": dict(sorted(categories.items())),
            "samples": sum(counts.values()), "bytes": sum(s["bytes"] for s in streams.values()), "streams": streams}


def check_new_output(out: str | os.PathLike) -> Path:
    """``out`` as a path, if it is a new or empty folder (else ``FileExistsError`` saying to choose another)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output path {out} is a file, not a folder; choose a new --out")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty; choose a new --out")
    return out


def write_manifest(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Add the totals and the content hash (of every shard's path and sha256, in split and stream order) to
    ``manifest`` (with its ``splits``), write it to ``out/manifest.json`` and return it."""
    digest = hashlib.sha256()
    for split in manifest["splits"].values():
        for stream in STREAMS:
            for shard in split["streams"][stream]["shards"]:
                digest.update(f"{shard['path']}:{shard['sha256']}\n".encode())
    manifest["total_samples"] = sum(s["samples"] for s in manifest["splits"].values())
    manifest["total_bytes"] = sum(s["bytes"] for s in manifest["splits"].values())
    manifest["content_hash"] = digest.hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _versions() -> dict[str, str]:
    import av
    import PIL

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
            "pillow": PIL.__version__, "av": av.__version__}


def build_dataset(out: str | os.PathLike, preset: str | Preset = "tiny", seed: int = 0, workers: int = 1,
                  splits: tuple[str, ...] = ("train", "eval")) -> dict[str, Any]:
    """Generate ``preset`` with ``seed`` into ``out``; writes and returns the manifest."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    out = check_new_output(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"generator": "kimi-vl-suite synth", "generator_version": GENERATOR_VERSION,
                                "preset": preset.name, "seed": seed, "versions": _versions(), "splits": {}}
    for split in splits:
        manifest["splits"][split] = write_split(out, preset, seed, split, workers)
    return write_manifest(out, manifest)


def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    path = Path(root) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no manifest.json in {root} (is it a dataset built by `kimi-vl data synth`?)")
    return json.loads(path.read_text())


def split_shards(root: str | os.PathLike, split: str = "train", stream: str | None = None) -> list[str]:
    """Absolute shard paths of a built dataset's ``split`` (one ``stream`` or both)."""
    manifest = read_manifest(root)
    if split not in manifest["splits"]:
        raise ValueError(f"dataset {root} has no split {split!r}; it has {sorted(manifest['splits'])}")
    streams = STREAMS if stream is None else (stream,)
    return [str(Path(root) / s["path"]) for st in streams for s in manifest["splits"][split]["streams"][st]["shards"]]
