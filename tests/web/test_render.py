"""Real-browser rendering: determinism, full page, network and scripts off, scroll videos, missing browser."""

from __future__ import annotations

import io
import time

import av
import numpy as np
import pytest

from data_pipelines.web import (
    ChromiumNotFoundError,
    ScrollVideoConfig,
    Viewport,
    decode_png,
    find_chromium,
    render_screenshot,
    render_scroll_frames,
    render_scroll_video,
)
from data_pipelines.web.generator import generate_page

LONG_PAGE = (
    "<html><body style='margin:0;font:14px DejaVu Sans'>"
    "<nav style='position:sticky;top:0;background:#123456;color:#fff;height:40px'>Nav</nav>"
    + "".join(f"<p>Paragraph {i}</p>" for i in range(60))
    + "</body></html>"
)


def test_missing_chromium_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ChromiumNotFoundError, match="install_chromium.sh"):
        find_chromium("/nonexistent/chromium")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("KVL_CHROMIUM", raising=False)
    with pytest.raises(ChromiumNotFoundError, match="apt-get install -y chromium"):
        find_chromium()


def test_screenshot_is_deterministic_and_full_page(browser) -> None:
    html = generate_page(4).html
    first = render_screenshot(html, browser=browser)
    assert render_screenshot(html, browser=browser) == first, "same HTML must give the same PNG bytes"
    image = decode_png(first)
    assert image.shape[1] == 512 and image.shape[0] > 384
    tall = decode_png(render_screenshot(LONG_PAGE, Viewport(320, 240), max_height=600, browser=browser))
    assert tall.shape == (600, 320, 3)


def test_network_and_scripts_are_off(browser) -> None:
    plain = "<html><body style='background:#ffffff'><p>x</p></body></html>"
    hostile = plain.replace(
        "<p>x</p>",
        "<link rel='stylesheet' href='http://example.com/a.css'><img src='https://example.com/b.png'>"
        "<p>x</p><script>document.body.style.background='red'</script>",
    )
    start = time.monotonic()
    assert decode_png(render_screenshot(hostile, browser=browser))[5, 5].tolist() == [255, 255, 255]
    assert time.monotonic() - start < 5.0, "blocked requests must fail fast"


def test_scroll_frames_follow_offsets_and_keep_sticky_nav(browser) -> None:
    config = ScrollVideoConfig(step_px=200, fps=2)
    frames, offsets = render_scroll_frames(LONG_PAGE, Viewport(320, 240), config, browser=browser)
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(frames) == len(offsets) >= 3
    assert frames.shape[1:] == (240, 320, 3)
    assert not np.array_equal(frames[0], frames[-1])
    np.testing.assert_array_equal(frames[-1][10, 300], [0x12, 0x34, 0x56])  # sticky bar still on top


def test_scroll_video_is_deterministic_mp4(browser) -> None:
    config = ScrollVideoConfig(step_px=300, fps=2)
    video = render_scroll_video(LONG_PAGE, Viewport(320, 240), config, browser=browser)
    assert render_scroll_video(LONG_PAGE, Viewport(320, 240), config, browser=browser) == video
    with av.open(io.BytesIO(video)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    _, offsets = render_scroll_frames(LONG_PAGE, Viewport(320, 240), config, browser=browser)
    assert len(decoded) == len(offsets) and decoded[0].shape == (240, 320, 3)


def test_meta_refresh_cannot_navigate_away(browser) -> None:
    page = "<html><body style='background:#00ff00'><p>stay</p></body></html>"
    refresh = page.replace("<html>", "<html><meta http-equiv='Refresh' content='0;url=file:///etc/hostname'>")
    assert render_screenshot(refresh, browser=browser) == render_screenshot(page, browser=browser)
    assert browser.evaluate("location.protocol") == "file:" and browser.evaluate("document.body.innerText") == "stay"


def test_browser_restarts_after_a_crash() -> None:
    from data_pipelines.web import ChromiumBrowser

    with ChromiumBrowser() as own:
        first = render_screenshot("<p>x</p>", browser=own)
        own._process.kill()
        own._process.wait()
        assert render_screenshot("<p>x</p>", browser=own) == first


def _fake_chromium(folder, body: str):
    path = folder / "fake-chromium"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_start_that_never_answers_fails_with_attempts_and_stderr(tmp_path) -> None:
    from data_pipelines.web import ChromiumBrowser, RenderError

    fake = _fake_chromium(tmp_path, "echo 'fake chromium: no display' >&2\nexec sleep 60\n")
    browser = ChromiumBrowser(fake, start_timeout_s=0.5, start_attempts=2)
    began = time.monotonic()
    with pytest.raises(RenderError, match=r"(?s)tried 2 times, 0.5 s each.*fake chromium: no display"):
        browser.start()
    assert 0.9 < time.monotonic() - began < 20 and not browser.alive
    browser.close()
    with pytest.raises(ValueError, match="start_attempts >= 1"):
        ChromiumBrowser(fake, start_attempts=0)


def test_start_retries_a_failed_first_start(tmp_path) -> None:
    """The first start dies at once; the second attempt, a real Chromium, renders the page."""
    from data_pipelines.web import ChromiumBrowser

    marker = tmp_path / "started-once"
    real = find_chromium()
    fake = _fake_chromium(tmp_path, f'if [ ! -e "{marker}" ]; then touch "{marker}"; exit 1; fi\nexec "{real}" "$@"\n')
    with ChromiumBrowser(fake, start_attempts=2) as own:
        png = render_screenshot("<p>x</p>", browser=own)
        assert marker.exists() and decode_png(png).shape[1] == 512
