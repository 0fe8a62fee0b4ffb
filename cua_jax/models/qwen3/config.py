"""Qwen3's configuration: `Qwen3Config` mirrors the fields of Hugging Face's config.json that
determine the computation (`from_hf_dict` reads the transformers-5 layout, `rope_parameters`, or
the older `rope_theta` + `rope_scaling`; `to_hf_dict` writes what transformers' own
`Qwen3Config.save_pretrained` writes), YaRN context extension of its rope, and the tiny config of
tests and the embedded default run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from cua_jax.models.configs import RopeConfig, check_decoder_fields, decoder_fields_from_hf, decoder_fields_to_hf


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """The fields of HF's Qwen3Config that determine the computation.

    `dtype` is the activation/compute dtype, `param_dtype` the dtype parameters are
    stored in, each "float32" or "bfloat16" (a name or the jnp dtype; stored as the jnp
    dtype). Softmaxes, norms and logits are computed in float32 whatever `dtype` is.
    Training with bfloat16 parameters keeps float32 master weights in the optimizer
    (`cua_jax.train.learner.make_optimizer`).
    `attention_query_chunk` bounds attention-score memory for long sequences (queries
    per block; 0 = all at once). `remat`: rematerialise each decoder layer (and each
    vision block of a Qwen3-VL) in the backward pass instead of keeping its activations,
    so activation memory is one layer's plus a [B, T, E] residual per layer. These four
    are ours, not HF fields.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_query_chunk: int = 1024
    remat: bool = False

    def __post_init__(self):
        check_decoder_fields(self, "Qwen3Config")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (Qwen3 uses 'silu')")

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides: Any) -> Qwen3Config:
        """Builds the config from a config.json dict; `overrides` set dtype, param_dtype, ...."""
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        kwargs = decoder_fields_from_hf(hf, "Qwen3")
        kwargs["rope"] = RopeConfig.from_hf_dict(hf)
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """The config.json dict transformers' `Qwen3ForCausalLM` loads."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **decoder_fields_to_hf(self, torch_dtype),
            "rope_parameters": self.rope.to_hf_dict(),
            "use_sliding_window": False,
        }


def rope_scaled(config: Any, factor: float) -> Any:
    """`config` with its text decoder's default rope replaced by YaRN at `factor` over the
    context the model was trained at, its max_position_embeddings (HF: `rope_scaling={"rope_type":
    "yarn", "factor": factor, "original_max_position_embeddings": max_position_embeddings}`), and
    max_position_embeddings scaled by `factor`: test-time context extension, same weights.

    config: a Qwen3Config, or a config whose `text` is one (Qwen3-VL). A ValueError for a factor
    <= 1, a rope that is not "default", or another text config (Qwen3.5 has only its default rope).
    """
    if hasattr(config, "text"):
        return dataclasses.replace(config, text=rope_scaled(config.text, factor))
    if not isinstance(config, Qwen3Config):
        raise ValueError(
            f"{type(config).__name__} supports only its default rope; YaRN scaling needs a Qwen3 "
            "or Qwen3-VL text decoder"
        )
    if not factor > 1:
        raise ValueError(f"a YaRN factor must exceed 1, got {factor}")
    if config.rope.rope_type != "default":
        raise ValueError(f"YaRN scaling extends a model's default rope; this one is already {config.rope.rope_type!r}")
    original = config.max_position_embeddings
    rope = RopeConfig(
        rope_theta=config.rope.rope_theta,
        rope_type="yarn",
        factor=float(factor),
        original_max_position_embeddings=original,
    )
    return dataclasses.replace(config, rope=rope, max_position_embeddings=int(original * factor))


def rope_scaled_model(model: Any, factor: float) -> Any:
    """An NNX module of `model`'s class under `rope_scaled(model.config, factor)` holding
    `model`'s parameter arrays themselves (nothing copied or initialised). It shares the arrays,
    not the variables: once `model`'s weights change, `nnx.update(view, nnx.state(model))`
    brings the view up to date."""
    import jax
    from flax import nnx

    config = rope_scaled(model.config, factor)
    view = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
    nnx.update(view, nnx.state(model))
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(nnx.state(view))):
        raise ValueError(f"{type(model).__name__} under a scaled rope has state the model lacks")
    return view


def tiny_qwen3_config(**overrides: Any) -> Qwen3Config:
    """A small random-init config for tests and the embedded default run (item 6).

    hidden 128, 2 layers, 4 query heads / 2 KV heads of head_dim 64 (grouped-query
    attention exercised), vocab 512. Every sharded dimension divides by 2, 4 and 8.
    """
    base = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope=RopeConfig(rope_theta=10000.0),
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    base.update(overrides)
    return Qwen3Config(**base)
