"""Real data in common layouts, through the same pipes as the synthetic world.

- Webdataset image-text shards (``{key}.jpg|png`` + ``{key}.txt|json`` with a caption) are read as they
  are: :func:`ensure_record` turns a decoded sample without our ``json`` record into one
  (``doc = [image..., caption]``), and the packer calls it for every sample.
- :func:`text_chunks`: a ``.txt`` file's text cut at blank lines into ~``chunk_chars`` documents (used by
  ``data_pipelines.convert``, which writes the user's text, images, videos and questions into a dataset folder).
"""

from __future__ import annotations

from typing import Any

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


def text_chunks(text: str, chunk_chars: int = 2000) -> list[str]:
    """Paragraphs (blank-line separated) joined into documents of up to ~``chunk_chars`` characters."""
    out, cur = [], ""
    for para in (p.strip() for p in text.split("\n\n")):
        if para:
            if cur and len(cur) + len(para) > chunk_chars:
                out.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
    return out + ([cur] if cur else [])
