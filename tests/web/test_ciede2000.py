"""CIEDE2000 against Sharma, Wu & Dalal (2005) Table 1, and sRGB -> Lab anchors (no browser needed)."""

from __future__ import annotations

import numpy as np
import pytest

from eval.web_metric.ciede2000 import ciede2000, rgb_delta_e, srgb_to_lab

# (L1, a1, b1), (L2, a2, b2), Delta E00 - pairs 1, 2, 3, 7, 13, 17, 25 of the paper's test data.
SHARMA = [
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 3.1571, -77.2803), (50.0, 0.0, -82.7485), 2.8615),
    ((50.0, 2.8361, -74.0200), (50.0, 0.0, -82.7485), 3.4412),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, 2.4900, -0.0010), (50.0, -2.4900, 0.0009), 7.1792),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
]


def test_matches_published_test_pairs() -> None:
    lab1 = np.array([p[0] for p in SHARMA])
    lab2 = np.array([p[1] for p in SHARMA])
    expected = np.array([p[2] for p in SHARMA])
    np.testing.assert_allclose(ciede2000(lab1, lab2), expected, atol=5e-5)
    np.testing.assert_allclose(ciede2000(lab2, lab1), expected, atol=5e-5)


def test_srgb_to_lab_anchors() -> None:
    lab = srgb_to_lab(np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0]]))
    np.testing.assert_allclose(lab[0], [100.0, 0.0, 0.0], atol=1e-3)
    np.testing.assert_allclose(lab[1], [0.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(lab[2], [53.24, 80.09, 67.20], atol=0.02)


def test_rgb_delta_e_zero_for_equal_and_grows_with_distance() -> None:
    base = np.array([40, 90, 160])
    assert float(rgb_delta_e(base, base)) == 0.0
    steps = [float(rgb_delta_e(base, base + [d, 0, 0])) for d in (10, 40, 90)]
    assert steps == sorted(steps) and steps[0] > 0


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="last axis of 3"):
        srgb_to_lab(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="last axis of 3"):
        ciede2000(np.zeros(3), np.zeros(2))
