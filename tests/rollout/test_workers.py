"""vLLM engines in Ray actors behind the Router: parity, consistent versions, failover.

Two actors (one CPU each) serve in-process vLLM engines with the DLPack weight transport,
so this module also exercises that path. One Ray session and one router per module.
"""

import functools
import threading
import time

import numpy as np
import pytest
from flax import nnx

from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
from cua_jax.rollout.jax_engine import JaxSamplerEngine
from cua_jax.rollout.vllm_engine import VllmEngine, VllmEngineConfig
from cua_jax.rollout.workers import Router, RouterConfig, vllm_host_weights
from tests.rollout.conftest import ENGINE_ENV, LOGPROB_ATOL, PROMPTS, perturbed

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REQUESTS = [GenerationRequest(p) for p in PROMPTS] + [GenerationRequest(np.array([50, 51, 52, 53], np.int32))]
GREEDY = SamplingConfig(max_new_tokens=10, temperature=0.0)
# Long enough that a test can act while it runs.
LONG = SamplingConfig(max_new_tokens=150, temperature=0.0)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def router(ray_session, qwen3_checkpoint):
    _, directory = qwen3_checkpoint
    factory = functools.partial(VllmEngine, VllmEngineConfig(directory, max_model_len=256, weight_transport="dlpack"))
    router = Router(
        factory,
        RouterConfig(num_engines=2, cpus_per_engine=1, env_vars=ENGINE_ENV),
        host_weights=vllm_host_weights(directory),
    )
    yield router
    router.close()


def assert_matches_jax(generations, model, sampling=GREEDY, requests=REQUESTS):
    reference = JaxSamplerEngine(model).generate(requests, sampling)
    for got, want in zip(generations, reference, strict=True):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=LOGPROB_ATOL)


def wait_until_busy(actor, deadline_s=300.0):
    import ray

    deadline = time.monotonic() + deadline_s
    while ray.get(actor.in_flight.remote()) == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the actor never started the request")
        time.sleep(0.05)


def test_router_spreads_a_batch_and_matches_jax(router, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    out = router.generate(REQUESTS, GREEDY)
    assert_matches_jax(out, model)
    assert all(g.policy_version == 0 for g in out)
    assert all(h.healthy for h in router.engine_health())


def test_weight_update_waits_for_in_flight_requests(router, qwen3_checkpoint):
    model, _ = qwen3_checkpoint
    results = {}
    worker = threading.Thread(target=lambda: results.setdefault("out", router.generate(REQUESTS, LONG)))
    worker.start()
    wait_until_busy(router.actors[0])
    new_model = perturbed(model, seed=3)
    router.update_weights(nnx.state(new_model), version=1)  # must wait for the batch above
    worker.join()
    assert all(g.policy_version == 0 for g in results["out"])
    assert_matches_jax(results["out"], model, LONG)  # produced entirely by the old weights
    after = router.generate(REQUESTS, GREEDY)
    assert all(g.policy_version == 1 for g in after)
    assert_matches_jax(after, new_model)
    assert router.health().healthy


def test_killed_actor_fails_over_and_comes_back(router, qwen3_checkpoint):
    import ray

    model, _ = qwen3_checkpoint
    current = perturbed(model, seed=3)  # the weights of version 1, pushed by the test above
    results = {}
    worker = threading.Thread(target=lambda: results.setdefault("out", router.generate(REQUESTS, LONG)))
    worker.start()
    wait_until_busy(router.actors[0])
    ray.kill(router.actors[0], no_restart=False)
    worker.join()
    # Actor 0's half of the batch was retried on actor 1 with the same weights.
    assert all(g.policy_version == 1 for g in results["out"])
    assert_matches_jax(results["out"], current, LONG)
    # Ray restarts actor 0 (a fresh engine with the checkpoint's weights); the router
    # re-syncs version 1 before it serves again.
    assert router.wait_recovered(timeout_s=600)
    assert router.engine_health()[0].policy_version == 1
    direct = ray.get(router.actors[0].generate.remote(REQUESTS, GREEDY))
    assert_matches_jax(direct, current)
    assert router.health().healthy
