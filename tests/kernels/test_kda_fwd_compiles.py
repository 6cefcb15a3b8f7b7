"""The KDA forward's kernels compile for the H100 (sm_90a) with Triton's compiler and ptxas, no GPU needed, as the
forward launches them (bf16, K = V = 128, in-kernel L2 norm and gate; ``chunk_triton``'s constants: since session 38
the q, k norms come from the scores kernel's loop at ``SCORES2_NORMS_STAGES``), and hold their registers without
spills (the scores kernel at its 168-register cap: with the norms in its loop at 3 stages it spilled 144 B). In a
subprocess without ``TRITON_INTERPRET``, as ``test_kda_bwd_compiles``."""

from __future__ import annotations

import pytest
from kvl_testing import ptxas_lines

SCRIPT = """
from kernels.benchmarks.ptxas_regs import KERNELS, _launch, ptxas_report
warps, stages, maxnreg = _launch()
for name in KERNELS:
    print(name, " | ".join(ptxas_report(name, warps[name], stages[name], maxnreg.get(name)).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_kda_fwd_kernels_compile_for_sm90_without_spills():
    for line in ptxas_lines(SCRIPT, 4):
        assert "0 bytes spill stores" in line, line
