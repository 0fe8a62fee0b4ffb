"""Test-time YaRN (config.eval.rope_scaling): `rope_scaled` writes the rope HF describes, and
`rope_scaled_model` is the same weights under it. The YaRN tables themselves are checked
against transformers in test_layers.py / test_qwen3_parity.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cua_jax.models.configs import RopeConfig
from cua_jax.models.qwen3 import rope_scaled, rope_scaled_model, tiny_qwen3_config


def test_the_scaled_rope_is_hf_yarn_over_the_models_own_context():
    config = tiny_qwen3_config(max_position_embeddings=2048)
    scaled = rope_scaled(config, 4.0)
    # What HF / Qwen write for YaRN:
    # rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": n}.
    hf = {
        "rope_theta": config.rope.rope_theta,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    }
    assert scaled.rope == RopeConfig.from_hf_dict(hf)
    assert scaled.max_position_embeddings == 8192
    assert rope_scaled(config, 4.0) == scaled  # hashable and equal: one compiled program per factor
    for factor in (1.0, 0.5, 0.0, -2.0):
        with pytest.raises(ValueError, match="must exceed 1"):
            rope_scaled(config, factor)
    with pytest.raises(ValueError, match="already 'yarn'"):
        rope_scaled(scaled, 2.0)


def test_qwen3_5_refuses_a_scaled_rope():
    from cua_jax.models.qwen3_5 import tiny_qwen3_5_config

    with pytest.raises(ValueError, match="supports only its default rope"):
        rope_scaled(tiny_qwen3_5_config(), 2.0)


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_vl"])
def test_the_evaluation_view_shares_the_weights_and_rotates_long_positions_otherwise(kind):
    if kind == "qwen3":
        from cua_jax.models.qwen3 import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(tiny_qwen3_config(num_hidden_layers=1), rngs=nnx.Rngs(0))
        text = lambda m: m.config
    else:
        from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

        model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(num_hidden_layers=2), rngs=nnx.Rngs(0))
        text = lambda m: m.config.text
    original = text(model).max_position_embeddings
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 500, (1, 8)), jnp.int32)
    forward = nnx.jit(lambda m, positions: m(ids, positions=positions)[0])
    long = original + 1000 + jnp.arange(8, dtype=jnp.int32)[None]
    before = np.asarray(forward(model, long))

    view = rope_scaled_model(model, 2.0)
    assert type(view) is type(model)
    assert text(view).rope == RopeConfig(
        rope_theta=text(model).rope.rope_theta, rope_type="yarn", factor=2.0, original_max_position_embeddings=original
    )
    assert text(model).rope.rope_type == "default"  # the training model keeps its rope
    ours, theirs = jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(view))
    assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))  # the arrays, not copies

    scaled = np.asarray(forward(view, long))
    assert np.abs(scaled - before).max() > 1e-2  # past the trained context, YaRN rotates otherwise
    np.testing.assert_array_equal(np.asarray(forward(model, long)), before)  # the model is unchanged
