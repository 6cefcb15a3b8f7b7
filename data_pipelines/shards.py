"""Webdataset tar shards: a deterministic writer and a resumable, rank/worker-split reader.

Format (webdataset): a sample is the run of tar members sharing a key (the basename up to its first
dot); the rest of the name is the field (``json``, ``txt``, ``img0.png``, ``vid0.mp4``, ``jpg`` ...).
The writer fixes mtime/owner/mode so the same samples give byte-identical shards, and starts a new
shard when ``max_count`` samples or ``max_bytes`` would be exceeded.

Reading (:class:`ShardStream`): images stay at native resolution (decoded to RGB PIL, never resized);
shards are split over ``rank x worker`` (falling back to sample-level striding when there are fewer
shards than readers); ``resampled=True`` draws shards with replacement forever; a sample that fails to
decode (or a truncated shard) is skipped with a warning and counted in ``stats["corrupt"]``; the
:class:`StreamPosition` of the next unread sample can be saved and given back to resume exactly.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
import random
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

log = logging.getLogger(__name__)
IMAGE_EXTS = ("png", "jpg", "jpeg", "webp")
VIDEO_EXTS = ("mp4", "avi", "mkv", "webm", "mov")


@dataclass
class ShardInfo:
    path: str
    count: int
    bytes: int
    sha256: str


class ShardWriter:
    """Writes samples (``{"__key__": key, field: bytes, ...}``) to ``{out_dir}/{prefix}-{i:06d}.tar``."""

    def __init__(self, out_dir: str | os.PathLike, prefix: str, max_count: int = 1000,
                 max_bytes: int = 256 * 2**20):
        if max_count < 1 or max_bytes < 1:
            raise ValueError(f"max_count and max_bytes must be >= 1, got {max_count}, {max_bytes}")
        self.out_dir, self.prefix = Path(out_dir), prefix
        self.max_count, self.max_bytes = max_count, max_bytes
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.shards: list[ShardInfo] = []
        self._tar: tarfile.TarFile | None = None
        self._count = self._bytes = 0

    def _open(self) -> None:
        path = self.out_dir / f"{self.prefix}-{len(self.shards):06d}.tar"
        self._tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)
        self.shards.append(ShardInfo(str(path), 0, 0, ""))
        self._count = self._bytes = 0

    def write(self, sample: dict[str, Any]) -> None:
        key = sample.get("__key__")
        if not key or "." in key or "/" in key:
            raise ValueError(f"sample __key__ must be non-empty without dots or slashes, got {key!r}")
        members = {k: (v.encode() if isinstance(v, str) else bytes(v)) for k, v in sample.items() if k != "__key__"}
        size = sum(len(v) + 1024 for v in members.values())
        if self._tar is None or self._count >= self.max_count or (self._count and self._bytes + size > self.max_bytes):
            self._close_current()
            self._open()
        for name in sorted(members):
            info = tarfile.TarInfo(f"{key}.{name}")
            info.size, info.mtime, info.mode = len(members[name]), 0, 0o444
            info.uname = info.gname = "kvl"
            self._tar.addfile(info, io.BytesIO(members[name]))
        self._count += 1
        self._bytes += size
        self.shards[-1].count = self._count

    def _close_current(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._tar = None
        info = self.shards[-1]
        data = Path(info.path).read_bytes()
        info.bytes, info.sha256 = len(data), hashlib.sha256(data).hexdigest()

    def close(self) -> list[ShardInfo]:
        self._close_current()
        return self.shards


def list_shards(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths from a directory (all ``*.tar`` under it, sorted), a glob, a file, or a list of those."""
    if isinstance(source, (str, os.PathLike)):
        sources = [source]
    else:
        sources = list(source)
    if not sources:
        raise ValueError("shard list is empty: pass a directory, a glob, a .tar path or a non-empty list")
    out: list[str] = []
    for src in sources:
        s = str(src)
        if os.path.isdir(s):
            found = sorted(glob.glob(os.path.join(s, "**", "*.tar"), recursive=True))
            if not found:
                raise ValueError(f"no .tar shards under directory {s}")
            out += found
        elif any(ch in s for ch in "*?["):
            found = sorted(glob.glob(s))
            if not found:
                raise ValueError(f"no shards match the glob {s}")
            out += found
        elif os.path.isfile(s):
            out.append(s)
        else:
            raise FileNotFoundError(f"shard path does not exist: {s}")
    return out


def split_key(name: str) -> tuple[str, str]:
    """``dir/abc.img0.png`` -> (``dir/abc``, ``img0.png``) (webdataset's rule: first dot of the basename)."""
    head, base = os.path.split(name)
    key, _, ext = base.partition(".")
    return (f"{head}/{key}" if head else key), ext


def iter_tar(path: str) -> Iterator[dict[str, Any]]:
    """Raw samples ``{"__key__", "__url__", field: bytes}`` of one shard, in file order.

    A truncated or unreadable tar raises ``tarfile.ReadError``/``OSError`` after the complete samples (the
    sample being read when the data ran out is not yielded).
    """
    current: dict[str, Any] | None = None
    with tarfile.open(path, "r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = split_key(member.name)
            if not ext:
                continue
            if current is not None and current["__key__"] != key:
                yield current
                current = None
            if current is None:
                current = {"__key__": key, "__url__": path}
            current[ext] = tar.extractfile(member).read()
        end = tar.offset
    if os.path.getsize(path) < end + 2 * tarfile.BLOCKSIZE:  # a cut inside a header reads as a clean end
        raise tarfile.ReadError(f"{path} is truncated (no end-of-archive marker after byte {end})")
    if current is not None:
        yield current


class CorruptSample(ValueError):
    """A sample whose members do not decode (bad image, bad JSON, bad video)."""


def decode_image(data: bytes, name: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        return image.convert("RGB")
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, DecompressionBombError...)
        raise CorruptSample(f"image {name} does not decode: {err}") from err


def decode_sample(raw: dict[str, Any], video_fps: float | None = 2.0,
                  video_frames: int | None = None) -> dict[str, Any]:
    """Decode a raw sample: ``json`` -> dict, ``txt`` and ``html`` -> str, images -> RGB PIL (native size), videos ->
    :class:`~data_pipelines.video.DecodedVideo` sampled at ``video_fps`` or ``video_frames``. Media are
    listed in name order under ``images`` / ``videos``."""
    from data_pipelines.video import decode_mp4

    key = raw["__key__"]
    out: dict[str, Any] = {"__key__": key, "__url__": raw.get("__url__", ""), "images": [], "videos": [],
                           "image_names": [], "video_names": []}
    for name in sorted(k for k in raw if not k.startswith("__")):
        value, ext = raw[name], name.rsplit(".", 1)[-1].lower()
        where = f"{key}.{name} in {raw.get('__url__', '?')}"
        if ext == "json":
            try:
                out["json"] = json.loads(value)
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise CorruptSample(f"{where}: bad JSON: {err}") from err
        elif ext in ("txt", "text", "caption"):
            out["txt"] = value.decode("utf-8", errors="replace")
        elif ext in ("html", "htm"):  # a web page's ground-truth HTML (data_pipelines/web)
            out["html"] = value.decode("utf-8", errors="replace")
        elif ext in IMAGE_EXTS:
            out["images"].append(decode_image(value, where))
            out["image_names"].append(name)
        elif ext in VIDEO_EXTS:
            try:
                out["videos"].append(decode_mp4(value, fps=video_fps, num_frames=video_frames, name=where))
            except ValueError as err:
                raise CorruptSample(str(err)) from err
            out["video_names"].append(name)
        else:
            out[name] = value
    return out


@dataclass
class StreamPosition:
    """Where a reader is: ``epoch`` (or 0 when resampled), ``cursor`` (index into this epoch's shard
    order, or the draw number when resampled) and ``offset`` (samples of that shard already consumed)."""

    epoch: int = 0
    cursor: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> StreamPosition:
        return cls(**{k: int(d[k]) for k in ("epoch", "cursor", "offset")})


@dataclass
class ShardStream:
    """Decoded samples of a shard set for reader ``reader_id`` of ``num_readers`` (see module docstring).

    ``reader_id = rank * num_workers + worker_id``; ``epochs=None`` repeats forever (ignored when
    ``resampled``). Each yielded sample has ``"__position__"``: the position *after* it.
    """

    shards: list[str]
    reader_id: int = 0
    num_readers: int = 1
    seed: int = 0
    shuffle_shards: bool = True
    resampled: bool = False
    epochs: int | None = 1
    video_fps: float | None = 2.0
    video_frames: int | None = None
    position: StreamPosition = field(default_factory=StreamPosition)
    stats: dict[str, int] = field(default_factory=lambda: {"samples": 0, "corrupt": 0})

    def __post_init__(self) -> None:
        if not self.shards:
            raise ValueError("ShardStream needs a non-empty shard list")
        if not 0 <= self.reader_id < self.num_readers:
            raise ValueError(f"reader_id {self.reader_id} outside [0, num_readers={self.num_readers})")

    def _plan(self, epoch: int) -> tuple[list[str], int]:
        """This reader's shard order for ``epoch`` and its sample stride phase (-1: whole shards)."""
        order = list(self.shards)
        if self.shuffle_shards:
            random.Random(f"{self.seed}/epoch/{epoch}").shuffle(order)
        if len(order) >= self.num_readers:
            return order[self.reader_id::self.num_readers], -1
        return order, self.reader_id

    def _shard_for(self, epoch: int, cursor: int) -> tuple[str | None, int]:
        if self.resampled:
            rng = random.Random(f"{self.seed}/draw/{self.reader_id}/{cursor}")
            return rng.choice(self.shards), -1
        mine, phase = self._plan(epoch)
        return (mine[cursor] if cursor < len(mine) else None), phase

    def __iter__(self) -> Iterator[dict[str, Any]]:
        pos = StreamPosition(**self.position.to_dict())
        while self.resampled or self.epochs is None or pos.epoch < self.epochs:
            shard, phase = self._shard_for(pos.epoch, pos.cursor)
            if shard is None:
                pos = StreamPosition(pos.epoch + 1, 0, 0)
                continue
            yield from self._read_shard(shard, phase, pos)
            pos = StreamPosition(pos.epoch, pos.cursor + 1, 0)
            self.position = pos

    def _read_shard(self, shard: str, phase: int, pos: StreamPosition) -> Iterator[dict[str, Any]]:
        start = pos.offset
        index = -1
        try:
            for index, raw in enumerate(iter_tar(shard)):
                if index < start or (phase >= 0 and index % self.num_readers != phase):
                    continue
                after = StreamPosition(pos.epoch, pos.cursor, index + 1)
                self.position = after
                try:
                    sample = decode_sample(raw, self.video_fps, self.video_frames)
                except CorruptSample as err:
                    self.stats["corrupt"] += 1
                    log.warning("skipping corrupt sample (%d so far): %s", self.stats["corrupt"], err)
                    continue
                self.stats["samples"] += 1
                sample["__position__"] = after.to_dict()
                yield sample
        except (tarfile.TarError, OSError, EOFError) as err:
            self.stats["corrupt"] += 1
            log.warning("skipping the rest of shard %s after sample %d (%d corrupt so far): %s",
                        shard, index, self.stats["corrupt"], err)
