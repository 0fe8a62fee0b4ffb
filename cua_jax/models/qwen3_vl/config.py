"""Qwen3-VL's configuration: `Qwen3VLConfig` (HF `Qwen3VLConfig`: text config, vision config,
M-RoPE sections, special token ids), read from and written to config.json dicts, and the small
random-init config tests and default runs use."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cua_jax.context.tokenizer import VOCAB_SIZE, shipped_image_token_ids, shipped_special_token_ids
from cua_jax.models.configs import RopeConfig
from cua_jax.models.qwen3 import Qwen3Config, tiny_qwen3_config
from cua_jax.models.vision import VisionConfig, vision_language_hf_dict, vision_language_hf_parts


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
    """HF `Qwen3VLConfig`: a Qwen3 text config, a vision config, M-RoPE sections and the
    special token ids. `mrope_section` (t, h, w) counts rotary frequencies per axis and sums
    to text.head_dim // 2."""

    text: Qwen3Config
    vision: VisionConfig
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self):
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.text.head_dim // 2:
            raise ValueError(
                f"mrope_section {self.mrope_section} must have 3 entries summing to head_dim // 2 = "
                f"{self.text.head_dim // 2}"
            )
        self.vision.check_image_token_width(self.text.hidden_size)
        if self.text.rope.rope_type == "dynamic":
            raise ValueError("dynamic-NTK rope is not supported with multimodal RoPE")
        if len(self.vision.deepstack_visual_indexes) > self.text.num_hidden_layers:
            raise ValueError(
                f"{len(self.vision.deepstack_visual_indexes)} DeepStack features but only "
                f"{self.text.num_hidden_layers} decoder layers to inject them into"
            )

    @property
    def tie_word_embeddings(self) -> bool:
        return self.text.tie_word_embeddings

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **text_overrides: Any) -> Qwen3VLConfig:
        """From a Qwen3-VL config.json dict; `text_overrides` set dtype, param_dtype, ...."""
        text_hf, vision_hf, token_ids = vision_language_hf_parts(hf, cls, "Qwen3-VL")
        rope_params = dict(text_hf.get("rope_parameters") or text_hf.get("rope_scaling") or {})
        mrope = rope_params.get("mrope_section", [24, 20, 20])
        if rope_params.get("mrope_interleaved") is False:
            raise ValueError("only interleaved M-RoPE (Qwen3-VL) is supported, config has mrope_interleaved=false")
        text = Qwen3Config.from_hf_dict(text_hf, **text_overrides)
        vision = VisionConfig.from_hf_dict(vision_hf, deepstack=True)
        return cls(
            text=text,
            vision=vision,
            mrope_section=tuple(int(x) for x in mrope),
            **token_ids,
        )

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """The config.json dict transformers' `Qwen3VLForConditionalGeneration` loads."""
        text = self.text.to_hf_dict(torch_dtype)
        del text["use_sliding_window"]  # not a Qwen3-VL text field
        text["model_type"] = "qwen3_vl_text"
        text["rope_parameters"] = {
            **self.text.rope.to_hf_dict(),
            "mrope_section": list(self.mrope_section),
            "mrope_interleaved": True,
        }
        vision = self.vision.to_hf_dict("qwen3_vl_vision", deepstack=True)
        return vision_language_hf_dict(self, "Qwen3VLForConditionalGeneration", "qwen3_vl", text, vision, torch_dtype)


def tiny_qwen3_vl_config(**text_overrides: Any) -> Qwen3VLConfig:
    """A small random-init Qwen3-VL for tests and the embedded default run (item 6).

    Text: `tiny_qwen3_config` (hidden 128, 4 heads / 2 KV heads of head_dim 64) with 3 layers
    and the shipped tiny tokenizer's 4096-token vocabulary and special ids. Vision: Qwen3-VL's
    patch geometry (16 px patches, 2 frames, 2x2 merge), width 64, 2 heads, 3 blocks, DeepStack
    from blocks 0 and 1 into decoder layers 0 and 1, a 16x16 learned positional grid (a 160x210
    MiniWoB screenshot is a 14x10 patch grid, 35 image tokens).
    """

    ids = shipped_special_token_ids()
    text = dict(
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=3,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope=RopeConfig(rope_theta=10000.0),
    )
    text.update(text_overrides)
    return Qwen3VLConfig(
        text=tiny_qwen3_config(**text),
        vision=VisionConfig(
            depth=3,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=128,
            num_position_embeddings=256,
            deepstack_visual_indexes=(0, 1),
        ),
        mrope_section=(12, 10, 10),
        **shipped_image_token_ids(),
    )
