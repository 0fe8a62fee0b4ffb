"""Shared fixtures for the model tests: tiny random Qwen3 checkpoints written by transformers.

Weights are redrawn with a larger spread than transformers' init (std 0.02) and norm
weights around 1 with noise, so logits vary enough for parity checks to mean something.
"""

import numpy as np
import pytest


def hf_qwen3_config(**overrides):
    import transformers

    kwargs = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    kwargs.update(overrides)
    return transformers.Qwen3Config(**kwargs)


def random_hf_qwen3(seed: int = 0, **overrides):
    """A transformers Qwen3ForCausalLM (float32, eval mode) with spread-out random weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(hf_qwen3_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


@pytest.fixture(scope="session")
def hf_qwen3_dir(tmp_path_factory):
    """(directory, torch model) of an untied tiny Qwen3 saved with save_pretrained."""
    model = random_hf_qwen3(seed=0)
    directory = tmp_path_factory.mktemp("hf_qwen3")
    model.save_pretrained(directory)
    return directory, model


@pytest.fixture(scope="session")
def our_qwen3(hf_qwen3_dir):
    """(model, config) loaded from `hf_qwen3_dir` by cua_jax."""
    from cua_jax.models.qwen3 import load_qwen3

    return load_qwen3(hf_qwen3_dir[0])


@pytest.fixture(scope="session")
def token_batch():
    return np.random.RandomState(0).randint(3, 512, size=(2, 12)).astype(np.int64)


def _forward(model, ids, segment_ids, positions):
    return model(ids, segment_ids=segment_ids, positions=positions)[0]


@pytest.fixture(scope="session")
def jit_forward():
    """forward(model, ids, segment_ids, positions) -> logits, one compiled program per shape."""
    from flax import nnx

    return nnx.jit(_forward)


def right_padded(rows, length):
    """(ids, segment_ids, positions) int32 [len(rows), length] for sequences padded on the right."""
    ids = np.zeros((len(rows), length), np.int32)
    segments = np.zeros_like(ids)
    positions = np.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = row
        segments[r, : len(row)] = 1
        positions[r, : len(row)] = np.arange(len(row))
    return ids, segments, positions


@pytest.fixture(scope="session")
def make_hf_qwen3():
    """`random_hf_qwen3` as a fixture (test modules do not import conftest)."""
    return random_hf_qwen3


@pytest.fixture(scope="session")
def pad_right():
    """`right_padded` as a fixture."""
    return right_padded
