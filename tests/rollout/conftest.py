"""Shared fixtures of the rollout tests: a small random Qwen3 written by our exporter.

vLLM on CPU: its attention kernels need head_dim 64 (the tiny config's), and its processes
get the thread limits of ENGINE_ENV (the machine's cores are shared): through
`engine_env` for engines started by the test process, through the actors' runtime
environment for engines in Ray actors.
"""

import numpy as np
import pytest

from cua_jax.context.render import ChatRenderer
from cua_jax.context.tokenizer import load_processor

ENGINE_ENV = (("OMP_NUM_THREADS", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"), ("JAX_PLATFORMS", "cpu"))

# Prompts of different lengths: vLLM batches them unpadded, the JAX sampler left-pads.
PROMPTS = (
    np.array([1, 2, 3, 4, 5, 6], np.int32),
    np.array([7, 8, 9], np.int32),
    np.arange(10, 47, dtype=np.int32),
)

# Both sides compute in float32 on CPU; measured differences are ~1e-6.
LOGPROB_ATOL = 1e-4


def sharpened_tiny_qwen3(seed: int = 0):
    """The tiny Qwen3 with its final norm scaled up 8x, so next-token distributions are
    peaked (a random init is near uniform, where greedy ties would make parity a coin toss)."""
    from flax import nnx

    from cua_jax.context.tokenizer import VOCAB_SIZE
    from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config

    model = Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=VOCAB_SIZE), rngs=nnx.Rngs(seed))
    model.model.norm.weight[...] = model.model.norm.weight[...] * 8.0
    return model


def perturbed(model, seed: int, scale: float = 0.05):
    """A copy of `model` with Gaussian noise added to every parameter."""
    import jax
    from flax import nnx

    copy = nnx.clone(model)
    state = nnx.state(copy, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    nnx.update(copy, jax.tree.unflatten(treedef, noisy))
    return copy


@pytest.fixture(scope="module")
def engine_env():
    """ENGINE_ENV set for the module's duration (vLLM's processes inherit it)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ENGINE_ENV:
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory):
    """(model, directory): the sharpened tiny Qwen3 and the HF directory our exporter wrote."""
    from cua_jax.models.qwen3 import export_qwen3

    model = sharpened_tiny_qwen3()
    directory = tmp_path_factory.mktemp("qwen3_export")
    export_qwen3(model, directory)
    return model, str(directory)


@pytest.fixture(scope="module")
def renderer():
    """The shipped tiny tokenizer and image processor's chat renderer."""
    tokenizer, image_processor = load_processor()
    return ChatRenderer(tokenizer, image_processor)


@pytest.fixture(scope="module")
def runtime():
    """A capsule runtime (one shared Chromium) whose observations carry the DOM as text."""
    from cua_jax.envs.capsules import CapsuleRuntime

    with CapsuleRuntime(include_dom_text=True, seed=0) as capsules:
        yield capsules
