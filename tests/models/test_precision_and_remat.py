"""Model precision and rematerialisation options: `Qwen3Config.dtype` / `param_dtype`
("float32" | "bfloat16") and `Qwen3Config.remat` (each decoder layer and vision block under
jax.checkpoint), on tiny random models (CPU)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cua_jax.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, tiny_qwen3_config
from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, rope_index, tiny_qwen3_vl_config
from cua_jax.models.vision import ImageGrid

REMAT_PRIMITIVE = re.compile(r"\b(remat\w*|checkpoint)\[")


def text_loss(model, ids):
    logits, _ = model(ids[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1))


@nnx.jit
def text_grads(model, ids):
    return nnx.to_pure_dict(nnx.grad(text_loss)(model, ids))


def remat_count(fn, *args) -> int:
    """How many rematerialised regions the traced program of fn(*args) holds."""
    return len(REMAT_PRIMITIVE.findall(str(jax.make_jaxpr(fn)(*args))))


def assert_trees_close(a, b, atol):
    pairs = zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b))
    for (path, x), y in pairs:
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_remat_text_gradients_equal_plain_gradients():
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 512, size=(2, 16)))
    plain = Qwen3ForCausalLM(tiny_qwen3_config(), rngs=nnx.Rngs(0))
    remat = Qwen3ForCausalLM(tiny_qwen3_config(remat=True), rngs=nnx.Rngs(0))
    assert remat_count(lambda i: text_loss(plain, i), ids) == 0
    assert remat_count(lambda i: text_loss(remat, i), ids) == remat.config.num_hidden_layers
    expected, got = text_grads(plain, ids), text_grads(remat, ids)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(expected)) > 1e-3  # gradients are not all ~0
    assert_trees_close(got, expected, atol=1e-5)


def test_remat_vision_language_gradients_equal_plain_gradients():
    """Every decoder layer and vision block rematerialised, with images and DeepStack."""
    base = tiny_qwen3_vl_config()
    base = dataclasses.replace(
        base,
        text=dataclasses.replace(base.text, num_hidden_layers=2),
        vision=dataclasses.replace(base.vision, depth=2, deepstack_visual_indexes=(0, 1)),
    )
    remat_config = dataclasses.replace(base, text=dataclasses.replace(base.text, remat=True))
    grid = ((1, 4, 6), (1, 4, 4))
    rng = np.random.RandomState(0)
    rows = []
    for tokens in (6, 4):
        rows.append(
            [5, 6, base.vision_start_token_id]
            + [base.image_token_id] * tokens
            + [base.vision_end_token_id]
            + list(rng.randint(10, 300, 10 - tokens))
        )
    ids = np.asarray(rows, np.int32)
    positions, _ = rope_index(ids, grid, image_token_id=base.image_token_id, spatial_merge_size=2)
    pixels = jnp.asarray(rng.normal(size=(40, base.vision.patch_dim)).astype(np.float32))
    inputs = (jnp.asarray(ids), jnp.asarray(positions), pixels)

    def loss(model, ids, positions, pixels):
        logits, _ = model(ids, positions=positions, pixel_values=pixels, image_grid_thw=ImageGrid(grid))
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    grads = nnx.jit(lambda model, *a: nnx.to_pure_dict(nnx.grad(loss)(model, *a)))
    plain = Qwen3VLForConditionalGeneration(base, rngs=nnx.Rngs(1))
    remat = Qwen3VLForConditionalGeneration(remat_config, rngs=nnx.Rngs(1))
    assert remat_count(lambda *a: loss(remat, *a), *inputs) == base.text.num_hidden_layers + base.vision.depth
    expected, got = grads(plain, *inputs), grads(remat, *inputs)
    assert float(jnp.max(jnp.abs(expected["visual"]["blocks"][0]["attn"]["qkv"]["kernel"]))) > 1e-5
    assert_trees_close(got, expected, atol=1e-5)


def test_bfloat16_parameters_and_compute():
    """bfloat16 weights and activations: logits still float32, close to the float32 model's
    on the same (rounded) weights; mixed float32 weights with bfloat16 compute too."""
    ids = jnp.asarray(np.random.RandomState(1).randint(3, 512, size=(2, 16)))
    forward = nnx.jit(lambda m, i: m(i)[0])
    reference = Qwen3ForCausalLM(tiny_qwen3_config(), rngs=nnx.Rngs(0))
    rounded = jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(reference, nnx.Param))
    nnx.update(reference, jax.tree.map(lambda a: a.astype(jnp.float32), rounded))
    expected = np.asarray(forward(reference, ids))
    for param_dtype in ("bfloat16", "float32"):
        model = Qwen3ForCausalLM(tiny_qwen3_config(dtype="bfloat16", param_dtype=param_dtype), rngs=nnx.Rngs(0))
        assert {a.dtype for a in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(param_dtype)}
        nnx.update(model, jax.tree.map(lambda a: a.astype(param_dtype), rounded))  # noqa: B023 - run within this iteration
        logits = forward(model, ids)
        assert logits.dtype == jnp.float32
        assert model.hidden_states(ids)[0].dtype == jnp.bfloat16
        # bfloat16 activations keep 8 significant bits: measured 0.035 x the logits' spread after
        # 2 layers; float32 compute would agree to ~1e-7, so the lower bound shows bfloat16 ran.
        error = np.abs(np.asarray(logits) - expected).max()
        assert 1e-4 < error < 0.1 * expected.std(), error


def test_dtype_names_and_errors():
    config = tiny_qwen3_config(dtype="bfloat16", param_dtype=jnp.float32)
    assert config.dtype is jnp.bfloat16 and config.param_dtype is jnp.float32
    assert Qwen3Config.from_hf_dict(config.to_hf_dict(), dtype="bfloat16").dtype is jnp.bfloat16
    with pytest.raises(ValueError, match="Qwen3Config.param_dtype 'float16' is not supported"):
        tiny_qwen3_config(param_dtype="float16")
    with pytest.raises(ValueError, match="Qwen3Config.dtype"):
        tiny_qwen3_config(dtype="bf16")
    with pytest.raises(ValueError, match="Qwen3Config.remat must be a bool"):
        tiny_qwen3_config(remat="layer")
    vl = tiny_qwen3_vl_config(param_dtype="bfloat16", remat=True)
    model = Qwen3VLForConditionalGeneration(vl, rngs=nnx.Rngs(0))
    assert model.visual.remat and model.visual.blocks[0].attn.qkv.kernel[...].dtype == jnp.bfloat16
