"""kernels.qk_max: the chunked per-head max logit equals the full-matrix max (causal, packed, padded)."""

from __future__ import annotations

import pytest
import torch

import kernels.qk_max.chunked as chunked_mod
from kernels.qk_max import max_logits_per_head, max_logits_per_head_naive
from kernels.qk_max.naive import visibility_mask


def _qk(B: int, T: int, S: int, H: int = 3, D: int = 5, dtype: torch.dtype = torch.float32):
    return torch.randn(B, T, H, D, dtype=dtype) * 2, torch.randn(B, S, H, D, dtype=dtype) * 2


@pytest.mark.parametrize("B,T,S", [(1, 1, 1), (2, 63, 63), (1, 65, 65), (2, 7, 20), (1, 33, 9)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_naive(B: int, T: int, S: int, causal: bool) -> None:
    q, k = _qk(B, T, S)
    want = max_logits_per_head_naive(q, k, 0.3, causal)
    got = max_logits_per_head(q, k, 0.3, causal)
    assert got.dtype == torch.float32 and got.shape == (3,)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_small_chunks_cover_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force many tiny query chunks (and causal key truncation) so chunk bookkeeping is exercised."""
    monkeypatch.setattr(chunked_mod, "_CHUNK_ELEMS", 40)
    for causal in (False, True):
        q, k = _qk(2, 37, 41)
        torch.testing.assert_close(
            max_logits_per_head(q, k, 0.5, causal), max_logits_per_head_naive(q, k, 0.5, causal), rtol=1e-5, atol=1e-5
        )


def test_max_sits_in_a_masked_region_is_ignored() -> None:
    """Plant a huge logit in an invisible pair: the answer must not see it (guards against a no-op mask)."""
    q, k = _qk(1, 8, 8, H=2)
    q[0, 2, 0] = 50.0
    k[0, 6, 0] = 50.0  # pair (2, 6) is above the diagonal
    full = max_logits_per_head(q, k, 1.0, causal=False)
    caus = max_logits_per_head(q, k, 1.0, causal=True)
    assert full[0] > 1000 and caus[0] < 1000
    torch.testing.assert_close(caus, max_logits_per_head_naive(q, k, 1.0, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_cu_seqlens_block_diagonal(causal: bool) -> None:
    B, L = 2, 24
    q, k = _qk(B, L, L)
    cu = torch.tensor([0, 5, 11, 24, 30, 31, 48], dtype=torch.int32)  # a segment spans no row boundary here
    want = max_logits_per_head_naive(q, k, 0.4, causal, cu_seqlens=cu)
    got = max_logits_per_head(q, k, 0.4, causal, cu_seqlens=cu)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # cross-document pairs are invisible: plant a huge pair across a boundary
    q2, k2 = q.clone(), k.clone()
    q2[0, 6, 1] = 40.0
    k2[0, 2, 1] = 40.0
    assert max_logits_per_head(q2, k2, 1.0, causal, cu_seqlens=cu)[1] < 1000
    assert max_logits_per_head(q2, k2, 1.0, causal)[1] > 1000


def test_visibility_mask_is_block_diagonal() -> None:
    cu = torch.tensor([0, 2, 5])
    vis = visibility_mask(1, 5, 5, True, cu, None, torch.device("cpu"))[0]
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]).bool()
    assert torch.equal(vis, want)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask(causal: bool) -> None:
    q, k = _qk(2, 12, 12)
    kpm = torch.ones(2, 12, dtype=torch.long)
    kpm[0, 9:] = 0
    kpm[1, 4:] = 0
    k[0, 10] = 100.0  # padding keys with huge values must be ignored
    want = max_logits_per_head_naive(q, k, 0.2, causal, key_padding_mask=kpm)
    got = max_logits_per_head(q, k, 0.2, causal, key_padding_mask=kpm)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 3, 12, 20, 24])
    want = max_logits_per_head_naive(q, k, 0.2, causal, cu_seqlens=cu, key_padding_mask=kpm)
    got = max_logits_per_head(q, k, 0.2, causal, cu_seqlens=cu, key_padding_mask=kpm)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_no_visible_pair_gives_minus_inf_and_bf16_input() -> None:
    q, k = _qk(1, 4, 4, dtype=torch.bfloat16)
    got = max_logits_per_head(q, k, 1.0, True, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
    assert torch.isneginf(got).all()
    torch.testing.assert_close(max_logits_per_head(q, k, 1.0, True), max_logits_per_head_naive(q, k, 1.0, True))


def test_bad_inputs_raise() -> None:
    q, k = _qk(2, 8, 8)
    with pytest.raises(ValueError, match="4-D"):
        max_logits_per_head(q[0], k[0], 1.0, True)
    with pytest.raises(ValueError, match="share B, H and D"):
        max_logits_per_head(q, k[:, :, :2], 1.0, True)
    with pytest.raises(ValueError, match="cu_seqlens"):
        max_logits_per_head(q, k, 1.0, True, cu_seqlens=torch.tensor([0, 3, 9]))
    with pytest.raises(ValueError, match="key_padding_mask"):
        max_logits_per_head(q, k, 1.0, True, key_padding_mask=torch.ones(2, 7))
    with pytest.raises(ValueError, match="backend"):
        max_logits_per_head(q, k, 1.0, True, backend="cuda")


def test_triton_on_a_cpu_tensor_needs_the_interpreter(monkeypatch) -> None:
    """``backend="triton"`` on a CPU tensor without ``TRITON_INTERPRET=1``: the package's own error, not Triton's
    "0 active drivers"."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k = _qk(2, 8, 8)
    with pytest.raises(ValueError, match=r"backend 'triton' on device cpu needs CUDA or TRITON_INTERPRET=1"):
        max_logits_per_head(q, k, 1.0, True, backend="triton")
