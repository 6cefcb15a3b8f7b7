"""MoonViT processor: token counts, grids and pixels against transformers' kimi_k25 processors; bad input."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from vision_encoder.geometry import DEFAULT_GEOMETRY, PatchGeometry, num_vision_tokens, resize_and_pad_hw
from vision_encoder.processor import (
    K25_IMAGE_GEOMETRY,
    MoonViTProcessor,
    MoonViTProcessorConfig,
    format_timestamp,
    sample_frame_indices,
)

k25_image = pytest.importorskip("transformers.models.kimi_k25.image_processing_kimi_k25")
k25_video = pytest.importorskip("transformers.models.kimi_k25.video_processing_kimi_k25")


def _random_sizes(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    sizes = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:
            sizes.append((rng.randint(1, 4000), rng.randint(1, 4000)))
        elif kind < 0.8:
            sizes.append((rng.randint(1, 60), rng.randint(1, 20000)))
        else:
            sizes.append((rng.randint(1, 30000), rng.randint(1, 100)))
    return sizes


@pytest.mark.parametrize("max_patches", [4096, 16384])
def test_geometry_matches_navit_resize_on_1000_sizes(max_patches: int) -> None:
    geo = PatchGeometry(max_patches=max_patches)
    proc = k25_image.Kimi_K25ImageProcessor(max_patches=max_patches)
    for w, h in _random_sizes(1000, seed=max_patches):
        (rh, rw), (ph, pw) = k25_image.navit_resize(h, w, 14, 2, max_patches, 512)
        assert resize_and_pad_hw(h, w, geo) == (rh, rw, ph, pw), (w, h)
        ours = num_vision_tokens(1, h, w, geo)
        assert ours * 4 == proc.get_number_of_image_patches(h, w), (w, h)


def test_video_token_counts_match_transformers() -> None:
    from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

    vproc = k25_video.Kimi_K25VideoProcessor()
    sizes = [(f, h, w) for f, (w, h) in zip([1, 3, 4, 5, 8, 13, 64], _random_sizes(7, seed=3))]
    proc = Kimi_K25Processor.__new__(Kimi_K25Processor)
    proc.video_processor = vproc
    proc.image_processor = k25_image.Kimi_K25ImageProcessor()
    proc._merge_kwargs = lambda **kw: {"images_kwargs": {}, "videos_kwargs": {}}
    expected = proc._get_num_multimodal_tokens(video_sizes=sizes)["num_video_tokens"]
    assert [num_vision_tokens(f, h, w, DEFAULT_GEOMETRY) for f, h, w in sizes] == expected


def _pil(w: int, h: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, size=(h, w, channels), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode=mode)


def test_pixel_values_match_transformers_image_processor() -> None:
    images = [_pil(100, 50, seed=1), _pil(700, 90, "RGBA", seed=2), _pil(13, 9, "L", seed=3), _pil(1200, 1100, seed=4)]
    ref = k25_image.Kimi_K25ImageProcessor(max_patches=4096)(images, return_tensors="pt")
    pixel_values, grid = MoonViTProcessor().preprocess_images(images)
    assert torch.equal(grid, ref["image_grid_thw"])
    assert pixel_values.dtype == torch.float32 and pixel_values.shape == ref["pixel_values"].shape
    torch.testing.assert_close(pixel_values, ref["pixel_values"], rtol=0, atol=1e-6)


def test_pixel_values_match_transformers_video_processor() -> None:
    from transformers.video_utils import VideoMetadata

    frames = torch.randint(0, 256, (10, 3, 61, 90), dtype=torch.uint8)
    meta = VideoMetadata(total_num_frames=10, fps=5.0, frames_indices=list(range(10)))
    ref = k25_video.Kimi_K25VideoProcessor()(
        [frames], video_metadata=[meta], do_sample_frames=False, return_tensors="pt")
    pixel_values, grid, times = MoonViTProcessor().preprocess_video(frames, fps=5.0)
    assert torch.equal(grid, ref["video_grid_thw"])
    assert grid[:, 0].tolist() == [4, 4, 2]
    torch.testing.assert_close(pixel_values, ref["pixel_values_videos"], rtol=0, atol=1e-6)
    assert times == [0.0, 0.8, 1.6]
    assert [format_timestamp(t) for t in times] == ["00:00:00.000", "00:00:00.800", "00:00:01.600"]


def test_patch_layout_is_row_major() -> None:
    img = torch.zeros(3, 28, 56, dtype=torch.uint8)
    img[:, :14, 14:28] = 255  # patch (row 0, col 1)
    pixel_values, grid = MoonViTProcessor().preprocess_images([img])
    assert grid.tolist() == [[1, 2, 4]]
    assert torch.allclose(pixel_values[1], torch.ones(3, 14, 14))
    assert torch.allclose(pixel_values[0], -torch.ones(3, 14, 14))


def test_large_image_respects_budget_and_side_cap() -> None:
    proc = MoonViTProcessor(MoonViTProcessorConfig(image_geometry=K25_IMAGE_GEOMETRY))
    _, grid = proc.preprocess_images([torch.zeros(3, 20, 9000, dtype=torch.uint8)])
    assert grid.tolist() == [[1, 2, 512]]  # width capped at 512 patches, height kept (never upsampled)
    assert proc.num_image_tokens(20, 9000) == 256


def test_frame_sampling_matches_transformers_rule() -> None:
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    for total, vfps, fps in [(300, 30.0, 2.0), (7, 24.0, 2.0), (100, 10.0, 1.5)]:
        meta = VideoMetadata(total_num_frames=total, fps=vfps)
        assert sample_frame_indices(total, vfps, fps=fps).tolist() == default_sample_indices_fn(meta, fps=fps).tolist()
    assert sample_frame_indices(10, None, num_frames=4).tolist() == [0, 2, 5, 7]


def test_video_file_decode_and_chunk(tmp_path) -> None:
    av = pytest.importorskip("av")
    pytest.importorskip("decord")
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            arr = np.full((48, 64, 3), i * 8, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    proc = MoonViTProcessor()
    pixel_values, grid, times = proc.preprocess_video_file(path, fps=2.0)
    assert grid.tolist() == [[4, 4, 6], [2, 4, 6]]
    assert pixel_values.shape == (144, 3, 14, 14)
    assert times == [0.0, 2.0]
    with pytest.raises(ValueError, match="clip_bad.mp4"):
        bad = tmp_path / "clip_bad.mp4"
        bad.write_bytes(path.read_bytes()[:200])
        proc.preprocess_video_file(bad)


def test_bad_inputs_are_converted_or_rejected(tmp_path) -> None:
    proc = MoonViTProcessor(MoonViTProcessorConfig(max_input_pixels=10_000))
    _, grid = proc.preprocess_images([_pil(30, 30, "L"), _pil(30, 30, "RGBA")])
    assert grid.tolist() == [[1, 4, 4], [1, 4, 4]]
    buf = io.BytesIO()
    _pil(80, 60).save(buf, format="PNG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ValueError, match="truncated.png"):
        proc.preprocess_images([str(truncated)])
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.jpg"):
        proc.preprocess_images([empty])
    with pytest.raises(ValueError, match=r"image .*missing.png: no such file"):
        proc.preprocess_images([tmp_path / "missing.png"])
    with pytest.raises(ValueError, match=r"video .*missing.mp4: no such file"):
        proc.load_video(tmp_path / "missing.mp4")
    big = tmp_path / "big.png"
    _pil(200, 100).save(big)
    with pytest.raises(ValueError, match=r"big.png.*max_input_pixels=10000"):
        proc.preprocess_images([big])
    with pytest.raises(ValueError, match="empty"):
        proc.preprocess_video([], fps=2.0, source="nothing.mp4")
    with pytest.raises(ValueError, match="empty"):
        proc.preprocess_images([torch.zeros(3, 0, 5, dtype=torch.uint8)])
