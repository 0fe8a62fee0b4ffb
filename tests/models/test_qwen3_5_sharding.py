"""Qwen3.5 sharded over 8 CPU devices computes what it computes on one: logits and gradients of
a training step, and greedy decoding with the hybrid cache (KV + conv + delta-rule state).
Tolerance as tests/models/test_sharding.py (sharded reductions sum in another order)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from cua_jax.models.qwen3_5 import QWEN3_5_RULES, Qwen3_5ForCausalLM, tiny_qwen3_5_text_config
from cua_jax.models.sampler import Sampler, SamplingParams
from cua_jax.models.sharding import MeshConfig, make_mesh, shard_state, use_mesh

TOL = dict(atol=2e-5, rtol=2e-5)


def loss_fn(model, ids):
    logits, _ = model(ids[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))


@nnx.jit
def logits_and_grads(model, ids):
    logits, _ = model(ids)
    loss, grads = nnx.value_and_grad(loss_fn)(model, ids)
    return logits, loss, nnx.to_pure_dict(grads)


@pytest.fixture(scope="module")
def model():
    cfg = tiny_qwen3_5_text_config(
        chunk_size=8, num_hidden_layers=2, layer_types=("linear_attention", "full_attention")
    )
    m = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
    # Spread the weights (init std 0.02 leaves logits near-constant) so the comparison means something.
    state = nnx.state(m, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    nnx.update(m, jax.tree.map(lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape, p.dtype), state))
    return m


@pytest.fixture(scope="module")
def sharded(model):
    mesh = make_mesh(MeshConfig(fsdp=2, tensor=4))
    graphdef, state = nnx.split(model)
    out = nnx.merge(graphdef, shard_state(state, mesh, QWEN3_5_RULES))
    conv = out.model.layers[0].linear_attn.conv1d[...]
    assert conv.sharding.spec == PartitionSpec("tensor", None, None)
    return out, mesh


def test_sharded_step_equals_one_device(model, sharded):
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 512, size=(8, 19)), jnp.int32)
    ref_logits, ref_loss, ref_grads = logits_and_grads(model, ids)
    sharded_model, mesh = sharded
    with use_mesh(mesh, QWEN3_5_RULES):
        logits, loss, grads = logits_and_grads(sharded_model, ids)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), **TOL)
    np.testing.assert_allclose(float(loss), float(ref_loss), **TOL)
    jax.tree.map(lambda g, r: np.testing.assert_allclose(np.asarray(g), np.asarray(r), **TOL), grads, ref_grads)


def test_sharded_greedy_decoding_equals_one_device(model, sharded):
    prompts = [[5, 77, 300, 12, 9, 41], [400, 3, 18], [7, 7, 7, 7], [100]]
    params = SamplingParams(temperature=0, max_new_tokens=6)
    buckets = dict(prompt_buckets=(8,), batch_buckets=(4,), new_token_buckets=(8,))
    ref_tokens = Sampler(model, **buckets).generate(prompts, params, jax.random.key(0)).tokens
    sharded_model, mesh = sharded
    with use_mesh(mesh, QWEN3_5_RULES):
        tokens = Sampler(sharded_model, **buckets).generate(prompts, params, jax.random.key(0)).tokens
    assert [t.tolist() for t in tokens] == [t.tolist() for t in ref_tokens]
