"""Fixtures for the web tests: one Chromium shared by every test that needs it.

Tests that take the ``browser`` fixture FAIL (not skip) when Chromium is missing, with the install hint: CI must
install it (``bash scripts/install_chromium.sh``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from data_pipelines.web import ChromiumBrowser, ChromiumNotFoundError


@pytest.fixture(scope="session")
def browser() -> Iterator[ChromiumBrowser]:
    try:
        instance = ChromiumBrowser()
    except ChromiumNotFoundError as err:
        pytest.fail(f"this test needs Chromium and none was found: {err}", pytrace=False)
    instance.start()
    yield instance
    instance.close()
