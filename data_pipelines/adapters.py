"""Real data in common layouts, through the same pipes as the synthetic world.

- Webdataset image-text shards (``{key}.jpg|png`` + ``{key}.txt|json`` with a caption) are read as they
  are: :func:`ensure_record` turns a decoded sample without our ``json`` record into one
  (``doc = [image..., caption]``), and the packer calls it for every sample.
- :func:`text_files_to_shards`: ``.txt`` files (cut at blank lines into ~``chunk_chars`` documents) and
  ``.jsonl`` files (one object per line with ``text`` or ``messages``) -> text shards.
- :func:`video_folder_to_shards`: a folder of videos, each with a caption file of the same stem
  (``clip.mp4`` + ``clip.txt``) -> vision shards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_pipelines.shards import VIDEO_EXTS, ShardInfo, ShardWriter

CAPTION_KEYS = ("caption", "text", "txt", "alt", "description")


def ensure_record(sample: dict[str, Any], source: str = "external") -> dict[str, Any]:
    """The sample's record (``json`` with ``doc``/``messages``), building one from images/videos + caption."""
    record = sample.get("json") if isinstance(sample.get("json"), dict) else {}
    if record.get("doc") or record.get("messages"):
        return record
    caption = sample.get("txt") or next((str(record[k]) for k in CAPTION_KEYS if record.get(k)), "")
    media = [{"kind": "image"} for _ in sample.get("images", [])]
    media += [{"kind": "video"} for _ in sample.get("videos", [])]
    doc: list[dict[str, Any]] = [{"media": i} for i in range(len(media))]
    if caption:
        doc.append({"text": caption})
    if not doc:
        raise ValueError(f"sample {sample.get('__key__')} has no media, caption or text")
    return {"family": record.get("source", source), "doc": doc, "media": media}


def _text_chunks(text: str, chunk_chars: int) -> list[str]:
    out, cur = [], ""
    for para in (p.strip() for p in text.split("\n\n")):
        if para:
            if cur and len(cur) + len(para) > chunk_chars:
                out.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
    return out + ([cur] if cur else [])


def _records_from_file(path: Path, chunk_chars: int) -> list[dict[str, Any]]:
    if path.suffix == ".txt":
        return [{"doc": [{"text": c}]} for c in _text_chunks(path.read_text(encoding="utf-8"), chunk_chars)]
    if path.suffix == ".jsonl":
        records = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON: {err}") from err
            if "messages" in obj:
                records.append({"messages": obj["messages"]})
            elif "text" in obj:
                records.append({"doc": [{"text": str(obj["text"])}]})
            else:
                raise ValueError(f"{path}:{n}: a line needs a 'text' or 'messages' field")
        return records
    raise ValueError(f"unsupported text file {path} (expected .txt or .jsonl)")


def text_files_to_shards(paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike, source: str = "user_text",
                         chunk_chars: int = 2000, max_count: int = 1000) -> list[ShardInfo]:
    """User ``.txt``/``.jsonl`` files -> ``{out_dir}/text-*.tar`` (stream ``text``)."""
    if not paths:
        raise ValueError("text_files_to_shards needs at least one path")
    writer = ShardWriter(out_dir, "text", max_count)
    n = 0
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"text file does not exist: {p}")
        for record in _records_from_file(p, chunk_chars):
            record.update(family=source, stream="text", media=[])
            text = "\n".join(s["text"] for s in record.get("doc", []))
            writer.write({"__key__": f"{source}_{n:08d}", "json": json.dumps(record, sort_keys=True), "txt": text})
            n += 1
    return writer.close()


def video_folder_to_shards(folder: str | os.PathLike, out_dir: str | os.PathLike, source: str = "user_video",
                           max_count: int = 200) -> list[ShardInfo]:
    """``clip.mp4`` + ``clip.txt`` pairs -> ``{out_dir}/vision-*.tar``; a video without a caption is an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"video folder does not exist: {folder}")
    videos = sorted(p for p in folder.iterdir() if p.suffix.lstrip(".").lower() in VIDEO_EXTS)
    if not videos:
        raise ValueError(f"no videos ({', '.join(VIDEO_EXTS)}) in {folder}")
    writer = ShardWriter(out_dir, "vision", max_count)
    for n, video in enumerate(videos):
        caption_path = video.with_suffix(".txt")
        if not caption_path.is_file():
            raise FileNotFoundError(f"video {video} has no caption file {caption_path.name}")
        caption = caption_path.read_text(encoding="utf-8").strip()
        record = {"family": source, "stream": "vision", "doc": [{"media": 0}, {"text": caption}],
                  "media": [{"kind": "video", "name": "vid0" + video.suffix.lower()}], "caption": caption}
        writer.write({"__key__": f"{source}_{n:08d}", "json": json.dumps(record, sort_keys=True), "txt": caption,
                      "vid0" + video.suffix.lower(): video.read_bytes()})
    return writer.close()
