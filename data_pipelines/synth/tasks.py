"""Held-out verifiable tasks for evaluation and RL: one :class:`TaskItem` per question of the eval split.

Suites: ``vision`` (families whose ``eval_suite`` is ``vision``: shapes, ocr, chart, document, video) and
``text`` (text_mirror). Items come from a built dataset's ``eval`` split, or are generated on the fly
from the same eval seeds (``source=None``). :func:`check_answer` scores a prediction: integers and
strings by normalised exact match, boxes by IoU (all in ``[0, 1]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from data_pipelines.synth.build import generate_sample, get_preset, split_shards
from data_pipelines.synth.families import FAMILIES


@dataclass
class TaskItem:
    id: str
    suite: str
    family: str
    category: str
    question: str
    answer: str
    answer_type: str  # int | str | yesno | box
    images: list[Any] = field(default_factory=list)  # PIL, native size
    videos: list[Any] = field(default_factory=list)  # DecodedVideo
    context: str = ""  # text suite: the scene description the question is about
    spec: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, Any]]:
        """The user turn (media parts first) to send to a chat model."""
        parts: list[dict[str, Any]] = [{"type": "image", "media": i} for i in range(len(self.images))]
        parts += [{"type": "video", "media": i} for i in range(len(self.videos))]
        text = f"{self.context}\n{self.question}" if self.context else self.question
        return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def suite_families(suite: str) -> list[str]:
    fams = sorted(n for n, f in FAMILIES.items() if f.eval_suite == suite)
    if not fams:
        raise ValueError(f"unknown eval suite {suite!r}; suites: "
                         f"{sorted({f.eval_suite for f in FAMILIES.values() if f.eval_suite})}")
    return fams


def dataset_families(root: str | None, suite: str) -> list[str]:
    """The families of ``suite``: the registered ones, plus those a dataset folder's manifest declares for it
    (``eval_suites``: ``kimi-vl data convert`` declares the user's questions, ``<source>_vqa``, as ``vision``)."""
    fams = set(suite_families(suite))
    if root is not None:
        from data_pipelines.synth.build import read_manifest

        fams |= {f for f, s in read_manifest(root).get("eval_suites", {}).items() if s == suite}
    return sorted(fams)


def _items(record: dict[str, Any], images: list[Any], videos: list[Any], key: str, suite: str) -> Iterator[TaskItem]:
    context = record.get("caption", "") if suite == "text" else ""
    for j, q in enumerate(record.get("qa", [])):
        yield TaskItem(f"{key}#{j}", suite, record["family"], q["category"], q["question"], q["answer"],
                       q["answer_type"], images, videos, context, record.get("spec", {}))


def eval_items(source: str | None = None, suite: str = "vision", preset: str = "tiny", seed: int = 0,
               limit: int | None = None, video_fps: float | None = 2.0) -> list[TaskItem]:
    """Items of ``suite`` from a dataset directory's eval split, or generated (``source=None``)."""
    from data_pipelines.shards import decode_sample, iter_tar

    families, out = set(dataset_families(source, suite)), []
    if source is None:
        p = get_preset(preset)
        for fam in sorted(families & set(p.eval)):
            for i in range(p.eval[fam]):
                s = generate_sample(p, seed, "eval", fam, i)
                raw = {"__key__": s.meta["key"], **{m.name: m.data for m in s.media}}
                dec = decode_sample(raw, video_fps=video_fps)
                out += _items(s.record(), dec["images"], dec["videos"], s.meta["key"], suite)
    else:
        for shard in split_shards(source, "eval"):
            for raw in iter_tar(shard):
                dec = decode_sample(raw, video_fps=video_fps)
                if dec.get("json", {}).get("family") in families:
                    out += _items(dec["json"], dec["images"], dec["videos"], dec["__key__"], suite)
    return out[:limit] if limit is not None else out


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()


def _box(text: str) -> list[float] | None:
    nums = re.findall(r"-?\d+(?:\.\d+)?", text)
    return [float(v) for v in nums[:4]] if len(nums) >= 4 else None


def box_iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def check_answer(prediction: str, answer: str, answer_type: str) -> float:
    """Score in ``[0, 1]``: IoU for boxes, else 1.0 on a normalised exact match (first integer for ints)."""
    if answer_type == "box":
        pred, gold = _box(prediction), _box(answer)
        return box_iou(pred, gold) if pred is not None and gold is not None else 0.0
    if answer_type == "int":
        found = re.search(r"-?\d+", prediction)
        return float(found is not None and int(found.group()) == int(answer))
    return float(_norm(prediction) == _norm(answer))
