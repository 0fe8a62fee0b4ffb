"""Qwen3.5 (hybrid Gated DeltaNet / gated full attention, text and vision-language): `config`
(configurations), `modeling` (caches, layers and models), `params` (checkpoint tables, loading
and exporting). The public names of all three are importable from here."""

from cua_jax.models.qwen3_5.config import (
    LAYER_TYPES,
    CheckpointTensorSpec,
    Qwen3_5Config,
    Qwen3_5TextConfig,
    tiny_qwen3_5_config,
    tiny_qwen3_5_text_config,
)
from cua_jax.models.qwen3_5.modeling import (
    CheckpointTensor,
    CheckpointTensors,
    DecoderLayer,
    GatedAttention,
    GatedDeltaNet,
    GatedRMSNorm,
    HybridCache,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextModel,
    ZeroCenteredRMSNorm,
    image_prefill_extras,
    init_hybrid_cache,
)
from cua_jax.models.qwen3_5.params import (
    QWEN3_5_RULES,
    checkpoint_mtp_tensors,
    export_qwen3_5,
    is_vision_language,
    load_qwen3_5,
    qwen3_5_key_table,
    text_key_rules,
)

__all__ = [
    "LAYER_TYPES",
    "CheckpointTensorSpec",
    "Qwen3_5Config",
    "Qwen3_5TextConfig",
    "tiny_qwen3_5_config",
    "tiny_qwen3_5_text_config",
    "CheckpointTensor",
    "CheckpointTensors",
    "DecoderLayer",
    "GatedAttention",
    "GatedDeltaNet",
    "GatedRMSNorm",
    "HybridCache",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5TextModel",
    "ZeroCenteredRMSNorm",
    "image_prefill_extras",
    "init_hybrid_cache",
    "QWEN3_5_RULES",
    "checkpoint_mtp_tensors",
    "export_qwen3_5",
    "is_vision_language",
    "load_qwen3_5",
    "qwen3_5_key_table",
    "text_key_rules",
]
