"""Command line: ``python -m eval.web_metric REFERENCE.html CANDIDATE.html [...pairs]`` prints the report as JSON.

``python -m eval.web_metric --bench N`` instead times scoring N generated pages against perturbed copies
(one browser, reference analysed once per page) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from data_pipelines.web.browser import ChromiumBrowser
from data_pipelines.web.generator import generate_page
from eval.web_metric.score import analyze_html, score_html, score_pages


def _bench(pages: int) -> dict:
    start = time.perf_counter()
    browser = ChromiumBrowser()
    browser.start()
    started = time.perf_counter()
    htmls = [generate_page(seed).html for seed in range(pages)]
    analyses = [analyze_html(h, browser=browser) for h in htmls]
    analysed = time.perf_counter()
    for html, reference in zip(htmls, analyses):
        candidate = html.replace("</style>", "main{margin-top:40px}</style>")
        score_html(html, candidate, browser=browser, reference=reference)
    done = time.perf_counter()
    browser.close()
    return {"pages": pages, "browser_start_s": round(started - start, 4),
            "analysis_s_per_page": round((analysed - started) / pages, 4),
            "score_with_cached_reference_s_per_page": round((done - analysed) / pages, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.web_metric", description=__doc__)
    parser.add_argument("files", nargs="*", help="REFERENCE CANDIDATE pairs of HTML files")
    parser.add_argument("--bench", type=int, default=0, help="time N generated pages instead")
    args = parser.parse_args(argv)
    if args.bench:
        print(json.dumps(_bench(args.bench)))
        return 0
    if not args.files or len(args.files) % 2:
        parser.error("give REFERENCE CANDIDATE pairs of HTML files")
    try:
        raw = [Path(f).read_bytes() for f in args.files]
    except OSError as err:
        parser.error(f"{err.filename}: {err.strerror}")
    references = []
    for name, data in zip(args.files[0::2], raw[0::2]):
        try:
            references.append(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            parser.error(f"{name}: a reference must be UTF-8 ({err.reason} at byte {err.start})")
    # a candidate that is not UTF-8 scores 0 with its reason in the report (the metric's protocol), as in the API
    report = score_pages(references, raw[1::2])
    json.dump(report.to_dict(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
