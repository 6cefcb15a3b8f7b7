"""KimiVLConfig: the architecture of the Kimi Linear text backbone (KDA + NoPE MLA, dense/MoE FFN, AttnRes).

A transformers ``PretrainedConfig`` whose text fields carry the names of transformers'
``KimiLinearConfig`` (``hidden_size``, ``linear_num_heads``, ``kv_lora_rank``, ``num_experts`` ...), so
that conversion to and from ``kimi_linear`` checkpoints is a rename of keys, not of meanings. Source:
Kimi Linear (arXiv 2510.26692), its released config, and transformers ``models/kimi_linear``.

Layer layout: ``layer_types`` lists one entry per layer, ``"linear_attention"`` (KDA) or
``"full_attention"`` (NoPE MLA); the short names ``"kda"`` / ``"mla"`` are accepted and normalised.
When it is omitted, ``attn_ratio`` (``"3:1"`` = three KDA layers per MLA layer) builds it, with the last
layer always global as in the released model. ``mlp_layer_types`` lists ``"dense"`` or ``"sparse"``
(``"moe"`` accepted); when omitted the first ``first_k_dense_replace`` layers are dense.

``residual_mode`` selects the residual stream (``standard`` PreNorm, ``attnres_full``, ``attnres_block``
with ``attnres_block_size`` sublayers per block; see ``modeling/attn_res.py``). ``vision_config`` is
reserved for the vision-encoder sub-config of the multimodal model.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

LAYER_TYPE_ALIASES = {"kda": "linear_attention", "linear_attention": "linear_attention",
                      "mla": "full_attention", "full_attention": "full_attention"}
MLP_TYPE_ALIASES = {"dense": "dense", "sparse": "sparse", "moe": "sparse"}
RESIDUAL_MODES = ("standard", "attnres_full", "attnres_block")
MLA_CACHE_MODES = ("latent", "expanded")
ATTN_BACKENDS = ("auto", "sdpa", "flex", "eager")


def layer_types_from_ratio(num_layers: int, ratio: str, last_global: bool = True) -> list[str]:
    """``"3:1"`` -> every 4th layer (1-indexed) is MLA, the rest KDA; the last layer is MLA if ``last_global``."""
    try:
        n_kda, n_mla = (int(p) for p in ratio.split(":"))
    except ValueError as err:
        raise ValueError(f"KimiVLConfig: attn_ratio must look like '3:1', got {ratio!r}") from err
    if n_kda < 0 or n_mla < 0 or n_kda + n_mla == 0:
        raise ValueError(f"KimiVLConfig: attn_ratio {ratio!r} needs non-negative parts with a positive sum")
    period = n_kda + n_mla
    types = ["linear_attention" if (i % period) < n_kda else "full_attention" for i in range(num_layers)]
    if last_global and n_mla > 0 and num_layers > 0:
        types[-1] = "full_attention"
    return types


def _normalise(values: list[str], aliases: dict[str, str], field: str) -> list[str]:
    out = []
    for i, v in enumerate(values):
        if v not in aliases:
            raise ValueError(f"KimiVLConfig: {field}[{i}] = {v!r} is unknown; allowed: {sorted(aliases)}")
        out.append(aliases[v])
    return out


class KimiVLConfig(PretrainedConfig):
    """Architecture of the Kimi Linear backbone (see module docstring); build named ones with :meth:`from_flavor`."""

    model_type = "kimi_vl"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {"num_local_experts": "num_experts", "n_shared_experts": "num_shared_experts",
                     "num_experts_per_token": "num_experts_per_tok", "moe_renormalize": "norm_topk_prob"}

    def __init__(
        self,
        vocab_size: int = 163840,
        hidden_size: int = 2304,
        intermediate_size: int = 9216,
        moe_intermediate_size: int = 1024,
        num_hidden_layers: int = 27,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        q_lora_rank: int | None = None,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        linear_num_heads: int = 32,
        linear_head_dim: int = 128,
        linear_conv_kernel_dim: int = 4,
        kda_gate_lower_bound: float | None = None,
        num_experts: int = 256,
        num_experts_per_tok: int = 8,
        num_shared_experts: int = 1,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 2.446,
        norm_topk_prob: bool = True,
        moe_bias_update_rate: float = 1e-3,
        layer_types: list[str] | None = None,
        attn_ratio: str = "3:1",
        mlp_layer_types: list[str] | None = None,
        first_k_dense_replace: int = 1,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mla_cache_mode: str = "latent",
        attn_backend: str = "auto",
        residual_mode: str = "standard",
        attnres_block_size: int = 6,
        max_position_embeddings: int = 1048576,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        vision_config: dict | None = None,
        flavor: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.linear_num_heads = linear_num_heads
        self.linear_head_dim = linear_head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.kda_gate_lower_bound = kda_gate_lower_bound
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.norm_topk_prob = norm_topk_prob
        self.moe_bias_update_rate = moe_bias_update_rate
        self.attn_ratio = attn_ratio
        if layer_types is None:
            layer_types = layer_types_from_ratio(num_hidden_layers, attn_ratio)
        self.layer_types = _normalise(list(layer_types), LAYER_TYPE_ALIASES, "layer_types")
        if mlp_layer_types is None:
            mlp_layer_types = ["dense" if i < first_k_dense_replace else "sparse" for i in range(num_hidden_layers)]
        self.mlp_layer_types = _normalise(list(mlp_layer_types), MLP_TYPE_ALIASES, "mlp_layer_types")
        self.first_k_dense_replace = first_k_dense_replace
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mla_cache_mode = mla_cache_mode
        self.attn_backend = attn_backend
        self.residual_mode = residual_mode
        self.attnres_block_size = attnres_block_size
        self.max_position_embeddings = max_position_embeddings
        self.use_cache = use_cache
        self.vision_config = vision_config
        self.flavor = flavor
        self._check()
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def num_sublayers(self) -> int:
        """Each attention and each FFN is one sublayer (the AttnRes unit)."""
        return 2 * self.num_hidden_layers

    def _check(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"KimiVLConfig: {field} {why} (kimi_vl/configuration.py)")

        n = self.num_hidden_layers
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "linear_num_heads",
                      "linear_head_dim", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "intermediate_size",
                      "linear_conv_kernel_dim", "attnres_block_size"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) <= 0:
                raise bad(field, f"must be a positive int, got {getattr(self, field)!r}")
        if self.qk_rope_head_dim < 0:
            raise bad("qk_rope_head_dim", f"must be >= 0, got {self.qk_rope_head_dim}")
        if len(self.layer_types) != n:
            raise bad("layer_types", f"has {len(self.layer_types)} entries for num_hidden_layers={n}")
        if len(self.mlp_layer_types) != n:
            raise bad("mlp_layer_types", f"has {len(self.mlp_layer_types)} entries for num_hidden_layers={n}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise bad("num_key_value_heads", f"must equal num_attention_heads for MLA, got {self.num_key_value_heads}")
        if self.hidden_size % self.num_attention_heads:
            raise bad("num_attention_heads",
                      f"={self.num_attention_heads} does not divide hidden_size={self.hidden_size}")
        if self.hidden_size % self.linear_num_heads:
            raise bad("linear_num_heads", f"={self.linear_num_heads} does not divide hidden_size={self.hidden_size}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise bad("q_lora_rank", f"must be None or positive, got {self.q_lora_rank}")
        if self.kda_gate_lower_bound is not None and not -5.0 <= self.kda_gate_lower_bound < 0.0:
            raise bad("kda_gate_lower_bound", f"must be None or in [-5, 0), got {self.kda_gate_lower_bound}")
        if "sparse" in self.mlp_layer_types:
            self._check_moe(bad)
        if self.residual_mode not in RESIDUAL_MODES:
            raise bad("residual_mode", f"={self.residual_mode!r} is not one of {RESIDUAL_MODES}")
        if self.mla_cache_mode not in MLA_CACHE_MODES:
            raise bad("mla_cache_mode", f"={self.mla_cache_mode!r} is not one of {MLA_CACHE_MODES}")
        if self.attn_backend not in ATTN_BACKENDS:
            raise bad("attn_backend", f"={self.attn_backend!r} is not one of {ATTN_BACKENDS}")
        if self.hidden_act != "silu":
            raise bad("hidden_act", f"={self.hidden_act!r}; only 'silu' (SwiGLU) is implemented")

    def _check_moe(self, bad) -> None:
        if self.num_experts <= 0 or self.moe_intermediate_size <= 0:
            raise bad("num_experts", f"and moe_intermediate_size must be positive, got {self.num_experts}, "
                      f"{self.moe_intermediate_size}")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise bad("num_experts_per_tok",
                      f"={self.num_experts_per_tok} must be in [1, num_experts={self.num_experts}]")
        if self.num_experts % self.n_group:
            raise bad("n_group", f"={self.n_group} does not divide num_experts={self.num_experts}")
        if not 0 < self.topk_group <= self.n_group:
            raise bad("topk_group", f"={self.topk_group} must be in [1, n_group={self.n_group}]")
        if self.n_group > 1 and self.num_experts // self.n_group < 2:
            raise bad("n_group", "needs at least 2 experts per group (group score = sum of the top-2)")
        if self.num_experts_per_tok > self.topk_group * (self.num_experts // self.n_group):
            raise bad("num_experts_per_tok", "exceeds the experts available in topk_group groups")
        if self.num_shared_experts < 0:
            raise bad("num_shared_experts", f"must be >= 0, got {self.num_shared_experts}")

    @classmethod
    def from_flavor(cls, name: str, **overrides: Any) -> KimiVLConfig:
        """A named architecture (see ``kimi_vl/flavors.py``) with keyword overrides applied on top."""
        from kimi_vl.flavors import flavor_kwargs

        kwargs = flavor_kwargs(name)
        kwargs.update(overrides)
        if "num_hidden_layers" in overrides and "layer_types" not in overrides:
            kwargs.pop("layer_types", None)
        if "num_hidden_layers" in overrides and "mlp_layer_types" not in overrides:
            kwargs.pop("mlp_layer_types", None)
        return cls(flavor=name, **kwargs)
