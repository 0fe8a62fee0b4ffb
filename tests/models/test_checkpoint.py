"""HF safetensors in and out: transformers' checkpoints load, our exports load in
transformers with identical logits, sharded indexes and bfloat16 both ways, clear errors."""

import json

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from cua_jax.models.checkpoint import KeyRule, SafetensorsFile, expand_key_table, load_hf_checkpoint
from cua_jax.models.qwen3 import Qwen3ForCausalLM, export_qwen3, load_qwen3, qwen3_key_table


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()


def flat_params(model):
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model))}


@pytest.fixture(scope="module")
def exported(our_qwen3, tmp_path_factory):
    model, _ = our_qwen3
    return export_qwen3(model, tmp_path_factory.mktemp("export"))


def test_round_trip_hf_ours_hf_gives_identical_logits(hf_qwen3_dir, exported, token_batch):
    _, hf = hf_qwen3_dir
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(exported).eval()
    np.testing.assert_array_equal(torch_logits(reloaded, token_batch), torch_logits(hf, token_batch))
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]


def test_export_carries_tokenizer_and_processor_files(exported):
    from cua_jax.context.tokenizer import load_processor

    tokenizer, image_processor = load_processor(exported)
    assert tokenizer("click the button")["input_ids"]
    assert (exported / "preprocessor_config.json").is_file()


def test_sharded_index_both_ways(hf_qwen3_dir, our_qwen3, tmp_path, token_batch):
    hf_dir, hf = hf_qwen3_dir
    model, _ = our_qwen3
    # transformers writes an index-sharded checkpoint; ours loads it
    hf.save_pretrained(tmp_path / "hf", max_shard_size="300KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    from_index, _ = load_qwen3(tmp_path / "hf")
    expected = flat_params(model)
    for path, value in flat_params(from_index).items():
        np.testing.assert_array_equal(value, expected[path])
    # ours writes an index-sharded checkpoint; transformers loads it
    export_qwen3(model, tmp_path / "ours", max_shard_bytes=300_000, tokenizer_files=False)
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_array_equal(torch_logits(reloaded, token_batch), torch_logits(hf, token_batch))


def test_bfloat16_export_and_load(our_qwen3, tmp_path):
    model, _ = our_qwen3
    export_qwen3(model, tmp_path, dtype="bfloat16", tokenizer_files=False)
    f = SafetensorsFile(tmp_path / "model.safetensors")
    assert f.array("model.norm.weight").dtype == ml_dtypes.bfloat16
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path)
    assert hf.model.norm.weight.dtype == torch.bfloat16
    reloaded, _ = load_qwen3(tmp_path)  # float32 parameters from bfloat16 tensors
    ours = flat_params(model)
    for path, value in flat_params(reloaded).items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, ours[path].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_key_table_covers_every_parameter_once(our_qwen3):
    model, config = our_qwen3
    table = qwen3_key_table(config)
    paths = {m.path for m in table}
    assert paths == set(flat_params(model))
    assert len(paths) == len(table)


def test_errors_name_the_problem(hf_qwen3_dir, our_qwen3, tmp_path):
    hf_dir, hf = hf_qwen3_dir
    _, config = our_qwen3
    table = qwen3_key_table(config)
    make = lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    with pytest.raises(KeyError, match="lacks tensors"):
        load_hf_checkpoint(
            hf_dir, make, [m if m.hf != "model.norm.weight" else type(m)("nope", m.path, False) for m in table]
        )
    with pytest.raises(KeyError, match="missing from the key table: \\['model.norm.weight'\\]"):
        load_hf_checkpoint(hf_dir, make, [m for m in table if m.hf != "model.norm.weight"])
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in hf.state_dict().items()}
    save_file(
        {**tensors, "model.extra.weight": torch.zeros(3)},
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with pytest.raises(KeyError, match="does not map: \\['model.extra.weight'\\]"):
        load_hf_checkpoint(tmp_path, make, table)
    wrong = [type(m)(m.hf, m.path, not m.transpose) if "q_proj" in m.hf else m for m in table]
    with pytest.raises(ValueError, match="q_proj.weight: checkpoint shape"):
        load_hf_checkpoint(hf_dir, make, wrong)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(tmp_path / "empty", make, table)
    with pytest.raises(ValueError, match="several placeholders"):
        expand_key_table([KeyRule("a.{layer}.{block}", "b")], {"layer": 1, "block": 1})
