"""The Kimi Linear backbone in PyTorch: KDA and NoPE-MLA token mixers, dense/MoE FFN, AttnRes, hybrid cache.

Shape letters used in names and comments across this package: B batch, T query tokens, S key tokens
(cached + new), D hidden size, H heads, K key head dim, V value head dim, R latent (kv_lora) rank,
E experts, N sequences (documents) or AttnRes sources, W conv kernel width.
"""
