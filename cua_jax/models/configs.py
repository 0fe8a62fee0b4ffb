"""What the models' configurations share: the rotary embedding's `RopeConfig`, the dtypes a
config accepts, and the config.json fields every decoder reads and writes the same way
(`decoder_fields_from_hf`, `decoder_fields_to_hf`). Each model's own config is in its package
(`cua_jax.models.qwen3.config`, ...).

A config is frozen (hashable) because it is a static attribute of the NNX modules and so part of
every jitted function's cache key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

ROPE_TYPES = ("default", "linear", "dynamic", "yarn")
# Parameter and compute dtypes a model config accepts, by name.
MODEL_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def model_dtype(value: Any, field: str) -> Any:
    """The jnp dtype `value` names ("float32" / "bfloat16", or the dtype itself); a ValueError
    naming `field` for anything else."""
    if isinstance(value, str):
        name = value
    else:
        try:
            name = jnp.dtype(value).name
        except TypeError:
            name = None
    if name not in MODEL_DTYPES:
        raise ValueError(f"{field} {value!r} is not supported; choose one of {tuple(MODEL_DTYPES)}")
    return MODEL_DTYPES[name]


def check_decoder_fields(config: Any, name: str) -> None:
    """What every decoder config's `__post_init__` does first: dtype and param_dtype stored as jnp
    dtypes, remat a bool, query heads a multiple of key/value heads; errors name `name`'s fields."""
    object.__setattr__(config, "dtype", model_dtype(config.dtype, f"{name}.dtype"))
    object.__setattr__(config, "param_dtype", model_dtype(config.param_dtype, f"{name}.param_dtype"))
    if not isinstance(config.remat, bool):
        raise ValueError(f"{name}.remat must be a bool, got {config.remat!r}")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({config.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )


def decoder_fields_from_hf(hf: Mapping[str, Any], model_name: str) -> dict[str, Any]:
    """The config fields a decoder's config.json gives as every Qwen decoder does (sizes, heads,
    norm, embeddings, special ids), with HF's defaults; a ValueError naming `model_name` when a
    required one is missing."""
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(f"config.json lacks required fields {missing} (a {model_name} config)")
    eos = hf.get("eos_token_id")
    return dict(
        {name: hf[name] for name in required},
        num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        attention_bias=hf.get("attention_bias", False),
        hidden_act=hf.get("hidden_act", "silu"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
    )


def decoder_fields_to_hf(config: Any, torch_dtype: str) -> dict[str, Any]:
    """The config.json fields `decoder_fields_from_hf` reads, from `config`, with what
    transformers writes beside them (no dropout, the cache on, `torch_dtype`)."""
    eos = config.eos_token_id
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
        "pad_token_id": config.pad_token_id,
        "dtype": torch_dtype,
    }


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters`).

    rope_type: one of ROPE_TYPES. `factor` scales positions (linear), the base (dynamic
    NTK) or blends interpolation/extrapolation (yarn). The yarn fields default as in HF.
    """

    rope_theta: float = 10000.0
    rope_type: str = "default"
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {self.rope_type!r}; supported: {ROPE_TYPES}")
        if self.rope_type in ("linear", "dynamic") and self.factor is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs a 'factor'")
        if self.rope_type == "yarn" and self.original_max_position_embeddings is None:
            raise ValueError("rope_type 'yarn' needs 'original_max_position_embeddings'")

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any]) -> RopeConfig:
        """Reads `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older)."""
        params = dict(hf.get("rope_parameters") or {})
        legacy = dict(hf.get("rope_scaling") or {})
        params = {**legacy, **params}
        if "rope_theta" not in params and "rope_theta" in hf:
            params["rope_theta"] = hf["rope_theta"]
        rope_type = params.pop("rope_type", params.pop("type", "default"))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(params) - known - {"partial_rotary_factor", "mrope_section", "mrope_interleaved"}
        if unknown:
            raise ValueError(f"unknown rope parameters {sorted(unknown)} in config")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported")
        kwargs = {k: v for k, v in params.items() if k in known}
        return cls(rope_type=rope_type, **kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in out and value is not None and f.name != "truncate":
                out[f.name] = value
        if not self.truncate:
            out["truncate"] = False
        return out
