"""Text-only data: scene descriptions with mirrored reasoning problems, and real prose found on every machine.

- Mirror problems describe a shapes scene or a chart table in words (pixel coordinates included) and ask
  the same questions as the visual tasks (counting, spatial relations, arithmetic, grounding), so the
  skills can transfer between modalities.
- Prose comes from ``pydoc_data.topics`` (Python's help topics) and the docstrings of standard-library
  modules (parsed with ``ast``, never imported), cut at paragraph boundaries into ~1.5 kB chunks. It
  depends on the Python version, which the dataset manifest records.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

from data_pipelines.synth.questions import chart_qa, shapes_qa

CHUNK_CHARS = 1500


def describe_shapes_scene(spec: dict[str, Any]) -> str:
    lines = [f"A {spec['width']} by {spec['height']} pixel canvas has a {spec['background']} background."]
    for o in spec["objects"]:
        x0, y0, x1, y1 = o["box"]
        lines.append(f"A {o['size']} {o['color']} {o['kind']} occupies x from {x0} to {x1} and y from {y0} to {y1}.")
    return " ".join(lines)


def describe_chart_table(spec: dict[str, Any]) -> str:
    rows = "; ".join(f"{b['label']}: {b['value']}" for b in spec["bars"])
    return f'A table titled "{spec["title"]}" lists these values. {rows}.'


def mirror_problem(rng: random.Random, spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """``(description, QA list)`` for a shapes or chart spec, in words only."""
    if spec["type"] == "shapes":
        return describe_shapes_scene(spec), shapes_qa(rng, spec, scene_word="scene")
    if spec["type"] == "chart":
        return describe_chart_table(spec), chart_qa(rng, spec, scene_word="table")
    raise ValueError(f"mirror problems need a shapes or chart spec, got {spec.get('type')!r}")


def _chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    out, cur = [], ""
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        if cur and len(cur) + len(para) > size:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur:
        out.append(cur)
    return [c for c in out if len(c) >= 200]


def _stdlib_docstrings(max_files: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.glob("*.py"))[:max_files]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 120:
                    texts.append(doc)
    return texts


@lru_cache(maxsize=4)
def prose_corpus(max_stdlib_files: int = 120) -> tuple[str, ...]:
    """Chunks of real English: help topics first, then stdlib docstrings (both sorted, so stable)."""
    import pydoc_data.topics as topics

    chunks: list[str] = []
    for key in sorted(topics.topics):
        chunks.extend(_chunks(topics.topics[key]))
    chunks.extend(_chunks("\n\n".join(_stdlib_docstrings(max_stdlib_files))))
    if not chunks:
        raise RuntimeError("no prose found in pydoc_data.topics or the standard library")
    return tuple(chunks)
