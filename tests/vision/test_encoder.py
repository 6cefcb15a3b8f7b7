"""MoonViT encoder: transformers kimi_k25 parity, packing invariants, backends, QK-Clip protocol, flavors."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms

from vision_encoder.config import FLAVORS, MoonViTConfig, moonvit_config
from vision_encoder.convert import from_kimi_k25, to_kimi_k25
from vision_encoder.model import MoonViT
from vision_encoder.processor import MoonViTProcessor

k25 = pytest.importorskip("transformers.models.kimi_k25.modeling_kimi_k25")
k25_cfg = pytest.importorskip("transformers.models.kimi_k25.configuration_kimi_k25")

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, pos_emb_height=8, pos_emb_width=8)


def _pixels(grid: torch.Tensor) -> torch.Tensor:
    return torch.randn(int(grid.prod(-1).sum()), 3, 14, 14)


@pytest.fixture(scope="module")
def pair() -> tuple[MoonViT, torch.nn.Module, torch.nn.Module]:
    """(ours, Kimi_K25VisionModel, Kimi_K25MultimodalProjection) with the same random weights."""
    torch.manual_seed(1)
    vcfg = k25_cfg.Kimi_K25VisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=64, pos_emb_height=8, pos_emb_width=8)
    text = {"model_type": "llama", "hidden_size": 48, "num_attention_heads": 4}
    full = k25_cfg.Kimi_K25Config(vision_config=vcfg, text_config=text, projection_hidden_size=32)
    tower, proj = k25.Kimi_K25VisionModel(vcfg).eval(), k25.Kimi_K25MultimodalProjection(full).eval()
    with torch.no_grad():
        for p in list(tower.parameters()) + list(proj.parameters()):
            p.normal_(0, 0.2)
    ref_sd = {"model.vision_tower." + k: v for k, v in tower.state_dict().items()}
    ref_sd |= {"model.mm_projector." + k: v for k, v in proj.state_dict().items()}
    ours = MoonViT(MoonViTConfig(**TINY, out_hidden_size=48)).eval()
    ours.load_state_dict(from_kimi_k25(ref_sd), strict=True)
    return ours, tower, proj


@pytest.mark.parametrize("grid", [
    [[1, 4, 6], [1, 2, 2], [1, 10, 2], [1, 8, 8], [1, 16, 8], [1, 2, 40]],
    [[4, 4, 6], [4, 2, 2], [4, 8, 8]],
    [[3, 6, 4]],
])
def test_parity_with_kimi_k25_tower_and_projector(pair, grid) -> None:
    ours, tower, proj = pair
    grid = torch.tensor(grid)
    pv = _pixels(grid)
    with torch.no_grad():
        ref = tower(pv, grid)
        ref_tokens = proj(ref.pooler_output).squeeze(1)
        out = ours(pv, grid)
    assert_rel_rms(out.last_hidden_state, ref.last_hidden_state, 1e-5, "last_hidden_state")
    assert_rel_rms(out.merged, ref.pooler_output, 1e-5, "merged")
    assert_rel_rms(out.projected, ref_tokens, 1e-5, "projected")


def test_key_map_round_trip_is_exact(pair) -> None:
    ours = pair[0]
    sd = ours.state_dict()
    back = from_kimi_k25(to_kimi_k25(sd))
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    with pytest.raises(ValueError, match="no kimi_k25 name"):
        to_kimi_k25({"blocks.0.attn.wqkv.weight": torch.zeros(1)})


def _model(**overrides) -> MoonViT:
    torch.manual_seed(0)
    return MoonViT(moonvit_config("debug", out_hidden_size=24, **overrides)).eval()


MIXED = torch.tensor([[1, 2, 2], [4, 4, 6], [1, 6, 2], [2, 2, 4], [1, 40, 2], [1, 2, 40]])


@pytest.mark.parametrize("backend", ["masked", "loop"])
def test_packing_equals_encoding_each_alone(backend: str) -> None:
    model = _model()
    pv = _pixels(MIXED)
    with torch.no_grad():
        packed = model(pv, MIXED, backend=backend).projected
        alone = [model(p, g[None]).projected for p, g in zip(torch.split(pv, MIXED.prod(-1).tolist()), MIXED)]
        padded = model.forward_padded(pv, MIXED).projected
    assert_rel_rms(packed, torch.cat(alone), 1e-6, "packed vs alone")
    assert_rel_rms(padded, packed, 1e-6, "padded vs packed")
    assert packed.shape[0] == sum(int(g[1] * g[2]) // 4 for g in MIXED)


def test_no_gradient_flows_between_images() -> None:
    model = _model()
    grid = torch.tensor([[1, 4, 4], [4, 2, 6], [1, 6, 2]])
    pv = _pixels(grid).requires_grad_(True)
    out = model(pv, grid).projected
    n0 = 4  # tokens of the first image
    out[:n0].sum().backward()
    first = int(grid[0].prod())
    assert pv.grad[:first].abs().sum() > 0
    assert torch.count_nonzero(pv.grad[first:]) == 0


def test_every_parameter_gets_a_gradient() -> None:
    model = _model().train()
    grid = torch.tensor([[1, 4, 4], [2, 2, 2]])
    model(_pixels(grid), grid).projected.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


def test_fused_layer_norm_path_equals_torch_path(monkeypatch, device) -> None:
    """The tower with its LayerNorms on the Triton kernel (on the GPU, else the interpreter on the CPU) equals
    nn.LayerNorm's path: output and every gradient (fp32)."""
    model = _model().train().to(device)
    grid = torch.tensor([[1, 4, 4], [2, 2, 2]])
    pv = _pixels(grid).to(device)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVL_NORM_BACKEND", backend)
        model.zero_grad()
        out = model(pv, grid).projected
        out.square().mean().backward()
        results[backend] = [out.detach()] + [p.grad.clone() for p in model.parameters()]
    names = ["out"] + [n for n, _ in model.named_parameters()]
    for name, a, b in zip(names, results["triton"], results["torch"]):
        assert_rel_rms(a, b, 1e-5, name)


def test_aspect_ratios_and_single_patch_images() -> None:
    proc, model = MoonViTProcessor(), _model()
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8)
              for h, w in [(1, 1), (14, 14), (28, 560), (560, 28), (20, 400), (400, 20), (7, 3)]]
    pv, grid = proc.preprocess_images(images)
    with torch.no_grad():
        out = model(pv, grid).projected
    expected = [proc.num_image_tokens(img.shape[1], img.shape[2]) for img in images]
    assert out.shape[0] == sum(expected) and expected[0] == 1 and expected[2] == 20
    assert torch.isfinite(out).all()


def test_bad_inputs_raise() -> None:
    model = _model()
    with pytest.raises(ValueError, match="implies 24 patches"):
        model(torch.randn(10, 3, 14, 14), torch.tensor([[1, 4, 6]]))
    with pytest.raises(ValueError, match="pixel_values must be"):
        model(torch.randn(24, 3, 16, 16), torch.tensor([[1, 4, 6]]))
    with pytest.raises(ValueError, match="pos_emb_time"):
        model(torch.randn(40, 3, 14, 14), torch.tensor([[10, 2, 2]]))


def test_qk_clip_protocol() -> None:
    from kernels.qk_max import max_logits_per_head_naive

    model = _model()
    attn = model.blocks[0].attn
    assert attn.qk_clip_num_heads == 2 and torch.isinf(attn.max_logits_H).all()
    captured = {}
    attn.register_forward_hook(lambda m, a, o: captured.update(args=a))
    grid = torch.tensor([[1, 4, 4], [2, 2, 2]])
    pv = _pixels(grid)
    with torch.no_grad():
        model(pv, grid)
    assert torch.isinf(attn.max_logits_H).all()  # not tracking by default
    for blk in model.blocks:
        blk.attn.track_max_logits = True
    with torch.no_grad():
        model(pv, grid)
        x, cos, sin, layout = captured["args"]
        from vision_encoder.rope_2d import apply_rope_2d
        shape = x.shape[:-1] + (2, attn.head_dim)
        q = apply_rope_2d(attn.q_proj(x).view(shape), cos, sin)
        k = apply_rope_2d(attn.k_proj(x).view(shape), cos, sin)
        expected = max_logits_per_head_naive(q[None], k[None], attn.scale, False, cu_seqlens=layout.cu_seqlens)
    torch.testing.assert_close(attn.max_logits_H, expected.float(), rtol=1e-5, atol=1e-5)
    before = {n: p.detach().clone() for n, p in attn.named_parameters()}
    attn.qk_clip_(torch.tensor([1.0, 0.25]))
    d = attn.head_dim
    assert torch.equal(attn.q_proj.weight[:d], before["q_proj.weight"][:d])
    torch.testing.assert_close(attn.k_proj.weight[d:], before["k_proj.weight"][d:] * 0.5)
    torch.testing.assert_close(attn.q_proj.bias[d:], before["q_proj.bias"][d:] * 0.5)
    assert torch.equal(attn.v_proj.weight, before["v_proj.weight"])
    assert torch.equal(attn.out_proj.weight, before["out_proj.weight"])


def test_so400m_shape_on_meta_device() -> None:
    with torch.device("meta"):
        model = MoonViT(moonvit_config("so400m"))
    n = model.num_params()
    assert 405e6 < n < 420e6, n
    with torch.device("meta"):
        with_proj = MoonViT(moonvit_config("so400m", out_hidden_size=2048))
    assert with_proj.num_params() > n
    assert set(FLAVORS) == {"debug", "tiny", "small", "so400m"}


def test_tiny_flavor_is_cheap() -> None:
    model = MoonViT(moonvit_config("tiny"))
    assert model.num_params() < 300_000


def test_timm_registration() -> None:
    timm = pytest.importorskip("timm")
    import vision_encoder.timm_registry  # noqa: F401

    model = timm.create_model("moonvit_debug", out_hidden_size=16)
    assert isinstance(model, MoonViT) and model.config.out_hidden_size == 16
    with pytest.raises(ValueError, match="no pretrained"):
        timm.create_model("moonvit_debug", pretrained=True)


@pytest.mark.parametrize("hw", [(5, 11), (8, 8), (13, 3), (1, 1)])
def test_position_table_resize_equals_bicubic_interpolate(hw):
    """The matrix form of the table resize (two matmuls, fp32 even under autocast) == ``F.interpolate`` bicubic:
    values and the table's gradient."""
    import torch.nn.functional as F

    model = MoonViT(MoonViTConfig(**TINY))
    with torch.no_grad():
        model.pos_emb.table.normal_()
    h, w = hw
    table = model.pos_emb.table
    ref = F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bicubic", align_corners=False)
    ref = ref[0].permute(1, 2, 0).reshape(h * w, -1)
    dy = torch.randn_like(ref)
    (g_ref,) = torch.autograd.grad((ref * dy).sum(), table)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model.pos_emb.spatial(h, w)
    assert got.dtype == torch.float32
    (g,) = torch.autograd.grad((got * dy).sum(), table)
    assert_rel_rms(got, ref, 1e-6, "table")
    assert_rel_rms(g, g_ref, 1e-6, "table gradient")
