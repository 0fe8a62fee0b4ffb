"""Qwen3-VL (vision tower + Qwen3 text decoder with DeepStack and interleaved M-RoPE): `config`
(configuration), `modeling` (multimodal positions and the model), `params` (checkpoint tables,
loading and exporting). The public names of all three are importable from here."""

from cua_jax.models.qwen3_vl.config import Qwen3VLConfig, tiny_qwen3_vl_config
from cua_jax.models.qwen3_vl.modeling import (
    Qwen3VLForConditionalGeneration,
    decode_positions,
    image_features,
    image_prefill_extras,
    image_token_counts,
    rope_index,
    text_positions,
    text_rope_tables,
)
from cua_jax.models.qwen3_vl.params import (
    QWEN3_VL_RULES,
    export_qwen3_vl,
    load_qwen3_vl,
    qwen3_vl_key_table,
    vision_key_rules,
)

__all__ = [
    "Qwen3VLConfig",
    "tiny_qwen3_vl_config",
    "Qwen3VLForConditionalGeneration",
    "decode_positions",
    "image_features",
    "image_prefill_extras",
    "image_token_counts",
    "rope_index",
    "text_positions",
    "text_rope_tables",
    "QWEN3_VL_RULES",
    "export_qwen3_vl",
    "load_qwen3_vl",
    "qwen3_vl_key_table",
    "vision_key_rules",
]
