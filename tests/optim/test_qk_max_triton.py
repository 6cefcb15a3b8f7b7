"""The fused Triton max-logit pass equals the chunked reference (interpreter on CPU, compiled on GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kernels.qk_max import max_logits_per_head

_CASES = """
import torch
from kernels.qk_max import max_logits_per_head
from kernels.qk_max.triton_max import max_logits_per_head_triton
torch.manual_seed(0)
for B, T, S, H, D, causal, packed, pad in [(1, 5, 5, 2, 8, True, False, False), (2, 9, 9, 1, 12, True, True, True),
                                          (1, 7, 11, 2, 16, False, False, True), (1, 11, 4, 1, 8, True, False, False)]:
    q, k = torch.randn(B, T, H, D) * 2, torch.randn(B, S, H, D) * 2
    cu = torch.tensor([0, 4, 9, 15, 18]) if packed else None
    kpm = (torch.rand(B, S) > 0.3) if pad else None
    want = max_logits_per_head(q, k, 0.3, causal, cu, kpm, backend="torch")
    got = max_logits_per_head_triton(q, k, 0.3, causal, cu, kpm, block_m=4, block_n=4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # bf16 inputs (tensor cores on GPU, the fp32 path here): equal to the fp32 maths on the same bf16 values
    qb, kb = q.bfloat16(), k.bfloat16()
    want = max_logits_per_head(qb.float(), kb.float(), 0.3, causal, cu, kpm, backend="torch")
    got = max_logits_per_head_triton(qb, kb, 0.3, causal, cu, kpm, block_m=16, block_n=16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU host tests the compiled kernel "
                    "(test_triton_gpu_matches_reference); Triton 3.6's interpreter there cannot iterate a range "
                    "bounded by loaded values (session 31 call4), Triton 3.9's on the CPU machines can")
def test_triton_interpreter_matches_reference() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_triton_gpu_matches_reference(causal: bool) -> None:
    q = torch.randn(2, 1000, 4, 72, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1000, 4, 72, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 63, 65, 1000, 1700, 2000], device="cuda", dtype=torch.int32)
    kpm = torch.rand(2, 1000, device="cuda") > 0.1
    for kw in ({}, {"cu_seqlens": cu}, {"key_padding_mask": kpm}):
        want = max_logits_per_head(q, k, 0.1, causal, backend="torch", **kw)
        got = max_logits_per_head(q, k, 0.1, causal, backend="triton", **kw)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
