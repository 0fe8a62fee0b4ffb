"""Policy directories (cua_jax.models.hf_policy): transformers' sharded Qwen3 and Qwen3-VL
checkpoints load with transformers' logits; our exports load in transformers with our logits and
carry the policy's own tokenizer, chat template and image processor; bad directories are refused
before any weight is read, with the file and field at fault named."""

import json
import pathlib
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from cua_jax.context.tokenizer import (
    PROCESSOR_FILES,
    SHIPPED_TOKENIZER_DIR,
    TOKENIZER_FILES,
    build_image_processor,
    load_processor,
    load_tokenizer,
    pixel_bounds,
    save_tokenizer_and_processor,
)
from cua_jax.models.hf_policy import check_policy_directory, export_policy, load_policy
from cua_jax.models.qwen3 import Qwen3ForCausalLM
from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
from tests.support.qwen3_vl import hf_logits, our_logits, screenshot, vl_inputs

TOL = 1e-4
SUPPORTED = "Qwen3ForCausalLM, Qwen3VLForConditionalGeneration"
# The policy's own chat template: not the shipped one, so an export falling back to it shows.
POLICY_TEMPLATE = "{%- for m in messages -%}[{{ m.role }}] {{ m.content }}\n{%- endfor -%}"


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()


def spread_weights(model, seed):
    """transformers' init (std 0.02) gives near-constant logits; spread them out."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = name.endswith(("norm.weight", "norm1.weight", "norm2.weight"))
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if is_norm else 0.08 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def hf_qwen3_sharded(tmp_path_factory, make_hf_qwen3):
    """(directory, torch model): a Qwen3ForCausalLM (vocabulary 512) that transformers saved in shards."""
    model = make_hf_qwen3(seed=3)
    directory = tmp_path_factory.mktemp("hf_qwen3_sharded")
    model.save_pretrained(directory, max_shard_size="300KB")
    return directory, model


@pytest.fixture(scope="module")
def hf_vl_sharded(tmp_path_factory):
    """(directory, torch model): the tiny Qwen3-VL saved by transformers in shards, with the shipped
    tokenizer and processor beside it (as a Qwen3-VL checkpoint keeps its own)."""
    config = tiny_qwen3_vl_config()
    model = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**config.to_hf_dict())).eval()
    spread_weights(model, seed=5)
    directory = tmp_path_factory.mktemp("hf_qwen3_vl_sharded")
    model.save_pretrained(directory, max_shard_size="1MB")
    save_tokenizer_and_processor(directory)
    return directory, model


@pytest.fixture(scope="module")
def policy_tokenizer():
    """The policy's own tokenizer: the shipped one plus one added token (4097 ids), with its own chat template."""
    tokenizer = load_tokenizer()
    tokenizer.add_tokens(["<|policy_marker|>"])
    tokenizer.chat_template = POLICY_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def policy_processor():
    """The policy's own image processor: pixel bounds other than the default's."""
    processor = build_image_processor(min_pixels=8 * 32 * 32, max_pixels=64 * 32 * 32)
    assert pixel_bounds(processor) != pixel_bounds(build_image_processor())
    return processor


@pytest.fixture(scope="module")
def qwen3_policy(tmp_path_factory, make_hf_qwen3):
    """(our Qwen3ForCausalLM of vocabulary 4160, the torch model it was loaded from)."""
    hf = make_hf_qwen3(seed=4, vocab_size=4160)
    directory = tmp_path_factory.mktemp("hf_qwen3_4160")
    hf.save_pretrained(directory)
    model, kind = load_policy(directory)
    assert kind == "qwen3"
    return model, hf


def copy_of(directory, tmp_path):
    return pathlib.Path(shutil.copytree(directory, tmp_path / "copy"))


def edit_json(path, **fields):
    value = json.loads(path.read_text())
    value.update(fields)
    path.write_text(json.dumps(value))


def assert_same_processor_files(exported, tokenizer, image_processor):
    """`load_processor(exported)` gives `tokenizer`'s vocabulary and chat template and `image_processor`'s settings."""
    loaded_tokenizer, loaded_processor = load_processor(exported)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert pixel_bounds(loaded_processor) == pixel_bounds(image_processor)
    for name in ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std"):
        assert getattr(loaded_processor, name) == getattr(image_processor, name), name


# ---------------------------------------------------------------------------------------
# Loading what transformers wrote


def test_load_policy_of_a_sharded_transformers_qwen3_matches_its_logits(hf_qwen3_sharded, token_batch):
    directory, hf = hf_qwen3_sharded
    policy = check_policy_directory(directory)
    assert policy.kind == "qwen3" and policy.vocab_size == 512 and len(policy.safetensors) > 1
    assert not policy.has_tokenizer and not policy.has_processor
    model, kind = load_policy(directory)
    assert kind == "qwen3" and isinstance(model, Qwen3ForCausalLM)
    ref = torch_logits(hf, token_batch)
    assert ref.std() > 0.5  # the comparison is not between near-constants
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(token_batch))[0]), ref, atol=TOL, rtol=0)


def test_load_policy_of_a_sharded_transformers_qwen3_vl_matches_its_logits(hf_vl_sharded):
    directory, hf = hf_vl_sharded
    policy = check_policy_directory(directory)
    assert policy.kind == "qwen3_vl" and policy.architecture == "Qwen3VLForConditionalGeneration"
    assert len(policy.safetensors) > 1 and policy.tokenizer_size == policy.vocab_size == 4096 and policy.has_processor
    model, kind = load_policy(directory)
    assert kind == "qwen3_vl" and isinstance(model, Qwen3VLForConditionalGeneration)
    tokenizer, _ = load_processor(directory)
    inputs = vl_inputs(tokenizer, [["IMG", "Click OK."], ["Scroll down."]], [screenshot(210, 160, seed=1)])
    mask = inputs[1].astype(bool)
    ref = hf_logits(hf, model.config, *inputs)[mask]
    assert ref.std() > 0.5
    np.testing.assert_allclose(our_logits(model, model.config, *inputs)[mask], ref, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------
# Directories refused before loading


def test_a_missing_shard_names_the_index_and_the_shard(hf_qwen3_sharded, tmp_path):
    directory = copy_of(hf_qwen3_sharded[0], tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(
        ValueError,
        match=rf"model\.safetensors\.index\.json: field `weight_map` names shard files "
        rf"missing from .*\['{shard.name}'\]",
    ):
        check_policy_directory(directory)
    with pytest.raises(ValueError, match=shard.name):
        load_policy(directory)


def test_an_unknown_architecture_names_the_field_and_the_supported_ones(hf_qwen3_sharded, tmp_path):
    directory = copy_of(hf_qwen3_sharded[0], tmp_path)
    edit_json(directory / "config.json", architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(
        ValueError,
        match=rf"config\.json: field `architectures` is \['LlamaForCausalLM'\]; "
        rf"supported: {SUPPORTED}",
    ):
        load_policy(directory)
    edit_json(directory / "config.json", architectures=None, model_type="llama")
    with pytest.raises(ValueError, match=r"config\.json: no field `architectures`, and field `model_type` \('llama'\)"):
        check_policy_directory(directory)
    edit_json(directory / "config.json", architectures=["Qwen3ForCausalLM"], model_type="qwen3_vl")
    with pytest.raises(
        ValueError, match=r"field `model_type` is 'qwen3_vl', but field `architectures` names Qwen3ForCausalLM"
    ):
        check_policy_directory(directory)


def test_a_tokenizer_past_the_vocabulary_names_both_files_and_the_field(hf_qwen3_sharded, hf_vl_sharded, tmp_path):
    qwen3 = copy_of(hf_qwen3_sharded[0], tmp_path / "qwen3")
    save_tokenizer_and_processor(qwen3)  # the shipped tokenizer's 4096 ids into a 512-token model
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(str(qwen3))}/tokenizer\.json: the tokenizer produces ids up to 4095, past the "
        rf"model's vocabulary: field `vocab_size` of {re.escape(str(qwen3))}/config\.json is 512",
    ):
        load_policy(qwen3)
    vl = copy_of(hf_vl_sharded[0], tmp_path / "vl")
    config = json.loads((vl / "config.json").read_text())
    config["text_config"]["vocab_size"] = 4000
    (vl / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"tokenizer\.json: the tokenizer produces ids up to 4095, past the model's "
        r"vocabulary: field `text_config\.vocab_size` of .*config\.json is 4000",
    ):
        check_policy_directory(vl)


def test_a_directory_without_config_or_weights_is_refused(hf_qwen3_sharded, tmp_path):
    directory = copy_of(hf_qwen3_sharded[0], tmp_path)
    (directory / "config.json").unlink()
    with pytest.raises(ValueError, match=rf"{re.escape(str(directory))}/config\.json is missing"):
        load_policy(directory)
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is unreadable"):
        check_policy_directory(directory)
    shutil.copyfile(hf_qwen3_sharded[0] / "config.json", directory / "config.json")
    edit_json(directory / "config.json", vocab_size=None)
    with pytest.raises(ValueError, match=r"config\.json: field `vocab_size` must be a positive integer, got None"):
        check_policy_directory(directory)
    shutil.copyfile(hf_qwen3_sharded[0] / "config.json", directory / "config.json")
    for path in directory.glob("model*.safetensors*"):
        path.unlink()
    with pytest.raises(ValueError, match="holds no safetensors weights"):
        check_policy_directory(directory)
    with pytest.raises(ValueError, match="is not a directory"):
        check_policy_directory(directory / "config.json")


# ---------------------------------------------------------------------------------------
# Export


def test_qwen3_export_loads_in_transformers_with_the_policy_tokenizer_and_processor(
    qwen3_policy, policy_tokenizer, policy_processor, token_batch, tmp_path
):
    model, hf = qwen3_policy
    policy = export_policy(model, tmp_path, tokenizer=policy_tokenizer, image_processor=policy_processor)
    assert policy.kind == "qwen3" and policy.tokenizer_size == 4097 and policy.vocab_size == 4160
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, transformers.Qwen3ForCausalLM)
    ours = np.asarray(model(jnp.asarray(token_batch))[0])
    np.testing.assert_allclose(torch_logits(reloaded, token_batch), ours, atol=TOL, rtol=0)
    np.testing.assert_array_equal(torch_logits(reloaded, token_batch), torch_logits(hf, token_batch))
    assert_same_processor_files(tmp_path, policy_tokenizer, policy_processor)


def test_export_from_a_tokenizer_directory_copies_its_files(qwen3_policy, policy_tokenizer, policy_processor, tmp_path):
    model, _ = qwen3_policy
    source = tmp_path / "source"
    policy_tokenizer.save_pretrained(source)
    policy_processor.save_pretrained(source)
    export_policy(model, tmp_path / "out", tokenizer=source)
    copied = sorted(path.name for path in source.iterdir())
    assert set(copied) <= set(TOKENIZER_FILES + PROCESSOR_FILES)
    for name in copied:
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes(), name
    assert_same_processor_files(tmp_path / "out", policy_tokenizer, policy_processor)
    # A new chat template replaces the directory's; vocabulary and processor stay.
    export_policy(model, tmp_path / "templated", tokenizer=source, chat_template="{{ messages[0].content }}")
    tokenizer, processor = load_processor(tmp_path / "templated")
    assert tokenizer.chat_template == "{{ messages[0].content }}"
    assert tokenizer.get_vocab() == policy_tokenizer.get_vocab()
    assert pixel_bounds(processor) == pixel_bounds(policy_processor)


def test_exporting_again_into_a_directory_leaves_none_of_the_old_files(
    qwen3_policy, policy_tokenizer, policy_processor, tmp_path
):
    model, _ = qwen3_policy
    export_policy(model, tmp_path / "out", tokenizer=policy_tokenizer, image_processor=policy_processor)
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == POLICY_TEMPLATE
    # A tokenizer directory keeping its template in tokenizer_config.json, which a stale
    # chat_template.jinja would outrank, and no processor files (the default processor applies).
    source = tmp_path / "source"
    source.mkdir()
    shutil.copyfile(SHIPPED_TOKENIZER_DIR / "tokenizer.json", source / "tokenizer.json")
    config = json.loads((SHIPPED_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[-1].content }}"
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    export_policy(model, tmp_path / "out", tokenizer=source)
    assert not (tmp_path / "out" / "chat_template.jinja").exists()
    assert_same_processor_files(tmp_path / "out", load_tokenizer(source), build_image_processor())


def test_qwen3_vl_export_loads_in_transformers_with_our_logits(hf_vl_sharded, tmp_path):
    directory, hf = hf_vl_sharded
    model, _ = load_policy(directory)
    policy = export_policy(model, tmp_path, tokenizer=directory, dtype="float32")
    assert policy.kind == "qwen3_vl" and policy.has_processor
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    tokenizer, image_processor = load_processor(tmp_path)
    inputs = vl_inputs(tokenizer, [["Before:", "IMG", "what now?"]], [screenshot(100, 130, seed=2)])
    np.testing.assert_allclose(
        hf_logits(reloaded, model.config, *inputs), our_logits(model, model.config, *inputs), atol=TOL, rtol=0
    )
    assert_same_processor_files(tmp_path, *load_processor(directory))


def test_export_refuses_a_tokenizer_past_the_vocabulary_before_writing(hf_qwen3_sharded, tmp_path):
    model, _ = load_policy(hf_qwen3_sharded[0])  # vocabulary 512
    with pytest.raises(
        ValueError,
        match=rf"the tokenizer in {re.escape(str(SHIPPED_TOKENIZER_DIR))} produces ids up to 4095, past the "
        r"model's vocabulary \(its config's vocab_size is 512\)",
    ):
        export_policy(model, tmp_path / "out", tokenizer=SHIPPED_TOKENIZER_DIR)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        export_policy(model, tmp_path / "out", tokenizer=None)
    with pytest.raises(ValueError, match=rf"no tokenizer files .* in {re.escape(str(tmp_path))}$"):
        export_policy(model, tmp_path / "out", tokenizer=tmp_path)
    with pytest.raises(TypeError, match="cannot export a Qwen3Model"):
        export_policy(model.model, tmp_path / "out", tokenizer=SHIPPED_TOKENIZER_DIR)
