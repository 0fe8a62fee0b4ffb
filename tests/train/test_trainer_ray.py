"""The trainer with its rollout worker in a Ray actor (a local Ray the trainer starts and stops).

One trainer, tiny random Qwen3-VL on real MiniWoB++ capsules (system Chromium) inside the
actor: a strictly on-policy step through the actor, a save / step / restore / step that must
repeat the metrics exactly (the actor's engine sampling state travels through the
checkpoint), and an asynchronous step whose rollout thread drives the actor.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from cua_jax.rollout.rollout_worker import RemoteRolloutWorker
from cua_jax.train.settings import ConfigError, TrainSettings
from tests.support.trainer import replayed_metrics, start_trainer, tiny_config

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_trainer(tmp_path_factory):
    import ray

    assert not ray.is_initialized()
    trainer = start_trainer(tiny_config(tmp_path_factory.mktemp("ray"), rollout__worker_backend="ray"))
    try:
        yield trainer
    finally:
        trainer.close()
    assert not ray.is_initialized()  # the trainer stopped the Ray it started


def test_config_names_bad_worker_fields(tmp_path):
    for field, value, message in (
        ("worker_backend", "threads", "rollout.worker_backend"),
        ("worker_cpus", 0.0, "rollout.worker_cpus"),
        ("ray_object_store_mb", 10, "rollout.ray_object_store_mb"),
        ("engine", "sglang", "rollout.engine: .*'sglang' is not one of"),
    ):
        with pytest.raises(ConfigError, match=message):
            TrainSettings.from_config(tiny_config(tmp_path, **{f"rollout__{field}": value}))


def test_on_policy_step_through_an_actor_has_ratio_one_and_syncs_the_actor(ray_trainer):
    trainer = ray_trainer
    assert len(trainer.workers) == 1 and isinstance(trainer.workers[0], RemoteRolloutWorker)
    assert trainer.workers[0].health().policy_version == 0
    metrics = trainer.train_step()
    assert metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == metrics["learner/ratio_mean"] == 1.0
    assert metrics["learner/clipfrac"] == 0.0 and math.isfinite(metrics["learner/loss"])
    assert metrics["episodes/trained"] == 4 and metrics["learner/num_tokens"] > 0
    assert metrics["quarantine/total"] == 0
    assert metrics["policy/version"] == 1
    assert trainer.workers[0].health().policy_version == 1  # the actor's engine holds the new weights
    assert trainer.workers[0].sampling_state() == {"calls": 1}  # one turn: one batched call


def test_resume_restores_the_actors_sampling_state_and_repeats_the_step(ray_trainer):
    trainer = ray_trainer
    trainer.save()
    saved_step, saved_sampling = trainer.step, trainer.workers[0].sampling_state()
    first = trainer.train_step()
    params_first = jax.tree.map(np.asarray, trainer.learner.train_state()["params"])
    assert trainer.workers[0].sampling_state() != saved_sampling
    assert trainer.restore() and trainer.step == saved_step
    assert trainer.workers[0].sampling_state() == saved_sampling
    assert trainer.workers[0].health().policy_version == trainer.version
    second = trainer.train_step()
    assert replayed_metrics(second) == replayed_metrics(first)
    for a, b in zip(jax.tree.leaves(params_first), jax.tree.leaves(trainer.learner.train_state()["params"])):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_async_step_takes_groups_a_rollout_thread_collected_through_the_actor(ray_trainer):
    trainer = ray_trainer
    version = trainer.version
    trainer.start_rollouts()
    try:
        metrics = trainer.async_step(timeout_s=600.0)
    finally:
        trainer.stop_rollouts()
    assert metrics["policy/version"] == version + 1 and metrics["policy/lag_max"] == 0
    assert metrics["learner/updates"] == 1 and metrics["episodes/trained"] == 4
    assert math.isfinite(metrics["learner/loss"])
    assert trainer.workers[0].health().policy_version == version + 1


def test_held_out_evaluation_goes_through_the_harness_on_the_actor(ray_trainer):
    """The trainer's evaluation path (the evaluation harness) with its worker in a Ray actor."""
    import json
    import os

    trainer = ray_trainer
    trainer.settings = dataclasses.replace(
        trainer.settings, eval=dataclasses.replace(trainer.settings.eval, num_seeds=1)
    )
    result = trainer.evaluate("actor")
    assert result["episodes"] + result["given_up"] == 2 and 0.0 <= result["success_rate"] <= 1.0
    folder = os.path.join(trainer.workdir, "evals", f"actor_{trainer.step:06d}")
    records = [json.loads(line) for line in open(os.path.join(folder, "results.jsonl"))]
    assert {r["task"] for r in records} == set(trainer.eval_tasks) and os.path.exists(
        os.path.join(folder, "results.md")
    )
