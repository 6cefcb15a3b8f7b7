"""The held-out page run in two halves: generate where the model is (no browser), score where Chromium is.

``python -m eval.demo.candidates generate --checkpoint RUN/final --data DIR --out DIR [--batch-size 25]
[--max-new-tokens 1024] [--deadline-s S] [--limit N] [--device auto] [--dtype fp32]`` writes

- ``candidates.jsonl``: one line per held-out page (``key``, ``family``, ``media_name``, ``prompt``, the
  ``generation`` as :class:`~eval.demo.generator.Generation` fields, ``reference_html``, ``error``), appended after
  every batch, so a run cut short keeps what it finished. Pages go in family-interleaved order (screenshot,
  video, screenshot, ...) and are decoded greedily in left-padded batches; with ``--deadline-s`` (seconds from
  the start, model loading included) a batch gets the time that is left as ``generate``'s ``max_time`` and no
  batch starts with less than ``--min-batch-s`` left;
- ``candidates_meta.json``: checkpoint, data folder and its content hash, pages done / skipped, errors, seconds,
  device, versions.

Nothing on this side renders or imports PyAV or the browser driver (a GPU machine without Chromium runs it).

``python -m eval.demo.candidates score CANDIDATES_DIR --data DIR --out DIR [--pages-dir DIR] [--examples 2]``
renders and scores every candidate against its reference with the demo's own code
(:func:`eval.demo.pipeline.write_page_result`: the Design2Code scores, ``scroll_states``, ``input_ssim``), the
inputs coming from the same dataset (checked by content hash and reference HTML). It writes into ``--out``:
``summary.json`` (the held-out demo's summary, :func:`eval.demo.heldout.summarize`, plus 95% percentile-bootstrap
intervals of every mean over pages, :func:`eval.stats.bootstrap_score`, and the generation side's metadata),
``summary.md`` (the table), ``examples.png`` and ``side_by_side/KEY.png`` (the first ``--examples`` pages of each
family: input | generated | reference), and ``gpu/`` (the other small files found in ``CANDIDATES_DIR``: training
metrics, curves, logs). Each page's whole demo folder (renders, ``report.html``) goes to ``--pages-dir``
(default ``runs/scored_pages/<name of --out>``), out of the results folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from PIL import Image

from eval.demo.generator import Generation, WebsiteGenerator, load_video
from eval.demo.heldout import PAGE_FAMILIES, SCORE_KEYS, HeldoutPage, data_folder, heldout_pages

CANDIDATES = "candidates.jsonl"
META = "candidates_meta.json"
COPY_LIMIT_BYTES = 8 * 2**20  # files of CANDIDATES_DIR copied into OUT/gpu/ only up to this total


def interleave(pages: Sequence[HeldoutPage]) -> list[HeldoutPage]:
    """Pages round-robin over their families, each family in its own order (a cut run covers every family)."""
    by_family: dict[str, list[HeldoutPage]] = {}
    for page in pages:
        by_family.setdefault(page.family, []).append(page)
    queues = list(by_family.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def generation_inputs(page: HeldoutPage) -> dict[str, Any]:
    """The generator's keyword arguments for a held-out page: its decoded media and the sample's instruction."""
    text = page.prompt or None
    if page.family == "page_video":
        return {"video": load_video(page.media), "text": text}
    with Image.open(io.BytesIO(page.media)) as im:
        return {"image": im.convert("RGB"), "text": text}


def _record(page: HeldoutPage, generation: Generation, error: str = "") -> dict[str, Any]:
    return {"key": page.key, "family": page.family, "media_name": page.media_name, "prompt": page.prompt,
            "generation": dataclasses.asdict(generation), "reference_html": page.html, "error": error}


def _generate(generator: WebsiteGenerator, batch: Sequence[HeldoutPage], max_new_tokens: int,
              deadline: float | None, errors: list[str]) -> list[tuple[Generation, str]]:
    """One batch, given the time up to ``deadline`` (``time.monotonic()``); if the batch fails (memory, ...),
    page by page; a page that fails alone (or finds no time left) gets an empty text and its error."""
    left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())  # noqa: E731
    inputs = [generation_inputs(p) for p in batch]
    try:
        return [(g, "") for g in generator.generate_batch(inputs, max_new_tokens, left())]
    except (RuntimeError, ValueError) as err:
        errors.append(f"batch of {len(batch)} from {batch[0].key}: {type(err).__name__}: {err}"[:2000])
    out = []
    for page, kwargs in zip(batch, inputs):
        try:
            if left() == 0.0:
                raise RuntimeError("no time left before the deadline")
            out.append((generator.generate_batch([kwargs], max_new_tokens, left())[0], ""))
        except (RuntimeError, ValueError) as err:
            message = f"{type(err).__name__}: {err}"[:2000]
            errors.append(f"{page.key}: {message}")
            out.append((Generation("", 0, 0, 0, 0.0, False), message))
    return out


def _versions() -> dict[str, str]:
    import torch
    import transformers

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "device_name": device, "host": platform.node()}


def generate_candidates(checkpoint: str | os.PathLike, data: str, out_dir: str | os.PathLike, *,
                        batch_size: int = 25, max_new_tokens: int = 1024, deadline_s: float | None = None,
                        min_batch_s: float = 5.0, limit: int | None = None, device: str = "cpu",
                        dtype: str = "fp32", generator: WebsiteGenerator | None = None) -> dict[str, Any]:
    """Generate HTML for every held-out page of ``data`` (no rendering); writes and returns the metadata."""
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CANDIDATES
    path.unlink(missing_ok=True)
    pages = interleave(heldout_pages(data, limit=limit))
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    generator = generator or WebsiteGenerator.from_checkpoint(checkpoint, device=device, dtype=dtypes[dtype])
    load_s, done, skipped, errors = time.monotonic() - t0, [], [], []
    for start in range(0, len(pages), batch_size):
        batch = pages[start:start + batch_size]
        left = None if deadline_s is None else deadline_s - (time.monotonic() - t0)
        if left is not None and left < min_batch_s:
            skipped += [p.key for p in batch]
            continue
        results = _generate(generator, batch, max_new_tokens, None if left is None else t0 + deadline_s, errors)
        with path.open("a", encoding="utf-8") as f:
            for page, (generation, error) in zip(batch, results):
                f.write(json.dumps(_record(page, generation, error)) + "\n")
        done += [p.key for p in batch]
        gens = [g for g, _ in results]
        print(f"[candidates] {len(done)}/{len(pages)} pages, batch {gens[0].seconds:.1f} s, "
              f"{sum(g.new_tokens for g in gens)} tokens, {sum(g.stopped for g in gens)}/{len(gens)} stopped",
              flush=True)
    meta = {"checkpoint": str(checkpoint), "data": str(data), "data_hash": _content_hash(data),
            "pages": len(pages), "done": len(done), "skipped": skipped, "errors": errors,
            "batch_size": batch_size, "max_new_tokens": max_new_tokens, "deadline_s": deadline_s, "dtype": dtype,
            "device": str(generator.device), "load_s": load_s, "seconds": time.monotonic() - t0, **_versions()}
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _content_hash(data: str | os.PathLike) -> str:
    manifest = data_folder(str(data)) / "manifest.json"
    return json.loads(manifest.read_text())["content_hash"]


def read_candidates(candidates_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of ``candidates.jsonl`` and the metadata (empty when the run was cut before writing it)."""
    folder = Path(candidates_dir)
    path = folder / CANDIDATES
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {CANDIDATES} (the output of `python -m eval.demo.candidates generate`)")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"[score] {path}:{n}: skipped an incomplete line (the run was cut while writing it)")
    meta = json.loads((folder / META).read_text()) if (folder / META).is_file() else {}
    return records, meta


def _matching_page(record: dict[str, Any], pages: dict[str, HeldoutPage]) -> HeldoutPage:
    page = pages.get(record["key"])
    if page is None:
        raise ValueError(f"candidate {record['key']!r} is not a held-out page of the data given (another dataset?)")
    if page.html != record["reference_html"]:
        raise ValueError(f"candidate {record['key']!r}: its reference HTML differs from the data's (another dataset?)")
    return page


def score_records(records: Sequence[dict[str, Any]], data: str, pages_dir: str | os.PathLike,
                  checkpoint: str = "") -> list[dict[str, Any]]:
    """Render and score each candidate against its reference (the demo's files per page in ``pages_dir/KEY``);
    returns the demo result dicts with ``key``, ``family`` and the generation side's ``error``."""
    from eval.demo.pipeline import screenshot_input, video_input, write_page_result

    pages = {p.key: p for p in heldout_pages(data)}
    results = []
    for n, record in enumerate(records, 1):
        page = _matching_page(record, pages)
        load = video_input if page.family == "page_video" else screenshot_input
        page_input = load(page.media, source=f"{page.key}/{page.media_name}")
        generation = Generation(**record["generation"])
        result = write_page_result(page_input, checkpoint, Path(pages_dir) / page.key, generation, page.html)
        results.append({"key": page.key, "family": page.family, "error": record.get("error", ""), **result})
        print(f"[score] {n}/{len(records)} {page.key}: overall {result['scores'].get('overall', 0.0):.3f}",
              flush=True)
    return results


def intervals(per_page: Sequence[dict[str, Any]], n_boot: int = 2000) -> dict[str, dict[str, dict[str, float]]]:
    """95% percentile-bootstrap intervals (over pages) of every score's mean: ``{group: {score: estimate}}``
    for ``all`` and each family."""
    import numpy as np

    from eval.stats import bootstrap_score

    groups = {"all": list(per_page), **{f: [r for r in per_page if r["family"] == f] for f in PAGE_FAMILIES}}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, rows in groups.items():
        cells = {}
        for key in SCORE_KEYS:
            values = [r[key] for r in rows if key in r]
            if values:
                cells[key] = bootstrap_score(np.asarray(values, dtype=float), n_boot=n_boot, seed=0).to_dict()
        if cells:
            out[name] = cells
    return out


def _table(ci: dict[str, dict[str, dict[str, float]]]) -> str:
    groups = list(ci)
    lines = ["| score | " + " | ".join(f"{g} (n={next(iter(ci[g].values()))['n_questions']})" for g in groups) + " |",
             "| --- |" + " --- |" * len(groups)]
    for key in SCORE_KEYS:
        cells = [f"{ci[g][key]['value']:.3f} [{ci[g][key]['lo']:.3f}, {ci[g][key]['hi']:.3f}]" if key in ci[g] else "-"
                 for g in groups]
        if any(c != "-" for c in cells):
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _markdown(summary: dict[str, Any]) -> str:
    gen, rows = summary["generation"], summary["per_page"]
    stopped, errors = sum(r["stopped"] for r in rows), len(gen.get("errors", []))
    reasons = Counter(r["reason"] for r in rows if r.get("reason"))
    why = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common()) or "none"
    return f"""# Held-out pages: generated on {gen.get('device_name', '?')}, scored here

- candidates: `{summary['candidates']}`, checkpoint `{summary['checkpoint']}`, data hash `{gen.get('data_hash', '?')}`
- generation: {gen.get('done', len(rows))} of {gen.get('pages', '?')} held-out pages \
({len(gen.get('skipped', []))} skipped for time, {errors} errors), greedy, at most {gen.get('max_new_tokens', '?')} \
new tokens, batches of {gen.get('batch_size', '?')}, {gen.get('dtype', '?')}, torch {gen.get('torch', '?')}, \
{gen.get('seconds', 0):.0f} s; {stopped} of {len(rows)} pages ended their turn
- scored {summary['scored_at']} on `{summary['scored_on']}`: `{summary['command']}`
- rendered: {summary['rendered']} of {summary['pages']}; held-out pages not generated: {len(summary['missing'])}; \
pages scored 0 with a reason: {why}

Means over pages with 95% percentile-bootstrap intervals (`eval.stats.bootstrap_score`, resampling pages):

{_table(summary['ci95'])}

![examples](examples.png)
"""


def _copy_small_files(src: Path, dst: Path) -> list[str]:
    files = [f for f in sorted(src.iterdir()) if f.is_file() and f.name != CANDIDATES]
    if sum(f.stat().st_size for f in files) > COPY_LIMIT_BYTES:
        print(f"[score] {src}: files over {COPY_LIMIT_BYTES} bytes in all, not copied")
        return []
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, dst / f.name)
    return [f.name for f in files]


def score_candidates(candidates_dir: str | os.PathLike, data: str, out_dir: str | os.PathLike,
                     pages_dir: str | os.PathLike | None = None, examples: int = 2, n_boot: int = 2000,
                     command: str = "") -> dict[str, Any]:
    """Score a ``generate`` output (see the module docstring); writes and returns ``summary.json``."""
    from eval.demo.heldout import summarize, write_examples

    records, meta = read_candidates(candidates_dir)
    if meta.get("data_hash") and meta["data_hash"] != _content_hash(data):
        raise ValueError(f"{candidates_dir} was generated from data with content hash {meta['data_hash']}, "
                         f"but {data} has {_content_hash(data)}: pass the same dataset")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pages_dir = Path(pages_dir) if pages_dir is not None else Path("runs/scored_pages") / out.resolve().name
    results = score_records(records, data, pages_dir, meta.get("checkpoint", ""))
    summary = {"candidates": str(candidates_dir), "checkpoint": meta.get("checkpoint", ""), "data": str(data),
               "generation": meta, "scored_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "scored_on": platform.node(), "command": command, **summarize(results)}
    done = {r["key"] for r in results}
    summary["missing"] = [p.key for p in heldout_pages(data) if p.key not in done]
    summary["generation_errors"] = {r["key"]: r["error"] for r in results if r["error"]}
    summary["ci95"] = intervals(summary["per_page"], n_boot)
    side = out / "side_by_side"
    side.mkdir(exist_ok=True)
    for pick in write_examples(results, out / "examples.png", examples):
        shutil.copy2(pick["files"]["side_by_side"], side / f"{pick['key']}.png")
    summary["copied"] = _copy_small_files(Path(candidates_dir), out / "gpu")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(_markdown(summary))
    return summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.demo.candidates", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="HTML for every held-out page, no rendering")
    g.add_argument("--checkpoint", required=True, help="an export folder (RUN/final) of a vision model")
    g.add_argument("--data", required=True, help="dataset folder or synth:PRESET[:SEED]")
    g.add_argument("--out", required=True)
    g.add_argument("--batch-size", type=int, default=25)
    g.add_argument("--max-new-tokens", type=int, default=1024)
    g.add_argument("--deadline-s", type=float, default=None, help="seconds from the start for the whole command")
    g.add_argument("--min-batch-s", type=float, default=5.0)
    g.add_argument("--limit", type=int, default=None, help="at most this many pages per family")
    g.add_argument("--device", default="auto", help="auto: cuda when available, else cpu")
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    s = sub.add_parser("score", help="render and score the candidates (needs Chromium)")
    s.add_argument("candidates", help="the folder with candidates.jsonl")
    s.add_argument("--data", required=True, help="the dataset the candidates were generated from")
    s.add_argument("--out", required=True)
    s.add_argument("--pages-dir", default=None, help="per-page demo folders (default runs/scored_pages/<out name>)")
    s.add_argument("--examples", type=int, default=2, help="pages per family in examples.png and side_by_side/")
    s.add_argument("--n-boot", type=int, default=2000)
    return p


def main(argv: Sequence[str] | None = None, command: str | None = None) -> int:
    """The command line; ``command`` is the invocation recorded in ``summary.json`` (default: this module's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.cmd == "generate":
        import torch

        device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        meta = generate_candidates(args.checkpoint, args.data, args.out, batch_size=args.batch_size,
                                   max_new_tokens=args.max_new_tokens, deadline_s=args.deadline_s,
                                   min_batch_s=args.min_batch_s, limit=args.limit, device=device, dtype=args.dtype)
        print(json.dumps({k: meta[k] for k in ("pages", "done", "seconds", "device", "device_name")}))
        return 0 if not meta["errors"] else 1
    command = command or " ".join(["python -m eval.demo.candidates", *argv])
    summary = score_candidates(args.candidates, args.data, args.out, args.pages_dir, args.examples, args.n_boot,
                               command)
    print(json.dumps({k: summary[k] for k in ("pages", "rendered", "means", "per_family")}, indent=1))
    print(f"summary: {Path(args.out) / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
