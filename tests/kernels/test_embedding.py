"""Token embedding with the deterministic Triton backward (``kernels/embedding.py``) against PyTorch's, on id
distributions that exercise the chunk boundaries: runs inside a chunk, across one and across many chunks, a single
id throughout, all ids distinct, fewer tokens than a chunk. On a CPU the kernels run under the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels import embedding as emb


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)
    monkeypatch.delenv("KVL_EMBEDDING_BACKEND", raising=False)


def _ids(case: str, vocab: int, gen: torch.Generator) -> torch.Tensor:
    c = emb.CHUNK
    if case == "random":
        return torch.randint(0, vocab, (3, 41), generator=gen)
    if case == "one id":
        return torch.full((5 * c + 3,), 7)
    if case == "distinct":
        return torch.randperm(vocab, generator=gen)[: 2 * c + 5]
    if case == "long runs":  # a run over several chunks, one across a boundary, short ones
        ids = torch.cat([torch.full((3 * c + 2,), 3), torch.full((c - 1,), 9), torch.full((c + 4,), 1),
                         torch.arange(10, 20)])
        return ids[torch.randperm(ids.numel(), generator=gen)]
    if case == "zipf":
        p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
        return torch.multinomial(p, 8 * c, replacement=True, generator=gen)
    return torch.tensor([4])  # "one token"


@pytest.mark.parametrize("case", ["random", "one id", "distinct", "long runs", "zipf", "one token"])
def test_backward_equals_the_sum_per_id(case):
    """fp32: every row of the gradient is its id's rows of the output gradient summed (to fp32 rounding; the fp64
    ``index_add_`` is the reference); rows of absent ids are exactly zero."""
    gen = torch.Generator().manual_seed(1)
    vocab, d = 64, 40 if case != "random" else 300  # 300: two column blocks, the second ragged
    ids = _ids(case, vocab, gen)
    dout = torch.randn(*ids.shape, d, generator=gen)
    dev = kernel_device()
    got = emb.embedding_backward(ids.to(dev), dout.to(dev), vocab, torch.float32).cpu()
    want = torch.zeros(vocab, d, dtype=torch.float64).index_add_(0, ids.reshape(-1), dout.reshape(-1, d).double())
    assert_rel_rms(got, want, 1e-6, case)
    absent = torch.ones(vocab, dtype=torch.bool)
    absent[ids.reshape(-1)] = False
    assert torch.equal(got[absent], torch.zeros_like(got[absent]))


def test_function_matches_f_embedding_and_is_deterministic():
    """Through autograd, int32 ids ``[B, S]``, bf16 output gradient into an fp32 weight (the gradient in the weight's
    dtype): the forward is ``F.embedding``'s; the weight's gradient matches PyTorch's backward and is bit-for-bit the
    same in a second run."""
    gen = torch.Generator().manual_seed(2)
    dev = kernel_device()
    w = torch.randn(50, 64, generator=gen).to(dev).requires_grad_()
    ids = torch.randint(0, 50, (4, 33), generator=gen).to(dev, torch.int32)
    g = torch.randn(4, 33, 64, generator=gen).to(dev)
    grads = []
    for backend in ("triton", "triton", "torch"):
        out = emb.embedding(ids, w, backend=backend)
        assert torch.equal(out, torch.nn.functional.embedding(ids, w))
        grads.append(torch.autograd.grad((out * g).sum(), w)[0])
    assert torch.equal(grads[0], grads[1])
    assert_rel_rms(grads[0], grads[2], 1e-6, "against F.embedding's backward")


def test_empty_ids_and_checks(monkeypatch):
    """No tokens: a zero gradient; non-integer ids, an unknown backend and a forced Triton backend on a CPU without
    the interpreter are refused, naming what is wrong."""
    dev = kernel_device()
    w = torch.randn(10, 8, device=dev, requires_grad=True)
    out = emb.embedding(torch.zeros(0, dtype=torch.int64, device=dev), w, backend="triton")
    (grad,) = torch.autograd.grad(out.sum(), w)
    assert torch.equal(grad, torch.zeros(10, 8, device=dev))
    with pytest.raises(ValueError, match="ids must be int32/int64"):
        emb.embedding(torch.zeros(3, device=dev), w)
    monkeypatch.setenv("KVL_EMBEDDING_BACKEND", "fast")
    with pytest.raises(ValueError, match="KVL_EMBEDDING_BACKEND"):
        emb.embedding(torch.zeros(3, dtype=torch.int64, device=dev), w)
    monkeypatch.setenv("KVL_EMBEDDING_BACKEND", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):  # a CPU weight, on any host
        emb.embedding(torch.zeros(3, dtype=torch.int64), torch.randn(10, 8, requires_grad=True))


@pytest.mark.gpu
def test_small_flavor_size_bf16_on_gpu():
    """8 x 4096 Zipf-distributed ids into a 32768 x 768 bf16 weight: the gradient against PyTorch's backward (both
    sum in fp32 and round once; their orders differ) and bit-equal across two runs."""
    gen = torch.Generator().manual_seed(3)
    p = 1.0 / torch.arange(1, 32769, dtype=torch.float64)
    ids = torch.multinomial(p, 8 * 4096, replacement=True, generator=gen).reshape(8, 4096).cuda()
    w = (0.02 * torch.randn(32768, 768, generator=gen)).to("cuda", torch.bfloat16).requires_grad_()
    g = torch.randn(8, 4096, 768, generator=gen).to("cuda", torch.bfloat16)
    ours = [torch.autograd.grad((emb.embedding(ids, w, backend="triton") * g).sum(), w)[0] for _ in range(2)]
    ref = torch.autograd.grad((torch.nn.functional.embedding(ids, w) * g).sum(), w)[0]
    assert torch.equal(ours[0], ours[1])
    assert_rel_rms(ours[0].float(), ref.float(), 5e-3, "bf16 gradient")


SCRIPT = """
from kernels import embedding as e
from kernels.benchmarks.ptxas_regs import compile_report
for fn, args in ((e._embed_rows_kernel, ["*i64", "*i64", "*bf16", "*bf16", "*fp32", "i32", "i32"]),
                 (e._embed_join_kernel, ["*i64", "*bf16", "*fp32", "i32", "i32"])):
    consts = dict(CHUNK=e.CHUNK, BLOCK_D=e.BLOCK_D)
    it = iter(args)
    sig = {a: "constexpr" if a in consts else next(it) for a in fn.arg_names}
    opts = {"num_warps": e.NUM_WARPS, "num_stages": 2}
    print(fn.__name__, " | ".join(compile_report(fn, sig, consts, opts).splitlines()), flush=True)
"""


@pytest.mark.timeout(600)
def test_kernels_compile_for_sm90():
    """Both kernels (loops with run-dependent branches and a data-dependent while loop) compile for sm_90a without
    spills; the interpreter cannot tell."""
    from kvl_testing import ptxas_lines

    for line in ptxas_lines(SCRIPT, 2):
        assert "0 bytes spill stores" in line, line
