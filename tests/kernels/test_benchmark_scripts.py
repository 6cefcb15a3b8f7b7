"""The GPU benchmark scripts under ``kernels/benchmarks`` import on a CPU machine (their GPU work only starts in
``main``), so that a carried snapshot does not fail on an import at the start of a device call; ``ab_kda``'s setting
parser and its constants' save and restore."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kernels.benchmarks as benchmarks


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)))
def test_benchmark_module_imports(name):
    mod = importlib.import_module(f"kernels.benchmarks.{name}")
    assert mod.__doc__, f"kernels/benchmarks/{name}.py has no docstring saying how to run it"


def test_ab_kda_setting_parses_sets_and_restores():
    from kernels.benchmarks import ab_kda
    from kernels.kda import chunk_triton, chunk_triton_bwd

    setting = ab_kda._parse(["SCORES2_BK=32", "BWD_DY_BV=64", "SCORES2_LAUNCH=(4, 2)"])
    assert setting == {"SCORES2_BK": 32, "BWD_DY_BV": 64, "SCORES2_LAUNCH": (4, 2)}
    before = (chunk_triton.SCORES2_BK, chunk_triton_bwd.BWD_DY_BV, chunk_triton.SCORES2_LAUNCH)
    with ab_kda._Setting(setting):
        assert (chunk_triton.SCORES2_BK, chunk_triton_bwd.BWD_DY_BV, chunk_triton.SCORES2_LAUNCH) == (32, 64, (4, 2))
    assert (chunk_triton.SCORES2_BK, chunk_triton_bwd.BWD_DY_BV, chunk_triton.SCORES2_LAUNCH) == before
    with pytest.raises(SystemExit, match="NO_SUCH_CONSTANT"):
        ab_kda._parse(["NO_SUCH_CONSTANT=1"])
