"""The AttnRes mix and two-phase kernels compile for the H100 (sm_90a) with Triton's own compiler and ptxas, no GPU
needed: the interpreter runs them as Python and cannot catch what only the compiler rejects (compile-time branches,
loop-carried tuples of accumulators). In a subprocess without ``TRITON_INTERPRET`` (the test session sets it,
which turns every kernel into an interpreted function at import)."""

from __future__ import annotations

import re

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import attnres_ptxas_report, two_phase_ptxas_report
for kernel, defer in (("fwd", 0), ("bwd", 0), ("bwd", 3), ("flush", 0), ("mix_norm_fwd", 0), ("mix_norm_bwd", 3)):
    print(kernel, defer, " | ".join(attnres_ptxas_report(kernel, 3, defer=defer).splitlines()), flush=True)
for kernel, qpar in (("rows", True), ("rows", False), ("tiled", False), ("phase2", False)):
    print("two-phase", kernel, qpar, " | ".join(two_phase_ptxas_report(kernel, qpar=qpar).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_attnres_kernels_compile_for_sm90():
    lines = ptxas_lines(SCRIPT, 10)
    fwd = next(line for line in lines if line.startswith("fwd"))
    assert re.search(r"\b0 bytes spill stores", fwd), fwd  # (the backward spills 8 bytes at N = 3 with Triton 3.9)
    fused = next(line for line in lines if line.startswith("mix_norm_fwd"))
    assert re.search(r"\b0 bytes spill stores", fused), fused
