"""The training loader: two shard streams (text, vision) -> vision-ratio mixing -> packed batches, resumable.

- :class:`VisionRatioSchedule`: ``ratio(step)`` is 0 before ``inject_step`` and ``ratio`` after, so early
  (inject 0), mid and late fusion are configs. The share is measured in tokens: after injection the
  mixer takes the next document from the vision stream while vision-document tokens are below
  ``ratio`` of all tokens since injection.
- Each reader (``rank x worker``) runs the whole pipeline on its slice of the shards; a batch carries
  ``loader_state`` (stream positions, block-shuffle offsets, mixer counters, batch index) taken *before*
  the first document it did not consume, so restoring it replays the stream exactly.
- :class:`ResumableLoader` wraps ``torch.utils.data.DataLoader`` (batches are built in the workers) and
  keeps the newest state of every reader; ``state_dict()`` / ``load_state_dict()`` save and restore it,
  including whose turn is next, so a resumed run sees the same batches. ``stats()`` sums the readers'
  counters (``corrupt`` skipped samples, ``dropped`` too-long documents).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from data_pipelines.packing import Encoder, Packer, collate
from data_pipelines.shards import ShardStream, StreamPosition, list_shards
from vision_encoder.geometry import DEFAULT_GEOMETRY, PatchGeometry


@dataclass(frozen=True)
class VisionRatioSchedule:
    ratio: float = 0.1
    inject_step: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"vision ratio must lie in [0, 1], got {self.ratio}")
        if self.inject_step < 0:
            raise ValueError(f"inject_step must be >= 0, got {self.inject_step}")

    def __call__(self, step: int) -> float:
        return self.ratio if step >= self.inject_step else 0.0


@dataclass
class LoaderConfig:
    """What :func:`build_loader` reads. ``text_shards``/``vision_shards``: directories, globs or lists
    (either may be empty, not both)."""

    text_shards: Sequence[str] | str = ()
    vision_shards: Sequence[str] | str = ()
    seq_len: int = 512
    batch_size: int = 4
    mode: str = "pretrain"
    schedule: VisionRatioSchedule = field(default_factory=VisionRatioSchedule)
    seed: int = 0
    resampled: bool = True
    epochs: int | None = None
    shuffle_block: int = 64
    video_fps: float | None = 2.0
    video_frames: int | None = None
    grad_accum: int = 1
    image_geometry: PatchGeometry = DEFAULT_GEOMETRY
    video_geometry: PatchGeometry = DEFAULT_GEOMETRY
    max_batches: int | None = None  # per reader; None = until the streams end


class BlockShuffled:
    """Reads ``block`` samples, emits them in a seeded order; position = (block start, emitted)."""

    def __init__(self, stream: ShardStream, block: int, seed: str, state: dict[str, Any] | None = None):
        self.stream, self.block, self.seed = stream, max(1, block), seed
        state = state or {"start": StreamPosition().to_dict(), "emitted": 0}
        self.start, self.emitted = StreamPosition.from_dict(state["start"]), int(state["emitted"])
        self.buffer: list[dict[str, Any]] = []
        self.iterator: Iterator[dict[str, Any]] | None = None
        self.exhausted = False

    def state(self) -> dict[str, Any]:
        return {"start": self.start.to_dict(), "emitted": self.emitted}

    def _fill(self) -> None:
        """Read the block that starts at ``self.start`` and shuffle it (same block -> same order)."""
        if self.iterator is None:
            self.stream.position = self.start
            self.iterator = iter(self.stream)
        self.buffer = []
        for sample in self.iterator:
            self.buffer.append(sample)
            if len(self.buffer) == self.block:
                break
        self.end = StreamPosition.from_dict(self.buffer[-1]["__position__"]) if self.buffer else self.start
        key = f"{self.seed}/{self.start.epoch}/{self.start.cursor}/{self.start.offset}"
        random.Random(key).shuffle(self.buffer)

    def next(self) -> dict[str, Any] | None:
        if self.exhausted:
            return None
        if self.iterator is None:
            self._fill()
        if self.emitted >= len(self.buffer):
            self.start, self.emitted = self.end, 0
            self._fill()
        if not self.buffer:
            self.exhausted = True
            return None
        sample = self.buffer[self.emitted]
        self.emitted += 1
        return sample


class Mixer:
    """Chooses the stream of the next document to keep the vision token share at ``schedule(step)``."""

    def __init__(self, schedule: VisionRatioSchedule, state: dict[str, Any] | None = None):
        self.schedule = schedule
        state = state or {"ratio": -1.0, "vision": 0, "total": 0}
        self.ratio, self.vision, self.total = float(state["ratio"]), int(state["vision"]), int(state["total"])

    def state(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "vision": self.vision, "total": self.total}

    def pick(self, step: int) -> str:
        ratio = self.schedule(step)
        if ratio != self.ratio:
            self.ratio, self.vision, self.total = ratio, 0, 0
        if ratio <= 0.0:
            return "text"
        if ratio >= 1.0:
            return "vision"
        return "vision" if self.vision <= ratio * self.total else "text"

    def record(self, stream: str, tokens: int) -> None:
        self.total += tokens
        if stream == "vision":
            self.vision += tokens


def _rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class PackedDataset(torch.utils.data.IterableDataset):
    """Yields packed batches; one pipeline per reader (see module docstring)."""

    def __init__(self, config: LoaderConfig, tokenizer: Any, processor: Any = None,
                 rank: int | None = None, world_size: int | None = None):
        super().__init__()
        self.config, self.tokenizer, self.processor = config, tokenizer, processor
        env_rank, env_world = _rank_world()
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        self.shards = {name: (list_shards(src) if (isinstance(src, str) and src) or
                              (not isinstance(src, str) and len(src)) else [])
                       for name, src in (("text", config.text_shards), ("vision", config.vision_shards))}
        if not self.shards["text"] and not self.shards["vision"]:
            raise ValueError("LoaderConfig needs text_shards or vision_shards (both are empty)")
        self.restore: dict[int, dict[str, Any]] = {}
        self.worker_offset = 0

    def _reader(self) -> tuple[int, int, int]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        logical = (wid + self.worker_offset) % nw
        return logical, self.rank * nw + logical, self.world_size * nw

    def __iter__(self) -> Iterator[dict[str, Any]]:
        logical, reader_id, num_readers = self._reader()
        yield from self._batches(logical, reader_id, num_readers, self.restore.get(logical, {}))

    def _streams(self, reader_id: int, num_readers: int, state: dict[str, Any]) -> dict[str, BlockShuffled]:
        c, out = self.config, {}
        for name, shards in self.shards.items():
            if shards:
                stream = ShardStream(shards, reader_id, num_readers, seed=c.seed, resampled=c.resampled,
                                     epochs=c.epochs, video_fps=c.video_fps, video_frames=c.video_frames)
                out[name] = BlockShuffled(stream, c.shuffle_block, f"{c.seed}/{name}/{reader_id}",
                                          state.get("streams", {}).get(name))
        return out

    def _batches(self, logical: int, reader_id: int, num_readers: int,
                 state: dict[str, Any]) -> Iterator[dict[str, Any]]:
        c = self.config
        encoder = Encoder(self.tokenizer, c.mode, c.image_geometry, c.video_geometry)
        streams = self._streams(reader_id, num_readers, state)
        mixer = Mixer(c.schedule, state.get("mixer"))
        index = int(state.get("batch_index", 0))
        counters = {"dropped": 0, **state.get("counters", {})}
        nw = max(1, num_readers // self.world_size)
        packer = Packer(c.seq_len, c.batch_size)
        pending: list[Any] = []  # docs (pieces) read but not yet placed, with the state before them
        snapshot = lambda: {"streams": {k: s.state() for k, s in streams.items()}, "mixer": mixer.state(),  # noqa: E731
                            "batch_index": index, "counters": dict(counters)}
        while c.max_batches is None or index < int(state.get("batch_index", 0)) + c.max_batches:
            step = (index * nw + logical) // c.grad_accum
            resume_state, full = None, False
            while not full:
                if not pending:
                    before = snapshot()
                    doc = self._next_doc(streams, mixer, step, encoder, counters)
                    if doc is None:
                        break
                    pending = [(piece, before) for piece in packer.split_long(doc)]
                    counters["dropped"] = packer.dropped
                    continue
                piece, before = pending[0]
                if packer.add(piece):
                    pending.pop(0)
                else:
                    resume_state, full = before, True
            if packer.empty():
                return
            rows = packer.take()
            index += 1
            batch = collate(rows, c.seq_len, encoder.ids.pad, self.processor, encoder.ids)
            resume = dict(resume_state or snapshot(), batch_index=index)
            batch["loader_state"] = {"reader": logical, "state": resume,
                                     "corrupt": sum(s.stream.stats["corrupt"] for s in streams.values()),
                                     "dropped": counters["dropped"]}
            yield batch

    def _next_doc(self, streams: dict[str, BlockShuffled], mixer: Mixer, step: int, encoder: Encoder,
                  counters: dict[str, int]) -> Any:
        name = mixer.pick(step)
        order = [name] + [n for n in ("text", "vision") if n != name]
        for candidate in order:
            if candidate not in streams:
                continue
            sample = streams[candidate].next()
            if sample is None:
                continue
            doc = encoder.encode(sample)
            mixer.record(candidate, len(doc.input_ids))
            return doc
        return None


class ResumableLoader:
    """Iterates a :class:`PackedDataset` through a DataLoader and tracks every reader's resume state."""

    def __init__(self, dataset: PackedDataset, num_workers: int = 0):
        self.dataset, self.num_workers = dataset, num_workers
        self.reader_states: dict[int, dict[str, Any]] = {}
        self.counters: dict[int, dict[str, int]] = {}
        self.next_reader = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.dataset.restore = dict(self.reader_states)
        self.dataset.worker_offset = self.next_reader
        # pinned batches on a CUDA machine: the trainer's non-blocking copies then never wait for the device
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers,
                                             persistent_workers=False, pin_memory=torch.cuda.is_available())
        readers = max(1, self.num_workers)
        for batch in loader:
            info = batch.pop("loader_state")
            self.reader_states[info["reader"]] = info["state"]
            self.counters[info["reader"]] = {"corrupt": info["corrupt"], "dropped": info["dropped"]}
            self.next_reader = (info["reader"] + 1) % readers
            yield batch

    def stats(self) -> dict[str, int]:
        return {k: sum(c.get(k, 0) for c in self.counters.values()) for k in ("corrupt", "dropped")}

    def state_dict(self) -> dict[str, Any]:
        return {"readers": {str(k): v for k, v in self.reader_states.items()}, "next_reader": self.next_reader,
                "num_workers": self.num_workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("num_workers", self.num_workers)) != self.num_workers:
            raise ValueError(f"loader state was saved with num_workers={state['num_workers']}, "
                             f"this loader has {self.num_workers}; resume with the same value")
        self.reader_states = {int(k): v for k, v in state["readers"].items()}
        self.next_reader = int(state["next_reader"])


def build_loader(config: LoaderConfig, tokenizer: Any, processor: Any = None, num_workers: int = 0,
                 rank: int | None = None, world_size: int | None = None) -> ResumableLoader:
    """The loader the training app uses (``processor``: see :mod:`data_pipelines.packing`)."""
    return ResumableLoader(PackedDataset(config, tokenizer, processor, rank, world_size), num_workers)
