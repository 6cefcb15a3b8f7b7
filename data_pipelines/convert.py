"""User data -> a dataset folder in the layout ``kimi-vl data synth`` writes, so that training (``data.path``), RL
(verifiable questions) and the held-out evaluation read it unchanged::

    OUT/{train,eval}/{text,vision}-NNNNNN.tar    webdataset shards (records as the synthetic world's)
    OUT/manifest.json                            splits, streams, shards (sha256), counts, content hash
    OUT/tokenizer/                               a byte-level BPE trained on the train split (unless vocab 0)

Inputs (any mix, see :func:`convert_dataset`): text files (``.txt`` cut at blank lines; ``.jsonl`` lines with
``text``, ``messages``, or questions about a ``context``: ``{"context": ..., "question": ..., "answer": ...}`` or
``"qa": [...]``, family ``<source>_textqa`` of the ``text`` suite, for the text RL arm and evaluation), video
folders (``clip.mp4`` + ``clip.txt``), image folders (``a.png`` + ``a.txt``), JSONL files of images or a video per
line with captions and/or verifiable questions (below), and existing webdataset shards (``--shards`` for the train
split, ``--eval-shards`` for the eval split; each sample is a vision sample when it has an image or video member).

A JSONL line of ``--images``::

    {"image": "imgs/a.png" | ["a.png", "b.png"],          # relative to the JSONL file's folder; or
     "video": "clips/c.mp4",                               # one video instead
     "caption": "...",                                     # optional: pre-training text
     "question": "...", "answer": "3",                     # optional: one verifiable question, or
     "qa": [{"question": ..., "answer": ..., "answer_type": ..., "category": ...}, ...],
     "split": "train" | "eval"}                            # optional: else assigned (see below)

``answer_type`` is ``int``, ``str``, ``yesno`` or ``box`` (``[x0, y0, x1, y1]`` in 0-1000); inferred when left out
(a list of four numbers -> ``box``, an integer -> ``int``, yes/no -> ``yesno``, else ``str``). ``category`` names
the RL reward (:data:`QA_CATEGORIES`; default ``grounding`` for boxes, ``count`` for integers, ``exact`` otherwise).
Questions become the record's ``qa`` (evaluation and RL), a chat in ``messages`` (SFT: the first user turn holds the
media) and ``Q: ... / A: ...`` lines in ``doc`` (pre-training), like the synthetic world's samples.

Splits: samples without an explicit ``split`` go to ``eval`` at evenly spaced positions of their stream, a share
``eval_fraction`` of them (at least one when a stream has two or more such samples and the fraction is above 0), the
rest to ``train``. The assignment depends only on the inputs' order, so the same inputs give the same dataset.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipelines.adapters import text_chunks
from data_pipelines.shards import IMAGE_EXTS, VIDEO_EXTS, ShardWriter, iter_tar, list_shards
from data_pipelines.synth.build import STREAMS, check_new_output, progress, split_entry, write_manifest

GENERATOR = "kimi-vl-suite convert"
SPLITS = ("train", "eval")
ANSWER_TYPES = ("int", "str", "yesno", "box")
# QA categories the RL trainer has a reward for (rl.synth_source.CATEGORY_REWARDS; a test keeps the two equal)
QA_CATEGORIES = ("arithmetic", "chart_value", "color", "count", "exact", "grounding", "motion", "ocr", "shape",
                 "spatial")


@dataclass
class Item:
    """One planned sample: its stream, family and split (``None``: assigned later), and how to build its members."""

    stream: str
    family: str
    split: str | None
    build: Callable[[], dict[str, Any]]  # -> members without ``__key__`` (``json``, ``txt``, media names)
    categories: list[str] = field(default_factory=list)


def convert_dataset(out: str | os.PathLike, text: Sequence[str | os.PathLike] = (),
                    videos: Sequence[str | os.PathLike] = (), images: Sequence[str | os.PathLike] = (),
                    shards: Sequence[str | os.PathLike] = (), eval_shards: Sequence[str | os.PathLike] = (),
                    eval_fraction: float = 0.05, vocab_size: int = 8192, source: str = "user",
                    max_count: int = 1000, chunk_chars: int = 2000) -> dict[str, Any]:
    """Write the dataset folder ``out`` (new or empty) from the inputs; returns its manifest.

    ``source`` prefixes the families (``{source}_text``, ``{source}_textqa``, ``{source}_image``, ``{source}_video``,
    ``{source}_vqa``; ``{source}_shards`` in the counts) and the sample keys; ``vocab_size`` 0 skips the tokenizer."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must lie in [0, 1), got {eval_fraction}")
    if not source.isidentifier():
        raise ValueError(f"source must be an identifier (it names families and keys), got {source!r}")
    items = [*_text_items(text, source, chunk_chars), *_video_items(videos, source), *_image_items(images, source)]
    if not items and not shards and not eval_shards:
        raise ValueError("nothing to convert: give text files, video folders, image folders/JSONL files or shards")
    final = check_new_output(out).resolve()
    _assign_splits(items, eval_fraction)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")  # a failure leaves no half-written dataset behind
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        manifest = _write(tmp, items, shards, eval_shards, source, max_count, vocab_size)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _publish(tmp: Path, final: Path) -> None:
    """``tmp`` becomes ``final``: renamed when ``final`` does not exist, else (an empty folder, maybe the working
    directory) its entries moved in with the manifest last, so that a folder without one is never a dataset."""
    if not final.exists():
        os.replace(tmp, final)
        return
    for child in sorted(tmp.iterdir(), key=lambda p: p.name == "manifest.json"):
        os.replace(child, final / child.name)


def _write(out: Path, items: list[Item], shards: Sequence, eval_shards: Sequence, source: str, max_count: int,
           vocab_size: int) -> dict[str, Any]:
    writers = {(sp, st): ShardWriter(out / sp, st, max_count) for sp in SPLITS for st in STREAMS}
    counts = {sp: Counter() for sp in SPLITS}
    categories = {sp: Counter() for sp in SPLITS}
    n, bar = 0, progress(len(items), "convert")
    for item in items:
        writers[item.split, item.stream].write({"__key__": f"{source}_{n:08d}", **item.build()})
        counts[item.split][item.family] += 1
        categories[item.split].update(item.categories)
        n += 1
        bar.update(1)
    bar.close()
    for split, paths in (("train", shards), ("eval", eval_shards)):
        for raw in _shard_samples(paths):
            stream = "vision" if _has_media(raw) else "text"
            writers[split, stream].write({"__key__": f"{source}_{n:08d}", **raw})
            counts[split][f"{source}_shards"] += 1
            n += 1
    manifest = _manifest(out, writers, counts, categories, source)
    if vocab_size:
        from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

        train = [str(out / s["path"]) for st in STREAMS for s in manifest["splits"]["train"]["streams"][st]["shards"]]
        train_tokenizer(iter_corpus_texts(train), out / "tokenizer", vocab_size)
    return manifest


def _assign_splits(items: list[Item], eval_fraction: float) -> None:
    for stream in STREAMS:
        free = [it for it in items if it.stream == stream and it.split is None]
        n_eval = 0 if eval_fraction == 0 or len(free) < 2 else max(1, round(len(free) * eval_fraction))
        chosen = {int((j + 0.5) * len(free) / n_eval) for j in range(n_eval)}
        for i, it in enumerate(free):
            it.split = "eval" if i in chosen else "train"


def _manifest(out: Path, writers: dict, counts: dict, categories: dict, source: str) -> dict[str, Any]:
    splits = {split: split_entry(out, {st: writers[split, st] for st in STREAMS}, counts[split], categories[split])
              for split in SPLITS}
    return write_manifest(out, {"generator": GENERATOR, "source": source, "splits": splits,
                                "eval_suites": {f"{source}_vqa": "vision", f"{source}_textqa": "text"}})


# ---------------------------------------------------------------------------------------------------- inputs


def _text_items(paths: Sequence[str | os.PathLike], source: str, chunk_chars: int) -> list[Item]:
    items = []
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"text file does not exist: {p}")
        if p.suffix == ".txt":
            items += [_text_item({"doc": [{"text": c}]}, f"{source}_text", None)
                      for c in text_chunks(p.read_text(encoding="utf-8"), chunk_chars)]
        elif p.suffix == ".jsonl":
            items += [_text_line_item(obj, source, where) for where, obj in _jsonl_lines(p)]
        else:
            raise ValueError(f"unsupported text file {p} (expected .txt or .jsonl)")
    return items


def _text_line_item(obj: dict[str, Any], source: str, where: str) -> Item:
    """A text JSONL line: ``messages`` (a chat), ``text`` (a document), or questions about a ``context``."""
    split = _split(obj, where)
    if "question" in obj or "qa" in obj:
        qa = _questions(obj, where)
        context = str(obj.get("context") or "").strip()
        if not context:
            raise ValueError(f"{where}: a text question needs the 'context' it is about")
        lines = [f"Q: {q['question']}\nA: {q['answer']}" for q in qa]
        messages: list[dict[str, Any]] = []
        for j, q in enumerate(qa):
            text = f"{context}\n{q['question']}" if j == 0 else q["question"]
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": q["answer"]}]
        record = {"doc": [{"text": "\n".join([context, *lines])}], "messages": messages, "qa": qa, "caption": context,
                  "source": where}
        return _text_item(record, f"{source}_textqa", split, [q["category"] for q in qa])
    if "messages" in obj:
        return _text_item({"messages": obj["messages"]}, f"{source}_text", split)
    if "text" in obj:
        return _text_item({"doc": [{"text": str(obj["text"])}]}, f"{source}_text", split)
    raise ValueError(f"{where}: a line needs 'text', 'messages', or a 'question' (or 'qa') with a 'context'")


def _text_item(record: dict[str, Any], family: str, split: str | None, categories: Sequence[str] = ()) -> Item:
    record.update(family=family, stream="text", media=[])
    plain = "\n".join(s["text"] for s in record.get("doc", []))
    return Item("text", family, split, _const({"json": _dumps(record), "txt": plain}), list(categories))


def _jsonl_lines(path: Path):
    """``(where, object)`` for each non-blank line of a JSONL file (``where`` = ``path:line``)."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON: {err}") from err
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: a line must be a JSON object, got {type(obj).__name__}")
        yield where, obj


def _split(obj: dict[str, Any], where: str) -> str | None:
    split = obj.get("split")
    if split not in (None, *SPLITS):
        raise ValueError(f"{where}: 'split' must be one of {SPLITS}, got {split!r}")
    return split


def _video_items(folders: Sequence[str | os.PathLike], source: str) -> list[Item]:
    return [_media_item([video], "video", caption, [], None, f"{source}_video", str(video))
            for folder in map(Path, folders) for video, caption in _captioned(folder, VIDEO_EXTS, "video")]


def _image_items(paths: Sequence[str | os.PathLike], source: str) -> list[Item]:
    items = []
    for p in map(Path, paths):
        if p.is_dir():
            for image, caption in _captioned(p, IMAGE_EXTS, "image"):
                items.append(_media_item([image], "image", caption, [], None, f"{source}_image", str(image)))
        elif p.is_file() and p.suffix == ".jsonl":
            items += _jsonl_items(p, source)
        elif p.is_file():
            raise ValueError(f"image input {p}: expected a folder of images with captions or a .jsonl file of "
                             "images or videos with captions and/or questions")
        else:
            raise FileNotFoundError(f"image input does not exist: {p}")
    return items


def _captioned(folder: Path, exts: tuple[str, ...], kind: str) -> list[tuple[Path, str]]:
    """``(media path, caption)`` for every file of ``exts`` in ``folder``; each needs a same-stem ``.txt``."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{kind} folder does not exist: {folder}")
    files = sorted(p for p in folder.iterdir() if p.suffix.lstrip(".").lower() in exts)
    if not files:
        raise ValueError(f"no {kind}s ({', '.join(exts)}) in {folder}")
    out = []
    for f in files:
        caption = f.with_suffix(".txt")
        if not caption.is_file():
            raise FileNotFoundError(f"{kind} {f} has no caption file {caption.name}")
        out.append((f, caption.read_text(encoding="utf-8").strip()))
    return out


def _jsonl_items(path: Path, source: str) -> list[Item]:
    items = []
    for where, obj in _jsonl_lines(path):
        kind, files = _line_media(obj, path.parent, where)
        qa = _questions(obj, where)
        caption = str(obj.get("caption") or obj.get("text") or "").strip()
        if not qa and not caption:
            raise ValueError(f"{where}: give a 'caption', a 'question' with an 'answer', or a 'qa' list")
        family = f"{source}_vqa" if qa else f"{source}_{kind}"
        items.append(_media_item(files, kind, caption, qa, _split(obj, where), family, where))
    return items


def _line_media(obj: dict[str, Any], folder: Path, where: str) -> tuple[str, list[Path]]:
    """``("image", paths)`` for a line's ``image`` (a path or a list), or ``("video", [path])`` for its ``video``."""
    if ("image" in obj) == ("video" in obj):
        raise ValueError(f"{where}: give 'image' (a path or a list of paths) or 'video' (a path), one of the two")
    kind = "image" if "image" in obj else "video"
    names = [obj[kind]] if isinstance(obj[kind], str) else obj[kind]
    if not names or not all(isinstance(i, str) and i for i in names) or (kind == "video" and len(names) != 1):
        what = "a path or a non-empty list of paths" if kind == "image" else "one path"
        raise ValueError(f"{where}: '{kind}' must be {what}, got {obj[kind]!r}")
    exts = IMAGE_EXTS if kind == "image" else VIDEO_EXTS
    files = [folder / name for name in names]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{where}: {kind} {f} does not exist")
        if f.suffix.lstrip(".").lower() not in exts:
            raise ValueError(f"{where}: {kind} {f} is not one of {', '.join(exts)}")
    return kind, files


def _questions(obj: dict[str, Any], where: str) -> list[dict[str, str]]:
    if "qa" in obj:
        if "question" in obj:
            raise ValueError(f"{where}: give either 'question' and 'answer' or a 'qa' list, not both")
        if not isinstance(obj["qa"], list) or not obj["qa"]:
            raise ValueError(f"{where}: 'qa' must be a non-empty list of questions")
        raw = obj["qa"]
    elif "question" in obj or "answer" in obj:
        raw = [{k: obj[k] for k in ("question", "answer", "answer_type", "category") if k in obj}]
    else:
        return []
    return [_question(q, f"{where} question {j}") for j, q in enumerate(raw)]


def _question(q: Any, where: str) -> dict[str, str]:
    if not isinstance(q, dict) or not str(q.get("question") or "").strip() or q.get("answer") in (None, ""):
        raise ValueError(f"{where}: needs a non-empty 'question' and 'answer', got {q!r}")
    answer, kind = q["answer"], q.get("answer_type") or _infer_type(q["answer"])
    if kind not in ANSWER_TYPES:
        raise ValueError(f"{where}: answer_type must be one of {ANSWER_TYPES}, got {kind!r}")
    if kind == "box":
        box = answer if isinstance(answer, list) else _numbers(str(answer))
        if len(box) != 4 or not all(isinstance(v, (int, float)) and 0 <= v <= 1000 for v in box):
            raise ValueError(f"{where}: a box answer is [x0, y0, x1, y1] in 0-1000, got {answer!r}")
        answer = "[" + ", ".join(str(round(v)) for v in box) + "]"
    elif kind == "int" and not re.fullmatch(r"-?\d+", str(answer).strip()):
        raise ValueError(f"{where}: answer_type int needs an integer answer, got {answer!r}")
    elif kind == "yesno" and str(answer).strip().lower() not in ("yes", "no"):
        raise ValueError(f"{where}: answer_type yesno needs 'yes' or 'no', got {answer!r}")
    category = q.get("category") or {"box": "grounding", "int": "count"}.get(kind, "exact")
    if category not in QA_CATEGORIES:
        raise ValueError(f"{where}: category {category!r} has no reward; one of {QA_CATEGORIES}")
    return {"category": category, "question": str(q["question"]).strip(), "answer": str(answer).strip(),
            "answer_type": kind}


def _infer_type(answer: Any) -> str:
    if isinstance(answer, list):
        return "box"
    if isinstance(answer, int) or re.fullmatch(r"-?\d+", str(answer).strip()):
        return "int"
    return "yesno" if str(answer).strip().lower() in ("yes", "no") else "str"


def _numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", text)]


def _media_item(files: list[Path], kind: str, caption: str, qa: list[dict[str, str]], split: str | None,
                family: str, where: str) -> Item:
    """A vision sample of ``files`` (images, or one video): the caption and the questions' ``Q: / A:`` lines in
    ``doc``, the questions in ``qa`` and as a chat in ``messages`` (the first user turn holds the media)."""
    prefix = "img" if kind == "image" else "vid"
    names = [f"{prefix}{i}." + f.suffix.lstrip(".").lower() for i, f in enumerate(files)]
    lines = [f"Q: {q['question']}\nA: {q['answer']}" for q in qa]
    doc = [{"media": i} for i in range(len(files))] + [{"text": "\n".join(([caption] if caption else []) + lines)}]
    record: dict[str, Any] = {"family": family, "stream": "vision", "doc": doc, "qa": qa, "caption": caption,
                              "media": [{"kind": kind, "name": name} for name in names], "source": where}
    if qa:
        parts = [{"type": kind, "media": i} for i in range(len(files))]
        messages: list[dict[str, Any]] = []
        for j, q in enumerate(qa):
            text = [{"type": "text", "text": q["question"]}]
            messages += [{"role": "user", "content": (parts if j == 0 else []) + text},
                         {"role": "assistant", "content": q["answer"]}]
        record["messages"] = messages
    return Item("vision", family, split, _file_sample(record, doc[-1]["text"], dict(zip(names, files)), where),
                [q["category"] for q in qa])


def _file_sample(record: dict[str, Any], text: str, media: dict[str, Path], where: str = "") -> Callable:
    """A builder that reads the media files when the sample is written (images are checked to decode; videos are
    decoded only when read, where a bad one is counted as a corrupt sample)."""

    def build() -> dict[str, Any]:
        members = {name: path.read_bytes() for name, path in media.items()}
        for m in record["media"]:
            if m["kind"] == "image":
                m["width"], m["height"] = _image_size(members[m["name"]], f"{where or media[m['name']]}")
        return {"json": _dumps(record), "txt": text, **members}

    return build


def _image_size(data: bytes, where: str) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.size
    except Exception as err:  # PIL raises many types
        raise ValueError(f"{where}: image does not decode: {err}") from err


def _shard_samples(paths: Sequence[str | os.PathLike]):
    """Raw samples of existing shards, keys dropped (the writer gives new ones)."""
    if not paths:
        return
    for shard in list_shards(list(map(str, paths))):
        for raw in iter_tar(shard):
            yield {k: v for k, v in raw.items() if not k.startswith("__")}


def _has_media(raw: dict[str, Any]) -> bool:
    return any(name.rsplit(".", 1)[-1].lower() in IMAGE_EXTS + VIDEO_EXTS for name in raw)


def _const(members: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    return lambda: members


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


__all__ = ["ANSWER_TYPES", "GENERATOR", "QA_CATEGORIES", "convert_dataset"]
