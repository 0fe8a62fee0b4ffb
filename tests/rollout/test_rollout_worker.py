"""The rollout worker, in-process and as a local Ray actor: capsules + engine + agent loops.

In-process, the engine is the JAX sampler over a tiny random Qwen3-VL built by
`JaxEngineFactory` from host parameters (as an actor builds it): the tests check that groups
share batched engine calls, and that the engine's sampling state, read and restored through
the worker, reproduces the samples. In the actor, the engine is the scripted oracle policy
of test_agent_loop (built inside the actor), so the actor needs no model: that test is about
the actor plumbing, the two agent loops, weight versions and the episodes it returns.
"""

from __future__ import annotations

import functools
import pickle

import jax
import numpy as np
import pytest
from flax import nnx

from cua_jax.rollout.agent_loop import AgentConfig
from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxEngineFactory, JaxSamplerEngine
from cua_jax.rollout.rollout_worker import (
    RemoteRolloutWorker,
    RolloutWorker,
    RolloutWorkerConfig,
    assign_by_last_task,
)
from cua_jax.types import EpisodeStatus

# Imported by its package path, so that the actor process can import the factory too.
from tests.support.agent_loop import scripted_oracle_engine

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG_TIME_LIMIT_S = 600.0  # MiniWoB's 10 s limit is shorter than a CPU-sampled turn


def _trained_ids(rollout):
    return np.concatenate([item.ids[item.loss_mask == 1] for item in rollout.items])


def _responses(groups):
    """Each group's responses as a sorted list of byte strings: the episodes of a group see the
    same prompts, so which of them got which sample depends on arrival order at the engine."""
    return [
        sorted(np.concatenate([t.response_ids for t in r.episode.turns]).tobytes() for r in group) for group in groups
    ]


# ------------------------------------------------------------------------------------
# In-process, with the JAX sampler
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vl():
    from cua_jax.models.qwen3_vl import (
        Qwen3VLForConditionalGeneration,
        tiny_qwen3_vl_config,
    )

    return Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(num_hidden_layers=2), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def jax_worker(tiny_vl):
    host = jax.tree.map(np.asarray, nnx.state(tiny_vl))
    factory = JaxEngineFactory(type(tiny_vl), tiny_vl.config, host, seed=7)
    config = RolloutWorkerConfig(
        agent=AgentConfig(max_turns=1, max_new_tokens=8, max_context_tokens=2048, batch_wait_s=None),
        segmenter="sliding_window",
        segmenter_options=(("keep", 1), ("min_removal", 1)),
        include_dom_text=False,
        time_limit_s=LONG_TIME_LIMIT_S,
        canonical_order=True,
    )
    worker = RolloutWorker(factory, config)
    try:
        yield worker
    finally:
        worker.shutdown()


def test_engine_factory_survives_pickling_and_copies_the_parameters(tiny_vl):
    host = jax.tree.map(np.asarray, nnx.state(tiny_vl))
    factory = pickle.loads(pickle.dumps(JaxEngineFactory(type(tiny_vl), tiny_vl.config, host, seed=3)))
    rebuilt, direct = factory(), JaxSamplerEngine(nnx.clone(tiny_vl), seed=3)
    requests = [GenerationRequest(np.arange(1, 9, dtype=np.int32)), GenerationRequest(np.array([5, 6, 7], np.int32))]
    sampling = SamplingConfig(max_new_tokens=5, temperature=1.0)
    for a, b in zip(rebuilt.generate(requests, sampling), direct.generate(requests, sampling)):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6)
    with pytest.raises(ValueError, match="params lack"):
        partial = nnx.state(tiny_vl).filter(lambda path, _: "visual" not in map(str, path))
        JaxEngineFactory(type(tiny_vl), tiny_vl.config, jax.tree.map(np.asarray, partial))()


def test_groups_share_batched_engine_calls_and_sampling_state_replays_them(jax_worker):
    requests = [("click-button", 3, 0), ("focus-text", 5, 1)]
    jax_worker.update_weights(jax.tree.map(np.asarray, nnx.state(jax_worker.engine.engine.model)), 2)
    assert jax_worker.health().policy_version == 2
    start = jax_worker.sampling_state()
    first = jax_worker.run_groups(requests, 2)
    # One turn each: all four episodes of both groups went out in a single engine call.
    assert jax_worker.sampling_state() == {"calls": start["calls"] + 1}
    assert [[r.episode.episode_id for r in group] for group in first] == [
        ["click-button/g0/e0", "click-button/g0/e1"],
        ["focus-text/g1/e0", "focus-text/g1/e1"],
    ]
    for group, (task, _, group_id) in zip(first, requests):
        for rollout in group:
            episode = rollout.episode
            assert episode.task_id == task and episode.group_id == group_id and episode.policy_version == 2
            assert episode.num_turns == 1 and episode.status is EpisodeStatus.NO_VERDICT
            np.testing.assert_array_equal(_trained_ids(rollout), episode.turns[0].response_ids)

    # An evaluation at temperature 0 (eval.low_temperature) decodes greedily: a group's
    # episodes see one prompt, so they give one reply, where sampling gave two.
    greedy = jax_worker.run_groups(requests[:1], 2, evaluation=True, temperature=0.0)[0]
    assert len(_responses([greedy])[0]) == 2 and len(set(_responses([greedy])[0])) == 1
    assert len(set(_responses(first[:1])[0])) == 2
    with pytest.raises(ValueError, match="evaluation groups only"):
        jax_worker.run_groups(requests, 2, temperature=0.0)
    jax_worker.load_sampling_state({"calls": start["calls"] + 1})
    fresh = jax_worker.run_groups(requests, 2)  # the next call of the stream: other samples
    jax_worker.load_sampling_state(start)
    replayed = jax_worker.run_groups(requests, 2)
    assert _responses(replayed) == _responses(first)
    assert _responses(fresh) != _responses(first)
    with pytest.raises(ValueError, match="sampling state"):
        jax_worker.load_sampling_state({"counter": 1})
    with pytest.raises(ValueError, match=r"\(task, seed, group_id\)"):
        jax_worker.run_groups([("click-button", 3)], 2)
    # Drawn in the other order, each group still gets the environments that ran its task, and
    # their episodes begin in the pages they hold (env.capsules.episodes_per_page).
    restarts = jax_worker.runtime.page_restarts
    jax_worker.run_groups(list(reversed(requests)), 2)
    assert jax_worker.runtime.page_restarts == restarts + 4


def test_groups_get_the_environments_that_last_ran_their_task():
    a, b, c, d, e = (object() for _ in range(5))
    last = {a: "x", b: "y", c: "x", d: "y"}
    assert assign_by_last_task([a, b, c, d, e], ["y", "x"], 2, last) == [[b, d], [a, c]]
    assert assign_by_last_task([a, b, c, d, e], ["x", "z"], 2, last) == [[a, c], [b, d]]  # z: the rest, in order
    assert last == {a: "x", b: "z", c: "x", d: "z"}
    assert assign_by_last_task([e, a], ["x"], 1, {}) == [[e]]


# ------------------------------------------------------------------------------------
# A Ray actor, with the scripted oracle policy
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_worker_actor_runs_train_and_eval_groups_and_takes_weight_updates(ray_session):
    config = RolloutWorkerConfig(
        agent=AgentConfig(max_turns=4, max_new_tokens=64),
        eval_agent=AgentConfig(max_turns=1, max_new_tokens=64),  # too few turns for click-checkboxes
        segmenter="sliding_window",
        segmenter_options=(("keep", 1), ("min_removal", 1)),
        time_limit_s=LONG_TIME_LIMIT_S,
    )
    worker = RemoteRolloutWorker.start(functools.partial(scripted_oracle_engine, "click-checkboxes"), config)
    try:
        first = worker.run_group("click-checkboxes", 2, seed=2, group_id=0)
        worker.update_weights(None, 5)
        assert worker.health().policy_version == 5
        second, third = worker.run_groups([("click-checkboxes", 6, 1), ("click-checkboxes", 7, 2)], 3)
        evaluated = worker.run_groups([("click-checkboxes", 8, 3)], 1, evaluation=True)[0]
        assert worker.sampling_state() == {}  # the scripted policy draws nothing
        with pytest.raises(ValueError, match="no sampling state"):
            worker.load_sampling_state({"calls": 1})
    finally:
        worker.shutdown()
    worker.shutdown()  # idempotent
    for group, version, group_id in ((first, 0, 0), (second, 5, 1), (third, 5, 2)):
        for rollout in group:
            episode = rollout.episode
            assert episode.status is EpisodeStatus.SUCCESS and episode.reward == 1.0
            assert episode.policy_version == version and episode.group_id == group_id
            trained = np.concatenate([item.ids[item.loss_mask == 1] for item in rollout.items])
            np.testing.assert_array_equal(trained, np.concatenate([t.response_ids for t in episode.turns]))
    assert len(second) == len(third) == 3
    # The evaluation loop's one-turn budget ends the multi-click task without a verdict.
    assert [r.episode.status for r in evaluated] == [EpisodeStatus.NO_VERDICT]
    assert evaluated[0].episode.num_turns == 1
