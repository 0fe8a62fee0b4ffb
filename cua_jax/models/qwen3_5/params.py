"""Qwen3.5 checkpoint I/O: HF keys <-> our parameter paths, loading and exporting.

Checkpoints: one key table per model (`qwen3_5_key_table`) loads and exports both classes;
the multi-token-prediction weights (`mtp.*`) released checkpoints carry are kept verbatim
(shape and dtype) as non-trainable `CheckpointTensor` variables and written back on export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from cua_jax.models import checkpoint
from cua_jax.models.qwen3_5.config import CheckpointTensorSpec, Qwen3_5Config, Qwen3_5TextConfig
from cua_jax.models.qwen3_5.modeling import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
from cua_jax.models.qwen3_vl import vision_key_rules
from cua_jax.models.sharding import DEFAULT_RULES
from cua_jax.models.vision import VISION_RULES

QWEN3_5_RULES: Mapping[str, Any] = {**DEFAULT_RULES, **VISION_RULES}


def text_key_rules(cfg: Qwen3_5TextConfig, hf_prefix: str, our_prefix: str) -> list[checkpoint.KeyRule]:
    """The text decoder's table (layer indices filled in: the layer kinds differ)."""
    R = checkpoint.KeyRule
    h, o = hf_prefix, our_prefix
    rules = [R(f"{h}embed_tokens.weight", f"{o}embed_tokens.embedding"), R(f"{h}norm.weight", f"{o}norm.weight")]
    for i, kind in enumerate(cfg.layer_types):
        lh, lo = f"{h}layers.{i}.", f"{o}layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            rules.append(R(f"{lh}{norm}.weight", f"{lo}{norm}.weight"))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            rules.append(R(f"{lh}mlp.{proj}.weight", f"{lo}mlp.{proj}.kernel", transpose=True))
        if kind == "linear_attention":
            for proj in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                rules.append(R(f"{lh}linear_attn.{proj}.weight", f"{lo}linear_attn.{proj}.kernel", transpose=True))
            rules += [
                R(f"{lh}linear_attn.conv1d.weight", f"{lo}linear_attn.conv1d"),
                R(f"{lh}linear_attn.dt_bias", f"{lo}linear_attn.dt_bias"),
                R(f"{lh}linear_attn.A_log", f"{lo}linear_attn.A_log"),
                R(f"{lh}linear_attn.norm.weight", f"{lo}linear_attn.norm.weight"),
            ]
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                rules.append(R(f"{lh}self_attn.{proj}.weight", f"{lo}self_attn.{proj}.kernel", transpose=True))
                if cfg.attention_bias:
                    rules.append(R(f"{lh}self_attn.{proj}.bias", f"{lo}self_attn.{proj}.bias"))
            for norm in ("q_norm", "k_norm"):
                rules.append(R(f"{lh}self_attn.{norm}.weight", f"{lo}self_attn.{norm}.weight"))
    return rules


def _head_and_mtp_rules(cfg: Qwen3_5TextConfig, our_prefix: str) -> list[checkpoint.KeyRule]:
    R = checkpoint.KeyRule
    rules = [] if cfg.tie_word_embeddings else [R("lm_head.weight", f"{our_prefix}lm_head.kernel", transpose=True)]
    rules += [R(spec.key, f"{our_prefix}mtp.tensors.{i}") for i, spec in enumerate(cfg.mtp_tensors)]
    return rules


def qwen3_5_key_table(config: Qwen3_5TextConfig | Qwen3_5Config) -> list[checkpoint.KeyMapping]:
    """HF keys <-> our parameter paths for `Qwen3_5ForCausalLM` (a text config) or
    `Qwen3_5ForConditionalGeneration` (a Qwen3_5Config), including the kept `mtp.*` tensors."""
    if isinstance(config, Qwen3_5TextConfig):
        rules = text_key_rules(config, "model.", "model.") + _head_and_mtp_rules(config, "")
        return checkpoint.expand_key_table(rules, {})

    text = config.text
    rules = text_key_rules(text, "model.language_model.", "language_model.model.")
    rules += _head_and_mtp_rules(text, "language_model.") + vision_key_rules()
    return checkpoint.expand_key_table(rules, {"block": config.vision.depth, "merger": 0})


def checkpoint_mtp_tensors(directory) -> tuple[CheckpointTensorSpec, ...]:
    """The `mtp.*` tensors of the checkpoint in `directory`, sorted by key."""
    files = checkpoint.open_checkpoint(directory)
    dtype_names = {dtype: name for name, dtype in checkpoint.SAFETENSORS_DTYPES.items()}
    return tuple(
        CheckpointTensorSpec(key, files[key].shape(key), dtype_names[files[key].array(key).dtype])
        for key in sorted(k for k in files if k.startswith("mtp."))
    )


def is_vision_language(hf_config: Mapping[str, Any]) -> bool:
    return "vision_config" in hf_config or "Qwen3_5ForConditionalGeneration" in (hf_config.get("architectures") or ())


def load_qwen3_5(
    directory, *, mesh=None, rules: Mapping[str, Any] = QWEN3_5_RULES, freeze_vision: bool = False, **text_overrides
):
    """(model, config) for the Qwen3.5 checkpoint in `directory`: a `Qwen3_5ForConditionalGeneration`
    for a vision-language config.json, else a `Qwen3_5ForCausalLM`; the checkpoint's `mtp.*`
    tensors are kept in the model. text_overrides set non-HF fields (dtype, param_dtype, chunk_size, ...)."""
    hf = checkpoint.read_hf_config(directory)
    mtp = checkpoint_mtp_tensors(directory)
    if is_vision_language(hf):
        config = Qwen3_5Config.from_hf_dict(hf, mtp_tensors=mtp, **text_overrides)
        model_fn = lambda: Qwen3_5ForConditionalGeneration(config, rngs=nnx.Rngs(0), freeze_vision=freeze_vision)
        tied = config.text.tie_word_embeddings
    else:
        config = Qwen3_5TextConfig.from_hf_dict(hf, mtp_tensors=mtp, **text_overrides)
        model_fn = lambda: Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0))
        tied = config.tie_word_embeddings
    model = checkpoint.load_hf_checkpoint(
        directory,
        model_fn,
        qwen3_5_key_table(config),
        mesh=mesh,
        rules=rules,
        ignore_hf_keys=lambda k: k.endswith("inv_freq") or (tied and k == "lm_head.weight"),
    )
    return model, config


def export_qwen3_5(model, directory, **kwargs):
    """Writes a Qwen3.5 (either class) as a HF directory, `mtp.*` tensors included; kwargs as
    `checkpoint.export_hf_checkpoint` (a `dtype` there applies to the mtp tensors too)."""
    config = model.config
    text = config if isinstance(config, Qwen3_5TextConfig) else config.text
    torch_dtype = kwargs.get("dtype") or np.dtype(text.param_dtype).name
    hf_config = config.to_hf_dict(torch_dtype="bfloat16" if torch_dtype in ("bf16", "bfloat16") else str(torch_dtype))
    return checkpoint.export_hf_checkpoint(model, directory, qwen3_5_key_table(config), hf_config, **kwargs)
