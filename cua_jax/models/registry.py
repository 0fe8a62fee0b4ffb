"""The model kinds: one `MODEL_KINDS` entry per kind of policy checkpoint, and one `TINY_MODELS`
entry per small random-init policy.

A `ModelKind` gives what code choosing between models needs: the transformers architecture a
config.json names, our config and model classes, where config.json keeps the vocabulary size,
the checkpoint loader and exporter, and the key table between our parameters and the
checkpoint's tensors. Looking up an unknown kind raises
`cua_jax.registry.UnknownNameError`, naming the registered kinds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from flax import nnx

from cua_jax.context.tokenizer import VOCAB_SIZE
from cua_jax.models.qwen3 import (
    Qwen3Config,
    Qwen3ForCausalLM,
    export_qwen3,
    load_qwen3,
    qwen3_key_table,
    tiny_qwen3_config,
)
from cua_jax.models.qwen3_5 import (
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
    export_qwen3_5,
    load_qwen3_5,
    qwen3_5_key_table,
    tiny_qwen3_5_config,
)
from cua_jax.models.qwen3_vl import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    export_qwen3_vl,
    load_qwen3_vl,
    qwen3_vl_key_table,
    tiny_qwen3_vl_config,
)
from cua_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class ModelKind:
    """One kind of policy checkpoint.

    name: the kind, which is also its config.json's `model_type`.
    architecture: the transformers class config.json's `architectures` names.
    config_class / model_class: our config and model classes.
    vocab_field: the path of the vocabulary size in config.json (a vision-language model's is
      its text config's).
    load: (directory, **overrides) -> (model, config); overrides as `hf_policy.load_policy`'s.
    export: (model, directory, **kwargs) writes the model as a Hugging Face directory.
    key_table: config -> the HF name <-> parameter path mappings (`checkpoint.KeyMapping`) of
      the model `config` builds (what weight sync to a serving engine maps through).
    """

    name: str
    architecture: str
    config_class: type
    model_class: type
    vocab_field: tuple[str, ...]
    load: Callable[..., tuple[Any, Any]]
    export: Callable[..., Any]
    key_table: Callable[[Any], list]

    @property
    def text_only(self) -> bool:
        """The config holds vocab_size itself (no text_config, no vision tower)."""
        return self.vocab_field == ("vocab_size",)


MODEL_KINDS: Registry[ModelKind] = Registry("model kind")


def _register(kind: ModelKind) -> None:
    MODEL_KINDS.register(kind.name)(kind)


def _load_qwen3_5_text(directory, *, freeze_vision: bool = False, **overrides):
    # A text model has no vision tower to freeze.
    return load_qwen3_5(directory, **overrides)


_register(
    ModelKind(
        "qwen3",
        "Qwen3ForCausalLM",
        Qwen3Config,
        Qwen3ForCausalLM,
        ("vocab_size",),
        load_qwen3,
        export_qwen3,
        qwen3_key_table,
    )
)
_register(
    ModelKind(
        "qwen3_vl",
        "Qwen3VLForConditionalGeneration",
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        ("text_config", "vocab_size"),
        load_qwen3_vl,
        export_qwen3_vl,
        qwen3_vl_key_table,
    )
)
_register(
    ModelKind(
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        ("text_config", "vocab_size"),
        load_qwen3_5,
        export_qwen3_5,
        qwen3_5_key_table,
    )
)
_register(
    ModelKind(
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        Qwen3_5TextConfig,
        Qwen3_5ForCausalLM,
        ("vocab_size",),
        _load_qwen3_5_text,
        export_qwen3_5,
        qwen3_5_key_table,
    )
)


def model_kind_of_architectures(architectures) -> ModelKind | None:
    """The kind whose architecture a config.json's `architectures` list names, or None."""
    return next((kind for kind in MODEL_KINDS.values() if kind.architecture in (architectures or ())), None)


def model_kind_of(model) -> ModelKind:
    """The kind of one of our models; TypeError naming the model classes for anything else."""
    return _kind_whose_class_holds(model, "model")


def model_kind_of_config(config) -> ModelKind:
    """The kind whose models `config` builds; TypeError naming the config classes for anything else."""
    return _kind_whose_class_holds(config, "config")


def _kind_whose_class_holds(value, role: str) -> ModelKind:
    """The kind whose `<role>_class` `value` is an instance of; TypeError naming those classes otherwise."""
    for kind in MODEL_KINDS.values():
        if isinstance(value, getattr(kind, f"{role}_class")):
            return kind
    classes = ", ".join(getattr(kind, f"{role}_class").__name__ for kind in MODEL_KINDS.values())
    raise TypeError(f"{type(value).__name__} is not one of the {role} classes ({classes})")


# Small random-init policies: (num_layers (0: the config's own), seed, **precision) -> model.
TINY_MODELS: Registry[Callable[..., Any]] = Registry("tiny model")


@TINY_MODELS.register("tiny_qwen3_vl")
def tiny_qwen3_vl(num_layers: int, seed: int, **precision):
    overrides = {"num_hidden_layers": num_layers} if num_layers else {}
    return Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(**overrides, **precision), rngs=nnx.Rngs(seed))


@TINY_MODELS.register("tiny_qwen3")
def tiny_qwen3(num_layers: int, seed: int, **precision):
    overrides = {"num_hidden_layers": num_layers} if num_layers else {}
    return Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=VOCAB_SIZE, **overrides, **precision), rngs=nnx.Rngs(seed))


@TINY_MODELS.register("tiny_qwen3_5")
def tiny_qwen3_5(num_layers: int, seed: int, **precision):
    # num_layers keeps Qwen3.5's pattern: every 4th layer full attention.
    overrides = {"num_hidden_layers": num_layers, "layer_types": ()} if num_layers else {}
    return Qwen3_5ForConditionalGeneration(tiny_qwen3_5_config(**overrides, **precision), rngs=nnx.Rngs(seed))
