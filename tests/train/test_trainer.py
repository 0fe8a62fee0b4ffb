"""The trainer end to end on real MiniWoB++ capsules (system Chromium) with a tiny random Qwen3-VL.

One on-policy trainer is shared by the on-policy, fault and resume tests (compiling a learner
is the expensive part); the asynchronous trainer has its own. A tiny random policy never
completes a task, so every episode ends NO_VERDICT and advantages are 0: an entropy bonus
keeps the gradient non-zero, so a resume that lost the parameters or the optimizer state
would show in the metrics.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time

import jax
import numpy as np
import pytest
from flax import nnx

from cua_jax.types import EpisodeStatus
from tests.support.faults import CapsuleClosingEnvironment, FaultSwitch
from tests.support.trainer import replayed_metrics, start_trainer, tiny_config

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def on_policy(tmp_path_factory):
    switch = FaultSwitch()

    def wrap(env):
        return CapsuleClosingEnvironment(env, switch)

    # Its evaluations run at YaRN 2 (eval.rope_scaling): training, and so the on-policy tests,
    # keep the model's own rope; a one-turn budget keeps the evaluation test short. Training
    # samples with per-turn seeds (rollout.seed_per_turn), the setting multi-host runs rely on.
    config = tiny_config(
        tmp_path_factory.mktemp("on_policy"), eval__rope_scaling=2.0, eval__max_turns=1, rollout__seed_per_turn=True
    )
    trainer = start_trainer(config, env_wrapper=wrap)
    try:
        yield trainer, switch
    finally:
        trainer.close()


def test_on_policy_step_has_ratio_one_and_no_clipping(on_policy):
    trainer, _ = on_policy
    metrics = trainer.train_step()
    assert math.isfinite(metrics["learner/loss"])
    assert metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == metrics["learner/ratio_mean"] == 1.0
    assert metrics["learner/clipfrac"] == 0.0 and metrics["learner/ppo_kl"] == 0.0
    assert metrics["learner/updates"] == 1.0 and metrics["learner/num_tokens"] > 0
    assert metrics["episodes/trained"] == 4 and metrics["policy/version"] == 1
    assert metrics["quarantine/total"] == 0  # the normal path loses no episode
    assert trainer.workers[0].engine.health().policy_version == 1
    # The defaults share work in the sampler: a group's rows decoded over their prompt held once
    # (rollout.shared_prefix_attention), and what they sampled is what the learner scores.
    stats = trainer.workers[0].engine_stats()
    assert stats["shared_prefix_rows"] >= 2 * stats["shared_prefixes"] > 0, stats
    assert metrics["learner/rollout_logprob_gap_max"] < 1e-3
    for key in (
        "groups/informative_fraction",
        "groups/all_pass_fraction",
        "groups/all_fail_fraction",
        "learner/grad_norm",
        "learner/entropy",
        "learner/ref_kl",
        "learner/rollout_logprob_gap",
        "learner/rollout_logprob_gap_p99",
        "learner/rollout_logprob_gap_max",
        "learner/tis_weight_mean",
        "episode/response_tokens",
        "episode/items",
        "time/rollout_s",
        "time/learn_s",
        "time/sync_s",
        "sampler/active_tasks",
        "sampler/pass_rate_mean",
    ):
        assert math.isfinite(metrics[key]), key
    assert metrics["learner/grad_norm"] > 0  # the entropy bonus moves the policy


def test_injected_fault_quarantines_one_episode_out_of_its_group(on_policy):
    trainer, switch = on_policy
    switch.arm()
    metrics = trainer.train_step()
    batch = trainer.last_batch
    assert all(e.status is not EpisodeStatus.QUARANTINED for e in batch.episodes.values())
    assert metrics["quarantine/total"] == 1 and metrics["quarantine/server_unresponsive"] == 1
    assert metrics["episodes/total"] == 4 and metrics["episodes/trained"] == 3
    group_sizes = sorted(len(ids) for ids in batch.kept_groups.values())
    assert group_sizes == [1, 2]
    kept_ids = {i for ids in batch.kept_groups.values() for i in ids}
    assert {item.episode_id for item in batch.items} == kept_ids
    assert sum(trainer.last_minibatch_item_counts) == len(batch.items)
    assert batch.quarantined and all(r.startswith("server unresponsive") for r in batch.quarantined.values())


def test_resumed_run_reproduces_the_metrics_exactly(on_policy):
    trainer, _ = on_policy
    trainer.save()
    saved_step = trainer.step
    first = trainer.train_step()
    params_first = jax.tree.map(np.asarray, trainer.learner.train_state()["params"])
    assert trainer.restore() and trainer.step == saved_step
    second = trainer.train_step()
    assert replayed_metrics(second) == replayed_metrics(first)
    # The config's env.capsules.episodes_per_page reaches the workers' capsules: the step's
    # resets began in the pages their environments held.
    assert first["capsules/page_restarts"] > 0 and second["capsules/page_restarts"] > 0
    for a, b in zip(jax.tree.leaves(params_first), jax.tree.leaves(trainer.learner.train_state()["params"])):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_per_turn_training_seeds_sample_a_group_alone_as_in_its_batch(on_policy):
    """rollout.seed_per_turn reaches the training agent: each request samples from
    turn_sampling_seed(config.seed, episode id, page seed, turn), so a group run alone draws the
    tokens it drew batched with the step's other groups (whichever worker or host runs it)."""
    trainer, _ = on_policy
    agent = trainer.workers[0].train_loop.config
    assert agent.seed_per_turn and agent.seed == trainer.settings.config_dict["seed"]
    worker, n = trainer.workers[0], trainer.settings.rollout.group_size
    # Requests of its own (task, page seed, group id), so the collector's draws and ids are untouched.
    requests = [(task, 500 + k, 10_000 + k) for k, task in enumerate(trainer.collector.pool.task_ids)]
    assert len(requests) >= 2
    batched = worker.run_groups(requests, n)
    alone = worker.run_groups(requests[1:2], n)[0]
    assert [r.episode.episode_id for r in alone] == [r.episode.episode_id for r in batched[1]]
    for together, single in zip(batched[1], alone, strict=True):
        assert len(together.episode.turns) == len(single.episode.turns)
        for a, b in zip(together.episode.turns, single.episode.turns):
            np.testing.assert_array_equal(a.response_ids, b.response_ids)
            np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=1e-5, rtol=0)
    # The group's episodes still sample differently from each other.
    first_replies = {tuple(r.episode.turns[0].response_ids) for r in alone}
    assert len(first_replies) > 1


def _wait_for(predicate, what, limit_s=600.0):
    """Blocks until predicate() holds (a readiness wait, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.2)


def _assert_whole_groups(trainer):
    batch = trainer.last_batch
    items_per_group = collections.Counter(item.group_id for item in batch.items)
    plan = batch.minibatch_groups
    assert len(plan) == 2
    flat = [g for mb in plan for g in mb]
    assert len(flat) == len(set(flat)) and set(flat) == set(items_per_group)
    # Each mini-batch that reached the learner holds exactly the items of its whole groups.
    assert trainer.last_minibatch_item_counts == [sum(items_per_group[g] for g in mb) for mb in plan]


def test_a_checkpoint_of_another_seed_or_worker_count_is_refused_before_anything_changes(on_policy):
    trainer, _ = on_policy
    state = trainer.trainer_state()
    assert state.step == trainer.step and state.version == trainer.version
    for bad, message in (
        (dataclasses.replace(state, base_key=state.base_key + 1), "config.seed"),
        (dataclasses.replace(state, engine_sampling=state.engine_sampling * 2), "config.rollout.num_workers"),
    ):
        with pytest.raises(ValueError, match=message):
            trainer.load_trainer_state(trainer.learner.train_state(), bad)
    assert trainer.trainer_state().step == state.step and trainer.version == state.version


def test_held_out_evaluation_runs_the_policy_under_yarn_on_the_engines_weights(on_policy):
    """config.eval.rope_scaling reaches the engine through the harness: the evaluation sampled a
    YaRN view of the worker's model (same arrays), and the model itself keeps its rope."""
    trainer, _ = on_policy
    trainer.settings = dataclasses.replace(
        trainer.settings, eval=dataclasses.replace(trainer.settings.eval, num_seeds=1)
    )
    engine = trainer.workers[0].engine.engine  # the JAX sampler behind the canonical-order wrapper
    assert engine.scaled_models == {}  # training never asks for it
    result = trainer.evaluate("yarn")
    assert result["episodes"] + result["given_up"] == 2
    view = engine.scaled_models[2.0]
    assert view.config.text.rope.rope_type == "yarn" and view.config.text.rope.factor == 2.0
    assert view.config.text.rope.original_max_position_embeddings == engine.model.config.text.max_position_embeddings
    assert engine.model.config.text.rope.rope_type == "default"
    assert all(a is b for a, b in zip(jax.tree.leaves(nnx.state(engine.model)), jax.tree.leaves(nnx.state(view))))


def test_on_policy_mode_runs_sequential_minibatch_updates_with_a_live_ratio(tmp_path):
    """CANOPY App. D's control: two sequential updates of whole groups on one freshly collected
    batch, no asynchrony. The first update's ratio is 1; the second's is live against the
    sampling policy's recomputed logprobs, so the step's extrema leave 1."""
    config = tiny_config(tmp_path, learner__num_minibatches=2, learner__old_logprobs="recompute")
    with start_trainer(config) as trainer:
        metrics = trainer.train_step()
        _assert_whole_groups(trainer)
    assert metrics["learner/updates"] == 2 and metrics["policy/version"] == 1
    assert metrics["learner/ratio_min"] < 1.0 < metrics["learner/ratio_max"]
    assert metrics["episodes/trained"] == 4 and math.isfinite(metrics["learner/loss"])


def _calibrate_during_a_rollout(trainer):
    """Starts the rollout threads, waits until one runs groups on the calibration worker, and
    runs a calibration pass there meanwhile (the call EvoCUA's periodic calibration makes from
    whichever thread draws). Returns (its outcomes, whether a rollout was in flight on that
    worker when it was called, every rollout call's (start, end))."""
    import threading

    worker, real = trainer.collector.default_worker, trainer.collector.default_worker.run_groups
    state = {"active": 0, "overlapped": None, "spans": []}
    lock = threading.Lock()

    def recording(requests, n, evaluation=False):
        calibrating = all(group_id < 0 for _, _, group_id in requests)  # calibration's ids are negative
        with lock:
            if calibrating:
                state["overlapped"] = state["active"] > 0
            else:
                state["active"] += 1
        start = time.monotonic()
        try:
            return real(requests, n, evaluation)
        finally:
            if not calibrating:
                with lock:
                    state["active"] -= 1
                    state["spans"].append((start, time.monotonic()))

    worker.run_groups = recording
    trainer.start_rollouts()
    _wait_for(lambda: state["active"] > 0, "a rollout on the calibration worker")
    tasks = list(trainer.settings.miniwob_tasks)
    outcomes = trainer.collector.run_outcome_groups(tasks, 2)
    return outcomes, state["overlapped"], state["spans"], tasks


def test_async_mode_drops_stale_groups_and_keeps_groups_whole(tmp_path):
    config = tiny_config(
        tmp_path,
        train__mode="async",
        train__staleness_window=1,
        train__buffer_groups=6,
        learner__num_minibatches=2,
        learner__old_logprobs="rollout",
        loss__kl_coef=0.0,
    )
    with start_trainer(config) as trainer:
        calibration = _calibrate_during_a_rollout(trainer)
        # Rollouts run ahead until the buffer is full: 6 groups of version 0.
        _wait_for(lambda: len(trainer.buffer) == trainer.buffer.capacity, "a full rollout buffer")
        steps = []
        for _ in range(3):
            steps.append(trainer.async_step())
            _assert_whole_groups(trainer)
        trainer.stop_rollouts()
    first, second, third = steps
    assert first["buffer/dropped_stale_groups"] == 0 and first["policy/lag_max"] == 0
    assert second["policy/lag_max"] <= 1
    # At version 2 the version-0 groups left in the buffer are older than the window: dropped, counted.
    assert third["buffer/dropped_stale_groups"] >= 2
    assert third["buffer/dropped_stale_episodes"] == 2 * third["buffer/dropped_stale_groups"]
    assert third["policy/lag_max"] <= 1 and third["policy/version"] == 3
    for metrics in steps:
        assert metrics["learner/updates"] == 2 and math.isfinite(metrics["learner/loss"])
        assert metrics["episodes/trained"] == 4
    # Calibration beside the rollout threads (EvoCUA's async recipe): called while a rollout ran
    # on the same worker, it waited for it (the worker runs one call at a time) and came back
    # whole, and the rollouts went on around it.
    outcomes, overlapped, spans, tasks = calibration
    assert overlapped
    assert [o.task_id for o in outcomes] == tasks and all(o.attempts == 2 for o in outcomes)
    assert len(spans) >= 2


def test_dapo_step_draws_again_and_skips_an_uninformative_batch(tmp_path):
    """DAPO dynamic sampling through the trainer: the random policy's groups are all
    uninformative, so each round's group is dropped (counted), the second round draws the
    other task, the third (train.dapo_repeat_tasks) one of the two again, and the step trains
    on nothing. (collect() holds the sampler lock across rounds that take it again: this once
    deadlocked.)"""
    import threading

    config = tiny_config(
        tmp_path, train__dapo=True, train__dapo_max_rounds=3, train__dapo_repeat_tasks=True, rollout__batch_tasks=1
    )
    with start_trainer(config) as trainer:
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(trainer.train_step()), daemon=True)
        thread.start()
        thread.join(timeout=600)
        assert not thread.is_alive(), "a DAPO training step did not finish"
    assert result["dapo/rounds"] == 3 and result["dapo/dropped_groups"] == 3
    assert result["dapo/missing_groups"] == 1 and result["learner/skipped"] == 1.0


def _trained_episodes(workdir, steps):
    from cua_jax.observe.episode_log import read_episode_log

    return {r.episode_id for r in read_episode_log(workdir / "episodes.jsonl") if r.step in steps}


def test_async_run_resumes_with_no_episode_lost_or_trained_twice(tmp_path):
    """An asynchronous run streaming its rollouts (4 episodes in flight), with partial rollouts
    and AReaL's decoupled objective, checkpointed while its rollout threads run and then stopped
    (as a kill would); the resumed run puts the saved groups back first, in order, starts the
    groups that were running again, and trains every saved episode once."""
    config = tiny_config(
        tmp_path,
        train__mode="async",
        train__staleness_window=8,
        train__buffer_groups=3,
        learner__old_logprobs="recompute",
        loss__surrogate="decoupled",
        loss__tis_cap=5.0,
        loss__kl_coef=0.0,
        rollout__partial_rollout_tokens=4,
        rollout__max_episodes_in_flight=4,
    )
    with start_trainer(config) as trainer:
        trainer.start_rollouts()
        _wait_for(lambda: len(trainer.buffer) == trainer.buffer.capacity, "a full rollout buffer")
        first = trainer.async_step()
        assert math.isfinite(first["learner/loss"]) and "learner/tis_capped_frac" in first
        # Replies of 8 tokens grow 4 at a time (partial rollouts), each segment's version recorded.
        turn = next(iter(trainer.last_batch.episodes.values())).turns[0]
        assert turn.info["version_segments"][0][0] == 0 and len(turn.response_ids) <= 8
        trainer.save()
    before = _trained_episodes(tmp_path, {0})
    assert len(before) == 4

    with start_trainer(config) as resumed:
        assert resumed.restore() and resumed.step == 1
        saved = resumed._restored_rollouts
        saved_groups = saved["buffer"] + [g for groups in saved["waiting"].values() for g in groups]
        saved_ids = [e.episode_id for g in saved_groups for e in g.episodes]
        assert saved_groups and not set(saved_ids) & before  # nothing taken is saved again
        assert len(saved_ids) == len(set(saved_ids))  # nor saved twice (buffer and waiting)
        drawn = saved["next_draw"]
        resumed.start_rollouts()
        resumed.async_step()
        # The saved buffer's oldest groups train first, whole (a batch takes 2 groups).
        assert {e.episode_id for g in saved_groups[:2] for e in g.episodes} == _trained_episodes(tmp_path, {1})
        while not set(saved_ids) <= _trained_episodes(tmp_path, set(range(1, resumed.step))):
            assert resumed.step < 6, "saved groups were lost"
            resumed.async_step()
        # The groups still running at the save were started again (same requests: same group
        # ids, so the same episode ids), and trained, once.
        redone = {
            f"{task}/g{group_id}/e{i}"
            for _, (task, _, group_id) in saved["unfinished_requests"]
            for i in range(config.rollout.group_size)
        }
        while not redone <= _trained_episodes(tmp_path, set(range(1, resumed.step))):
            assert resumed.step < 8, "the groups running at the save were lost"
            resumed.async_step()
        assert min(resumed.feeder.collected, default=drawn) >= min(
            [drawn] + [d for d, _ in saved["unfinished_requests"]]
        )
        resumed.stop_rollouts()
    after = _trained_episodes(tmp_path, set(range(1, 10)))
    assert not after & before  # no episode trained twice
