"""Design2Code-style metric: identity, monotone decrease under perturbations, bad candidates, determinism."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from data_pipelines.web import RenderError
from data_pipelines.web.generator import GeneratedPage, PageSpec, generate_page, spec_to_html
from eval.web_metric import COMPONENTS, WebMetricConfig, analyze_html, make_reward, score_html, score_pages
from eval.web_metric import score as score_module
from eval.web_metric.lm_eval_hooks import extract_html, process_results

SEED = 4  # nav, hero, cards, tables and footer: 45 text blocks


@pytest.fixture(scope="module")
def page() -> GeneratedPage:
    return generate_page(SEED)


@pytest.fixture(scope="module")
def reference(page, browser):
    return analyze_html(page.html, browser=browser)


def _edit_texts(spec: PageSpec, fraction: float) -> str:
    """Replace the first ``fraction`` of the words of every text with nonsense of the same length."""

    def edit(text: str) -> str:
        words = text.split(" ")
        n = round(fraction * len(words) + 0.49)
        return " ".join(["q" * len(w) for w in words[:n]] + words[n:])

    sections = [dataclasses.replace(s, heading=edit(s.heading), texts=[edit(t) for t in s.texts],
                                    items=[[edit(c) for c in row] for row in s.items]) for s in spec.sections]
    return spec_to_html(dataclasses.replace(spec, sections=sections))


def _shift_colours(spec: PageSpec, amount: int) -> str:
    """Push the text colours towards red by ``amount`` (0..255)."""

    def shift(hex_colour: str) -> str:
        r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return f"#{min(255, r + amount):02x}{max(0, g - amount):02x}{max(0, b - amount):02x}"

    p = spec.palette
    palette = dataclasses.replace(p, text=shift(p.text), muted=shift(p.muted), on_accent=shift(p.on_accent))
    return spec_to_html(dataclasses.replace(spec, palette=palette))


def _move_blocks(html: str, px: int) -> str:
    return html.replace("</style>", f"main{{margin-top:{px}px}}</style>")


def _scores(page, reference, browser, candidates):
    return [score_html(page.html, c, browser=browser, reference=reference) for c in candidates]


def test_page_against_itself_scores_one(browser) -> None:
    for seed in (0, 3, 4):
        html = generate_page(seed).html
        score = score_html(html, html, browser=browser)
        assert score.reason == "" and score.n_matched == score.n_reference_blocks > 0
        for key in (*COMPONENTS, "overall"):
            assert getattr(score, key) == pytest.approx(1.0, abs=1e-9), (seed, key)


def test_text_edits_decrease_text_and_overall(page, reference, browser) -> None:
    scores = _scores(page, reference, browser, [_edit_texts(page.spec, f) for f in (0.2, 0.5, 0.9)])
    assert 1.0 > scores[0].overall > scores[1].overall > scores[2].overall
    assert 1.0 > scores[0].block_match >= scores[1].block_match >= scores[2].block_match
    assert scores[0].text < 1.0


def test_moved_blocks_decrease_position_and_overall(page, reference, browser) -> None:
    scores = _scores(page, reference, browser, [_move_blocks(page.html, px) for px in (24, 96, 240)])
    assert 1.0 > scores[0].position > scores[1].position > scores[2].position
    assert 1.0 > scores[0].overall > scores[1].overall > scores[2].overall
    assert all(s.text == 1.0 for s in scores)


def test_colour_shifts_decrease_color_and_overall(page, reference, browser) -> None:
    scores = _scores(page, reference, browser, [_shift_colours(page.spec, a) for a in (30, 90, 200)])
    assert 1.0 > scores[0].color > scores[1].color > scores[2].color
    assert 1.0 > scores[0].overall > scores[1].overall > scores[2].overall
    assert all(s.position == pytest.approx(1.0) for s in scores)


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        (None, "None"),
        (b"\xff\xfe<html>", "not UTF-8"),
        (42, "not HTML"),
        ("<html><body></body></html>", "blank page"),
    ],
)
def test_bad_candidates_score_zero_with_reason(page, reference, browser, caplog, candidate, reason) -> None:
    with caplog.at_level(logging.WARNING, logger="eval.web_metric.score"):
        score = score_html(page.html, candidate, browser=browser, reference=reference)
    assert score.overall == 0.0 and all(getattr(score, k) == 0.0 for k in COMPONENTS)
    assert reason in score.reason and reason in caplog.text


def test_unrenderable_candidate_scores_zero(page, reference, browser, monkeypatch, caplog) -> None:
    def fail(html, config, browser):
        raise RenderError("timed out waiting for Chromium")

    monkeypatch.setattr(score_module, "analyze_html", fail)
    with caplog.at_level(logging.WARNING, logger="eval.web_metric.score"):
        score = score_html(page.html, "<p>hello</p>", browser=browser, reference=reference)
    assert score.overall == 0.0 and "failed to render" in score.reason and "timed out" in caplog.text


def test_scoring_is_deterministic(page, reference, browser) -> None:
    candidate = _move_blocks(_edit_texts(page.spec, 0.5), 40)
    first = score_html(page.html, candidate, browser=browser, reference=reference)
    again = analyze_html(page.html, browser=browser)
    assert (again.screenshot == reference.screenshot).all() and again.blocks == reference.blocks
    assert score_html(page.html, candidate, browser=browser, reference=again) == first


def test_report_reward_and_lm_eval_hook(page, browser) -> None:
    other = generate_page(1).html
    report = score_pages([page.html, page.html], [page.html, other], browser=browser)
    assert report.pages[0].overall == pytest.approx(1.0) and report.pages[1].overall < 0.6
    assert report.overall == pytest.approx((report.pages[0].overall + report.pages[1].overall) / 2)
    assert "ssim" in report.to_dict()["visual_method"]
    reward = make_reward(WebMetricConfig(), browser=browser)
    assert reward(page.html, page.html) == pytest.approx(1.0) and reward(page.html, "") == 0.0
    generation = f"Here is the page:\n```html\n{page.html}```\nDone."
    assert extract_html(generation) == page.html.strip()
    assert process_results({"html": page.html}, [generation])["design2code"] == pytest.approx(1.0)


def test_cli_reads_bytes_and_names_bad_files(page, tmp_path, capsys) -> None:
    """``python -m eval.web_metric REF CAND``: a candidate that is not UTF-8 scores 0 with its reason (the protocol,
    as through the API); a missing file or a reference that is not UTF-8 is a usage error naming the file."""
    import json

    from eval.web_metric.__main__ import main

    ref, bad = tmp_path / "ref.html", tmp_path / "bad.html"
    ref.write_text(page.html, encoding="utf-8")
    bad.write_bytes(b"<html>\xff\xfe</html>")
    assert main([str(ref), str(bad)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["overall"] == 0.0 and "not UTF-8" in report["pages"][0]["reason"]
    for argv, message in (([str(ref), str(tmp_path / "nope.html")], "nope.html: No such file"),
                          ([str(bad), str(ref)], "bad.html: a reference must be UTF-8")):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2 and message in capsys.readouterr().err
