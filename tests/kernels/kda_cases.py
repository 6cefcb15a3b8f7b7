"""Shared input builders for the KDA tests: the four gate regimes of issue 4 and random inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

GATES = ("logsig", "logsig_sharp", "lower_bound", "logsig_slow")


def make_gate(kind: str, shape: tuple[int, ...], dtype=torch.float64) -> torch.Tensor:
    """Log-decays: logsigmoid(N); logsigmoid(N)/0.1; -5 * sigmoid(N) (lower bound -5); logsigmoid(N)*0.01."""
    n = torch.randn(shape, dtype=dtype)
    if kind == "logsig":
        return F.logsigmoid(n)
    if kind == "logsig_sharp":
        return F.logsigmoid(n) / 0.1
    if kind == "lower_bound":
        return -5.0 * torch.sigmoid(n)
    if kind == "logsig_slow":
        return F.logsigmoid(n) * 0.01
    raise ValueError(f"unknown gate regime {kind!r}")


def make_inputs(B, T, H, HV, K, V, gate="logsig", dtype=torch.float64, h0=False, N=None):
    """q, k (k L2-normalised), v, g, beta, h0 in ``dtype`` on the CPU."""
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = F.normalize(torch.randn(B, T, H, K, dtype=dtype), dim=-1)
    v = torch.randn(B, T, HV, V, dtype=dtype)
    g = make_gate(gate, (B, T, HV, K), dtype)
    beta = torch.rand(B, T, HV, dtype=dtype)
    state = torch.randn(N or B, HV, K, V, dtype=dtype) if h0 else None
    return q, k, v, g, beta, state
