"""The trainer's supervised warm start on real MiniWoB++ capsules: it runs before the learner,
the KL reference and the engines copy the policy, it is checkpointed with the reference, and a
resumed run skips it."""

from __future__ import annotations

import json
import math
import os
import re

import jax
import numpy as np
import pytest

from cua_jax.train.build import build_policy
from cua_jax.train.settings import ConfigError, TrainSettings
from experiments.configs import tiny
from tests.support.trainer import start_trainer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def warm_config(workdir):
    """The tiny run on click-button with DOM text (the oracle reads it), a KL reference and a
    3-step warm start on 2 demonstrations."""
    c = tiny.get_config()
    c.name = "warm"
    c.workdir = str(workdir)
    c.env.tasks = (("click-button", 0),)
    c.env.include_dom_text = True
    c.rollout.batch_tasks = 1
    c.rollout.max_new_tokens = 64  # an oracle reply is ~50 tokens
    c.rollout.max_context_tokens = 4096
    c.loss.kl_coef = 1e-3
    c.eval.max_turns = 2
    c.warm_start.steps = 3
    c.warm_start.demos_per_task = 2
    c.warm_start.concurrency = 2
    return c


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def test_warm_start_config_errors_name_the_field():
    c = warm_config("/tmp/unused")
    c.env.include_dom_text = False
    with pytest.raises(ConfigError, match=r"config\.warm_start\.steps: .*include_dom_text"):
        TrainSettings.from_config(c)
    c = warm_config("/tmp/unused")
    c.env.tasks = (("click-button", 0), ("book-flight", 0))
    with pytest.raises(
        ConfigError, match=r"config\.warm_start\.steps: the oracle has no demonstrations for \['book-flight'\]"
    ):
        TrainSettings.from_config(c)
    c = warm_config("/tmp/unused")
    c.warm_start.demos_per_task = 0
    with pytest.raises(ConfigError, match=r"config\.warm_start\.demos_per_task"):
        TrainSettings.from_config(c)
    c = warm_config("/tmp/unused")
    c.warm_start.held_out_seeds = -1
    with pytest.raises(ConfigError, match=r"config\.warm_start\.held_out_seeds"):
        TrainSettings.from_config(c)


def test_warm_start_feeds_learner_and_reference_and_is_resumed_not_rerun(tmp_path):
    config = warm_config(tmp_path)
    config.warm_start.held_out_seeds = 2
    # The warm start trains the vision tower, RL keeps it frozen: the checkpoint must hold it.
    config.learner.freeze_vision = True
    with start_trainer(config) as trainer:
        metrics = trainer.warm_start_metrics
        assert metrics["warm_start/demonstrations"] == 2 and metrics["warm_start/rejected"] == 0
        assert math.isfinite(metrics["warm_start/loss_first"]) and math.isfinite(metrics["warm_start/loss_last10"])
        # Scored on held-out pages: every reply token, and the click-point digits against the
        # page-blind prior (3 steps leave the policy far from reading either).
        for name in ("held_out_nll", "held_out_click_nll", "click_prior_nll"):
            assert 0 < metrics[f"warm_start/{name}"] < 20, (name, metrics)
        record = json.load(open(os.path.join(tmp_path, "warm_start.json")))
        assert len(record["losses"]) == 3 and record["demonstrations"] == 2
        assert record["held_out_click_nll"] == metrics["warm_start/held_out_click_nll"]
        logged = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
        assert any("warm_start/loss_first" in r for r in logged)

        random_init = build_policy(trainer.settings, config.seed)
        random_init.freeze_vision = True  # the learner's split: trainable params without the tower
        from flax import nnx

        random_params = leaves(nnx.split(random_init, random_init.trainable_filter(), ...)[1])
        learner_params = leaves(trainer.learner.params)
        # The learner starts from the warm-started policy, and the KL reference is that policy.
        assert [a.shape for a in random_params] == [a.shape for a in learner_params]
        assert sum(not np.array_equal(a, b) for a, b in zip(learner_params, random_params)) > len(random_params) // 2
        for a, b in zip(learner_params, leaves(trainer.learner.reference_params)):
            np.testing.assert_array_equal(a, b)
        reference = leaves(trainer.learner.reference_params)
        tower = leaves(trainer.learner.frozen)
        assert tower and sum(a.size for a in tower) > 0
        served = leaves(nnx.state(trainer.workers[0].engine.engine.model))
        trainer.save()

    with start_trainer(config) as resumed:  # the workdir holds a checkpoint: no second warm start
        assert resumed.warm_start_metrics == {}
        assert resumed.restore()
        for a, b in zip(reference, leaves(resumed.learner.reference_params)):
            np.testing.assert_array_equal(a, b)
        # The warm-started frozen tower comes back too, in the learner and in the engine.
        for a, b in zip(tower, leaves(resumed.learner.frozen), strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(served, leaves(nnx.state(resumed.workers[0].engine.engine.model)), strict=True):
            np.testing.assert_array_equal(a, b)


def test_elements_action_space_reaches_demonstrations_rollouts_and_the_learner(tmp_path):
    """env.action_space = "elements" through the whole run: the oracle demonstrates by element id,
    the policy's prompt offers element actions only, its observations carry marks and ids, and
    an RL step trains on those episodes."""
    from cua_jax.envs.miniwob import MARK_COLOR

    config = warm_config(tmp_path)
    config.env.action_space = "elements"
    config.rollout.prompt_style = "compact"
    config.train.num_steps = 1
    config.loss.kl_coef = 0.0
    with start_trainer(config) as trainer:
        assert trainer.warm_start_metrics["warm_start/demonstrations"] == 2
        demonstrated = json.load(open(os.path.join(tmp_path, "warm_start.json")))
        assert demonstrated["rejected"] == [] and demonstrated["oracle_errors"] == []
        trainer.train_step()
        batch = trainer.last_batch
        assert batch.items and batch.episodes
        decoded = trainer.tokenizer.decode(batch.items[0].ids.tolist(), skip_special_tokens=False)
        assert "click_element" in decoded and "left_click" not in decoded.split("Example reply:")[0]
        for episode in batch.episodes.values():
            assert re.search(r"^\s*BUTTON .*\[\d+\]$", episode.turns[0].observation_text, flags=re.M)  # id last
            assert "click=" not in episode.turns[0].observation_text
        runtime = trainer.workers[0].runtime
        assert runtime.action_space == "elements"
        observation = runtime.observe(runtime.create("click-button", seed=3))
        assert np.all(observation.screenshot == MARK_COLOR, axis=-1).any()
