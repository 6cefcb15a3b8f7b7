"""kernels.host_ints: one host read per cu_seqlens tensor, invalidated by in-place writes."""

from __future__ import annotations

import torch

from kernels.host_ints import _lookup, host_ints, remember


def test_cpu_tensor_reads_its_values() -> None:
    assert host_ints(torch.tensor([0, 3, 7], dtype=torch.int32)) == [0, 3, 7]


def test_remembered_values_are_found_until_the_tensor_changes() -> None:
    t = torch.tensor([0, 5, 9])
    remember(t, [0, 5, 9])
    assert _lookup(t) == [0, 5, 9]
    assert _lookup(t.clone()) is None  # a different tensor with equal values is not the same entry
    t.add_(1)  # in-place write bumps the version counter
    assert _lookup(t) is None


def test_cache_keeps_a_bounded_number_of_entries() -> None:
    tensors = [torch.tensor([0, i]) for i in range(20)]
    for i, t in enumerate(tensors):
        remember(t, [0, i])
    assert _lookup(tensors[-1]) == [0, 19]
    assert _lookup(tensors[0]) is None


def test_inference_mode_tensors_are_not_cached() -> None:
    with torch.inference_mode():
        t = torch.tensor([0, 2, 4])
    remember(t, [0, 2, 4])  # no version counter: nothing is stored, nothing raises
    assert _lookup(t) is None
    assert host_ints(t) == [0, 2, 4]
