"""The registry of sample families and the built-in ones.

A family turns ``(rng, ctx)`` into one :class:`Sample`. Built-ins: ``shapes``, ``ocr``, ``chart``,
``document``, ``video`` (vision); ``interleaved`` and ``chat`` (vision, multi-image / multi-turn);
``text_mirror``, ``prose``, ``tool_sft`` and ``retrieval`` (text only; ``retrieval`` is only in the
``*_retrieval`` presets). Other packages add families with
:func:`register_family` (e.g. rendered web pages) and name them in a preset's ``counts``; the builder
never needs to change.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from data_pipelines.synth.common import Media, Sample, png_bytes, sample_size
from data_pipelines.synth.motion import motion_caption, motion_qa, motion_spec, render_frames
from data_pipelines.synth.questions import caption_and_qa
from data_pipelines.synth.retrieval import make_retrieval
from data_pipelines.synth.scenes import chart_spec, document_spec, render, shapes_spec, text_spec
from data_pipelines.synth.textual import mirror_problem, prose_corpus
from data_pipelines.synth.toolsft import make_tool_sft


@dataclass(frozen=True)
class FamilyContext:
    """Per-preset knobs a family may read, plus where the sample sits in the dataset."""

    split: str
    index: int
    seed: int
    image_sides: tuple[int, int] = (56, 448)
    video_sides: tuple[int, int] = (64, 160)
    video_frames: tuple[int, int] = (8, 16)
    video_fps: int = 8


@dataclass(frozen=True)
class SampleFamily:
    name: str
    stream: str  # "vision" or "text": which shard stream (and vision-ratio pool) it feeds
    make: Callable[[random.Random, FamilyContext], Sample]
    description: str = ""
    eval_suite: str | None = None  # "vision" / "text": part of that held-out suite


FAMILIES: dict[str, SampleFamily] = {}


def register_family(family: SampleFamily, replace: bool = False) -> SampleFamily:
    """Add a family to :data:`FAMILIES` (``replace=True`` to override one of the same name)."""
    if family.stream not in ("vision", "text"):
        raise ValueError(f"family {family.name!r}: stream must be 'vision' or 'text', got {family.stream!r}")
    if family.name in FAMILIES and not replace:
        raise ValueError(f"family {family.name!r} is already registered (pass replace=True)")
    if not family.name.isidentifier():
        raise ValueError(f"family name must be an identifier (it becomes part of a shard key), got {family.name!r}")
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> SampleFamily:
    if name not in FAMILIES:
        raise ValueError(f"unknown sample family {name!r}; registered: {sorted(FAMILIES)}")
    return FAMILIES[name]


def qa_text(items: list[dict[str, Any]]) -> str:
    return "\n".join(f"Q: {q['question']}\nA: {q['answer']}" for q in items)


SCENES = {"shapes": (shapes_spec, 56), "ocr": (text_spec, 56), "chart": (chart_spec, 112),
          "document": (document_spec, 96)}


def make_scene(rng: random.Random, ctx: FamilyContext, kind: str) -> tuple[dict[str, Any], Media]:
    make_spec, min_side = SCENES[kind]
    lo, hi = ctx.image_sides
    max_ratio = 8.0 if kind in ("shapes", "ocr") else 3.0
    height, width = sample_size(rng, max(lo, min_side), max(hi, min_side * 2), max_ratio)
    spec = make_spec(rng, height, width)
    return spec, Media("img0.png", "image", png_bytes(render(spec)), height, width)


def _image_family(kind: str) -> Callable[[random.Random, FamilyContext], Sample]:
    def make(rng: random.Random, ctx: FamilyContext) -> Sample:
        spec, media = make_scene(rng, ctx, kind)
        caption, questions = caption_and_qa(rng, spec)
        pick = rng.choice(questions)
        return Sample(
            family=kind, stream="vision", caption=caption, qa=questions, spec=spec, media=[media],
            doc=[{"media": 0}, {"text": caption + "\n" + qa_text(questions)}],
            messages=[{"role": "user", "content": [{"type": "image", "media": 0},
                                                   {"type": "text", "text": pick["question"]}]},
                      {"role": "assistant", "content": pick["answer"]}])
    return make


def make_video(rng: random.Random, ctx: FamilyContext) -> Sample:
    from data_pipelines.video import encode_mp4

    frames = rng.randint(*ctx.video_frames)
    spec = motion_spec(rng, ctx.video_sides[0], ctx.video_sides[1], frames, ctx.video_fps)
    data = encode_mp4(render_frames(spec), ctx.video_fps)
    media = Media("vid0.mp4", "video", data, spec["height"], spec["width"], frames, float(ctx.video_fps))
    caption, questions = motion_caption(spec), motion_qa(rng, spec)
    pick = rng.choice(questions)
    return Sample(family="video", stream="vision", caption=caption, qa=questions, spec=spec, media=[media],
                  doc=[{"media": 0}, {"text": caption + "\n" + qa_text(questions)}],
                  messages=[{"role": "user", "content": [{"type": "video", "media": 0},
                                                         {"type": "text", "text": pick["question"]}]},
                            {"role": "assistant", "content": pick["answer"]}])


def make_interleaved(rng: random.Random, ctx: FamilyContext) -> Sample:
    """An article: prose, figures (shapes or charts) with references to them, and a closing question."""
    corpus = prose_corpus()
    doc: list[dict[str, Any]] = [{"text": corpus[rng.randrange(len(corpus))][:600]}]
    media, specs, questions = [], [], []
    for i in range(rng.randint(2, 3)):
        spec, m = make_scene(rng, ctx, rng.choice(["shapes", "chart"]))
        m.name = f"img{i}.png"
        caption, qa_items = caption_and_qa(rng, spec)
        media.append(m)
        specs.append(spec)
        questions += [dict(q, media=i) for q in qa_items]
        doc += [{"text": f"Figure {i + 1} is shown below."}, {"media": i}, {"text": f"Figure {i + 1}: {caption}"}]
    last = rng.choice(questions)
    doc.append({"text": f"Question about figure {last['media'] + 1}: {last['question']} Answer: {last['answer']}"})
    return Sample(family="interleaved", stream="vision", doc=doc, qa=questions, media=media,
                  spec={"type": "interleaved", "figures": specs})


def make_chat(rng: random.Random, ctx: FamilyContext) -> Sample:
    """A multi-turn conversation about one image."""
    spec, media = make_scene(rng, ctx, rng.choice(list(SCENES)))
    caption, questions = caption_and_qa(rng, spec)
    turns = rng.sample(questions, min(len(questions), rng.randint(2, 3)))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful visual assistant."}]
    for i, q in enumerate(turns):
        content: list[dict[str, Any]] = [{"type": "text", "text": q["question"]}]
        if i == 0:
            content.insert(0, {"type": "image", "media": 0})
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": q["answer"]}]
    return Sample(family="chat", stream="vision", messages=messages, qa=turns, caption=caption, spec=spec,
                  media=[media])


def make_text_mirror(rng: random.Random, ctx: FamilyContext) -> Sample:
    h, w = sample_size(rng, 112, max(224, ctx.image_sides[1]), 3.0)
    spec = shapes_spec(rng, h, w) if rng.random() < 0.7 else chart_spec(rng, h, w)
    description, questions = mirror_problem(rng, spec)
    pick = rng.choice(questions)
    return Sample(family="text_mirror", stream="text", qa=questions, spec=spec, caption=description,
                  doc=[{"text": description + "\n" + qa_text(questions)}],
                  messages=[{"role": "user", "content": description + "\n" + pick["question"]},
                            {"role": "assistant", "content": pick["answer"]}])


def make_prose(rng: random.Random, ctx: FamilyContext) -> Sample:
    corpus = prose_corpus()
    i = rng.randrange(len(corpus))
    return Sample(family="prose", stream="text", doc=[{"text": corpus[i]}], spec={"type": "prose", "chunk": i})


for _fam in (
    SampleFamily("shapes", "vision", _image_family("shapes"), "coloured shapes; count/colour/shape/spatial/grounding",
                 "vision"),
    SampleFamily("ocr", "vision", _image_family("ocr"), "rendered words; OCR and text grounding", "vision"),
    SampleFamily("chart", "vision", _image_family("chart"), "bar charts with labelled values", "vision"),
    SampleFamily("document", "vision", _image_family("document"), "a title and lines of text", "vision"),
    SampleFamily("video", "vision", make_video, "moving shapes (mp4); motion questions", "vision"),
    SampleFamily("interleaved", "vision", make_interleaved, "prose with 2-3 figures in between"),
    SampleFamily("chat", "vision", make_chat, "multi-turn chat about one image"),
    SampleFamily("text_mirror", "text", make_text_mirror, "scenes/tables described in words + questions", "text"),
    SampleFamily("prose", "text", make_prose, "Python help topics and stdlib docstrings"),
    SampleFamily("tool_sft", "text", make_tool_sft, "zero-vision SFT: Python ops on an image handle"),
    SampleFamily("retrieval", "text", make_retrieval, "key-value registry + question (long-context retrieval)"),
):
    register_family(_fam)

__all__ = ["FAMILIES", "FamilyContext", "SampleFamily", "get_family", "make_scene", "qa_text", "register_family"]
