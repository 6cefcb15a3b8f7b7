"""The Triton QK max-logit pass with packed documents (the training app's MLA and vision statistics).

The kernel streams only the key blocks of each query block's own segments (``segment_windows``); these tests
check the windows and that the result still equals the full-matrix specification (Triton interpreter on CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

_CASES = """
import torch
from kernels.qk_max.naive import max_logits_per_head_naive
from kernels.qk_max.triton_max import max_logits_per_head_triton
torch.manual_seed(0)
cases = [(1, 40, True, [0, 3, 3, 17, 18, 40], False), (2, 20, True, [0, 7, 26, 33, 40], True),
         (2, 20, False, [0, 7, 26, 33, 40], False), (1, 24, False, [0, 1, 9, 24], True)]
for B, T, causal, cu, pad in cases:
    q, k = torch.randn(B, T, 2, 8) * 2, torch.randn(B, T, 2, 8) * 2
    cu = torch.tensor(cu, dtype=torch.int32)
    kpm = (torch.rand(B, T) > 0.3) if pad else None
    want = max_logits_per_head_naive(q, k, 0.3, causal, cu, kpm)
    got = max_logits_per_head_triton(q, k, 0.3, causal, cu, kpm, block_m=4, block_n=4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_segment_windows_clip_segments_to_rows() -> None:
    pytest.importorskip("triton")
    from kernels.qk_max.triton_max import segment_windows

    seg, lo, hi = segment_windows(torch.tensor([0, 3, 3, 5, 8]), B=2, T=4)
    assert seg.tolist() == [0, 0, 0, 2, 2, 3, 3, 3]
    assert lo.tolist() == [0, 0, 0, 3, 0, 1, 1, 1]
    assert hi.tolist() == [3, 3, 3, 4, 1, 4, 4, 4]


def test_triton_segments_match_specification() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-4000:]


def test_segment_windows_cached_per_bounds_tensor() -> None:
    """The windows are computed once per ``cu_seqlens`` tensor and shape (every layer passes the same bounds), and
    recomputed after an in-place write to it or for another shape."""
    from kernels.qk_max.triton_max import cached_segment_windows, segment_windows

    cu = torch.tensor([0, 3, 7, 10])
    first = cached_segment_windows(cu, 1, 10)
    assert cached_segment_windows(cu, 1, 10) is first
    assert all(torch.equal(a, b) for a, b in zip(first, segment_windows(cu, 1, 10)))
    assert cached_segment_windows(cu, 2, 5) is not first
    cu[2] = 6
    again = cached_segment_windows(cu, 1, 10)
    assert again is not first and all(torch.equal(a, b) for a, b in zip(again, segment_windows(cu, 1, 10)))
