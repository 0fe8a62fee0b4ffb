"""Qwen3.5 text model against transformers' PyTorch Qwen3_5ForCausalLM (float32, CPU).

A tiny random hybrid model (three Gated DeltaNet layers, one gated full-attention layer) is
written by transformers' save_pretrained, with `mtp.*` tensors added to its safetensors file as
released checkpoints carry them, and loaded by cua_jax.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file, save_file

from cua_jax.models.checkpoint import open_checkpoint
from cua_jax.models.hf_policy import check_policy_directory, load_policy
from cua_jax.models.qwen3_5 import (
    CheckpointTensor,
    Qwen3_5ForCausalLM,
    export_qwen3_5,
    load_qwen3_5,
    qwen3_5_key_table,
    tiny_qwen3_5_text_config,
)
from cua_jax.models.sampler import Sampler, SamplingParams

TOL = 1e-4
CHUNK = 8  # small chunks so short test sequences span several


def spread_weights(model, seed):
    """Redraws transformers' init with more spread, so logits vary enough for parity to mean something."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight") or name.endswith(("norm1.weight", "norm2.weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("norm.weight"):  # zero-centred norms: 1 + w
                p.copy_(0.2 * torch.randn_like(p))
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def add_mtp_tensors(directory, hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Appends bfloat16 `mtp.*` tensors shaped as a released checkpoint's (fc, pre-fc norms, one
    decoder layer, final norm) to the directory's model.safetensors; returns them."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * hidden, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, 2 * hidden),
        "mtp.norm.weight": (hidden,),
    }
    mtp = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    path = directory / "model.safetensors"
    tensors = load_file(path)
    save_file({**tensors, **mtp}, path, metadata={"format": "pt"})
    return mtp


@pytest.fixture(scope="module")
def config():
    return tiny_qwen3_5_text_config(chunk_size=CHUNK)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, config):
    """(directory, torch model) of the tiny Qwen3.5, mtp tensors added, and a json field kept verbatim."""
    import transformers

    hf_config = transformers.Qwen3_5TextConfig(**config.to_hf_dict(), mtp_num_hidden_layers=1)
    model = spread_weights(transformers.Qwen3_5ForCausalLM(hf_config).eval(), seed=0)
    directory = tmp_path_factory.mktemp("hf_qwen3_5")
    model.save_pretrained(directory)
    add_mtp_tensors(directory, config.hidden_size)
    return directory, model


@pytest.fixture(scope="module")
def ours(hf_dir):
    model, _ = load_qwen3_5(hf_dir[0], chunk_size=CHUNK)
    return model


@nnx.jit
def forward(model, ids, segment_ids, positions):
    return model(ids, segment_ids=segment_ids, positions=positions)[0]


def left_padded(rows, length):
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask


def test_logits_match_transformers_with_left_padding(hf_dir, ours):
    _, hf = hf_dir
    rng = np.random.RandomState(0)
    ids, mask = left_padded([rng.randint(3, 512, size=n) for n in (21, 13)], 21)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        ref = hf(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), position_ids=torch.from_numpy(positions)
        ).logits.numpy()
    got = np.asarray(forward(ours, jnp.asarray(ids), jnp.asarray(mask, jnp.int32), jnp.asarray(positions, jnp.int32)))
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=TOL)
    assert np.abs(ref[real]).max() > 0.5  # logits far from zero: the comparison is not vacuous


def test_prefill_then_decode_equals_one_forward(ours):
    """A cached prefill by the chunked form, then decode steps by the recurrent form, give the
    logits of one uncached forward over the whole sequence."""
    ids = jnp.asarray(np.random.RandomState(1).randint(3, 512, size=(2, 15)), jnp.int32)
    full, _ = nnx.jit(lambda m, x: m(x))(ours, ids)
    step = nnx.jit(lambda m, x, c: m(x, kv_cache=c))
    cache = ours.init_cache(2, 32)
    logits, cache = step(ours, ids[:, :11], cache)
    pieces = [logits]
    for i in range(11, 15):
        logits, cache = step(ours, ids[:, i : i + 1], cache)
        pieces.append(logits)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=TOL, rtol=TOL)


def test_greedy_generation_equals_transformers_generate(hf_dir, ours):
    _, hf = hf_dir
    prompts = [[5, 77, 300, 12, 9, 41, 250], [400, 3, 18]]
    new = 10
    out = Sampler(ours, prompt_buckets=(16,), batch_buckets=(2,), new_token_buckets=(16,)).generate(
        prompts, SamplingParams(temperature=0, max_new_tokens=new), jax.random.key(0)
    )
    for prompt, tokens in zip(prompts, out.tokens):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt) :].tolist()
        assert tokens.tolist() == ref


def test_key_table_round_trip_keeps_mtp_tensors_byte_for_byte(hf_dir, ours, tmp_path):
    directory, hf = hf_dir
    mtp = [(k, v) for k, v in nnx.to_flat_state(nnx.state(ours, CheckpointTensor))]
    assert len(mtp) == 6  # kept, outside nnx.Param (so never trained)
    assert not any(k[0] == "mtp" for k, _ in nnx.to_flat_state(nnx.state(ours, nnx.Param)))
    export_qwen3_5(ours, tmp_path, tokenizer_files=False)
    source, written = open_checkpoint(directory), open_checkpoint(tmp_path)
    assert sorted(source) == sorted(written)
    assert sorted(source) == sorted(m.hf for m in qwen3_5_key_table(ours.config))
    for key in source:
        a, b = source[key].array(key), written[key].array(key)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), key
    exported = json.loads((tmp_path / "config.json").read_text())
    assert exported["mtp_num_hidden_layers"] == 1  # text-config fields we do not model are written back
    assert check_policy_directory(tmp_path).kind == "qwen3_5_text"
    again, kind = load_policy(tmp_path)
    assert kind == "qwen3_5_text" and isinstance(again, Qwen3_5ForCausalLM)
    import transformers

    reloaded = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with torch.no_grad():
        np.testing.assert_array_equal(reloaded(ids).logits.numpy(), hf(ids).logits.numpy())


def test_random_init_exports_and_loads_in_transformers(tmp_path):
    """A random-init model (tied embeddings, bfloat16 on disk) is a valid transformers checkpoint."""
    import transformers

    cfg = tiny_qwen3_5_text_config(
        tie_word_embeddings=True, layer_types=("full_attention", "linear_attention"), num_hidden_layers=2
    )
    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(3))
    export_qwen3_5(model, tmp_path, tokenizer_files=False, dtype="bfloat16")
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    back, _ = load_qwen3_5(tmp_path)
    ids = np.array([[5, 9, 200, 31, 7, 8, 100, 3, 4]])
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    got = nnx.jit(lambda m, x: m(x)[0])(back, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL, rtol=TOL)
