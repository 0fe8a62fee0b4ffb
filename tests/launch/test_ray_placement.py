"""Rollout engines placed on another Ray node through a placement group (cua_jax/rollout/workers.py),
on the two-node cluster of tests/launch/conftest.py: the engines' bundles reserve the custom
resource only the second node has, so they must run there, and they serve what an engine in
this process serves."""

from __future__ import annotations

import dataclasses
import functools
import sys

import numpy as np
import pytest

from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
from cua_jax.rollout.workers import Router, RouterConfig
from tests.launch.conftest import ROLLOUT_RESOURCE, driver_auth_mode

SMALL = dict(
    num_hidden_layers=1,
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    head_dim=16,
    num_attention_heads=2,
    num_key_value_heads=1,
)
GREEDY = SamplingConfig(max_new_tokens=6, temperature=0.0)
REQUESTS = [GenerationRequest(np.asarray([5, 6, 7, 8], np.int32)), GenerationRequest(np.asarray([9, 10, 11], np.int32))]


def tiny_engine(seed: int):
    """A JAX sampler engine over a small random Qwen3 (built inside the actor)."""
    from flax import nnx

    from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config
    from cua_jax.rollout.jax_engine import JaxSamplerEngine

    return JaxSamplerEngine(Qwen3ForCausalLM(tiny_qwen3_config(**SMALL), rngs=nnx.Rngs(seed)))


@pytest.fixture(scope="module")
def ray_client(ray_cluster):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import the tests
    with driver_auth_mode(ray_cluster["env"]["RAY_AUTH_MODE"]):
        ray.init(address=ray_cluster["address"], log_to_driver=False)
        yield ray
        ray.shutdown()


def test_engines_are_placed_on_the_node_with_the_rollout_resource(ray_client, ray_cluster):
    ray = ray_client
    [rollout_node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and ROLLOUT_RESOURCE in n["Resources"]]
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    config = RouterConfig(
        num_engines=2,
        cpus_per_engine=0.5,
        placement="STRICT_PACK",
        resources=((ROLLOUT_RESOURCE, 1.0),),
        placement_timeout_s=120,
    )
    router = Router(functools.partial(tiny_engine, 0), config)
    try:
        table = ray.util.placement_group_table(router.placement_group)
        assert set(table["bundles_to_node_id"].values()) == {rollout_node}
        from ray.util.state import list_actors

        # The address is named: with no address the state API refuses when another Ray runs here.
        actor_nodes = {
            a["node_id"]
            for a in list_actors(address=ray_cluster["dashboard"], filters=[("state", "=", "ALIVE")])
            if a["class_name"] == "EngineActor"
        }
        assert actor_nodes == {rollout_node}
        served = router.generate(REQUESTS, GREEDY)
        local = tiny_engine(0).generate(REQUESTS, GREEDY)
        for got, want in zip(served, local, strict=True):
            np.testing.assert_array_equal(got.token_ids, want.token_ids)
            np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    finally:
        router.close()
    assert router.placement_group is None


def test_a_placement_no_node_can_grant_is_an_error_naming_the_bundle(ray_client):
    config = RouterConfig(
        num_engines=3,
        cpus_per_engine=0.5,
        placement="STRICT_PACK",
        resources=((ROLLOUT_RESOURCE, 1.0),),
        placement_timeout_s=3,
    )
    with pytest.raises(RuntimeError, match=r"did not grant 3 bundles of .*rollout_node"):
        Router(functools.partial(tiny_engine, 0), config)
    with pytest.raises(ValueError, match="placement must be one of"):
        RouterConfig(placement="spread-ish")


def failing_engine():
    raise RuntimeError("no weights in this directory")


def test_an_engine_that_fails_to_start_gives_its_bundles_back(ray_client):
    """A start-up failure ends the actors and removes their placement group: a later run can
    reserve the same resources."""
    ray = ray_client
    config = RouterConfig(
        num_engines=2, cpus_per_engine=0.5, placement="STRICT_PACK", resources=((ROLLOUT_RESOURCE, 1.0),)
    )
    with pytest.raises(ray.exceptions.RayActorError, match="no weights in this directory"):
        Router(failing_engine, config)
    router = Router(functools.partial(tiny_engine, 0), dataclasses.replace(config, placement_timeout_s=60))
    router.close()


@pytest.mark.browser
def test_rollout_worker_actors_are_placed_on_the_node_with_the_rollout_resource(ray_client, ray_cluster):
    """Rollout workers in Ray actors (rollout.worker_backend = "ray", rollout.worker_placement
    and worker_node_resource): each actor, its browser and engine, runs on the rollout node."""
    from ray.util.state import list_actors

    from cua_jax.rollout.rollout_worker import RolloutWorkerConfig, start_remote_workers

    ray = ray_client
    [rollout_node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and ROLLOUT_RESOURCE in n["Resources"]]
    workers = start_remote_workers(
        [(functools.partial(tiny_engine, 0), RolloutWorkerConfig())],
        num_cpus=0.5,
        placement="STRICT_PACK",
        resources=((ROLLOUT_RESOURCE, 1.0),),
        placement_timeout_s=120,
    )
    group = workers[0].placement.group
    try:
        nodes = {
            a["node_id"]
            for a in list_actors(address=ray_cluster["dashboard"], filters=[("state", "=", "ALIVE")])
            if a["class_name"] == "RolloutWorker"
        }
        assert nodes == {rollout_node} and workers[0].health().healthy
    finally:
        for worker in workers:
            worker.shutdown()
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"  # the last shutdown gave the bundles back
