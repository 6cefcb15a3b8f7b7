"""Test infrastructure shared by every test module.

- Offline by construction: ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``, a temporary HF cache and a temporary
  data cache (``synth:PRESET`` datasets) are set before any test module imports transformers or lm-eval.
- Markers: ``gpu`` tests are skipped without CUDA; ``slow`` tests run with ``--runslow`` or
  ``KVL_RUN_SLOW=1``.
- Every test starts from the same seeds (``torch``, ``random``, ``numpy``).
- Without a GPU, ``TRITON_INTERPRET=1`` is set for the whole session (Triton kernels run on the CPU).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

if shutil.which("nvidia-smi") is None:
    # No GPU: Triton kernels can only run interpreted. The flag must be set before anything imports
    # triton, because @triton.jit decides between compiled and interpreted functions at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

_HF_TMP = tempfile.mkdtemp(prefix="kvl-hf-cache-")
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HOME": _HF_TMP,
    "HF_DATASETS_CACHE": os.path.join(_HF_TMP, "datasets"),
    "TOKENIZERS_PARALLELISM": "false",
    "DISABLE_MULTIPROC": "1",
    "KVL_PROGRESS": "0",
    "KVL_DATA_CACHE": os.path.join(_HF_TMP, "kvl-data"),  # synth:PRESET datasets, built once per session
}.items():
    os.environ[_key] = _value

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # one core per xdist worker: no oversubscription on a 2-core machine


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--runslow") or os.environ.get("KVL_RUN_SLOW") == "1"
    has_cuda = torch.cuda.is_available()
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow or KVL_RUN_SLOW=1")
    skip_gpu = pytest.mark.skip(reason="gpu: needs CUDA")
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
