"""Functions the generated lm-eval task YAML call (``!function utils.NAME``; the suite's ``utils.py`` re-exports
these): media loading for vision tasks, scoring of grounding answers, and the tool-use check of
``kimi_vision_tooluse``.

Media paths in the JSONL are absolute (lm-eval resolves nothing relative to the YAML). A video doc's frames
are decoded from its mp4 with ``data_pipelines.video.decode_mp4`` and handed over as a list of PIL images; its
prompt carries the ``<video>`` placeholder that :mod:`eval.media_prompt` expands.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from PIL import Image

from data_pipelines.tokenizer import TOOL_TOKENS

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
BOX_RE = re.compile(r"\[" + ",".join([_NUM] * 4) + r"\]")


def doc_to_image(doc: dict[str, Any]) -> list[Image.Image]:
    """The doc's images, or the decoded frames of its video (``doc["video"]``)."""
    if doc.get("video"):
        from data_pipelines.video import decode_mp4

        path = Path(doc["video"])
        clip = decode_mp4(path.read_bytes(), name=str(path))
        return [Image.fromarray(f) for f in clip.frames_THWC]
    return [Image.open(p).convert("RGB") for p in doc.get("images", [])]


def parse_box(text: str) -> list[float] | None:
    """First ``[x0, y0, x1, y1]`` in ``text`` (floats), or None."""
    m = BOX_RE.search(text)
    return [float(v) for v in m.groups()] if m else None


def box_iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two ``[x0, y0, x1, y1]`` boxes (0 for degenerate boxes)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def process_grounding(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``iou`` of the first box in the generation with the target box, and ``acc_iou50`` (IoU >= 0.5)."""
    pred, gold = parse_box(results[0]), parse_box(doc["answer"])
    if gold is None:
        raise ValueError(f"doc {doc.get('id')}: target {doc['answer']!r} is not a box")
    iou = box_iou(pred, gold) if pred is not None else 0.0
    return {"iou": iou, "acc_iou50": float(iou >= 0.5)}


SECTION_BEGIN, CALL_BEGIN, ARG_BEGIN, CALL_END, SECTION_END = TOOL_TOKENS
_CALL = re.compile(re.escape(CALL_BEGIN) + r"\s*functions\.([A-Za-z_]\w*):(\d+)\s*" + re.escape(ARG_BEGIN)
                   + "(.*?)" + re.escape(CALL_END), re.DOTALL)


def well_formed_tool_call(text: str, tool: str = "python", argument: str = "code") -> bool:
    """Whether ``text`` (a generated assistant turn, special tokens kept) makes a well-formed call of ``tool``.

    The first tool-call section must be closed and hold only calls (whitespace between them), each
    ``<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{JSON object}<|tool_call_end|>`` with
    ``NAME == tool`` and a string ``argument`` in the object: the format of the zero-vision SFT transcripts
    (``data_pipelines.synth.toolsft`` rendered by the chat template). Free text before the section is allowed."""
    start = text.find(SECTION_BEGIN)
    end = text.find(SECTION_END, start + 1)
    if start < 0 or end < 0:
        return False
    body, pos, calls = text[start + len(SECTION_BEGIN):end], 0, 0
    for m in _CALL.finditer(body):
        if body[pos:m.start()].strip():
            return False
        pos = m.end()
        try:
            args = json.loads(m.group(3))
        except ValueError:
            return False
        if m.group(1) != tool or not isinstance(args, dict) or not isinstance(args.get(argument), str):
            return False
        calls += 1
    return calls > 0 and not body[pos:].strip()


def process_tooluse(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``tool_call``: the generation makes a well-formed python call (:func:`well_formed_tool_call`);
    ``tool_attempt``: it contains any tool-call marker (well-formed or not)."""
    text = results[0]
    return {"tool_call": float(well_formed_tool_call(text)),
            "tool_attempt": float(any(t in text for t in TOOL_TOKENS))}


__all__ = ["box_iou", "doc_to_image", "parse_box", "process_grounding", "process_tooluse", "well_formed_tool_call"]
