"""The packed-document flex-attention mask built from block structure == ``create_block_mask`` on every pair."""

from __future__ import annotations

import pytest
import torch

flex = pytest.importorskip("torch.nn.attention.flex_attention")

from kimi_vl.modeling.masks import doc_causal_block_mask  # noqa: E402


def _docs(n: int, cuts: list[int]) -> torch.Tensor:
    cu = torch.tensor([0, *cuts, n])
    return torch.searchsorted(cu[1:], torch.arange(n), right=True)


@pytest.mark.parametrize("n,cuts", [
    (128, []), (512, [1, 127, 128, 129, 300]), (1024, [256, 512, 768]), (640, list(range(5, 640, 37))),
    (384, [383]), (256, [64, 64 + 128]),
])
def test_doc_causal_block_mask_equals_create_block_mask(n, cuts):
    docs = _docs(n, cuts)

    def mask_mod(b, h, q, kv):
        return (docs[q] == docs[kv]) & (q >= kv)

    ref = flex.create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n, device="cpu")
    got = doc_causal_block_mask(docs, mask_mod)
    assert torch.equal(got.to_dense(), ref.to_dense())
    for num_r, idx_r, num_g, idx_g in [(ref.kv_num_blocks, ref.kv_indices, got.kv_num_blocks, got.kv_indices),
                                       (ref.full_kv_num_blocks, ref.full_kv_indices, got.full_kv_num_blocks,
                                        got.full_kv_indices)]:
        assert torch.equal(num_g, num_r)
        for row in range(num_r.shape[-1]):
            k = int(num_r[0, 0, row])
            assert torch.equal(idx_g[0, 0, row, :k].sort().values, idx_r[0, 0, row, :k].sort().values)
