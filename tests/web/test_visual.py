"""SSIM visual similarity (no browser needed)."""

from __future__ import annotations

import numpy as np
import pytest

from eval.web_metric.visual import ssim, visual_similarity


def _page(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.full((300, 200, 3), 250, np.uint8)
    for _ in range(8):
        y, x = rng.integers(0, 260), rng.integers(0, 160)
        img[y : y + 30, x : x + 40] = rng.integers(0, 255, 3)
    return img


def test_identical_images_score_one() -> None:
    img = _page()
    assert ssim(img, img) == pytest.approx(1.0, abs=1e-12)
    assert visual_similarity(img, img) == pytest.approx(1.0, abs=1e-12)


def test_score_decreases_with_noise_and_with_missing_content() -> None:
    img = _page()
    rng = np.random.default_rng(1)
    noisy = [np.clip(img + rng.normal(0, s, img.shape), 0, 255).astype(np.uint8) for s in (5, 20, 60)]
    scores = [visual_similarity(img, n) for n in noisy]
    assert scores[0] > scores[1] > scores[2]
    assert visual_similarity(img, img[:150]) < 1.0


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="equal shapes"):
        ssim(np.zeros((4, 4, 3)), np.zeros((4, 5, 3)))
