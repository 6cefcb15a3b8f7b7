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


def _param(name: str, constexpr: bool = False, nospec: bool = False, default=None):
    import inspect

    return SimpleNamespace(name=name, is_constexpr=constexpr, do_not_specialize=nospec,
                           default=inspect.Parameter.empty if default is None else default)


class _ParamKernel(_Kernel):
    """A stand-in ``triton.jit`` kernel ``(x_ptr, n, flag, eps, BLOCK: constexpr, MODE: constexpr = 2)``, ``n``
    specialised, ``flag`` not."""

    __name__ = "_param_kernel"
    params = [_param("x_ptr"), _param("n"), _param("flag", nospec=True), _param("eps"),
              _param("BLOCK", constexpr=True), _param("MODE", constexpr=True, default=2)]


def test_fast_kernel_binds_like_the_jit_and_keys_what_it_specialises(fake_driver, monkeypatch):
    """``fast(kernel)[grid](...)``: keyword arguments and defaults bound in signature order (constexprs included),
    launch options kept apart; a second call that the JIT would compile the same way reuses the runner, and every
    change the JIT specialises on (dtype, 16-byte alignment, an int becoming 1 or a multiple of 16, a constexpr, an
    option) goes through the JIT again. A do_not_specialize int may change freely within 32 bits."""
    kernel = _ParamKernel()
    launch = fast_launch.FastKernel(kernel)
    x = torch.zeros(64)
    launch[(2,)](x, 5, 3, 1e-5, BLOCK=16, num_warps=4)
    assert kernel.log[0] == ("jit", (2,), (x, 5, 3, 1e-5, 16, 2), {"num_warps": 4})
    launch[(2,)](x, 7, 9, 2e-5, 16, num_warps=4)  # same specialisation, BLOCK positional
    assert kernel.log[1] == ("runner", (2, 1, 1), (x, 7, 9, 2e-5, 16, 2))
    changes = [
        lambda: launch[(2,)](x.double(), 7, 9, 1e-5, BLOCK=16, num_warps=4),  # dtype
        lambda: launch[(2,)](x[1:], 7, 9, 1e-5, BLOCK=16, num_warps=4),  # alignment
        lambda: launch[(2,)](x, 1, 9, 1e-5, BLOCK=16, num_warps=4),  # n == 1
        lambda: launch[(2,)](x, 32, 9, 1e-5, BLOCK=16, num_warps=4),  # n % 16 == 0
        lambda: launch[(2,)](x, 7, 9, 1e-5, BLOCK=32, num_warps=4),  # constexpr
        lambda: launch[(2,)](x, 7, 9, 1e-5, BLOCK=16, MODE=3, num_warps=4),  # defaulted constexpr
        lambda: launch[(2,)](x, 7, 9, 1e-5, BLOCK=16, num_warps=8),  # option
        lambda: launch[(2,)](x, 7, 2**40, 1e-5, BLOCK=16, num_warps=4),  # 64-bit
    ]
    for change in changes:
        change()
        assert kernel.log[-1][0] == "jit"
    launch[(2,)](x, 11, 16, 3e-5, BLOCK=16, num_warps=4)  # flag 16: not specialised
    assert kernel.log[-1][0] == "runner"
    with pytest.raises(TypeError, match="missing argument 'BLOCK'"):
        launch[(2,)](x, 7, 9, 1e-5, num_warps=4)
    launch[(2,)](x, 7, 9, [1.0], BLOCK=16, num_warps=4)  # a kind it does not key: the JIT every time
    launch[(2,)](x, 7, 9, [1.0], BLOCK=16, num_warps=4)
    assert [e[0] for e in kernel.log[-2:]] == ["jit", "jit"]
    assert fast_launch.fast(kernel) is fast_launch.fast(kernel)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # interpreted kernels (no compiled runner): the kernel itself
    assert fast_launch.fast(kernel) is kernel
