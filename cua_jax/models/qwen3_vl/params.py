"""Qwen3-VL checkpoint I/O: HF `Qwen3VLForConditionalGeneration` keys <-> our parameter paths
(the vision tower's table shared with Qwen3.5), loading and exporting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from cua_jax.models import checkpoint
from cua_jax.models.qwen3 import qwen3_key_rules
from cua_jax.models.qwen3_vl.config import Qwen3VLConfig
from cua_jax.models.qwen3_vl.modeling import Qwen3VLForConditionalGeneration
from cua_jax.models.sharding import DEFAULT_RULES
from cua_jax.models.vision import VISION_RULES

# Sharding rules covering the text decoder's and the vision tower's logical axes.
QWEN3_VL_RULES: Mapping[str, Any] = {**DEFAULT_RULES, **VISION_RULES}


def vision_key_rules(hf_prefix: str = "model.visual.", our_prefix: str = "visual.") -> list[checkpoint.KeyRule]:
    """The vision tower's table (placeholders {block} and {merger})."""
    h, o = hf_prefix, our_prefix
    R = checkpoint.KeyRule

    def linear(hf: str, ours: str) -> list[checkpoint.KeyRule]:
        return [R(f"{hf}.weight", f"{ours}.kernel", transpose=True), R(f"{hf}.bias", f"{ours}.bias")]

    def norm(hf: str, ours: str) -> list[checkpoint.KeyRule]:
        return [R(f"{hf}.weight", f"{ours}.scale"), R(f"{hf}.bias", f"{ours}.bias")]

    # The patch kernel is stored as the axis reversal of torch's Conv3d weight: a transpose.
    rules = linear(f"{h}patch_embed.proj", f"{o}patch_embed") + [R(f"{h}pos_embed.weight", f"{o}pos_embed")]
    blk_h, blk_o = f"{h}blocks.{{block}}.", f"{o}blocks.{{block}}."
    rules += norm(f"{blk_h}norm1", f"{blk_o}norm1") + norm(f"{blk_h}norm2", f"{blk_o}norm2")
    rules += linear(f"{blk_h}attn.qkv", f"{blk_o}attn.qkv") + linear(f"{blk_h}attn.proj", f"{blk_o}attn.proj")
    rules += linear(f"{blk_h}mlp.linear_fc1", f"{blk_o}mlp.linear_fc1")
    rules += linear(f"{blk_h}mlp.linear_fc2", f"{blk_o}mlp.linear_fc2")
    for hf_merger, our_merger in (
        (f"{h}merger", f"{o}merger"),
        (f"{h}deepstack_merger_list.{{merger}}", f"{o}deepstack_merger_list.{{merger}}"),
    ):
        rules += norm(f"{hf_merger}.norm", f"{our_merger}.norm")
        rules += linear(f"{hf_merger}.linear_fc1", f"{our_merger}.linear_fc1")
        rules += linear(f"{hf_merger}.linear_fc2", f"{our_merger}.linear_fc2")
    return rules


def qwen3_vl_key_table(config: Qwen3VLConfig) -> list[checkpoint.KeyMapping]:
    """HF `Qwen3VLForConditionalGeneration` keys <-> our parameter paths, for load and export."""
    text = qwen3_key_rules(
        "model.language_model.",
        "language_model.model.",
        tie_word_embeddings=config.text.tie_word_embeddings,
        attention_bias=config.text.attention_bias,
    )
    # The LM head sits at the top level in HF and inside our language model.
    text = [
        checkpoint.KeyRule(r.hf, "language_model." + r.ours, r.transpose) if r.hf == "lm_head.weight" else r
        for r in text
    ]
    counts = {
        "layer": config.text.num_hidden_layers,
        "block": config.vision.depth,
        "merger": len(config.vision.deepstack_visual_indexes),
    }
    return checkpoint.expand_key_table(text + vision_key_rules(), counts)


def load_qwen3_vl(
    directory, *, mesh=None, rules: Mapping[str, Any] = QWEN3_VL_RULES, freeze_vision: bool = False, **text_overrides
) -> tuple[Qwen3VLForConditionalGeneration, Qwen3VLConfig]:
    """(model, config) for the Qwen3-VL checkpoint in `directory`, parameters placed on `mesh`.

    text_overrides set non-HF fields such as dtype / param_dtype.
    """
    config = Qwen3VLConfig.from_hf_dict(checkpoint.read_hf_config(directory), **text_overrides)
    tied = config.text.tie_word_embeddings
    model = checkpoint.load_hf_checkpoint(
        directory,
        lambda: Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0), freeze_vision=freeze_vision),
        qwen3_vl_key_table(config),
        mesh=mesh,
        rules=rules,
        ignore_hf_keys=lambda k: k.endswith("inv_freq") or (tied and k == "lm_head.weight"),
    )
    return model, config


def export_qwen3_vl(model: Qwen3VLForConditionalGeneration, directory, **kwargs):
    """Writes a Qwen3-VL as a HF directory (config, safetensors, tokenizer and processor files);
    kwargs as `checkpoint.export_hf_checkpoint`."""
    config = model.config
    torch_dtype = kwargs.get("dtype") or np.dtype(config.text.param_dtype).name
    hf_config = config.to_hf_dict(torch_dtype="bfloat16" if torch_dtype in ("bf16", "bfloat16") else str(torch_dtype))
    return checkpoint.export_hf_checkpoint(model, directory, qwen3_vl_key_table(config), hf_config, **kwargs)
