"""Early-fusion sequence building: samples -> token documents -> fixed-length packed batches.

1. :func:`tokenize_sample` renders a decoded sample (``doc`` segments for pre-training, ``messages`` for
   chat/SFT) and expands every media placeholder to exactly
   ``vision_encoder.geometry.num_vision_tokens`` tokens (an image: one block; a video: one block per
   chunk of ``frames_per_chunk`` frames, each preceded by its ``HH:MM:SS.mmm`` timestamp).
   Labels are -100 on the whole media span (timestamp, ``<|media_begin|>`` .. ``<|media_end|>``) and,
   in SFT mode, on everything but assistant turns.
2. :class:`Packer` fills ``B`` rows of ``L`` tokens with whole documents in arrival order (a text-only
   document longer than ``L`` is cut into ``L``-token pieces; a longer multimodal one is dropped and
   counted), then :func:`collate` builds the batch of docs/INTERFACES.md "Packed batches".

Pixels come from an injected processor (duck-typed; ``vision_encoder.processor.MoonViTProcessor`` fits):
``processor.preprocess_images(list_of_PIL) -> (pixel_values [P, 3, 14, 14], image_grid_thw [n, 3])`` and
``processor.preprocess_video(frames_THWC_uint8, timestamps=list) -> (pixel_values_videos [P', 3, 14, 14],
video_grid_thw [n_chunks, 3], chunk_timestamps)``. Without a processor the batch carries sizes only
(``image_hw``/``video_thw``), which is all token counting needs. The collator checks that the
processor's grids give exactly as many tokens as the placeholders.

Shapes: B rows, L tokens per row, P patches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from data_pipelines.adapters import ensure_record
from data_pipelines.tokenizer import SpecialIds, render_chat, require_chat_tokens, special_ids
from data_pipelines.video import format_timestamp
from vision_encoder.geometry import DEFAULT_GEOMETRY, PatchGeometry, num_vision_tokens, tokens_for_grid

IGNORE = -100
MODALITY = {"text": 0, "image": 1, "video": 2}


@dataclass
class TokenDoc:
    """One tokenized document: ids and labels (same length), its media, where it came from."""

    input_ids: list[int]
    labels: list[int]
    images: list[Any] = field(default_factory=list)  # PIL images in placeholder order
    videos: list[Any] = field(default_factory=list)  # DecodedVideo in placeholder order
    source: str = "unknown"
    modality: int = 0
    vision_tokens: int = 0


class Encoder:
    """Tokenizes decoded samples; ``mode`` is ``"pretrain"`` or ``"sft"``."""

    def __init__(self, tokenizer: Any, mode: str = "pretrain", image_geometry: PatchGeometry = DEFAULT_GEOMETRY,
                 video_geometry: PatchGeometry = DEFAULT_GEOMETRY):
        if mode not in ("pretrain", "sft"):
            raise ValueError(f"mode must be 'pretrain' or 'sft', got {mode!r}")
        self.tokenizer, self.mode = tokenizer, mode
        self.ids: SpecialIds = special_ids(tokenizer)
        self.image_geometry, self.video_geometry = image_geometry, video_geometry
        self._cache: dict[str, list[int]] = {}

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _word(self, word: str) -> list[int]:
        if word not in self._cache:
            self._cache[word] = self.text_ids(word)
        return self._cache[word]

    def image_block(self, height: int, width: int) -> list[int]:
        n = num_vision_tokens(1, height, width, self.image_geometry)
        i = self.ids
        return [i.media_begin, *self._word("image"), i.media_content, *([i.media_pad] * n), i.media_end]

    def video_blocks(self, num_frames: int, height: int, width: int, timestamps: Sequence[float]) -> list[int]:
        i, fpc, out = self.ids, self.video_geometry.frames_per_chunk, []
        for start in range(0, num_frames, fpc):
            n = num_vision_tokens(min(fpc, num_frames - start), height, width, self.video_geometry)
            out += self.text_ids(format_timestamp(timestamps[start]))
            out += [i.media_begin, *self._word("video"), i.media_content, *([i.video_placeholder] * n), i.media_end]
        return out

    def _pieces(self, record: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
        doc, messages = record.get("doc") or [], record.get("messages") or []
        if self.mode == "sft" and messages or not doc:
            if not messages:
                text = record.get("text", "")
                return [(text, True, None), ("<|endoftext|>", True, None)] if text else []
            require_chat_tokens(self.tokenizer)
            return render_chat(messages, train_on="assistant" if self.mode == "sft" else "all")
        pieces: list[tuple[str, bool, str | None]] = []
        media_kinds = [m["kind"] for m in record.get("media", [])]
        for k, seg in enumerate(doc):
            if "media" in seg:
                pieces.append(("", False, media_kinds[seg["media"]] if media_kinds else "image"))
            else:
                sep = "\n" if k + 1 < len(doc) else ""
                pieces.append((seg["text"] + sep, True, None))
        pieces.append(("<|endoftext|>", True, None))
        return pieces

    def encode(self, sample: dict[str, Any]) -> TokenDoc:
        """A decoded sample (``json`` record, ``images``, ``videos``; or a caption/``txt`` only, see
        :func:`data_pipelines.adapters.ensure_record`) -> :class:`TokenDoc`."""
        images, videos = list(sample.get("images", [])), list(sample.get("videos", []))
        record = ensure_record(sample)
        ids: list[int] = []
        labels: list[int] = []
        n_img = n_vid = vision = 0
        run_text, run_train = "", None
        for text, trainable, media in self._pieces(record) + [("", None, None)]:
            if (media is not None or trainable != run_train) and run_text:
                toks = self.text_ids(run_text)
                ids += toks
                labels += toks if run_train else [IGNORE] * len(toks)
                run_text = ""
            if media == "image":
                if n_img >= len(images):
                    raise ValueError(f"sample {sample.get('__key__')}: more image placeholders than images")
                w, h = images[n_img].size
                block = self.image_block(h, w)
                n_img += 1
            elif media == "video":
                if n_vid >= len(videos):
                    raise ValueError(f"sample {sample.get('__key__')}: more video placeholders than videos")
                v = videos[n_vid]
                t, h, w = v.frames_THWC.shape[:3]
                block = self.video_blocks(t, h, w, v.timestamps)
                n_vid += 1
            else:
                run_text, run_train = run_text + text, trainable
                continue
            vision += sum(tok in (self.ids.media_pad, self.ids.video_placeholder) for tok in block)
            ids += block
            labels += [IGNORE] * len(block)
        if n_img != len(images) or n_vid != len(videos):
            raise ValueError(f"sample {sample.get('__key__')}: {len(images)} images / {len(videos)} videos but "
                             f"{n_img} / {n_vid} placeholders")
        modality = MODALITY["video"] if videos else MODALITY["image"] if images else MODALITY["text"]
        source = record.get("family") or record.get("source") or "unknown"
        return TokenDoc(ids, labels, images, videos, source, modality, vision)


@dataclass
class Packer:
    """Greedy in-order packing of documents into ``batch_size`` rows of ``seq_len`` tokens."""

    seq_len: int
    batch_size: int
    rows: list[list[TokenDoc]] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.batch_size < 1:
            raise ValueError(f"seq_len must be >= 2 and batch_size >= 1, got {self.seq_len}, {self.batch_size}")
        self.rows = [[]]

    def _used(self, row: list[TokenDoc]) -> int:
        return sum(len(d.input_ids) for d in row)

    def split_long(self, doc: TokenDoc) -> list[TokenDoc]:
        """Pieces of at most ``seq_len`` tokens (text-only docs); [] (and a drop count) for long media docs."""
        n = len(doc.input_ids)
        if n <= self.seq_len:
            return [doc]
        if doc.images or doc.videos:
            self.dropped += 1
            return []
        L = self.seq_len
        return [TokenDoc(doc.input_ids[i:i + L], doc.labels[i:i + L], source=doc.source, modality=doc.modality)
                for i in range(0, n, L)]

    def add(self, doc: TokenDoc) -> bool:
        """Place ``doc`` (<= seq_len tokens); False when the batch is full and it must go to the next one."""
        if len(doc.input_ids) > self.seq_len:
            raise ValueError(f"document of {len(doc.input_ids)} tokens exceeds seq_len={self.seq_len}; split first")
        if self._used(self.rows[-1]) + len(doc.input_ids) > self.seq_len:
            if len(self.rows) == self.batch_size:
                return False
            self.rows.append([])
        self.rows[-1].append(doc)
        return True

    def empty(self) -> bool:
        return not any(self.rows)

    def take(self) -> list[list[TokenDoc]]:
        rows, self.rows = self.rows, [[]]
        return rows + [[] for _ in range(self.batch_size - len(rows))]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Prompt token rows of any lengths for batched generation (the RL sampler, the page demo) -> ids ``[R, S]``
    left-padded with ``pad_id`` and the attention mask ``[R, S]``
    (long, 1 = token), or ``None`` for the mask when every row has the same length (nothing to mask)."""
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError(f"left_pad: need non-empty rows, got lengths {[len(row) for row in rows]}")
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + list(row) for row in rows], dtype=torch.long, device=device)
    if all(len(row) == width for row in rows):
        return ids, None
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return ids, torch.tensor(mask, dtype=torch.long, device=device)


def collate(rows: Sequence[Sequence[TokenDoc]], seq_len: int, pad_id: int, processor: Any = None,
            special: SpecialIds | None = None) -> dict[str, Any]:
    """Rows of documents -> the packed batch dict (docs/INTERFACES.md "Packed batches").

    Padding (row tail) has ``attention_mask`` 0, labels -100, ``source_ids``/``modality_ids`` -1 and is
    its own ``cu_seqlens`` segment.
    """
    B, L = len(rows), seq_len
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    labels = torch.full((B, L), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    position_ids = torch.zeros(B, L, dtype=torch.long)
    source_ids = torch.full((B, L), -1, dtype=torch.long)
    modality_ids = torch.full((B, L), -1, dtype=torch.long)
    sources: list[str] = []
    bounds, images, videos = [0], [], []
    for b, row in enumerate(rows):
        t = 0
        for doc in row:
            n = len(doc.input_ids)
            if doc.source not in sources:
                sources.append(doc.source)
            input_ids[b, t:t + n] = torch.tensor(doc.input_ids)
            labels[b, t:t + n] = torch.tensor(doc.labels)
            attention_mask[b, t:t + n] = 1
            position_ids[b, t:t + n] = torch.arange(n)
            source_ids[b, t:t + n] = sources.index(doc.source)
            modality_ids[b, t:t + n] = doc.modality
            images += doc.images
            videos += doc.videos
            t += n
            bounds.append(b * L + t)
        if t < L:
            position_ids[b, t:] = torch.arange(L - t)
            bounds.append((b + 1) * L)
    batch: dict[str, Any] = {
        "input_ids": input_ids, "labels": labels, "attention_mask": attention_mask,
        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32), "position_ids": position_ids,
        "source_ids": source_ids, "modality_ids": modality_ids, "sources": sources,
        "image_hw": torch.tensor([[im.size[1], im.size[0]] for im in images], dtype=torch.long).view(-1, 2),
        "video_thw": torch.tensor([list(v.frames_THWC.shape[:3]) for v in videos], dtype=torch.long).view(-1, 3),
    }
    if processor is not None:
        _add_pixels(batch, images, videos, processor, special)
    return batch


def _add_pixels(batch: dict[str, Any], images: list[Any], videos: list[Any], processor: Any,
                special: SpecialIds | None) -> None:
    if images:
        batch["pixel_values"], batch["image_grid_thw"] = processor.preprocess_images(images)
    if videos:
        pvs, grids = [], []
        for v in videos:
            pv, grid, _ = processor.preprocess_video(v.frames_THWC, timestamps=v.timestamps)
            pvs.append(pv)
            grids.append(grid)
        batch["pixel_values_videos"], batch["video_grid_thw"] = torch.cat(pvs), torch.cat(grids)
    if special is not None:
        for key, tok in (("image_grid_thw", special.media_pad), ("video_grid_thw", special.video_placeholder)):
            if key in batch:
                want = int((batch["input_ids"] == tok).sum())
                merge = getattr(getattr(processor, "config", None), "image_geometry", DEFAULT_GEOMETRY)
                got = sum(tokens_for_grid(int(t), int(h), int(w), merge) for t, h, w in batch[key].tolist())
                if got != want:
                    raise ValueError(f"{key}: the processor's grids give {got} vision tokens but the prompt has "
                                     f"{want} placeholders; processor and packer geometries disagree")
