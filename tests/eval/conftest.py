"""Fixtures of the eval tests: one tiny random checkpoint (tokenizer + KimiLinear) per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_lm import make_checkpoint


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny_ckpt"))
