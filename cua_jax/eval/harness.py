"""The evaluation harness: k samples of every task x seed of a suite, resumable, with tables.

    summary = evaluate(workers, policy, suite, seeds, k=4, out="evals/run")

Each (task, seed) is a problem; its k samples are one group of k episodes on the evaluation
agent loop (`RolloutWorker.run_groups(..., evaluation=True)`), the groups spread over the
workers given (one thread per worker, one group at a time each). As each group finishes,
one JSON line per episode goes to <out>/results.jsonl, so a killed run started again skips
every (task, seed, sample) already scored and runs only the rest.

Quarantined episodes (infrastructure faults, `EpisodeStatus.QUARANTINED`) are recorded and
counted apart; their samples are run again, up to `max_reruns` times each, and a sample
still quarantined after that is given up (counted apart, never scored).

Tables (per task, per domain and overall; `tables`): mean@k, pass@k, best@k (`passk`,
averaged over the problems; a problem with fewer than k scored samples n uses k = n), the
success rate over scored episodes with its Wilson interval, the quarantined episodes and the
given-up samples; written as <out>/results.md, tasks.csv, domains.csv and summary.json.

`sweep` runs one evaluation per turn budget x temperature, each in its own subfolder
(CANOPY's budget transfer: 15, 50, 100 turns).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cua_jax.eval.intervals import wilson_interval
from cua_jax.eval.passk import problem_metrics
from cua_jax.types import EpisodeStatus

RESULTS_FILE = "results.jsonl"
TABLE_COLUMNS = (
    "problems",
    "episodes",
    "successes",
    "success_rate",
    "ci_low",
    "ci_high",
    "mean@k",
    "pass@k",
    "best@k",
    "quarantined",
    "given_up",
)


# ------------------------------------------------------------------------------------
# The results file
# ------------------------------------------------------------------------------------


def read_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a results file ([] when absent). A last line cut short by a kill is
    dropped; a broken line before the last is an error naming the file and line."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if any(rest.strip() for rest in lines[number:]):
                raise ValueError(f"{path}: line {number} is not a JSON record") from None
    return records


def _episode_record(episode, task: str, domain: str, seed: int, sample: int, attempt: int) -> dict[str, Any]:
    return {
        "task": task,
        "domain": domain,
        "seed": int(seed),
        "sample": int(sample),
        "attempt": int(attempt),
        "status": episode.status.value,
        "success": episode.status is EpisodeStatus.SUCCESS,
        "reward": float(episode.reward),
        "turns": episode.num_turns,
        "valid_actions": sum(turn.action is not None for turn in episode.turns),
        "quarantine_reason": episode.quarantine_reason,
        "episode_id": episode.episode_id,
    }


@dataclasses.dataclass(frozen=True)
class Job:
    """One group to run: `samples` (indices in [0, k)) of (task, seed); `round` counts its
    reruns (0: first run), which keeps its group id apart from earlier rounds'."""

    task: str
    seed: int
    samples: tuple[int, ...]
    round: int = 0


def pending_jobs(
    records: Iterable[Mapping[str, Any]], tasks: Sequence[str], seeds: Sequence[int], k: int, max_reruns: int
) -> list[Job]:
    """The groups still to run: per (task, seed), the samples with no scored record whose
    quarantined attempts do not exceed max_reruns, grouped by how many times they ran."""
    scored, attempts = set(), collections.Counter()
    for r in records:
        key = (r["task"], r["seed"], r["sample"])
        if r["status"] == EpisodeStatus.QUARANTINED.value:
            attempts[key] += 1
        else:
            scored.add(key)
    jobs = []
    for task in tasks:
        for seed in seeds:
            by_round = collections.defaultdict(list)
            for sample in range(k):
                key = (task, seed, sample)
                if key not in scored and attempts[key] <= max_reruns:
                    by_round[attempts[key]].append(sample)
            jobs.extend(Job(task, seed, tuple(s), rnd) for rnd, s in sorted(by_round.items()))
    return jobs


def group_id(tasks: Sequence[str], seeds: Sequence[int], job: Job) -> int:
    """Negative (apart from training's), one per (task, seed, round), the same in every run."""
    problems = len(tasks) * len(seeds)
    return -(1 + tasks.index(job.task) * len(seeds) + list(seeds).index(job.seed) + job.round * problems)


# ------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------


def _take_jobs(pending: collections.deque, limit: int) -> list[Job]:
    """Up to `limit` jobs off the front of `pending` with as many samples as the first (one
    `run_groups` call runs groups of one size)."""
    first = pending.popleft()
    taken, rest = [first], []
    while pending and len(taken) < limit:
        job = pending.popleft()
        (taken if len(job.samples) == len(first.samples) else rest).append(job)
    pending.extendleft(reversed(rest))
    return taken


def run_jobs(
    workers: Sequence[Any],
    policy: Any,
    jobs: Sequence[Job],
    tasks: Sequence[str],
    seeds: Sequence[int],
    domains: Mapping[str, str],
    results_path: str | os.PathLike,
    max_reruns: int,
    progress: bool = True,
    groups_per_call: int = 1,
    on_group: Callable[[Job, Sequence[Any]], None] | None = None,
    temperature: float | None = None,
) -> None:
    """Runs `jobs` over the workers (one thread each, each taking up to `groups_per_call`
    groups per call, so a worker batches generation across them), appending each finished
    episode's record to `results_path`; quarantined samples go back in the queue until they
    have run max_reruns + 1 times. `on_group(job, rollouts)` sees every finished group. The
    first error of any worker stops the others and is raised. `temperature` replaces the
    workers' evaluation temperature (None: their own).

    A policy that must be told its task (`policy.per_task`, the oracle) runs one group per call."""
    from tqdm import tqdm

    if groups_per_call < 1:
        raise ValueError(f"groups_per_call must be >= 1, got {groups_per_call}")
    if getattr(policy, "per_task", False):
        groups_per_call = 1
    pending: collections.deque[Job] = collections.deque(jobs)
    running = [0]  # calls in flight: a rerun may still join the queue while any runs
    changed = threading.Condition()
    errors: list[BaseException] = []
    bar = tqdm(total=sum(len(j.samples) for j in jobs), unit="episode", disable=not progress, desc="evaluation")

    def serve(worker):
        while True:
            with changed:
                while not pending and running[0] and not errors:
                    changed.wait()
                if not pending or errors:
                    return
                batch = _take_jobs(pending, groups_per_call)
                running[0] += 1
            again = []
            try:
                again = run_batch(worker, batch)
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                errors.append(error)
            finally:
                with changed:
                    pending.extend(again)
                    running[0] -= 1
                    changed.notify_all()

    override = {} if temperature is None else {"temperature": temperature}

    def run_batch(worker, batch: list[Job]) -> list[Job]:
        policy.bind(worker, batch[0].task)
        results = worker.run_groups(
            [(job.task, job.seed, group_id(tasks, seeds, job)) for job in batch],
            len(batch[0].samples),
            evaluation=True,
            **override,
        )
        again = []
        with changed:
            with open(results_path, "a") as f:
                for job, rollouts in zip(batch, results):
                    rerun = []
                    for sample, rollout in zip(job.samples, rollouts):
                        record = _episode_record(
                            rollout.episode, job.task, domains[job.task], job.seed, sample, job.round
                        )
                        f.write(json.dumps(record) + "\n")
                        if rollout.episode.status is EpisodeStatus.QUARANTINED and job.round < max_reruns:
                            rerun.append(sample)
                        else:
                            bar.update(1)
                    if rerun:
                        again.append(Job(job.task, job.seed, tuple(rerun), job.round + 1))
                f.flush()
                os.fsync(f.fileno())
            if on_group is not None:
                for job, rollouts in zip(batch, results):
                    on_group(job, rollouts)
        return again

    threads = [
        threading.Thread(target=serve, args=(w,), daemon=True, name=f"eval-worker-{i}") for i, w in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        bar.close()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------


def _row(
    problems: Mapping[tuple[str, int], list[dict]], quarantined: int, given_up: int, k: int, confidence: float
) -> dict[str, float]:
    scored = [r for rs in problems.values() for r in rs]
    successes = sum(r["success"] for r in scored)
    low, high = wilson_interval(successes, len(scored), confidence)
    per_problem = [
        problem_metrics([float(r["success"]) for r in rs], min(k, len(rs))) for rs in problems.values() if rs
    ]
    # best@k over 0 / 1 outcomes: the verifier's success, the quantity the suite scores.
    mean = {
        m: sum(p[m] for p in per_problem) / len(per_problem) if per_problem else 0.0
        for m in ("mean@k", "pass@k", "best@k")
    }
    return {
        "problems": len(per_problem),
        "episodes": len(scored),
        "successes": successes,
        "success_rate": successes / max(len(scored), 1),
        "ci_low": low,
        "ci_high": high,
        **mean,
        "quarantined": quarantined,
        "given_up": given_up,
    }


def tables(records: Sequence[Mapping[str, Any]], k: int, confidence: float = 0.95) -> dict[str, Any]:
    """Per-task, per-domain and overall rows (TABLE_COLUMNS) of a results file's records.

    A sample's outcome is its first scored record; quarantined records count in
    "quarantined"; a sample with quarantined records only counts in "given_up"."""
    scored: dict[tuple[str, int, int], dict] = {}
    quarantined = collections.Counter()
    tried: dict[tuple[str, int, int], str] = {}
    domains: dict[str, str] = {}
    for r in records:
        key = (r["task"], r["seed"], r["sample"])
        domains[r["task"]] = r["domain"]
        tried[key] = r["task"]
        if r["status"] == EpisodeStatus.QUARANTINED.value:
            quarantined[r["task"]] += 1
        else:
            scored.setdefault(key, dict(r))
    given_up = collections.Counter(task for key, task in tried.items() if key not in scored)
    problems: dict[str, dict[tuple[str, int], list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for (task, seed, _), r in sorted(scored.items()):
        problems[task][(task, seed)].append(r)

    def row(tasks):
        merged = {p: rs for t in tasks for p, rs in problems.get(t, {}).items()}
        return _row(merged, sum(quarantined[t] for t in tasks), sum(given_up[t] for t in tasks), k, confidence)

    task_ids = sorted(domains)
    by_domain = collections.defaultdict(list)
    for task in task_ids:
        by_domain[domains[task]].append(task)
    return {
        "k": k,
        "confidence": confidence,
        "tasks": {t: {"domain": domains[t], **row([t])} for t in task_ids},
        "domains": {d: row(ts) for d, ts in sorted(by_domain.items())},
        "overall": row(task_ids),
    }


def _cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown_table(first: str, rows: Mapping[str, Mapping[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join((first, *columns)) + " |", "|" + "---|" * (len(columns) + 1)]
    lines += ["| " + " | ".join((name, *(_cell(row[c]) for c in columns))) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def write_tables(out: str | os.PathLike, summary: Mapping[str, Any]) -> None:
    """results.md (per-task and per-domain tables, skipped tasks), tasks.csv, domains.csv and
    summary.json under `out`."""
    os.makedirs(out, exist_ok=True)
    level = f"{100 * summary['confidence']:g}%"
    parts = [
        f"# {summary.get('title', 'evaluation')}",
        "",
        f"k = {summary['k']}; success with its Wilson {level} interval over scored episodes; mean@k, "
        "pass@k and best@k averaged over the (task, seed) problems.",
        "",
        "## Per task",
        "",
        markdown_table("task", summary["tasks"], ("domain", *TABLE_COLUMNS)),
        "",
        "## Per domain",
        "",
        markdown_table(
            "domain",
            {
                **summary["domains"],
                "all": summary["overall"],
                **({"all, feasible tasks only": summary["overall_feasible"]} if "overall_feasible" in summary else {}),
            },
            TABLE_COLUMNS,
        ),
        "",
    ]
    if summary.get("steps"):
        steps = " | ".join(f"{domain} {value:.2f}" for domain, value in summary["steps"].items())
        parts += ["Steps used (mean turns per scored episode): " + steps, ""]
    if summary.get("skipped"):
        parts += ["## Not run", "", *(f"- {task}: {why}" for task, why in summary["skipped"].items()), ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(parts))
    for name, rows, first in (("tasks.csv", summary["tasks"], "task"), ("domains.csv", summary["domains"], "domain")):
        with open(os.path.join(out, name), "w", newline="") as f:
            writer = csv.writer(f)
            columns = [c for c in next(iter(rows.values()), {}) if c != "domain"] if rows else list(TABLE_COLUMNS)
            extra = ["domain"] if first == "task" else []
            writer.writerow([first, *extra, *columns])
            for key, row in rows.items():
                writer.writerow([key, *(row[c] for c in extra), *(row[c] for c in columns)])
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


# ------------------------------------------------------------------------------------
# One evaluation, and sweeps
# ------------------------------------------------------------------------------------


def evaluate(
    workers: Sequence[Any],
    policy: Any,
    suite: Any,
    seeds: Sequence[int],
    k: int,
    out: str | os.PathLike,
    *,
    max_reruns: int = 2,
    confidence: float = 0.95,
    progress: bool = True,
    title: str | None = None,
    groups_per_call: int = 1,
    on_group: Callable[[Job, Sequence[Any]], None] | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """Evaluates `policy` (an `EvalPolicy`, or anything with `unsupported(task)` and
    `bind(worker, task_id)`) running on `workers` over `suite`'s tasks (a `suites.Suite`) x
    `seeds`, k samples each, resuming from <out>/results.jsonl; writes the tables and returns
    the summary (`tables` plus the tasks skipped and why, and "records": the scored and
    quarantined episodes' records). `groups_per_call`, `on_group` and `temperature`: see
    `run_jobs`."""
    if k < 1:
        raise ValueError(f"k (samples per task and seed) must be >= 1, got {k}")
    if not seeds:
        raise ValueError("an evaluation needs at least one seed")
    if max_reruns < 0:
        raise ValueError(f"max_reruns must be >= 0, got {max_reruns}")
    if not workers:
        raise ValueError("an evaluation needs at least one rollout worker")
    skipped = dict(suite.skipped)
    runnable = []
    for task in suite.catalog:
        reason = policy.unsupported(task)
        if reason is None:
            runnable.append(task.task_id)
        else:
            skipped[task.task_id] = reason
    seeds = [int(s) for s in seeds]
    os.makedirs(out, exist_ok=True)
    results_path = os.path.join(out, RESULTS_FILE)
    records = read_results(results_path)
    _check_resumable(records, runnable, seeds, k, results_path)
    if records:  # rewrite without a line a kill cut short, so appends start on a fresh line
        with open(results_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    jobs = pending_jobs(records, runnable, seeds, k, max_reruns)
    run_jobs(
        workers,
        policy,
        jobs,
        runnable,
        seeds,
        suite.catalog.domains(),
        results_path,
        max_reruns,
        progress,
        groups_per_call,
        on_group,
        temperature,
    )
    records = [r for r in read_results(results_path) if r["task"] in set(runnable) and r["seed"] in set(seeds)]
    title = title or f"{getattr(policy, 'name', 'policy')} on {suite.name}"
    summary = summarize(records, k, confidence, title=title, suite=suite, seeds=seeds, skipped=skipped)
    write_tables(out, summary)
    return {**summary, "records": records}


def summarize(
    records: Sequence[Mapping[str, Any]],
    k: int,
    confidence: float,
    *,
    title: str,
    suite: Any,
    seeds: Sequence[int],
    skipped: Mapping[str, str],
) -> dict[str, Any]:
    """An evaluation's summary over `records` (without them): its title, suite name, seeds,
    `tables`, the tasks skipped with why, "steps" (the mean turns an episode took, per domain
    and over all) and, when the suite holds infeasible tasks (whose right answer is to declare
    failure), "overall_feasible": the overall row over the feasible ones alone, as OSWorld
    reports its score with and without them. What `write_tables` writes."""
    summary = {
        "title": title,
        "suite": suite.name,
        "seeds": list(seeds),
        **tables(records, k, confidence),
        "skipped": dict(skipped),
    }
    turns: dict[str, list[int]] = collections.defaultdict(list)
    for r in records:
        if r["status"] != EpisodeStatus.QUARANTINED.value:
            turns[r["domain"]].append(int(r["turns"]))
            turns["all"].append(int(r["turns"]))
    summary["steps"] = {domain: sum(ts) / len(ts) for domain, ts in sorted(turns.items())}
    feasible = {task.task_id for task in suite.catalog if getattr(task, "feasible", True)}
    kept = [r for r in records if r["task"] in feasible]
    if kept and len(kept) < len(records):
        summary["overall_feasible"] = tables(kept, k, confidence)["overall"]
    return summary


def _check_resumable(records, tasks, seeds, k, path) -> None:
    """A results file from another evaluation (samples past k) is an error, not a resume."""
    beyond = [r for r in records if r["sample"] >= k and r["task"] in tasks and r["seed"] in seeds]
    if beyond:
        raise ValueError(
            f"{path} holds samples up to {max(r['sample'] for r in beyond)}, past k={k}: it is "
            "another evaluation's; choose another --out"
        )


def sweep_folder(turns: int, temperature: float) -> str:
    return f"turns_{turns}_temperature_{temperature:g}"


def sweep(
    make_workers: Callable[[int, float], Sequence[Any]],
    policy: Any,
    suite: Any,
    seeds: Sequence[int],
    k: int,
    out: str | os.PathLike,
    turn_budgets: Sequence[int],
    temperatures: Sequence[float],
    **options: Any,
) -> dict[str, dict[str, Any]]:
    """One `evaluate` per (turn budget, temperature), in <out>/turns_<T>_temperature_<t>/, on
    workers `make_workers(turns, temperature)` builds (and this shuts down). Returns each
    evaluation's summary by folder name."""
    if not turn_budgets or not temperatures:
        raise ValueError("a sweep needs at least one turn budget and one temperature")
    if any(t < 1 for t in turn_budgets):
        raise ValueError(f"turn budgets must be >= 1, got {list(turn_budgets)}")
    if any(t < 0 for t in temperatures):
        raise ValueError(f"temperatures must be >= 0, got {list(temperatures)}")
    summaries = {}
    for turns in turn_budgets:
        for temperature in temperatures:
            folder = sweep_folder(turns, temperature)
            workers = make_workers(int(turns), float(temperature))
            try:
                summaries[folder] = evaluate(
                    workers,
                    policy,
                    suite,
                    seeds,
                    k,
                    os.path.join(out, folder),
                    title=f"{getattr(policy, 'name', 'policy')} on {suite.name}, {turns} turns, "
                    f"temperature {temperature:g}",
                    **options,
                )
            finally:
                for worker in workers:
                    worker.shutdown()
    return summaries
