"""Shared by the data-pipeline tests (importable as ``data_testing``; a test module importing ``conftest`` gets
whichever conftest pytest imported first, which depends on the directories named on the command line)."""

from __future__ import annotations

import torch

from data_pipelines.synth.build import PRESETS
from vision_encoder.geometry import DEFAULT_GEOMETRY, patch_grid_hw

# A quarter of `tiny` keeps every family while staying fast.
MINI = PRESETS["tiny"].scaled(0.25)


class FakeProcessor:
    """Correctly shaped zeros from the geometry (the interface of vision_encoder.processor.MoonViTProcessor)."""

    def __init__(self, geo=DEFAULT_GEOMETRY):
        self.geo = geo

    def preprocess_images(self, images):
        grids = [[1, *patch_grid_hw(im.size[1], im.size[0], self.geo)] for im in images]
        grid = torch.tensor(grids, dtype=torch.long).view(-1, 3)
        return torch.zeros(int(grid.prod(-1).sum()), 3, 14, 14), grid

    def preprocess_video(self, frames, timestamps=None, fps=None):
        t, h, w = frames.shape[:3]
        grids = [[min(self.geo.frames_per_chunk, t - s), *patch_grid_hw(h, w, self.geo)]
                 for s in range(0, t, self.geo.frames_per_chunk)]
        grid = torch.tensor(grids, dtype=torch.long)
        return torch.zeros(int(grid.prod(-1).sum()), 3, 14, 14), grid, [timestamps[s] for s in range(0, t, 4)]
