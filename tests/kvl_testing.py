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
