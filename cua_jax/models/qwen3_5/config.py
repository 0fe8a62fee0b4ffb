"""Qwen3.5 configurations: `Qwen3_5TextConfig` (HF `Qwen3_5TextConfig`) and `Qwen3_5Config`
(text + vision tower + special token ids), read from and written to config.json dicts, and the
small random-init configs tests and default runs use."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from cua_jax.context.tokenizer import VOCAB_SIZE, shipped_image_token_ids, shipped_special_token_ids
from cua_jax.models.configs import check_decoder_fields, decoder_fields_from_hf, decoder_fields_to_hf
from cua_jax.models.vision import VisionConfig, vision_language_hf_dict, vision_language_hf_parts

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class CheckpointTensorSpec:
    """A checkpoint tensor kept verbatim (an `mtp.*` weight): its HF key, shape and dtype name."""

    key: str
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class Qwen3_5TextConfig:
    """The fields of HF's `Qwen3_5TextConfig` that determine the computation, plus ours.

    layer_types: one of LAYER_TYPES per layer (HF's default: every 4th layer full attention).
    Ours: dtype / param_dtype / attention_query_chunk / remat as `Qwen3Config`; chunk_size: tokens
    per chunk of the chunked delta rule; mtp_tensors: the `mtp.*` weights the checkpoint carries;
    hf_extra: other text-config fields of the config.json (JSON-encoded), written back on export.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    layer_types: tuple[str, ...] = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, int, int] = (11, 11, 10)
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
    chunk_size: int = 64
    mtp_tensors: tuple[CheckpointTensorSpec, ...] = ()
    hf_extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        check_decoder_fields(self, "Qwen3_5TextConfig")
        if not self.layer_types:
            object.__setattr__(
                self,
                "layer_types",
                tuple(
                    "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.num_hidden_layers)
                ),
            )
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mrope_section", tuple(int(x) for x in self.mrope_section))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"layer_types holds unknown types {bad}; known: {LAYER_TYPES}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.rotary_dim % 2 or self.rotary_dim == 0:
            raise ValueError(
                f"head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor} must "
                "give a positive even rotary dimension"
            )
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.rotary_dim // 2:
            raise ValueError(
                f"mrope_section {self.mrope_section} must have 3 entries summing to the rotary "
                f"dimension / 2 = {self.rotary_dim // 2}"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (Qwen3.5 uses 'silu')")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    _KNOWN = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "layer_types",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
        "attention_bias",
        "hidden_act",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "partial_rotary_factor",
        "model_type",
        "architectures",
        "dtype",
        "torch_dtype",
        "use_cache",
        "attention_dropout",
        "initializer_range",
        "transformers_version",
        "full_attention_interval",
    )

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides: Any) -> Qwen3_5TextConfig:
        """From a Qwen3.5 text config.json dict (or a VL config's text_config); `overrides` set
        dtype, param_dtype, mtp_tensors, ...."""
        kwargs = decoder_fields_from_hf(hf, "Qwen3.5 text")
        rope = {**dict(hf.get("rope_scaling") or {}), **dict(hf.get("rope_parameters") or {})}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported for Qwen3.5 (only 'default')")
        layers = hf["num_hidden_layers"]
        layer_types = hf.get("layer_types")
        if not layer_types:
            interval = hf.get("full_attention_interval", 4)
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        kwargs.update(
            linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
            linear_key_head_dim=hf.get("linear_key_head_dim", 128),
            linear_value_head_dim=hf.get("linear_value_head_dim", 128),
            linear_num_key_heads=hf.get("linear_num_key_heads", 16),
            linear_num_value_heads=hf.get("linear_num_value_heads", 32),
            layer_types=tuple(layer_types),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))),
            mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
            hf_extra=tuple(sorted((k, json.dumps(v)) for k, v in hf.items() if k not in cls._KNOWN)),
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """The config.json dict transformers' `Qwen3_5ForCausalLM` loads."""
        out = {k: json.loads(v) for k, v in self.hf_extra}
        out.update(
            {
                "architectures": ["Qwen3_5ForCausalLM"],
                "model_type": "qwen3_5_text",
                **decoder_fields_to_hf(self, torch_dtype),
                "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
                "linear_key_head_dim": self.linear_key_head_dim,
                "linear_value_head_dim": self.linear_value_head_dim,
                "linear_num_key_heads": self.linear_num_key_heads,
                "linear_num_value_heads": self.linear_num_value_heads,
                "layer_types": list(self.layer_types),
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": self.rope_theta,
                    "partial_rotary_factor": self.partial_rotary_factor,
                    "mrope_section": list(self.mrope_section),
                    "mrope_interleaved": True,
                },
            }
        )
        return out


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """HF `Qwen3_5Config`: the text config, a vision config (Qwen3-VL's tower, no DeepStack) and
    the special token ids."""

    text: Qwen3_5TextConfig
    vision: VisionConfig
    image_token_id: int = 248056
    video_token_id: int = 248057
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054

    def __post_init__(self):
        if self.vision.deepstack_visual_indexes:
            raise ValueError(
                "the Qwen3.5 vision tower has no DeepStack mergers (deepstack_visual_indexes must be empty)"
            )
        self.vision.check_image_token_width(self.text.hidden_size)

    @property
    def tie_word_embeddings(self) -> bool:
        return self.text.tie_word_embeddings

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **text_overrides: Any) -> Qwen3_5Config:
        text_hf, vision_hf, token_ids = vision_language_hf_parts(hf, cls, "Qwen3.5 vision-language")
        text = Qwen3_5TextConfig.from_hf_dict(text_hf, **text_overrides)
        vision = VisionConfig.from_hf_dict(vision_hf, deepstack=False)
        return cls(
            text=text,
            vision=vision,
            **token_ids,
        )

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """The config.json dict transformers' `Qwen3_5ForConditionalGeneration` loads."""
        text = self.text.to_hf_dict(torch_dtype)
        vision = self.vision.to_hf_dict("qwen3_5_vision", deepstack=False)
        return vision_language_hf_dict(self, "Qwen3_5ForConditionalGeneration", "qwen3_5", text, vision, torch_dtype)


def tiny_qwen3_5_text_config(**overrides: Any) -> Qwen3_5TextConfig:
    """A small random-init Qwen3.5 text config for tests: hidden 128, 4 layers (linear, linear,
    linear, full), 4 query / 2 KV heads of head_dim 32 (rotary on 8 channels), linear attention
    with 2 key / 4 value heads of dim 32, vocab 512."""
    base = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        mrope_section=(2, 1, 1),
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    base.update(overrides)
    return Qwen3_5TextConfig(**base)


def tiny_qwen3_5_config(**text_overrides: Any) -> Qwen3_5Config:
    """A small random-init Qwen3.5 vision-language config: `tiny_qwen3_5_text_config` with the
    shipped tiny tokenizer's vocabulary and special ids, and a 2-block, width-64 vision tower with
    Qwen3-VL's patch geometry (as `tiny_qwen3_vl_config`'s, without DeepStack)."""

    ids = shipped_special_token_ids()
    text = dict(
        vocab_size=VOCAB_SIZE, bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    text.update(text_overrides)
    return Qwen3_5Config(
        text=tiny_qwen3_5_text_config(**text),
        vision=VisionConfig(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=128,
            num_position_embeddings=256,
            deepstack_visual_indexes=(),
        ),
        **shipped_image_token_ids(),
    )
