"""Qwen3's checkpoint table (shared with Qwen3-VL's language model), loading and exporting."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from cua_jax.models.checkpoint import (
    KeyMapping,
    KeyRule,
    expand_key_table,
    export_hf_checkpoint,
    load_hf_checkpoint,
    read_hf_config,
)
from cua_jax.models.qwen3.config import Qwen3Config
from cua_jax.models.qwen3.modeling import Qwen3ForCausalLM
from cua_jax.models.sharding import DEFAULT_RULES


def qwen3_key_rules(
    hf_prefix: str = "model.", our_prefix: str = "model.", *, tie_word_embeddings: bool, attention_bias: bool = False
) -> list[KeyRule]:
    """The Qwen3 decoder's table. The prefixes let Qwen3-VL reuse it for its language
    model (HF "model.language_model."); the LM head is added when embeddings are untied."""
    h, o = hf_prefix, our_prefix
    layer_h, layer_o = f"{h}layers.{{layer}}.", f"{o}layers.{{layer}}."
    rules = [
        KeyRule(f"{h}embed_tokens.weight", f"{o}embed_tokens.embedding"),
        KeyRule(f"{h}norm.weight", f"{o}norm.weight"),
    ]
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        rules.append(KeyRule(f"{layer_h}self_attn.{proj}.weight", f"{layer_o}self_attn.{proj}.kernel", transpose=True))
        if attention_bias:
            rules.append(KeyRule(f"{layer_h}self_attn.{proj}.bias", f"{layer_o}self_attn.{proj}.bias"))
    for norm in ("self_attn.q_norm", "self_attn.k_norm", "input_layernorm", "post_attention_layernorm"):
        rules.append(KeyRule(f"{layer_h}{norm}.weight", f"{layer_o}{norm}.weight"))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        rules.append(KeyRule(f"{layer_h}mlp.{proj}.weight", f"{layer_o}mlp.{proj}.kernel", transpose=True))
    if not tie_word_embeddings:
        rules.append(KeyRule("lm_head.weight", "lm_head.kernel", transpose=True))
    return rules


def qwen3_key_table(config) -> list[KeyMapping]:
    """The expanded table for a `Qwen3ForCausalLM` of `config` (a Qwen3Config)."""
    rules = qwen3_key_rules(tie_word_embeddings=config.tie_word_embeddings, attention_bias=config.attention_bias)
    return expand_key_table(rules, {"layer": config.num_hidden_layers})


def load_qwen3(
    directory: str | os.PathLike,
    *,
    mesh: Mesh | None = None,
    rules: Mapping[str, Any] = DEFAULT_RULES,
    **config_overrides,
):
    """(model, config) for the Qwen3ForCausalLM checkpoint in `directory`.
    config_overrides set non-HF fields such as dtype / param_dtype."""

    config = Qwen3Config.from_hf_dict(read_hf_config(directory), **config_overrides)
    model = load_hf_checkpoint(
        directory,
        lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)),
        qwen3_key_table(config),
        mesh=mesh,
        rules=rules,
        ignore_hf_keys=lambda k: (
            k.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and k == "lm_head.weight")
        ),
    )
    return model, config


def export_qwen3(model, directory: str | os.PathLike, **kwargs) -> pathlib.Path:
    """Writes a Qwen3ForCausalLM as a HF directory; kwargs as `export_hf_checkpoint`."""
    config = model.config
    torch_dtype = kwargs.get("dtype") or np.dtype(config.param_dtype).name
    hf_config = config.to_hf_dict(torch_dtype="bfloat16" if torch_dtype in ("bf16", "bfloat16") else str(torch_dtype))
    return export_hf_checkpoint(model, directory, qwen3_key_table(config), hf_config, **kwargs)
