"""Visual similarity of two text-removed screenshots: SSIM (Wang, Bovik, Sheikh, Simoncelli, IEEE TIP 2004).

Design2Code uses CLIP embeddings here; this suite uses SSIM so that the metric needs no downloaded weights and
is exactly reproducible. Preprocessing (named in :data:`VISUAL_METHOD`): both images are padded with white to a
common size (a missing or extra part of the page lowers the score), box-downsampled to ``width`` pixels wide
(the same factor for both), then SSIM with an 11-tap Gaussian window (sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255)
is averaged over the R, G, B channels and clipped to [0, 1].

Shapes: images are ``uint8 [H, W, 3]``.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage

VISUAL_METHOD = "ssim-rgb(text-removed, white-padded, box-downsampled to {width}px wide, gaussian sigma=1.5)"


def pad_to(image_HW3: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pad ``uint8 [H, W, 3]`` with white at the bottom/right to ``[height, width, 3]``."""
    h, w = image_HW3.shape[:2]
    return np.pad(image_HW3, ((0, height - h), (0, width - w), (0, 0)), constant_values=255)


def ssim(x_HW3: np.ndarray, y_HW3: np.ndarray, sigma: float = 1.5) -> float:
    """Mean SSIM over channels of two equally shaped images in 0..255 (reference implementation, float64)."""
    if x_HW3.shape != y_HW3.shape:
        raise ValueError(f"ssim needs equal shapes, got {x_HW3.shape} and {y_HW3.shape}")
    x, y = x_HW3.astype(np.float64), y_HW3.astype(np.float64)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    blur = lambda a: ndimage.gaussian_filter(a, sigma=(sigma, sigma, 0), truncate=3.5, mode="reflect")
    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return float(ssim_map.mean())


def visual_similarity(reference_HW3: np.ndarray, candidate_HW3: np.ndarray, width: int = 160) -> float:
    """SSIM of two screenshots after white padding to a common size and downsampling (see module docstring)."""
    height = max(reference_HW3.shape[0], candidate_HW3.shape[0])
    full_width = max(reference_HW3.shape[1], candidate_HW3.shape[1])
    out_w = min(width, full_width)
    out_h = max(1, round(height * out_w / full_width))
    small = [
        np.asarray(Image.fromarray(pad_to(img, height, full_width)).resize((out_w, out_h), Image.Resampling.BOX))
        for img in (reference_HW3, candidate_HW3)
    ]
    return float(np.clip(ssim(small[0], small[1]), 0.0, 1.0))
