"""``kimi-vl demo``: ``video2web`` (scroll video -> HTML), ``screenshot2web`` (screenshot -> HTML), ``heldout``
(the held-out page set, scored). Each prints the scores as JSON and the path of ``report.html``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

TASKS = {"video2web": ("--video", "a scroll-through clip of a web page (mp4, webm, ...)"),
         "screenshot2web": ("--image", "a full-page screenshot (png, jpg, ...)")}


def task_parser(task: str, prog: str) -> argparse.ArgumentParser:
    flag, help_ = TASKS[task]
    p = argparse.ArgumentParser(prog=prog, description=f"{task}: generate a web page with a trained checkpoint")
    p.add_argument(flag, required=True, dest="input", help=help_)
    p.add_argument("--checkpoint", required=True, help="an export folder of a vision model (RUN/final)")
    p.add_argument("--out", required=True, help="output folder (HTML, side_by_side.png, scores.json, report.html)")
    p.add_argument("--reference", default=None, help="the true page's HTML file: adds the Design2Code scores")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--max-patches", type=int, default=None,
                   help="processor patch budget (default: data.max_patches of the run config beside the export)")
    p.add_argument("--device", default="cpu")
    return p


def _check_inputs(parser: argparse.ArgumentParser, task: str, args: argparse.Namespace) -> None:
    """Exit with a one-line usage error (not a traceback after loading the model) for a missing input."""
    from kimi_vl.exports import require_export

    for flag, value in ((TASKS[task][0], args.input), ("--reference", args.reference)):
        if value is not None and not Path(value).is_file():
            parser.error(f"{flag} {value}: no such file")
    require_export(parser, args.checkpoint, "--checkpoint")


def run_task(task: str, argv: Sequence[str], prog: str) -> int:
    from eval.demo.pipeline import screenshot_to_website, video_to_website

    parser = task_parser(task, prog)
    args = parser.parse_args(argv)
    _check_inputs(parser, task, args)
    reference = Path(args.reference).read_text(encoding="utf-8") if args.reference else None
    fn = video_to_website if task == "video2web" else screenshot_to_website
    result = fn(args.input, args.checkpoint, args.out, reference_html=reference, max_new_tokens=args.max_new_tokens,
                max_patches=args.max_patches, device=args.device)
    print(json.dumps(result["scores"], indent=1))
    print(f"report: {result['files']['report']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv or [])
    usage = "usage: kimi-vl demo {video2web,screenshot2web,heldout} [--help] ..."
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + __doc__)
        return 0
    name, rest = argv[0], argv[1:]
    if name in TASKS:
        return run_task(name, rest, f"kimi-vl demo {name}")
    if name == "heldout":
        from eval.demo.heldout import main as heldout_main

        return heldout_main(rest, "kimi-vl demo heldout")
    print(f"kimi-vl demo: unknown demo {name!r}\n{usage}")
    return 2
