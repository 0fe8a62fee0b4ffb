"""Qwen3 (the dense decoder; Qwen3-VL's language model): `config` (its configuration, YaRN
scaling, the tiny config), `modeling` (KV cache, layers and models), `params` (the checkpoint
table, loading and exporting). The public names of all three are importable from here."""

from cua_jax.models.qwen3.config import Qwen3Config, rope_scaled, rope_scaled_model, tiny_qwen3_config
from cua_jax.models.qwen3.modeling import (
    Attention,
    DecoderLayer,
    KVCache,
    Qwen3ForCausalLM,
    Qwen3Model,
    init_kv_cache,
)
from cua_jax.models.qwen3.params import export_qwen3, load_qwen3, qwen3_key_rules, qwen3_key_table

__all__ = [
    "Qwen3Config",
    "rope_scaled",
    "rope_scaled_model",
    "tiny_qwen3_config",
    "Attention",
    "DecoderLayer",
    "KVCache",
    "Qwen3ForCausalLM",
    "Qwen3Model",
    "init_kv_cache",
    "export_qwen3",
    "load_qwen3",
    "qwen3_key_rules",
    "qwen3_key_table",
]
