"""The held-out page set and a scored run of a checkpoint over it.

Held-out pages are the ``page`` (screenshot -> HTML) and ``page_video`` (scroll video -> HTML) samples of a
synthetic dataset's ``eval`` split: their seeds carry the eval split code, so no training sample of any preset
shares one (``data_pipelines.synth.common.sample_seed``). ``data`` is a dataset folder or ``synth:PRESET[:SEED]``
(built once into the training app's cache, exactly as ``data.path`` of a run config), default ``synth:web_tiny``,
the data of ``kimi_vl/configs/tiny_web.yaml``.

``python -m eval.demo.heldout --checkpoint RUN/final --out DIR [--data synth:web_tiny] [--limit N]`` runs the demo
on every held-out page (one model load), writes each page's folder, ``summary.json`` (per-page and mean scores,
per family) and ``examples.png`` (the side-by-side pictures of the first pages of each family).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from data_pipelines.shards import iter_tar
from data_pipelines.synth.build import split_shards
from eval.demo.generator import WebsiteGenerator
from eval.demo.outputs import stack_rows

PAGE_FAMILIES = ("page", "page_video")
DEFAULT_DATA = "synth:web_tiny"
SCORE_KEYS = ("overall", "block_match", "text", "position", "color", "visual", "scroll_states", "input_ssim")


@dataclass(frozen=True)
class HeldoutPage:
    """One held-out page: its shard key, family, ground-truth HTML, input media (``img0.png``/``vid0.mp4``) and
    the user's instruction of the sample."""

    key: str
    family: str
    html: str
    media_name: str
    media: bytes
    prompt: str = ""


def data_folder(data: str) -> Path:
    """A dataset folder, or ``synth:PRESET[:SEED]`` resolved (and built once) like the training app does."""
    from kimi_vl.train.build import SYNTH_PREFIX, ensure_synth

    return ensure_synth(data) if data.startswith(SYNTH_PREFIX) else Path(data)


def heldout_pages(data: str = DEFAULT_DATA, split: str = "eval", families: Sequence[str] = PAGE_FAMILIES,
                  limit: int | None = None) -> list[HeldoutPage]:
    """The page samples of ``split`` in shard order (at most ``limit`` per family)."""
    root = data_folder(data)
    pages, counts = [], dict.fromkeys(families, 0)
    for shard in split_shards(root, split, "vision"):
        for raw in iter_tar(shard):
            record = json.loads(raw["json"])
            family = record["family"]
            if family not in counts or (limit is not None and counts[family] >= limit):
                continue
            media = next(k for k in sorted(raw) if k.endswith((".png", ".mp4")))
            pages.append(HeldoutPage(raw["__key__"], family, raw["html"].decode("utf-8"), media, raw[media],
                                     _instruction(record)))
            counts[family] += 1
    if not pages:
        raise ValueError(f"{root}: no {list(families)} samples in split {split!r} (build a preset with pages, "
                         f"e.g. synth:web_tiny)")
    return pages


def _instruction(record: dict[str, Any]) -> str:
    """The text part of the sample's user turn (the page families' instruction)."""
    user = next(m for m in record["messages"] if m["role"] == "user")
    parts = user["content"] if isinstance(user["content"], list) else [{"type": "text", "text": user["content"]}]
    return "".join(p["text"] for p in parts if p.get("type") == "text")


def _means(results: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k in SCORE_KEYS if any(k in r["scores"] for r in results)]
    return {k: float(np.mean([r["scores"][k] for r in results if k in r["scores"]])) for k in keys}


def evaluate_heldout(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, data: str = DEFAULT_DATA,
                     limit: int | None = None, max_new_tokens: int = 1024, max_patches: int | None = None,
                     examples: int = 2, device: str = "cpu") -> dict[str, Any]:
    """Run the demo on the held-out pages with one loaded model; returns (and writes) ``summary.json``.

    Resumable: a page whose ``scores.json`` is in ``out_dir`` from a run with the same settings (``settings.json``)
    is read back, not generated again; other settings in the same ``out_dir`` are an error."""
    from eval.demo.pipeline import screenshot_to_website, video_to_website
    from kimi_vl.logs import progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _claim(out, {"checkpoint": str(checkpoint), "data": data, "limit": limit, "max_new_tokens": max_new_tokens,
                 "max_patches": max_patches})
    pages = heldout_pages(data, limit=limit)
    generator = None
    t0, results, reused = time.perf_counter(), [], 0
    for page in progress(pages, desc="held-out pages", unit="page"):
        folder = out / page.key
        if (folder / "scores.json").is_file():
            results.append({"key": page.key, "family": page.family, **json.loads((folder / "scores.json").read_text())})
            reused += 1
            continue
        folder.mkdir(exist_ok=True)
        media = folder / f"input_{page.media_name}"
        media.write_bytes(page.media)
        generator = generator or WebsiteGenerator.from_checkpoint(checkpoint, max_patches=max_patches, device=device)
        run = video_to_website if page.family == "page_video" else screenshot_to_website
        result = run(media, checkpoint, folder, reference_html=page.html, max_new_tokens=max_new_tokens,
                     generator=generator)
        results.append({"key": page.key, "family": page.family, **result})
    summary = {"checkpoint": str(checkpoint), "data": data, **summarize(results),
               "seconds": time.perf_counter() - t0, "reused_pages": reused, "max_new_tokens": max_new_tokens}
    write_examples(results, out / "examples.png", examples)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


class OtherSettingsError(ValueError):
    """The output folder holds a held-out run with other settings."""


def _claim(out: Path, settings: dict[str, Any]) -> None:
    """Record the run's settings in ``out/settings.json``; refuse a folder that holds a run with other ones."""
    path = out / "settings.json"
    if path.is_file():
        held = json.loads(path.read_text())
        if held != settings:
            changed = sorted(k for k in settings.keys() | held.keys() if held.get(k) != settings.get(k))
            raise OtherSettingsError(f"{out} holds a held-out run with other settings ({', '.join(changed)}: "
                                     f"{[held.get(k) for k in changed]} there, {[settings.get(k) for k in changed]} "
                                     "now); choose a new --out")
        return
    path.write_text(json.dumps(settings, indent=1) + "\n")


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Page count, mean scores (all pages and per family), rendered count and per-page rows of demo results
    (each a ``scores.json`` dict plus ``key`` and ``family``)."""
    per_family = {f: _means([r for r in results if r["family"] == f]) for f in PAGE_FAMILIES
                  if any(r["family"] == f for r in results)}
    return {"pages": len(results), "means": _means(results), "per_family": per_family,
            "rendered": sum(r["rendered"] for r in results),
            "per_page": [{"key": r["key"], "family": r["family"], "html_recovery": r["html_recovery"],
                          "new_tokens": r["generation"]["new_tokens"], "stopped": r["generation"]["stopped"],
                          **{k: r["scores"][k] for k in SCORE_KEYS if k in r["scores"]},
                          "reason": r["scores"].get("reason", "")} for r in results]}


def write_examples(results: list[dict[str, Any]], path: Path, examples: int = 2) -> list[dict[str, Any]]:
    """The side-by-side pictures of the first ``examples`` pages of each family, stacked into ``path``;
    returns the pages shown (none written when there are none)."""
    picks = [r for f in PAGE_FAMILIES for r in [r for r in results if r["family"] == f][:examples]]
    if picks:
        stack_rows([Image.open(r["files"]["side_by_side"]) for r in picks]).save(path)
    return picks


def _check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A missing checkpoint or dataset folder is a usage error naming the option, before anything loads."""
    from kimi_vl.exports import require_export
    from kimi_vl.runconfig import ConfigError
    from kimi_vl.train.build import SYNTH_PREFIX, parse_synth

    require_export(parser, args.checkpoint, "--checkpoint")
    if args.data.startswith(SYNTH_PREFIX):
        try:
            parse_synth(args.data, "--data")
        except ConfigError as err:
            parser.error(str(err))
    elif not (Path(args.data) / "manifest.json").is_file():
        parser.error(f"--data {args.data}: no manifest.json there (a folder of `kimi-vl data synth`, or synth:PRESET)")


def main(argv: Sequence[str] | None = None, prog: str = "python -m eval.demo.heldout") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="an export folder (RUN/final) of a vision model")
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=DEFAULT_DATA, help="dataset folder or synth:PRESET[:SEED]")
    p.add_argument("--limit", type=int, default=None, help="at most this many pages per family")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--max-patches", type=int, default=None, help="default: data.max_patches of the run config")
    p.add_argument("--examples", type=int, default=2, help="pages per family in examples.png")
    args = p.parse_args(argv)
    _check_inputs(p, args)
    try:
        summary = evaluate_heldout(args.checkpoint, args.out, args.data, args.limit, args.max_new_tokens,
                                   args.max_patches, args.examples)
    except OtherSettingsError as err:
        p.error(str(err))
    print(json.dumps({k: summary[k] for k in ("pages", "rendered", "means", "per_family", "seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
