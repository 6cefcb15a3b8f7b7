"""``kimi_vl.benchmarks.bench_backbone``'s CPU-side pieces: the results table (the GPU timing itself runs on a GPU)."""

from __future__ import annotations

from kimi_vl.benchmarks.bench_backbone import table


def test_table_shows_device_bound_mfu_where_measured():
    """A training row timed behind a GPU sleep shows its device-bound MFU and steps; one without leaves the column
    empty (``--head-start-ms 0``)."""
    row = dict(seq=4096, tokens_per_s=431251.0, mfu=0.3356, peak_mem_gib=20.6, step_s_each=[0.0795, 0.075])
    results = {"device": "GPU", "flavor": "small", "torch": "2.11", "date": "2026-11-30", "decode": {},
               "train": {"hybrid": [dict(row, mfu_device_bound=0.3363, step_s_each_device_bound=[0.0748, 0.0753]),
                                    dict(row, seq=32768)]}}
    lines = table(results).splitlines()
    assert "| hybrid | 4096 | 431,251 | 33.6% | 33.6% | 20.6 |" in lines
    assert "| hybrid | 32768 | 431,251 | 33.6% |  | 20.6 |" in lines
    assert "steps (ms): hybrid 4096: 79.5 75.0; hybrid 32768: 79.5 75.0" in lines
    assert "device-bound steps (ms): hybrid 4096: 74.8 75.3" in lines


def test_every_loss_kernel_is_in_the_loss_category():
    """The cross entropy's kernels, separate or fused with the LM head (each form), count as the step's loss."""
    from kimi_vl.benchmarks.bench_backbone import categorise

    names = ("_ce_fwd_kernel", "_ce_bwd_kernel", "_ce_fwd_grad_kernel", "_ce_fwd_grad_row_kernel", "_scale_rows_kernel")
    assert [categorise(n) for n in names] == ["loss"] * len(names)
    assert categorise("_norm_fwd_kernel") == "norm/act"


def test_fused_swiglu_kernels_have_their_own_category():
    """``KVL_SWIGLU_IMPL=fused``'s GEMM + activation kernels are counted apart from cuBLAS's GEMMs and the split
    path's activation kernels, so that a profile can compare the two paths' categories."""
    from kimi_vl.benchmarks.bench_backbone import categorise

    assert categorise("_gate_up_silu_kernel") == categorise("_down_silu_bwd_kernel") == "swiglu gemm"
    assert categorise("_silu_mul_bwd_kernel") == "norm/act"
