"""Page-to-HTML generation with a trained checkpoint: the training prompt, the training pixels, greedy decoding.

The prompt is built exactly as the training app builds an SFT sample of the ``page``/``page_video`` families
(``data_pipelines.web.family``): the chat ``[user: media + instruction]`` goes through
:class:`data_pipelines.packing.Encoder` (``mode="sft"``, so the same ``render_chat`` pieces, media blocks and
timestamps as in training), the assistant header is appended, and :func:`data_pipelines.packing.collate` with the
MoonViT processor turns it into ``input_ids`` plus ``pixel_values[_videos]`` / ``*_grid_thw`` (checking that the
processor's grids give as many vision tokens as the prompt has placeholders). Videos are decoded with
``data_pipelines.video.decode_mp4`` at the loader's 2 frames per second, as in training.

The processor's patch budget must be the one the model was trained with: it is read from the run config next to
an export (``RUN/config.yaml`` for ``RUN/final``, key ``data.max_patches``), else given explicitly.

Several prompts decode as one left-padded batch (:meth:`WebsiteGenerator.generate_batch`; rows never interact:
the model zeroes padded positions for KDA and masks them for MLA). Decoding (``decode=``): ``"generate"``
(transformers' ``generate``), ``"static"`` / ``"graph"`` (``kimi_vl.generation.GraphDecoder``: a static cache, on
CUDA each token one CUDA-graph replay; the same greedy tokens), ``"auto"`` (``"graph"`` on CUDA for a model
without MoE layers, else ``"generate"``).

Shapes: ``T`` prompt tokens, ``P`` packed patches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from PIL import Image

from data_pipelines.packing import IGNORE, Encoder, TokenDoc, collate, left_pad
from data_pipelines.page_prompts import IMAGE_PROMPT, VIDEO_PROMPT
from data_pipelines.tokenizer import ROLE_HEADERS
from data_pipelines.video import DecodedVideo, decode_mp4
from kimi_vl.exports import export_folder
from kimi_vl.modeling.multimodal import MEDIA_KEYS
from vision_encoder.geometry import PatchGeometry
from vision_encoder.processor import MoonViTProcessor, MoonViTProcessorConfig

VIDEO_FPS = 2.0  # the training loader's sampling rate (data_pipelines.loader.LoaderConfig.video_fps)
MAX_VIDEO_FRAMES = 32


@dataclass
class Generation:
    """One generation: the decoded text (special tokens removed), token counts and seconds."""

    text: str
    prompt_tokens: int
    new_tokens: int
    vision_tokens: int
    seconds: float  # wall time of the generate call (of the whole batch, for a batched generation)
    stopped: bool  # True when the model ended its turn (``<|im_end|>`` / end of text) before ``max_new_tokens``


def run_config_max_patches(checkpoint: str | os.PathLike) -> int | None:
    """``data.max_patches`` of the run that wrote ``checkpoint`` (an export ``RUN/final`` or ``RUN``), if found."""
    folder = Path(checkpoint)
    for candidate in (folder / "config.yaml", folder.parent / "config.yaml"):
        if candidate.is_file():
            data = yaml.safe_load(candidate.read_text()) or {}
            value = (data.get("data") or {}).get("max_patches")
            if value is not None:
                return int(value)
    return None


def load_video(path_or_bytes: str | os.PathLike | bytes, fps: float = VIDEO_FPS,
               max_frames: int = MAX_VIDEO_FRAMES) -> DecodedVideo:
    """Decode a clip at ``fps`` (the training rate); a long clip gets ``max_frames`` evenly spaced frames."""
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else Path(path_or_bytes).read_bytes()
    name = "<bytes>" if isinstance(path_or_bytes, bytes) else str(path_or_bytes)
    video = decode_mp4(data, fps=fps, name=name)
    if len(video.timestamps) > max_frames:
        video = decode_mp4(data, num_frames=max_frames, name=name)
    return video


class WebsiteGenerator:
    """A loaded checkpoint (model, tokenizer, processor) that writes HTML for a screenshot or a scroll video."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_patches: int, device: str = "cpu",
                 decode: str = "auto") -> None:
        missing = [k for k in MEDIA_KEYS if k not in _forward_params(model)]
        if missing:
            raise ValueError(f"{type(model).__name__} takes no {missing}: the checkpoint has no vision tower "
                             "(train with model.vision_flavor set, e.g. kimi_vl/configs/tiny_web.yaml)")
        self.model, self.tokenizer, self.device = model.to(device).eval(), tokenizer, torch.device(device)
        geo = PatchGeometry(max_patches=max_patches)
        self.processor = MoonViTProcessor(MoonViTProcessorConfig(image_geometry=geo, video_geometry=geo))
        self.encoder = Encoder(tokenizer, "sft", geo, geo)
        vocab = tokenizer.get_vocab()
        self.stop_ids = sorted({vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab})
        from kimi_vl.generation import DecoderSlot, resolve_decode

        self.decode = decode = resolve_decode(decode, self.model, self.device)
        self._decoders: Any = None  # kimi_vl.generation.DecoderSlot when decode is static or graph
        if decode != "generate":
            self._decoders = DecoderSlot(self.model, use_graph=decode == "graph")

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike, max_patches: int | None = None, device: str = "cpu",
                        dtype: torch.dtype = torch.float32, decode: str = "auto") -> WebsiteGenerator:
        """``import kimi_vl``, ``AutoModelForImageTextToText.from_pretrained`` (weights in ``dtype``) and the
        tokenizer saved beside it."""
        from transformers import AutoModelForImageTextToText

        import kimi_vl  # noqa: F401 - registers the suite's Auto classes
        import kimi_vl.modeling.multimodal  # noqa: F401 - registers AutoModelForImageTextToText (not done by kimi_vl)
        from data_pipelines.tokenizer import load_tokenizer

        folder = export_folder(checkpoint, "checkpoint")
        patches = max_patches if max_patches is not None else run_config_max_patches(folder)
        if patches is None:
            raise ValueError(f"checkpoint {folder}: no run config with data.max_patches beside it; pass max_patches "
                             "(the processor budget the model was trained with)")
        model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=dtype)
        return cls(model, load_tokenizer(folder), patches, device, decode)

    def prompt(self, image: Image.Image | None = None, video: DecodedVideo | None = None,
               text: str | None = None) -> tuple[dict[str, Any], int]:
        """The model inputs for one screenshot or one video (exactly one), and the prompt's vision-token count.
        ``text``: the instruction (default: the page families' instruction for the medium)."""
        if (image is None) == (video is None):
            raise ValueError("pass exactly one of image= or video=")
        kind = "image" if image is not None else "video"
        text = text if text is not None else page_instruction(kind)
        messages = [{"role": "user", "content": [{"type": kind, "media": 0}, {"type": "text", "text": text}]}]
        sample = {"__key__": "demo", "json": {"messages": messages, "media": [{"kind": kind}]},
                  "images": [image.convert("RGB")] if image is not None else [],
                  "videos": [video] if video is not None else []}
        doc = self.encoder.encode(sample)
        header = self.encoder.text_ids(ROLE_HEADERS["assistant"])
        doc = TokenDoc(doc.input_ids + header, doc.labels + [IGNORE] * len(header), doc.images, doc.videos,
                       doc.source, doc.modality, doc.vision_tokens)
        batch = collate([[doc]], len(doc.input_ids), self.encoder.ids.pad, self.processor, self.encoder.ids)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", *MEDIA_KEYS) if k in batch}
        return inputs, doc.vision_tokens

    def batch_inputs(self, media: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[int]]:
        """Model inputs for several prompts (each the keyword arguments of :meth:`prompt`), left-padded to one
        width (the model masks padding: ``kimi_vl.modeling.model``), media packed in row order; and each prompt's
        vision-token count."""
        if not media:
            raise ValueError("batch_inputs needs at least one prompt")
        prompts = [self.prompt(**m) for m in media]
        ids, mask = left_pad([p["input_ids"][0].tolist() for p, _ in prompts], self.encoder.ids.pad)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids) if mask is None else mask}
        for key in MEDIA_KEYS:
            parts = [p[key] for p, _ in prompts if key in p]
            if parts:
                batch[key] = torch.cat(parts)
        return batch, [v for _, v in prompts]

    @torch.no_grad()
    def generate_batch(self, media: Sequence[dict[str, Any]], max_new_tokens: int = 1024,
                       max_time: float | None = None) -> list[Generation]:
        """Greedy decoding of several prompts at once (see :meth:`batch_inputs`), each row until its assistant
        turn ends or ``max_new_tokens``; every row's ``seconds`` is the batch's wall time. ``max_time``: stop
        every row after this many seconds (``generate``'s own limit; rows cut there are not ``stopped``)."""
        inputs, vision_tokens = self.batch_inputs(media)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        width = inputs["input_ids"].shape[1]
        prompt_tokens = inputs["attention_mask"].sum(1).tolist()
        t0 = time.perf_counter()
        if self.decode == "generate":
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, max_time=max_time,
                                      eos_token_id=self.stop_ids, pad_token_id=self.encoder.ids.pad)
        else:
            ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
            out = self._decoders.get(ids.shape[0], width + max_new_tokens).generate(
                ids, mask, max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids,
                pad_token_id=self.encoder.ids.pad, max_time=max_time, **inputs)
        seconds = time.perf_counter() - t0
        return [self._finish(row[width:].tolist(), int(n), v, seconds)
                for row, n, v in zip(out, prompt_tokens, vision_tokens)]

    def generate(self, image: Image.Image | None = None, video: DecodedVideo | None = None,
                 max_new_tokens: int = 1024) -> Generation:
        """Greedy decoding until the assistant turn ends or ``max_new_tokens``."""
        return self.generate_batch([{"image": image, "video": video}], max_new_tokens)[0]

    def _finish(self, new: list[int], prompt_tokens: int, vision_tokens: int, seconds: float) -> Generation:
        """A row's new tokens cut after its first stop token (later ones are the batch's padding)."""
        end = next((i + 1 for i, t in enumerate(new) if t in self.stop_ids), None)
        new = new[:end] if end is not None else new
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, prompt_tokens, len(new), vision_tokens, seconds, end is not None)


def page_instruction(kind: str) -> str:
    """The page families' instruction for ``kind`` (``image`` or ``video``), from ``data_pipelines.page_prompts``
    (not the families' module, which loads the renderer and PyAV)."""
    return {"image": IMAGE_PROMPT, "video": VIDEO_PROMPT}[kind]


def _forward_params(model: torch.nn.Module) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


__all__ = ["Generation", "VIDEO_FPS", "WebsiteGenerator", "load_video", "page_instruction", "run_config_max_patches"]
