"""The JAX sampler behind the engine interface: versions, weights, images per request."""

import numpy as np
import pytest
from flax import nnx

from cua_jax.models.scoring import score_sequences
from cua_jax.rollout.engine import FinishReason, GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from tests.rollout.conftest import LOGPROB_ATOL, PROMPTS, perturbed, sharpened_tiny_qwen3

GREEDY = SamplingConfig(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return sharpened_tiny_qwen3()


def test_generations_carry_the_loaded_version_and_follow_new_weights(model):
    engine = JaxSamplerEngine(nnx.clone(model))
    requests = [GenerationRequest(p) for p in PROMPTS]
    before = engine.generate(requests, GREEDY)
    assert all(g.policy_version == 0 and g.finish_reason == FinishReason.LENGTH for g in before)
    new_model = perturbed(model, seed=1)
    engine.update_weights(nnx.state(new_model), version=4)
    after = engine.generate(requests, GREEDY)
    assert all(g.policy_version == 4 for g in after)
    assert any(not np.array_equal(a.token_ids, b.token_ids) for a, b in zip(before, after))
    for request, g in zip(requests, after):
        ids = np.concatenate([request.prompt_ids, g.token_ids])[None]
        want = np.asarray(score_sequences(new_model, ids)[0])[0, len(request.prompt_ids) :]
        np.testing.assert_allclose(g.logprobs, want, atol=LOGPROB_ATOL)


def test_seeded_calls_repeat_and_unseeded_calls_draw_afresh(model):
    engine = JaxSamplerEngine(model)
    requests = [GenerationRequest(PROMPTS[2])]
    seeded = SamplingConfig(max_new_tokens=12, temperature=1.5, seed=3)
    a, b = engine.generate(requests, seeded)[0], engine.generate(requests, seeded)[0]
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    fresh = SamplingConfig(max_new_tokens=12, temperature=1.5)
    c, d = engine.generate(requests, fresh)[0], engine.generate(requests, fresh)[0]
    assert not np.array_equal(c.token_ids, d.token_ids)


def test_a_rope_scaled_call_samples_the_yarn_view_of_the_current_weights(model):
    """SamplingConfig.rope_scaling (evaluation's config.eval.rope_scaling): the call samples the
    model under YaRN, from the engine's own parameter arrays, with a prefix cache of its own;
    weight updates reach the view; calls without it keep the model's rope."""
    import dataclasses

    import jax

    from cua_jax.models.qwen3 import rope_scaled_model

    engine = JaxSamplerEngine(nnx.clone(model), prefix_cache_tokens=512)
    requests = [GenerationRequest(p) for p in PROMPTS]
    yarn = dataclasses.replace(GREEDY, rope_scaling=2.0)

    def expect(generations, reference):
        for request, g in zip(requests, generations):
            ids = np.concatenate([request.prompt_ids, g.token_ids])[None]
            want = np.asarray(score_sequences(reference, ids)[0])[0, len(request.prompt_ids) :]
            np.testing.assert_allclose(g.logprobs, want, atol=LOGPROB_ATOL)

    plain = engine.generate(requests, GREEDY)  # fills the model's prefix cache
    expect(plain, model)
    assert engine.scaled_models == {}
    scaled = engine.generate(requests, yarn)
    expect(scaled, rope_scaled_model(model, 2.0))  # not the cached keys of the model's rope
    assert any(not np.allclose(a.logprobs, b.logprobs, atol=LOGPROB_ATOL) for a, b in zip(plain, scaled))
    view = engine.scaled_models[2.0]
    assert view.config.rope.rope_type == "yarn" and view.config.rope.factor == 2.0
    assert engine.model.config.rope.rope_type == "default"
    new_model = perturbed(model, seed=1)
    engine.update_weights(nnx.state(new_model), version=1)
    assert all(a is b for a, b in zip(jax.tree.leaves(nnx.state(engine.model)), jax.tree.leaves(nnx.state(view))))
    expect(engine.generate(requests, yarn), rope_scaled_model(new_model, 2.0))
    expect(engine.generate(requests, GREEDY), new_model)


def test_images_for_a_text_model_are_refused(model):
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match="text-only"):
        JaxSamplerEngine(model).generate([GenerationRequest(PROMPTS[0], images=[image])], GREEDY)


@pytest.mark.slow
def test_each_request_sees_its_own_image():
    from cua_jax.context.tokenizer import image_grid_thw, load_processor, merged_token_count, special_token_ids
    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

    vl = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(), rngs=nnx.Rngs(0))
    vl.language_model.model.norm.weight[...] = vl.language_model.model.norm.weight[...] * 8.0
    tokenizer, processor = load_processor()
    special = special_token_ids(tokenizer)
    count = merged_token_count(image_grid_thw(processor, 64, 96), processor.merge_size)
    prompt = np.array(
        [5, 6, special["<|vision_start|>"]] + [special["<|image_pad|>"]] * count + [special["<|vision_end|>"], 7],
        np.int32,
    )
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, 256, (64, 96, 3), dtype=np.uint8) for _ in range(2))
    engine = JaxSamplerEngine(vl, image_processor=processor)
    out = engine.generate([GenerationRequest(prompt, [im]) for im in (first, second, first)], GREEDY)
    np.testing.assert_array_equal(out[0].token_ids, out[2].token_ids)
    np.testing.assert_allclose(out[0].logprobs, out[2].logprobs, atol=LOGPROB_ATOL)
    assert not np.allclose(out[0].logprobs, out[1].logprobs, atol=LOGPROB_ATOL)


class PausingEngine(JaxSamplerEngine):
    """The real engine, paused at its first chunk boundary until the test lets it go on: a
    weight update is then certain to land mid-generation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import threading

        self.at_boundary, self.go_on, self.boundaries = threading.Event(), threading.Event(), 0

    def _yield_to_updates(self):
        self.boundaries += 1
        if self.boundaries == 1:
            self.at_boundary.set()
            self.go_on.wait(60)
        super()._yield_to_updates()


def test_partial_rollout_continues_under_new_weights_with_each_token_tagged(model):
    import threading

    engine = PausingEngine(nnx.clone(model), interrupt_tokens=2)
    requests = [GenerationRequest(p) for p in PROMPTS]
    result = {}
    generating = threading.Thread(target=lambda: result.update(out=engine.generate(requests, GREEDY)))
    generating.start()
    assert engine.at_boundary.wait(120)
    new_model = perturbed(model, seed=1)
    updating = threading.Thread(target=engine.update_weights, args=(nnx.state(new_model), 5))
    updating.start()
    updating.join(60)
    assert not updating.is_alive(), "the update waited for the whole generation"
    engine.go_on.set()
    generating.join(120)
    for request, g in zip(requests, result["out"]):
        assert g.token_versions.tolist() == [0, 0, 5, 5, 5, 5] and g.policy_version == 0
        assert g.version_segments() == [(0, 0), (2, 5)] and g.finish_reason == FinishReason.LENGTH
        # Each segment's logprobs are its own weights' (the new ones rescored the whole prefix).
        ids = np.concatenate([request.prompt_ids, g.token_ids])[None]
        p = len(request.prompt_ids)
        old = np.asarray(score_sequences(model, ids)[0])[0, p : p + 2]
        new = np.asarray(score_sequences(new_model, ids)[0])[0, p + 2 :]
        np.testing.assert_allclose(g.logprobs, np.concatenate([old, new]), atol=LOGPROB_ATOL)
    # Greedy under the old weights up to the update, then greedy under the new ones.
    engine_old = JaxSamplerEngine(nnx.clone(model))
    head = engine_old.generate(requests, SamplingConfig(max_new_tokens=2, temperature=0.0))
    for request, g, h in zip(requests, result["out"], head):
        np.testing.assert_array_equal(g.token_ids[:2], h.token_ids)
        engine_new = JaxSamplerEngine(nnx.clone(new_model))
        tail = engine_new.generate(
            [GenerationRequest(np.concatenate([request.prompt_ids, h.token_ids]))],
            SamplingConfig(max_new_tokens=4, temperature=0.0),
        )[0]
        np.testing.assert_array_equal(g.token_ids[2:], tail.token_ids)
