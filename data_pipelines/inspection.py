"""Statistics and a contact sheet of a shard dataset (``kimi-vl data inspect DIR``).

Statistics: samples per split/family, QA categories, image sizes, aspect ratios and vision tokens per
image (from ``vision_encoder.geometry``), video frame counts, text lengths, undecodable samples. The
contact sheet is a PNG grid of the first images (or first video frames) of vision samples, each with
one question and its answer underneath.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from data_pipelines.shards import CorruptSample, decode_sample, iter_tar, list_shards
from data_pipelines.synth.common import font
from vision_encoder.geometry import num_vision_tokens

THUMB = 160


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    return {"min": s[0], "median": s[len(s) // 2], "max": s[-1], "mean": round(sum(s) / len(s), 2)}


def _thumb(sample: dict[str, Any]) -> Image.Image | None:
    if sample["images"]:
        image = sample["images"][0].copy()
    elif sample["videos"]:
        image = Image.fromarray(sample["videos"][0].frames_THWC[0])
    else:
        return None
    image.thumbnail((THUMB, THUMB))
    return image


def contact_sheet(cells: list[tuple[Image.Image, str]], cols: int = 6) -> Image.Image:
    rows = max(1, -(-len(cells) // cols))
    cell_h = THUMB + 44
    sheet = Image.new("RGB", (cols * (THUMB + 8), rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (thumb, text) in enumerate(cells):
        x, y = (i % cols) * (THUMB + 8) + 4, (i // cols) * cell_h + 4
        sheet.paste(thumb, (x, y))
        for j, line in enumerate(_wrap(text, 30)[:3]):
            draw.text((x, y + THUMB + 2 + 12 * j), line, fill=(0, 0, 0), font=font(10))
    return sheet


def _wrap(text: str, width: int) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    return lines + ([cur] if cur else [])


def inspect_dataset(root: str | os.PathLike, out: str | os.PathLike | None = None, max_cells: int = 36,
                    video_frames: int = 4) -> dict[str, Any]:
    """Compute statistics over every shard under ``root``; write ``stats.json`` and ``contact_sheet.png``
    to ``out`` (default ``root/inspect``); returns the statistics."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"dataset path does not exist: {root}")
    out = Path(out) if out is not None else root / "inspect"
    families, categories, corrupt = Counter(), Counter(), 0
    heights, widths, ratios, tokens, frames, text_chars = [], [], [], [], [], []
    cells: list[tuple[Image.Image, str]] = []
    for shard in list_shards(root):
        for raw in iter_tar(shard):
            try:
                sample = decode_sample(raw, video_fps=None, video_frames=video_frames)
            except CorruptSample:
                corrupt += 1
                continue
            record = sample.get("json", {})
            split = Path(shard).parent.name
            families[f"{split}/{record.get('family', 'external')}"] += 1
            categories.update(q["category"] for q in record.get("qa", []))
            text_chars.append(len(sample.get("txt", "")))
            for image in sample["images"]:
                w, h = image.size
                heights.append(h)
                widths.append(w)
                ratios.append(round(max(w / h, h / w), 2))
                tokens.append(num_vision_tokens(1, h, w))
            frames += [m["frames"] for m in record.get("media", []) if m.get("kind") == "video"]
            thumb = _thumb(sample) if len(cells) < max_cells else None
            if thumb is not None:
                q = (record.get("qa") or [{"question": record.get("caption", ""), "answer": ""}])[0]
                cells.append((thumb, f"[{record.get('family', '?')}] {q['question']} -> {q['answer']}"))
    stats = {"samples": sum(families.values()), "corrupt": corrupt, "families": dict(sorted(families.items())),
             "qa_categories": dict(sorted(categories.items())), "image_height": _summary(heights),
             "image_width": _summary(widths), "aspect_ratio": _summary(ratios),
             "vision_tokens_per_image": _summary(tokens), "video_frames": _summary(frames),
             "text_chars": _summary(text_chars)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    if cells:
        contact_sheet(cells).save(out / "contact_sheet.png")
    return stats
