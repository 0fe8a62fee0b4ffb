"""The model registry: one entry per kind, found by name, model or config, with errors naming the kinds."""

import pytest

from cua_jax.models.hf_policy import SUPPORTED_ARCHITECTURES
from cua_jax.models.qwen3 import tiny_qwen3_config
from cua_jax.models.qwen3_5 import tiny_qwen3_5_config, tiny_qwen3_5_text_config
from cua_jax.models.qwen3_vl import tiny_qwen3_vl_config
from cua_jax.models.registry import MODEL_KINDS, TINY_MODELS, model_kind_of, model_kind_of_config
from cua_jax.registry import UnknownNameError


def test_an_unknown_kind_names_the_registered_kinds():
    with pytest.raises(UnknownNameError, match=r"unknown model kind 'qwen4'; known: \['qwen3', 'qwen3_5'"):
        MODEL_KINDS["qwen4"]
    with pytest.raises(UnknownNameError, match="unknown tiny model 'tiny_qwen4'; known: .*'tiny_qwen3_vl'"):
        TINY_MODELS["tiny_qwen4"]


@pytest.mark.parametrize(
    "config, kind",
    [
        (tiny_qwen3_config(), "qwen3"),
        (tiny_qwen3_vl_config(), "qwen3_vl"),
        (tiny_qwen3_5_config(), "qwen3_5"),
        (tiny_qwen3_5_text_config(), "qwen3_5_text"),
    ],
)
def test_each_config_class_has_one_kind(config, kind):
    assert model_kind_of_config(config).name == kind
    assert SUPPORTED_ARCHITECTURES[MODEL_KINDS[kind].architecture] == kind


def test_other_objects_have_no_kind():
    with pytest.raises(TypeError, match="dict is not one of the config classes .*Qwen3VLConfig"):
        model_kind_of_config({})
    with pytest.raises(TypeError, match="object is not one of the model classes .*Qwen3ForCausalLM"):
        model_kind_of(object())


def test_a_tiny_model_is_of_its_kind():
    model = TINY_MODELS["tiny_qwen3"](1, 0)
    assert model_kind_of(model).name == "qwen3" and len(model.model.layers) == 1
