"""The page families plug into the synthetic world's registry and produce well-formed samples."""

from __future__ import annotations

import io
import random

import av

from data_pipelines.synth.families import FAMILIES, FamilyContext
from data_pipelines.web import decode_png
from data_pipelines.web.family import make_page_screenshot, make_page_video, page_viewport, register_page_families


def test_register_is_idempotent() -> None:
    before = dict(FAMILIES)
    try:
        register_page_families()
        register_page_families()
        assert FAMILIES["page"].stream == FAMILIES["page_video"].stream == "vision"
    finally:  # leave the registry as other tests in this session expect it
        FAMILIES.clear()
        FAMILIES.update(before)


def test_page_samples_are_deterministic_and_carry_the_html(browser) -> None:
    ctx = FamilyContext(split="train", index=0, seed=0, image_sides=(56, 448))
    assert (page_viewport(ctx).width, page_viewport(ctx).height) == (448, 336)
    image = make_page_screenshot(random.Random(5), ctx)
    assert make_page_screenshot(random.Random(5), ctx).media[0].data == image.media[0].data
    html = image.spec["html"]
    assert image.messages[-1]["content"] == html and image.doc[-1]["text"] == html
    assert decode_png(image.media[0].data).shape[:2] == (image.media[0].height, image.media[0].width)
    video = make_page_video(random.Random(5), ctx)
    assert video.spec["html"] == html
    with av.open(io.BytesIO(video.media[0].data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == video.media[0].frames >= 2 and frames[0].shape == (336, 448, 3)
