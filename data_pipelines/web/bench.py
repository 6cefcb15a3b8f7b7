"""Rendering cost on this machine: ``python -m data_pipelines.web.bench [--pages N]`` prints one JSON line.

Times (seconds, wall clock): browser start, then per page the mean of generate, full-page screenshot and scroll
video (frames + mp4 encode). The metric's cost: ``python -m eval.web_metric --bench N``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from data_pipelines.web.browser import ChromiumBrowser
from data_pipelines.web.generator import generate_page
from data_pipelines.web.render import DEFAULT_VIEWPORT, render_screenshot, render_scroll_video


def _mean_time(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - start) / max(len(items), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_pipelines.web.bench", description=__doc__)
    parser.add_argument("--pages", type=int, default=20, help="number of generated pages (seeds 0..N-1)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    browser = ChromiumBrowser()
    browser.start()
    result = {"browser_start_s": time.perf_counter() - start, "pages": args.pages, "machine": platform.node(),
              "viewport": [DEFAULT_VIEWPORT.width, DEFAULT_VIEWPORT.height]}
    pages = [generate_page(seed).html for seed in range(args.pages)]
    result["generate_s"] = _mean_time(lambda s: generate_page(s), range(args.pages))
    result["screenshot_s"] = _mean_time(lambda h: render_screenshot(h, browser=browser), pages)
    result["scroll_video_s"] = _mean_time(lambda h: render_scroll_video(h, browser=browser), pages)
    browser.close()
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
