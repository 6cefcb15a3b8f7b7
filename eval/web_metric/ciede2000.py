"""CIEDE2000 colour difference and sRGB -> CIELAB, written from the published formulas.

Sources: G. Sharma, W. Wu, E. N. Dalal, "The CIEDE2000 color-difference formula: implementation notes,
supplementary test data, and mathematical observations", Color Res. Appl. 30(1), 2005 (equations 1-22; the test
pairs in ``tests/web/test_ciede2000.py`` come from its Table 1); IEC 61966-2-1 (sRGB transfer function and
primaries); CIE 15 (XYZ -> L*a*b*, D65 white point).

Shapes: colour arrays are ``[..., 3]``; differences are ``[...]``. Everything is vectorised over leading axes.
"""

from __future__ import annotations

import numpy as np

_SRGB_TO_XYZ = np.array(
    [[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]]
)
_D65_WHITE = np.array([0.95047, 1.0, 1.08883])


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in 0..255 ``[..., 3]`` -> CIELAB (D65) ``[..., 3]`` as float64."""
    rgb = np.asarray(rgb, dtype=np.float64)
    if rgb.shape[-1] != 3:
        raise ValueError(f"rgb must have a last axis of 3, got shape {rgb.shape}")
    c = rgb / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = linear @ _SRGB_TO_XYZ.T / _D65_WHITE
    eps, kappa = 216 / 24389, 24389 / 27
    f = np.where(xyz > eps, np.cbrt(xyz), (kappa * xyz + 16) / 116)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def ciede2000(lab1: np.ndarray, lab2: np.ndarray, kl: float = 1.0, kc: float = 1.0, kh: float = 1.0) -> np.ndarray:
    """CIEDE2000 difference Delta E_00 between CIELAB colours ``[..., 3]`` (broadcasting); returns ``[...]``."""
    lab1, lab2 = np.asarray(lab1, dtype=np.float64), np.asarray(lab2, dtype=np.float64)
    if lab1.shape[-1] != 3 or lab2.shape[-1] != 3:
        raise ValueError(f"lab1 and lab2 need a last axis of 3, got {lab1.shape} and {lab2.shape}")
    l1, a1, b1 = np.moveaxis(lab1, -1, 0)
    l2, a2, b2 = np.moveaxis(lab2, -1, 0)
    # (2)-(7): a' with the chroma-dependent G factor, then C' and h'.
    c_bar = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_bar**7 / (c_bar**7 + 25.0**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p = np.degrees(np.arctan2(b1, a1p)) % 360
    h2p = np.degrees(np.arctan2(b2, a2p)) % 360
    # (8)-(11): differences; the hue difference is 0 when either chroma is 0.
    dlp, dcp = l2 - l1, c2p - c1p
    dh = h2p - h1p
    dh = np.where(dh > 180, dh - 360, np.where(dh < -180, dh + 360, dh))
    dh = np.where(c1p * c2p == 0, 0.0, dh)
    dhp = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    # (12)-(14): means; the hue mean wraps around 360 and is the plain sum when either chroma is 0.
    lbp, cbp = (l1 + l2) / 2, (c1p + c2p) / 2
    hsum, hdist = h1p + h2p, np.abs(h1p - h2p)
    hbp = np.where(hdist <= 180, hsum / 2, np.where(hsum < 360, (hsum + 360) / 2, (hsum - 360) / 2))
    hbp = np.where(c1p * c2p == 0, hsum, hbp)
    # (15)-(22): weighting functions and the rotation term.
    t = (1 - 0.17 * np.cos(np.radians(hbp - 30)) + 0.24 * np.cos(np.radians(2 * hbp))
         + 0.32 * np.cos(np.radians(3 * hbp + 6)) - 0.20 * np.cos(np.radians(4 * hbp - 63)))
    d_theta = 30 * np.exp(-(((hbp - 275) / 25) ** 2))
    rc = 2 * np.sqrt(cbp**7 / (cbp**7 + 25.0**7))
    sl = 1 + 0.015 * (lbp - 50) ** 2 / np.sqrt(20 + (lbp - 50) ** 2)
    sc = 1 + 0.045 * cbp
    sh = 1 + 0.015 * cbp * t
    rt = -np.sin(np.radians(2 * d_theta)) * rc
    terms = (dlp / (kl * sl), dcp / (kc * sc), dhp / (kh * sh))
    return np.sqrt(terms[0] ** 2 + terms[1] ** 2 + terms[2] ** 2 + rt * terms[1] * terms[2])


def rgb_delta_e(rgb1: np.ndarray, rgb2: np.ndarray) -> np.ndarray:
    """CIEDE2000 between sRGB colours (0..255) ``[..., 3]``."""
    return ciede2000(srgb_to_lab(rgb1), srgb_to_lab(rgb2))
