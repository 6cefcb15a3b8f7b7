"""Answer parsers: response text -> a typed answer, or ``None`` when the answer is unparseable.

Format convention (the prompt asks for it; the format check in :mod:`rl.rewards.registry` counts
violations): the final answer is the content of the *last* ``<answer>...</answer>`` pair; without
tags, the rest of the last line that starts with ``Answer:``; without either, the whole response
stripped. Each family parser then reads a strict form out of that answer string:

- :func:`parse_number` - one integer/decimal (``"12"``, ``"-3.5"``, ``"1,024"``), optional trailing ``.``;
- :func:`parse_int` - :func:`parse_number` that is integral;
- :func:`parse_choice` - one option letter (``"B"``, ``"(b)"``, ``"B."``);
- :func:`parse_boxes` - ``[[x1, y1, x2, y2], ...]`` (or one flat box), finite, with x1 <= x2, y1 <= y2;
- :func:`parse_points` - ``[[x, y], ...]`` (or one flat point).
"""

from __future__ import annotations

import json
import math
import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^\s*answer\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$|^[+-]?\.\d+$")
_CHOICE = re.compile(r"^\(?([A-Za-z])\)?\.?$")


def extract_answer(text: str) -> str:
    """The answer part of a response (see the module docstring for the precedence)."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1].strip()
    return text.strip()


def parse_number(answer: str) -> float | None:
    """``"1,024"`` -> 1024.0; ``"3.5."`` -> 3.5; anything else (words, two numbers, empty) -> None."""
    s = answer.strip().rstrip(".").strip()
    if s.endswith("%"):
        s = s[:-1].strip()
    if not _NUMBER.match(s):
        return None
    value = float(s.replace(",", ""))
    return value if math.isfinite(value) else None


def parse_int(answer: str) -> int | None:
    """An integral :func:`parse_number` (``"4"``, ``"4.0"``) as ``int``; ``"4.5"`` -> None."""
    value = parse_number(answer)
    if value is None or value != int(value):
        return None
    return int(value)


def parse_choice(answer: str, num_options: int | None = None) -> str | None:
    """One option letter, upper-cased; letters beyond ``num_options`` (if given) -> None."""
    m = _CHOICE.match(answer.strip())
    if m is None:
        return None
    letter = m.group(1).upper()
    if num_options is not None and ord(letter) - ord("A") >= num_options:
        return None
    return letter


def _parse_coords(answer: str, width: int) -> list[list[float]] | None:
    try:
        data = json.loads(answer.strip())
    except (json.JSONDecodeError, ValueError):
        return None
    if isinstance(data, list) and len(data) == width and all(isinstance(v, (int, float)) for v in data):
        data = [data]
    if not isinstance(data, list):
        return None
    out = []
    for item in data:
        if not isinstance(item, list) or len(item) != width:
            return None
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in item):
            return None
        out.append([float(v) for v in item])
    return out


def parse_boxes(answer: str) -> list[list[float]] | None:
    """``"[[x1,y1,x2,y2], ...]"`` -> list of boxes; ``"[]"`` -> [] (an explicit empty prediction)."""
    boxes = _parse_coords(answer, 4)
    if boxes is None or any(b[0] > b[2] or b[1] > b[3] for b in boxes):
        return None
    return boxes


def parse_points(answer: str) -> list[list[float]] | None:
    """``"[[x,y], ...]"`` -> list of points; ``"[]"`` -> []."""
    return _parse_coords(answer, 2)


__all__ = ["extract_answer", "parse_boxes", "parse_choice", "parse_int", "parse_number", "parse_points"]
