"""``kernels.fast_launch``: the flag, and which calls go through the JIT and which reuse a runner (a stand-in
kernel on the CPU; the real kernels' reuse is checked on the GPU in ``test_attn_res_triton.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernels import fast_launch


class _Compiled:
    """What a JIT launch returns on a GPU: indexing by a three-dimensional grid gives a runner."""

    packed_metadata = object()

    def __init__(self, log: list) -> None:
        self.log = log

    def __getitem__(self, grid):
        return lambda *values, stream=None: self.log.append(("runner", grid, values))


class _Kernel:
    def __init__(self) -> None:
        self.log: list = []

    def __getitem__(self, grid):
        def launch(*values, **options):
            self.log.append(("jit", grid, values, options))
            return _Compiled(self.log)

        return launch


@pytest.fixture
def fake_driver(monkeypatch):
    class Active:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 7)

    monkeypatch.setattr(fast_launch, "driver", SimpleNamespace(active=Active))  # no GPU driver on a CPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KVL_FAST_LAUNCH", raising=False)


def test_first_launch_of_a_key_goes_through_the_jit_then_the_runner(fake_driver, monkeypatch):
    kernel = _Kernel()
    launch = fast_launch.CompiledLaunch(kernel)
    launch((4,), ("a",), 1, 2, num_warps=4)
    launch((4,), ("a",), 3, 4, num_warps=4)
    launch((8,), ("a",), 5, 6, num_warps=4)  # another grid: another runner
    launch((4,), ("b",), 7, 8, num_warps=4)  # another key
    assert [entry[0] for entry in kernel.log] == ["jit", "runner", "jit", "jit"]
    assert kernel.log[1] == ("runner", (4, 1, 1), (3, 4))
    monkeypatch.setenv("KVL_FAST_LAUNCH", "0")
    launch((4,), ("a",), 9, 9, num_warps=4)
    monkeypatch.setenv("KVL_FAST_LAUNCH", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launch((4,), ("a",), 9, 9, num_warps=4)
    assert [entry[0] for entry in kernel.log[4:]] == ["jit", "jit"]
    assert len(launch.runners) == 3


def test_flag_and_alignment(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("KVL_FAST_LAUNCH", "yes")
    with pytest.raises(ValueError, match="KVL_FAST_LAUNCH"):
        fast_launch.fast_launch_enabled()
    x = torch.zeros(17, dtype=torch.bfloat16)
    assert fast_launch.aligned16(x) and not fast_launch.aligned16(x, x[1:])
