"""A non-zero advantage travels through the trainer: one episode per group succeeds, and the
update raises the policy's logprob of what that episode did.

The tiny random Qwen3-VL never finishes a task, so every other trainer test sees all-zero
advantages. Here the MiniWoB oracle answers the first request of every distinct prompt in a
batch: at a group's first turn its episodes' prompts are identical (one task instance), so
exactly one episode per group plays the oracle's reply, through the engine interface, on a
real capsule. Its verdict is a success; the others fail. After one strictly on-policy update,
the learner scores the oracle episode's reply tokens higher than before, and no episode was
quarantined.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cua_jax.observe.viewer import build_site
from cua_jax.rollout.engine import Generation, GenerationRequest, RolloutEngine, SamplingConfig
from cua_jax.rollout.oracle_engine import OracleDemonstrator
from cua_jax.train.batching import make_minibatches, process_images
from experiments.configs import default
from tests.support.trainer import start_trainer, tiny_config

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASK = "click-button"


class OracleForFirstOfEachPrompt(RolloutEngine):
    """Serves the first request of each distinct prompt in a batch with the oracle's reply, the
    rest with the policy's engine; remembers the oracle's replies."""

    def __init__(self, engine: RolloutEngine, oracle: OracleDemonstrator):
        self.engine = engine
        self.oracle = oracle
        self.oracle_replies: list[np.ndarray] = []

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        seen: set[bytes] = set()
        first = []
        for request in requests:
            key = request.prompt_ids.tobytes()
            first.append(key not in seen)
            seen.add(key)
        policy = self.engine.generate([r for r, f in zip(requests, first) if not f], sampling)
        oracle = self.oracle.generate([r for r, f in zip(requests, first) if f], sampling)
        self.oracle_replies.extend(g.token_ids for g in oracle)
        policy_iter, oracle_iter = iter(policy), iter(oracle)
        return [next(oracle_iter) if f else next(policy_iter) for f in first]

    def update_weights(self, params: Any, version: int) -> None:
        self.engine.update_weights(params, version)

    def health(self):
        return self.engine.health()


def adopt_learning_settings(config, recipe) -> None:
    """The recipe's loss, advantage and sampler sections and its learner's objective settings
    in `config` (sizes, tasks and the learning rate stay the test's)."""
    for section in ("loss", "advantage", "sampler"):
        config[section] = recipe[section].copy_and_resolve_references()
    for field in ("old_logprobs", "num_minibatches", "freeze_vision"):
        config.learner[field] = recipe.learner[field]


@pytest.mark.parametrize("recipe", ["tiny", "default"])
def test_a_successful_episode_per_group_raises_its_reply_logprob(tmp_path, recipe):
    """Under tiny.py's settings and under the main job's (default.py's loss, advantage and
    sampler settings: the update the main job makes)."""
    config = tiny_config(
        tmp_path,
        env__include_dom_text=True,
        env__action_space="elements",
        rollout__group_size=4,
        rollout__batch_tasks=1,
        rollout__max_new_tokens=48,
        rollout__prompt_style="compact",
        optimizer__learning_rate=1e-3,
    )
    if recipe == "default":
        adopt_learning_settings(config, default.get_config())
    config.env.tasks = ((TASK, 0),)
    config.loss.entropy_coef = 0.0  # only the verdicts move the policy
    config.train.trace_every = 1  # the step's traces for the viewer, with the learner's logprobs
    config.eval.num_traces = 2
    with start_trainer(config) as trainer:
        worker = trainer.workers[0]
        oracle = OracleDemonstrator(
            trainer.tokenizer, trainer.renderer.end_of_turn_id, TASK, reasoning=False, action_space="elements"
        )
        mixed = OracleForFirstOfEachPrompt(worker.train_loop.engine, oracle)
        worker.train_loop.engine = mixed
        before = jax.tree.map(jnp.copy, trainer.learner.params)
        metrics = trainer.train_step()
        assert not oracle.errors, oracle.errors
        assert metrics["quarantine/total"] == 0
        assert metrics["success/rate"] == pytest.approx(0.25)  # the oracle's episode, one of four
        assert metrics["groups/informative_fraction"] == 1.0 and metrics["advantage/abs_mean"] > 0

        batch = trainer.last_batch
        replies = {r.tobytes() for r in mixed.oracle_replies}
        chosen = [
            k
            for k, item in enumerate(batch.items)
            if np.asarray(item.ids)[np.asarray(item.loss_mask) != 0].tobytes() in replies
        ]
        assert len(chosen) == 1
        items = [batch.items[k] for k in chosen]
        assert batch.item_advantages[chosen[0]] > 0
        patches = process_images(items, batch.episodes, trainer.image_processor)
        micro = make_minibatches(
            items,
            batch.item_advantages[chosen],
            trainer.settings.batching,
            1,
            pixel_patches=patches,
            multimodal=trainer.multimodal,
        )[0][0]
        mask = np.asarray(micro.loss_mask) != 0
        logp_before = trainer.learner.score(micro, params=before)[mask]
        logp_after = trainer.learner.score(micro)[mask]
        assert logp_after.mean() > logp_before.mean(), (logp_before.mean(), logp_after.mean())

    # The step's traces: the success (pushed up) and a failure (pushed down), each turn with the
    # rollout's and the learner's pre-update logprobs; the policy's own samples agree with the
    # learner (the oracle's reply, logprob 0 from the engine, does not), and the viewer reads them.
    traces = [json.load(open(tmp_path / "traces" / "train_000000" / k / "trace.json")) for k in ("00", "01")]
    assert traces[0]["status"] == "success" and traces[1]["status"] != "success"
    assert traces[0]["advantage"] > 0
    # A failure is pushed down unless negative advantages are scaled to 0 (reward-weighted filtering).
    assert traces[1]["advantage"] < 0 if config.advantage.negative_scale > 0 else traces[1]["advantage"] == 0
    sampled = traces[1]["turns"][0]
    gap = np.abs(np.asarray(sampled["learner_logprobs"]) - np.asarray(sampled["rollout_logprobs"]))
    assert len(sampled["tokens"]) == len(sampled["rollout_logprobs"]) and gap.max() < 1e-3, gap.max()
    index = build_site([str(tmp_path)], str(tmp_path / "site"))
    assert "train_000000" in open(index).read()
