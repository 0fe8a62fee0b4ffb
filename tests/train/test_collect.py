"""The rollout side of a training step with fake rollout workers (no engine, no browser):
`GroupCollector` (draws, group seeds and ids, DAPO rounds, the sampler's statistics),
`run_on_workers` (round-robin over workers, results in request order) and `RolloutFeeder`
(async mode's threads: draw accounting, whole groups, staleness, errors, save and restore)."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from cua_jax.rollout.agent_loop import Rollout
from cua_jax.train.async_rollouts import RolloutFeeder
from cua_jax.train.buffer import RolloutGroup
from cua_jax.train.collect import GroupCollector, run_on_workers
from cua_jax.train.groups import draw_group_seeds
from cua_jax.train.settings import TrainSettings
from cua_jax.types import Episode, EpisodeStatus, TrainingItem, Turn
from experiments.configs import tiny

TASKS = ("click-button", "click-tab", "click-widget")


def fake_rollout(task: str, seed: int, group_id: int, k: int, success: bool, version: int = 0) -> Rollout:
    """A one-turn episode whose reply encodes (seed, k), so a group's episodes differ."""
    ids = np.asarray([seed % 1000, k], np.int32)
    turn = Turn("", [], ids, np.zeros(2, np.float32))
    episode = Episode(
        f"{task}/g{group_id}/e{k}",
        task,
        group_id,
        "do it",
        [turn],
        reward=float(success),
        status=EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILURE,
        policy_version=version,
    )
    item = TrainingItem(
        np.arange(4, dtype=np.int32),
        np.asarray([0, 0, 1, 1], np.int32),
        np.zeros(4, np.float32),
        [],
        episode.episode_id,
        group_id,
        (0,),
    )
    return Rollout(episode, [item])


class FakeWorker:
    """`run_groups` as a rollout worker answers it: n episodes per (task, seed, group id)
    request, the first `successes[task]` of them successes; every call is recorded."""

    def __init__(self, successes: dict[str, int]):
        self.successes = successes
        self.calls: list[tuple[list[tuple], int]] = []
        self.lock = threading.Lock()

    def run_groups(self, requests, n):
        with self.lock:
            self.calls.append((list(requests), n))
        return [
            [fake_rollout(task, seed, gid, k, k < self.successes.get(task, 0)) for k in range(n)]
            for task, seed, gid in requests
        ]


def collector_for(worker, **overrides) -> GroupCollector:
    config = tiny.get_config()
    config.env.tasks = tuple((task, 0) for task in TASKS)
    config.rollout.batch_tasks, config.rollout.group_size = 2, 4
    for key, value in overrides.items():
        section, name = key.split("__")
        config[section][name] = value
    settings = TrainSettings.from_config(config)
    pool = settings.catalog.pool(settings.domain_weights, settings.training_tasks)
    return GroupCollector(settings, jax.random.key(7), worker, pool)


def test_collect_draws_runs_and_counts_groups_as_a_function_of_the_step():
    worker = FakeWorker({"click-button": 1, "click-tab": 4, "click-widget": 0})
    collector = collector_for(worker)
    groups, extra = collector.collect(0)
    assert extra == {} and len(worker.calls) == 1
    requests, n = worker.calls[0]
    assert n == 4 and [g.group_id for g in groups] == [0, 1] and collector.next_group_id == 2
    # The seeds are the step's draw (fold_in(base key, step), split into task and seed keys).
    _, seed_key = jax.random.split(jax.random.fold_in(jax.random.key(7), 0))
    assert [seed for _, seed, _ in requests] == draw_group_seeds(seed_key, 2, (), collector.settings.env.train_seed_max)
    assert [g.task_id for g in groups] == [task for task, _, _ in requests] and len(set(g.task_id for g in groups)) == 2
    for group in groups:
        assert len(group.episodes) == 4 and set(group.items) == {e.episode_id for e in group.episodes}
    # The sampler saw the outcomes: its statistics count the attempts.
    assert collector.sampler.metrics() == collector.sampler_metrics
    attempts = collector.sampler.pool.attempts[collector.sampler.pool.indices_of([g.task_id for g in groups])]
    assert list(attempts) == [4, 4]
    # draw_requests(step) is what collect(step) runs; a second collector with the same key draws the same.
    again = FakeWorker(worker.successes)
    twin = collector_for(again)
    assert twin.draw_requests(0) == requests
    collector.collect(1)
    assert [gid for _, _, gid in worker.calls[1][0]] == [2, 3]


def test_dapo_rounds_keep_informative_groups_and_report_their_rounds():
    # click-tab always succeeds and click-widget never does: only click-button's groups carry signal.
    worker = FakeWorker({"click-button": 2, "click-tab": 4, "click-widget": 0})
    collector = collector_for(worker, train__dapo=True, train__dapo_max_rounds=4, rollout__batch_tasks=1)
    groups, extra = collector.collect(0)
    assert set(extra) == {"dapo/dropped_groups", "dapo/rounds", "dapo/missing_groups", "dapo/rollouts"}
    assert extra["dapo/rounds"] == len(worker.calls) >= 1
    assert extra["dapo/rollouts"] == sum(len(requests) * n for requests, n in worker.calls)
    kept = {g.task_id for g in groups}
    assert kept <= {"click-button"} and len(groups) + extra["dapo/missing_groups"] == 1
    drawn = [task for requests, _ in worker.calls for task, _, _ in requests]
    assert extra["dapo/dropped_groups"] == sum(task != "click-button" for task in drawn)


def test_dapo_repeat_tasks_keeps_several_groups_of_one_task_apart():
    # Only click-button carries signal, and the batch wants two groups: once every task has
    # run, the second group has to be click-button again, on new pages.
    worker = FakeWorker({"click-button": 2, "click-tab": 4, "click-widget": 0})
    collector = collector_for(
        worker, train__dapo=True, train__dapo_max_rounds=6, train__dapo_repeat_tasks=True, rollout__batch_tasks=2
    )
    groups, extra = collector.collect(0)
    drawn = [task for call, _ in worker.calls for task, _, _ in call]
    assert sorted(drawn[:3]) == sorted(TASKS)  # the pool is drawn out before a task repeats
    assert [g.task_id for g in groups] == ["click-button", "click-button"] and extra["dapo/missing_groups"] == 0
    requests = {gid: (task, seed) for call, _ in worker.calls for task, seed, gid in call}
    assert len(requests) == extra["dapo/rollouts"] / 4  # every group its own id
    assert groups[0].group_id != groups[1].group_id
    assert requests[groups[0].group_id][1] != requests[groups[1].group_id][1]  # new pages
    for group in groups:  # each kept group is the one its outcome came from
        assert all(e.group_id == group.group_id for e in group.episodes)


def test_run_on_workers_deals_requests_round_robin_and_keeps_their_order():
    workers = [FakeWorker({}) for _ in range(3)]
    requests = [(TASKS[k % 3], 100 + k, k) for k in range(7)]
    results = run_on_workers(workers, requests, 2)
    for w, worker in enumerate(workers):
        assert worker.calls == [(requests[w::3], 2)]
    assert [[r.episode.group_id for r in group] for group in results] == [[k, k] for k in range(7)]


# ------------------------------------------------------------------------------------
# RolloutFeeder
# ------------------------------------------------------------------------------------


class Versioned:
    """A `collect(draw, worker)` for the feeder: one group per draw, sampled at the policy
    version the test sets, recording the draws; `fail_at` raises at that draw."""

    def __init__(self, fail_at: int | None = None):
        self.version = 0
        self.draws: list[int] = []
        self.fail_at = fail_at
        self.lock = threading.Lock()

    def __call__(self, draw, worker):
        if draw == self.fail_at:
            raise ValueError(f"draw {draw} broke")
        with self.lock:
            self.draws.append(draw)
        rollouts = [fake_rollout(TASKS[draw % 3], draw, draw, k, k == 0, self.version) for k in range(2)]
        return [RolloutGroup(draw, TASKS[draw % 3], [r.episode for r in rollouts])], {}


def _accounted(feeder: RolloutFeeder, taken: list[int]) -> tuple[list[int], int]:
    """Every draw the feeder knows of (one group each here): taken by the learner, being
    collected, collected and waiting for room, or in the buffer; and its next draw number."""
    state = feeder.state_dict()
    draws = taken + state["unfinished_draws"] + [g.group_id for gs in state["waiting"].values() for g in gs]
    draws += [g.group_id for g in state["buffer"]]
    return sorted(draws), state["next_draw"]


def _wait_until_full(feeder: RolloutFeeder, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(feeder.buffer) < feeder.buffer.capacity:
        assert time.monotonic() < deadline, "the rollout thread did not fill the buffer"
        time.sleep(0.01)


def test_the_feeder_accounts_for_every_draw_and_hands_out_whole_groups():
    collect = Versioned()
    feeder = RolloutFeeder(staleness_window=1, capacity=2)
    feeder.start([object(), object()], collect)
    try:
        taken: list[int] = []
        for _ in range(3):
            groups, _ = feeder.take(2, version=0, timeout_s=30)
            assert all(len(g.episodes) == 2 for g in groups)  # whole groups
            taken += [g.group_id for g in groups]
        assert len(set(taken)) == 6  # no group handed out twice
    finally:
        feeder.stop()
    draws, next_draw = _accounted(feeder, taken)
    # Every draw number below next_draw is taken, buffered, waiting or being collected, once.
    assert draws == list(range(next_draw)) and set(taken) <= set(collect.draws)


def test_the_feeder_drops_groups_past_the_staleness_window_and_counts_them():
    collect = Versioned()
    feeder = RolloutFeeder(staleness_window=1, capacity=4)
    feeder.start([object()], collect)
    try:
        feeder.take(1, version=0, timeout_s=30)
        _wait_until_full(feeder)  # version-0 groups wait in the buffer
        collect.version = 3  # groups sampled from now on are fresh at version 3
        groups, _ = feeder.take(2, version=3, timeout_s=30)
    finally:
        feeder.stop()
    assert all(3 - g.policy_version <= 1 for g in groups)
    state = feeder.state_dict()
    assert state["dropped_stale_groups"] >= 1 and state["dropped_stale_episodes"] == 2 * state["dropped_stale_groups"]


def test_a_failed_rollout_thread_reaches_the_learner():
    feeder = RolloutFeeder(staleness_window=0, capacity=2)
    feeder.start([object()], Versioned(fail_at=0))
    try:
        with pytest.raises(RuntimeError, match="a rollout thread failed") as error:
            feeder.take(1, version=0, timeout_s=30)
        assert "draw 0 broke" in str(error.value.__cause__)
    finally:
        feeder.stop()


def test_a_restored_feeder_hands_out_the_saved_groups_first_and_loses_no_draw():
    collect = Versioned()
    feeder = RolloutFeeder(staleness_window=0, capacity=3)
    feeder.start([object()], collect)
    try:
        first, _ = feeder.take(1, version=0, timeout_s=30)
        _wait_until_full(feeder)  # then save between learner steps
        state = feeder.state_dict()
    finally:
        feeder.stop()
    saved = [g.group_id for g in state["buffer"]] + [g.group_id for gs in state["waiting"].values() for g in gs]
    assert saved and first[0].group_id not in saved
    restored = RolloutFeeder(staleness_window=0, capacity=3)
    restored.load_state_dict(state)
    again = Versioned()
    restored.start([object()], again)
    try:
        groups, _ = restored.take(len(saved), version=0, timeout_s=30)
    finally:
        restored.stop()
    assert [g.group_id for g in groups] == saved  # the saved groups come back first, in order
    # Unfinished draws are collected again before fresh ones; fresh draws continue the count.
    assert again.draws[: len(state["unfinished_draws"])] == state["unfinished_draws"]
    assert all(d >= state["next_draw"] for d in again.draws[len(state["unfinished_draws"]) :])
