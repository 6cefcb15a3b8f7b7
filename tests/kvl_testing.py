"""Helpers for tests: error measures and NaN poisoning (importable as ``kvl_testing``)."""

from __future__ import annotations

import torch


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in fp64 (0 when both are zero)."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    denom = e.norm().item()
    diff = (a - e).norm().item()
    return diff / denom if denom > 0 else diff


def assert_rel_rms(actual: torch.Tensor, expected: torch.Tensor, tol: float, name: str = "tensor") -> None:
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    err = rel_rms(actual, expected)
    assert err <= tol, f"{name}: relative RMS error {err:.3e} > {tol:.1e}"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a tensor with NaN (in place) so unwritten outputs show up."""
    return t.fill_(float("nan"))


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def kernel_device() -> torch.device:
    """Where the Triton kernel tests run: the GPU when there is one, else the CPU (through the interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def interpret_without_gpu(monkeypatch) -> None:
    """Set ``TRITON_INTERPRET=1`` for one test when there is no GPU (conftest sets it for the session; tests that
    change it get it back; the flag is read at launch)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def ptxas_lines(script: str, expected: int) -> list[str]:
    """Run ``script`` (which prints one ``ptxas`` report line per compiled kernel, ``kernels/benchmarks/ptxas_regs``)
    in a subprocess without ``TRITON_INTERPRET`` (the test session sets it, which turns every kernel into an
    interpreted function at import), and check that it printed ``expected`` lines, each with a register count and
    no error. Returns the lines."""
    import os
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == expected, proc.stdout
    for line in lines:
        assert "rror" not in line, line
        assert re.search(r"Used \d+ registers", line), line
    return lines
