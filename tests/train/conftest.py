import pytest

from kimi_vl.train.build import ensure_synth


@pytest.fixture(scope="session")
def tiny_data():
    """The `tiny` synthetic preset (seed 0) with its tokenizer, built once per session in the test data cache."""
    return ensure_synth("synth:tiny")
