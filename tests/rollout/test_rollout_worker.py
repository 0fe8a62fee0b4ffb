"""The rollout worker as a local Ray actor: capsules + engine in the actor's process.

The engine is the scripted oracle policy of test_agent_loop (built inside the actor), so
the actor needs no model: the test is about the actor plumbing, weight versions and the
episodes it returns; the agent loop itself is tested with the JAX engine there.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from cua_jax.rollout.agent_loop import AgentConfig
from cua_jax.rollout.rollout_worker import RolloutWorkerConfig, rollout_worker_actor
from cua_jax.types import EpisodeStatus
# Imported by its package path, so that the actor process can import the factory too.
from tests.rollout.test_agent_loop import scripted_oracle_engine

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_worker_actor_runs_groups_and_takes_weight_updates(ray_session):
    ray = ray_session
    config = RolloutWorkerConfig(
        agent=AgentConfig(max_turns=4, max_new_tokens=64),
        segmenter="sliding_window",
        segmenter_options=(("keep", 1), ("min_removal", 1)),
        time_limit_s=600.0,
    )
    worker = rollout_worker_actor(num_cpus=1).remote(functools.partial(scripted_oracle_engine, "click-checkboxes"), config)
    try:
        first = ray.get(worker.run_group.remote("click-checkboxes", 2, seed=2, group_id=0))
        ray.get(worker.update_weights.remote(None, 5))
        assert ray.get(worker.health.remote()).policy_version == 5
        second = ray.get(worker.run_group.remote("click-checkboxes", 3, seed=6, group_id=1))
    finally:
        ray.get(worker.shutdown.remote())
        ray.kill(worker)
    for group, version, group_id in ((first, 0, 0), (second, 5, 1)):
        for rollout in group:
            episode = rollout.episode
            assert episode.status is EpisodeStatus.SUCCESS and episode.reward == 1.0
            assert episode.policy_version == version and episode.group_id == group_id
            trained = np.concatenate([item.ids[item.loss_mask == 1] for item in rollout.items])
            np.testing.assert_array_equal(trained, np.concatenate([t.response_ids for t in episode.turns]))
    assert len(second) == 3
