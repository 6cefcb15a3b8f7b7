"""Building blocks of the synthetic world: samples, seeds, palette, words, sizes, boxes, fonts.

A :class:`Sample` is one training/evaluation example: a JSON-able record plus media files (PNG images,
MP4 clips). Every sample carries the seed it was generated from and the ground-truth scene spec its
answers were computed from, so any answer can be re-derived and checked.

Seeds: :func:`sample_seed` maps ``(base_seed, split, family, index)`` to a 64-bit seed whose two top
bits are the split's code, so training and evaluation splits can never share a seed (disjoint by
construction, not by luck).
"""

from __future__ import annotations

import hashlib
import io
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from PIL import Image, ImageFont

SPLITS = {"train": 0, "eval": 1, "test": 2}

# Named colours, far apart in RGB so that an exact-colour threshold isolates each one.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 170),
    "orange": (245, 130, 20),
    "black": (20, 20, 20),
    "cyan": (30, 190, 200),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "light grey": (225, 225, 225),
    "beige": (240, 232, 210),
}
TEXT_COLORS: dict[str, tuple[int, int, int]] = {"black": (20, 20, 20), "blue": (40, 80, 220), "red": (220, 40, 40)}

WORDS = (
    "apple river stone cloud maple tiger orbit pixel lemon harbor violet candle summit falcon meadow "
    "copper signal garden rocket silver window marble forest planet thunder velvet anchor breeze canyon "
    "dragon ember frost glacier island jungle kettle lantern magnet nectar oasis pepper quartz raven "
    "saddle timber umbra vessel willow yonder zephyr atlas beacon cobalt delta echo fable granite "
    "horizon ivory jasper kernel lotus mosaic nimbus opal prism quiver ripple sierra tundra unity vertex"
).split()
CATEGORIES = "north south east west alpha beta gamma delta red blue green gold iron tin oak pine".split()


@dataclass
class Media:
    """One media file of a sample: ``kind`` is ``image`` or ``video``; ``name`` is the tar member suffix."""

    name: str  # "img0.png", "vid0.mp4"
    kind: str
    data: bytes
    height: int
    width: int
    frames: int = 1
    fps: float = 0.0

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "kind": self.kind, "height": self.height, "width": self.width}
        if self.kind == "video":
            d.update(frames=self.frames, fps=self.fps)
        return d


@dataclass
class Sample:
    """One example. ``doc`` is the pre-training form (segments ``{"text": s}`` or ``{"media": i}``);
    ``messages`` the chat form (roles system/user/assistant/tool; content a string or a list of parts
    ``{"type": "text", "text": s}`` / ``{"type": "image"|"video", "media": i}``; assistant turns may carry
    ``tool_calls``); ``qa`` the verifiable questions (category, question, answer, answer_type)."""

    family: str
    stream: str  # "vision" (has media) or "text"
    doc: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    qa: list[dict[str, Any]] = field(default_factory=list)
    caption: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    media: list[Media] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The JSON part (everything but the media bytes)."""
        return {
            "family": self.family, "stream": self.stream, "doc": self.doc, "messages": self.messages,
            "qa": self.qa, "caption": self.caption, "spec": self.spec,
            "media": [m.describe() for m in self.media], "meta": self.meta,
        }

    def plain_text(self) -> str:
        """The text of ``doc`` (or of the messages) with media left out: the ``.txt`` member."""
        if self.doc:
            return "\n".join(seg["text"] for seg in self.doc if "text" in seg)
        parts = []
        for msg in self.messages:
            content = msg.get("content") or ""
            parts.append(content if isinstance(content, str) else
                         " ".join(p["text"] for p in content if p.get("type") == "text"))
        return "\n".join(p for p in parts if p)


def sample_seed(base_seed: int, split: str, family: str, index: int) -> int:
    """A 64-bit seed; its top two bits are the split code, so splits never share a seed."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    digest = hashlib.blake2b(f"{base_seed}/{split}/{family}/{index}".encode(), digest_size=8).digest()
    low = int.from_bytes(digest, "little") & ((1 << 62) - 1)
    return (SPLITS[split] << 62) | low


def split_of_seed(seed: int) -> str:
    code = seed >> 62
    return next(name for name, c in SPLITS.items() if c == code)


def sample_size(rng: random.Random, min_side: int, max_side: int, max_ratio: float = 8.0) -> tuple[int, int]:
    """A ``(height, width)``: aspect ratio up to ``max_ratio``:1 either way (most near square), both
    sides in ``[min_side, max_side]``, even (video codecs want even sides)."""
    if rng.random() < 0.6:
        ratio = math.exp(rng.uniform(0, math.log(min(2.0, max_ratio))))
    else:
        ratio = math.exp(rng.uniform(0, math.log(max_ratio)))
    ratio = min(ratio, max_side / min_side)
    long_side = rng.uniform(min_side * ratio, max_side)
    short_side = max(min_side, long_side / ratio)
    long_side, short_side = _even(long_side), _even(short_side)
    return (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)


def _even(x: float) -> int:
    return int(round(x / 2)) * 2


def norm_box(box: tuple[int, int, int, int] | list[int], height: int, width: int) -> list[int]:
    """Pixel box ``(x0, y0, x1, y1)`` -> integers in ``[0, 1000)`` (the grounding answer format)."""
    x0, y0, x1, y1 = box
    return [min(999, int(x0 * 1000 / width)), min(999, int(y0 * 1000 / height)),
            min(999, int(x1 * 1000 / width)), min(999, int(y1 * 1000 / height))]


def format_box(box: list[int]) -> str:
    return "[" + ", ".join(str(v) for v in box) + "]"


@lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font at ``size`` px (same glyphs on every machine with this Pillow)."""
    return ImageFont.load_default(size=size)


def text_box(text: str, size: int, x: int, y: int) -> tuple[int, int, int, int]:
    """Pixel box of ``text`` drawn at ``(x, y)`` with :func:`font` of ``size``."""
    x0, y0, x1, y1 = font(size).getbbox(text)
    return x + x0, y + y0, x + x1, y + y1


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def position_word(cx: float, cy: float, height: int, width: int) -> str:
    """Where a point lies on a 3x3 grid: "top left", "centre", "bottom right", ..."""
    col = ("left", "centre", "right")[min(2, int(3 * cx / width))]
    row = ("top", "middle", "bottom")[min(2, int(3 * cy / height))]
    if row == "middle":
        return "centre" if col == "centre" else f"middle {col}"
    return f"{row} {col}" if col != "centre" else f"{row} centre"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else ("es" if word.endswith(("x", "sh")) else "s"))
