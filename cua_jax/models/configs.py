"""What the models' configurations share: the rotary embedding's `RopeConfig` and the dtypes a
config accepts. Each model's own config is in its package (`cua_jax.models.qwen3.config`, ...).

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
