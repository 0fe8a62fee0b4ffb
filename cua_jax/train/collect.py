"""One training step's rollout groups: task draws, group seeds and ids, runs on a rollout worker,
DTAC replay swaps and DAPO rounds, and the sampler's statistics (`GroupCollector`); the
workers' environment counters as per-update counts (`EnvironmentCounters`).

Every draw is a function of (the run's base key, the step), and group ids count up from the
collector's `next_group_id`, so a run restored with the sampler's state and these counters
collects what the uninterrupted run did. The collector is shared by async mode's rollout
threads: the sampler and the id counter sit behind one lock.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

import jax

from cua_jax.tasks.dynamic_sampling import collect_informative_groups
from cua_jax.tasks.pool import GroupOutcome, TaskPool
from cua_jax.tasks.sampler_interface import TaskSampler
from cua_jax.tasks.samplers import build_sampler
from cua_jax.train.coordinated import ProcessGroup, group_summary, partition_groups
from cua_jax.train.groups import CollectedGroup, draw_group_seeds, group_from_rollouts, group_outcome, swap_in_replay

# Calibration's rollouts draw their seeds from a stream of their own, apart from the steps'.
_CALIBRATION_STREAM = 1_000_003


def run_on_workers(workers: Sequence[Any], requests: Sequence[tuple], n: int) -> list[list[Any]]:
    """`run_groups(requests, n)` spread over `workers`: request k goes to worker k mod W, the
    workers run at once (one thread each); the results come back in request order."""
    if len(workers) == 1 or len(requests) <= 1:
        return workers[0].run_groups(list(requests), n)
    shares = [list(requests[w :: len(workers)]) for w in range(len(workers))]
    with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        results = list(pool.map(lambda pair: pair[0].run_groups(pair[1], n) if pair[1] else [], zip(workers, shares)))
    ordered: list[Any] = [None] * len(requests)
    for w, share in enumerate(results):
        for k, rollouts in enumerate(share):
            ordered[w + k * len(workers)] = rollouts
    return ordered


class EnvironmentCounters:
    """The rollout workers' environment counters (`environment_stats`: totals since each
    worker started, such as its capsule runtime's warm failures and crashes) as counts per
    update: `read` sums them over the workers and returns what each grew by since the
    previous read. Workers start with the run (a resumed one too), so both start from 0."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}

    def read(self, workers: Sequence[Any]) -> dict[str, float]:
        totals: collections.Counter[str] = collections.Counter()
        for worker in workers:
            totals.update(worker.environment_stats())
        counts = {name: float(total - self._totals.get(name, 0.0)) for name, total in totals.items()}
        self._totals = dict(totals)
        return counts


class GroupCollector:
    """Draws tasks with its `sampler` and runs their groups on rollout workers.

    settings: the run's `TrainSettings` (batch size, group size, training seeds, DTAC / DAPO,
    the sampler's kind and configs). base_key: the run's base PRNG key; step s draws with
    fold_in(base_key, s). default_worker: where calibration's rollouts and unassigned steps
    run. pool: the training tasks the sampler draws from; a calibrating sampler runs its
    rollouts through this collector (`run_outcome_groups`). draw_share: in a coordinated async
    run, this process's place among the processes: each draw (`draw_requests`, `collect`)
    yields only the groups `partition_groups` deals this process, numbered by the draw
    (group id = draw x rollout.batch_tasks + position), so the processes' ids never meet and a
    draw collected again after a resume has the same ids; the sampler sees this process's
    groups only.
    """

    def __init__(
        self,
        settings,
        base_key: jax.Array,
        default_worker: Any,
        pool: TaskPool,
        draw_share: ProcessGroup | None = None,
    ):
        self.settings = settings
        self.base_key = base_key
        self.default_worker = default_worker
        self.pool = pool
        kind = settings.sampler_kind
        self.sampler: TaskSampler = build_sampler(
            kind,
            pool,
            **{kind: settings.sampler_configs[kind]},
            calibration=settings.calibration,
            run_groups=self.run_outcome_groups if settings.calibration else None,
        )
        self.next_group_id = 0
        self.draw_share = draw_share
        # A coordinated run's processes (set by collect_share): calibration passes are split too.
        self._processes: ProcessGroup | None = None
        # Reentrant: under DAPO, collect() holds it across its rounds, whose group runs take it
        # again for group ids.
        self.lock = threading.RLock()
        # The sampler's metrics as of its last update, taken under the lock where the update
        # happens, so a learner step reads them without waiting on draws or calibration passes.
        self.sampler_metrics: dict[str, float] = {}

    def _group_seeds(self, key: jax.Array, count: int) -> list[int]:
        return draw_group_seeds(key, count, self.settings.env.train_seeds, self.settings.env.train_seed_max)

    def _numbered_requests(self, task_ids: Sequence[str], key: jax.Array) -> list[tuple[str, int, int]]:
        """(task id, page seed, group id) of each group of a draw: fresh group ids, seeds from `key`."""
        with self.lock:
            first = self.next_group_id
            self.next_group_id += len(task_ids)
        seeds = self._group_seeds(key, len(task_ids))
        return [(task_id, seed, first + k) for k, (task_id, seed) in enumerate(zip(task_ids, seeds))]

    def run_groups(self, worker: Any, task_ids: Sequence[str], key: jax.Array) -> list[CollectedGroup]:
        """One training group per task id on `worker` (or a list of workers: the groups dealt
        round-robin, all running at once), with fresh group ids and seeds from `key`."""
        requests = self._numbered_requests(task_ids, key)
        results = run_on_workers(
            worker if isinstance(worker, list) else [worker], requests, self.settings.rollout.group_size
        )
        return [group_from_rollouts(gid, task_id, rollouts) for (task_id, _, gid), rollouts in zip(requests, results)]

    def draw_requests(self, step: int) -> list[tuple[str, int, int]]:
        """Step `step`'s draw without running it: (task id, seed, group id) per group, as
        `collect` runs them (asynchronous streaming submits them one group at a time); with a
        `draw_share`, this process's groups of the draw only, numbered by the draw."""
        draw_key, seed_key = jax.random.split(jax.random.fold_in(self.base_key, step))
        with self.lock:
            task_ids = self.sampler.sample(draw_key, self.settings.rollout.batch_tasks)
            if self.draw_share is None:
                first = self.next_group_id
                self.next_group_id += len(task_ids)
        if self.draw_share is not None:
            first = step * self.settings.rollout.batch_tasks
        requests = [
            (task_id, seed, first + k)
            for k, (task_id, seed) in enumerate(zip(task_ids, self._group_seeds(seed_key, len(task_ids))))
        ]
        if self.draw_share is None:
            return requests
        owners = partition_groups([self.group_cost(task_id) for task_id in task_ids], self.draw_share.count)
        return [request for request, owner in zip(requests, owners) if owner == self.draw_share.index]

    def finish_group(self, request: tuple[str, int, int], rollouts: Sequence[Any]) -> CollectedGroup:
        """A streamed group's rollouts as a CollectedGroup, with its DTAC replay swap and the
        sampler's statistics updated."""
        task_id, _, group_id = request
        group = group_from_rollouts(group_id, task_id, rollouts)
        outcome = group_outcome(group, self.settings.sampler_kind == "dtac")
        with self.lock:
            for replay in self.sampler.assign_replays([outcome]):
                swap_in_replay(group, replay.trajectory)
            self.sampler.update([outcome])
            self.sampler_metrics = self.sampler.metrics()
        return group

    def run_outcome_groups(self, task_ids: Sequence[str], group_size: int) -> list[GroupOutcome]:
        """Calibration's rollouts (`RunGroups`): groups of `group_size`, outcomes only."""
        key = jax.random.fold_in(jax.random.fold_in(self.base_key, _CALIBRATION_STREAM), self.sampler.step)
        requests = [
            (task_id, seed, -1 - k)
            for k, (task_id, seed) in enumerate(zip(task_ids, self._group_seeds(key, len(task_ids))))
        ]
        processes = self._processes
        owners = partition_groups([float(group_size)] * len(requests), 1 if processes is None else processes.count)
        mine = [r for r, owner in zip(requests, owners) if processes is None or owner == processes.index]
        results = self.default_worker.run_groups(mine, group_size) if mine else []
        outcomes = [
            group_outcome(group_from_rollouts(gid, task_id, rollouts), keep_success=False)
            for (task_id, _, gid), rollouts in zip(mine, results)
        ]
        if processes is None:
            return outcomes
        # A coordinated run's pass is split like a step's groups; every process gets every outcome.
        shares = [iter(share) for share in processes.exchange(outcomes)]
        return [next(shares[owner]) for owner in owners]

    def collect(self, step: int, worker: Any = None) -> tuple[list[CollectedGroup], dict[str, float]]:
        """Step `step`'s rollout groups: draw, run, replay; the sampler's statistics are updated.
        Returns the groups and the step's DAPO metrics (none without DAPO)."""
        worker = worker or self.default_worker
        draw_key, seed_key = jax.random.split(jax.random.fold_in(self.base_key, step))
        keep_success = self.settings.sampler_kind == "dtac"
        batch_tasks, n = self.settings.rollout.batch_tasks, self.settings.rollout.group_size
        if self.settings.dynamic is not None:
            # Each outcome with its group, matched by identity: with dapo_repeat_tasks a task runs
            # more than one group, so its id does not name one.
            ran: list[tuple[GroupOutcome, CollectedGroup]] = []
            rounds = [0]

            def run_round(task_ids, group_size):
                rounds[0] += 1
                groups = self.run_groups(worker, task_ids, jax.random.fold_in(seed_key, rounds[0]))
                outcomes = [group_outcome(g, keep_success) for g in groups]
                ran.extend(zip(outcomes, groups))
                return outcomes

            with self.lock:
                dynamic = collect_informative_groups(
                    draw_key, self.sampler, run_round, batch_tasks, n, self.settings.dynamic
                )
                self.sampler_metrics = self.sampler.metrics()
            groups = [next(g for outcome, g in ran if outcome is o) for o in dynamic.groups]
            for replay in dynamic.replays:
                swap_in_replay(groups[replay.group_index], replay.trajectory)
            extra = {
                "dapo/dropped_groups": float(len(dynamic.dropped)),
                "dapo/rounds": float(dynamic.rounds),
                "dapo/missing_groups": float(dynamic.missing),
                "dapo/rollouts": float(dynamic.rollouts),
            }
            return groups, extra
        requests = self.draw_requests(step)
        results = run_on_workers(worker if isinstance(worker, list) else [worker], requests, n) if requests else []
        groups = [group_from_rollouts(gid, task_id, rollouts) for (task_id, _, gid), rollouts in zip(requests, results)]
        outcomes = [group_outcome(g, keep_success) for g in groups]
        with self.lock:
            for replay in self.sampler.assign_replays(outcomes):
                swap_in_replay(groups[replay.group_index], replay.trajectory)
            self.sampler.update(outcomes)
            self.sampler_metrics = self.sampler.metrics()
        return groups, {}

    def group_cost(self, task_id: str) -> float:
        """A group's expected cost, for dealing a draw's groups to processes: its episodes times
        their turn budget (rollout.group_size x rollout.max_turns, the same for every task today)."""
        del task_id
        return float(self.settings.rollout.group_size * self.settings.rollout.max_turns)

    def _run_share(
        self, worker: Any, task_ids: Sequence[str], key: jax.Array, processes: ProcessGroup
    ) -> tuple[dict[int, CollectedGroup], list[CollectedGroup], list[GroupOutcome]]:
        """`run_groups` split across processes: the groups numbered and seeded as `run_groups`
        does, dealt by `partition_groups`, this process's run on `worker`, then every group's
        summary and outcome exchanged. Returns (this process's groups by position, every group's
        summary, every group's outcome), the last two in order."""
        requests = self._numbered_requests(task_ids, key)
        owners = partition_groups([self.group_cost(task_id) for task_id in task_ids], processes.count)
        positions = [k for k, owner in enumerate(owners) if owner == processes.index]
        mine = [requests[k] for k in positions]
        workers = worker if isinstance(worker, list) else [worker]
        results = run_on_workers(workers, mine, self.settings.rollout.group_size) if mine else []
        local = [group_from_rollouts(gid, task_id, rollouts) for (task_id, _, gid), rollouts in zip(mine, results)]
        keep_success = self.settings.sampler_kind == "dtac"
        shares = [
            iter(share)
            for share in processes.exchange([(group_summary(g), group_outcome(g, keep_success)) for g in local])
        ]
        pairs = [next(shares[owner]) for owner in owners]
        return dict(zip(positions, local)), [summary for summary, _ in pairs], [outcome for _, outcome in pairs]

    def collect_share(
        self, step: int, worker: Any, processes: ProcessGroup
    ) -> tuple[list[CollectedGroup], list[CollectedGroup], dict[str, float]]:
        """Coordinated collection (config.train.coordinated): step `step`'s draw, as `collect`
        draws it on every process, dealt to the processes by `partition_groups`; this process
        runs its own groups on `worker` (or a list of workers). The processes then exchange
        their groups' summaries (`group_summary`) and outcomes, and every process updates its
        sampler with every group's outcome, in draw order, so the next draw is the same
        everywhere. DTAC: the outcomes carry each process's successes, so every sampler caches
        the same ones and assigns the same replays, swapped into each group by its owner (and by
        every process into the summaries). DAPO: every round is split so, and every process
        keeps the same groups.

        Returns (this process's groups, every group's summary, the step's DAPO metrics), the
        groups in the step's order. Collective: every process calls it for the same steps."""
        worker = worker or self.default_worker
        self._processes = processes
        draw_key, seed_key = jax.random.split(jax.random.fold_in(self.base_key, step))
        if self.settings.dynamic is not None:
            ran: list[tuple[GroupOutcome, CollectedGroup, CollectedGroup | None]] = []
            rounds = [0]

            def run_round(task_ids, group_size):
                rounds[0] += 1
                own, summaries, outcomes = self._run_share(
                    worker, task_ids, jax.random.fold_in(seed_key, rounds[0]), processes
                )
                ran.extend((o, summary, own.get(k)) for k, (o, summary) in enumerate(zip(outcomes, summaries)))
                return outcomes

            with self.lock:
                dynamic = collect_informative_groups(
                    draw_key,
                    self.sampler,
                    run_round,
                    self.settings.rollout.batch_tasks,
                    self.settings.rollout.group_size,
                    self.settings.dynamic,
                )
                self.sampler_metrics = self.sampler.metrics()
            kept = [next((summary, own) for outcome, summary, own in ran if outcome is o) for o in dynamic.groups]
            groups = [summary for summary, _ in kept]
            for replay in dynamic.replays:
                k = replay.group_index
                if kept[k][1] is not None:
                    swap_in_replay(kept[k][1], replay.trajectory)
                groups[k] = group_summary(groups[k])  # a copy of its own: the exchange may share objects
                swap_in_replay(groups[k], replay.trajectory)
            extra = {
                "dapo/dropped_groups": float(len(dynamic.dropped)),
                "dapo/rounds": float(dynamic.rounds),
                "dapo/missing_groups": float(dynamic.missing),
                "dapo/rollouts": float(dynamic.rollouts),
            }
            return [own for _, own in kept if own is not None], groups, extra
        with self.lock:
            task_ids = self.sampler.sample(draw_key, self.settings.rollout.batch_tasks)  # calibration: collective
        own, groups, outcomes = self._run_share(worker, task_ids, seed_key, processes)
        with self.lock:
            for replay in self.sampler.assign_replays(outcomes):
                k = replay.group_index
                if k in own:
                    swap_in_replay(own[k], replay.trajectory)
                groups[k] = group_summary(groups[k])  # a copy of its own: the exchange may share objects
                swap_in_replay(groups[k], replay.trajectory)
            self.sampler.update(outcomes)
            self.sampler_metrics = self.sampler.metrics()
        return [own[k] for k in sorted(own)], groups, {}
