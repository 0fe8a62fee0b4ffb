"""Trajectory-guided synthesis (ScaleCUA §3.2, App. B.5).

Failed tasks -> easier sub-tasks: find the earliest step where the agent departs from
the goal (against the successful trajectories of the same task when there are any,
otherwise by a judger call over the steps, or against the reference solution when no
model is configured), and emit a sub-task whose setup is the state at that step (the
task's setup plus a replay of the agent's own replies up to it: metadata.setup_actions)
and whose judge checks the sub-goal being worked on there.

Solved tasks -> harder tasks: cluster similar tasks of one application by instruction
embedding, and compose pairs of compatible tasks into one multi-objective task whose
instruction chains theirs and whose judge ANDs theirs (the minimum of their rewards).

`from_run` does both for a training run: its episode log (cua_jax.observe.episode_log)
gives the episodes and the real pass rates of the tasks it trained on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.observe import episode_log
from cua_jax.observe.episode_log import EpisodeRecord
from cua_jax.tasks.verigen.candidate import Candidate, Part
from cua_jax.tasks.verigen.llm import extract_json
from cua_jax.tasks.verigen.pipeline import ProposalError
from cua_jax.tasks.verigen.similarity import threshold_clusters
from cua_jax.types import EpisodeStatus

GUI_STEPS = ("open", "launch")

log = logging.getLogger(__name__)


def step_key(text: str) -> str:
    """A canonical form of one action text, so equal actions compare equal however written."""
    action = A.parse_action(text)
    if isinstance(action, A.InvalidAction):
        return "invalid:" + text.strip()
    return json.dumps(A.action_arguments(action), sort_keys=True)


def earliest_deviation(steps: list[str], reference: list[str]) -> int:
    """The index of the first step where `steps` departs from `reference` (actions compared
    canonically). Following the reference and then stopping early, or going on past it,
    deviates at the first index where they differ in length."""
    for index, (ours, theirs) in enumerate(zip(steps, reference)):
        if step_key(ours) != step_key(theirs):
            return index
    return min(len(steps), len(reference))


def deviation_by_judger(chat, candidate: Candidate, steps: list[str]) -> int:
    """Ask a judger model for the earliest off-goal step of a failed trajectory."""

    system = (
        "Find the earliest step at which the agent departs from the goal. Answer with one JSON object: "
        '{"step": int (0-based)}'
    )
    user = f"Task {candidate.id}: {candidate.instruction}\n\nSteps:\n" + "\n".join(
        f"{i}: {s}" for i, s in enumerate(steps)
    )
    value = extract_json(chat.chat("judger", system, user), "judger").get("step")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= len(steps):
        raise ValueError(f"the judger named no valid step: {value!r}")
    return value


def subtask_at(candidate: Candidate, deviation: int, prefix: Sequence[str] | None = None) -> Candidate | None:
    """The easier task that starts at `deviation` of the reference solution and ends at
    the end of the sub-goal (part) being worked on there; None when there is nothing
    easier (the deviation is at the very start of a single-goal task, or past the end).

    prefix: the action texts that reach the deviation, replayed as the sub-task's setup
    (an agent's own replies); the reference solution's first `deviation` steps by default.
    """
    solution = candidate.solution
    prefix = list(solution[:deviation] if prefix is None else prefix)
    if len(prefix) != deviation:
        raise ValueError(f"the prefix to the deviation at step {deviation} has {len(prefix)} steps")
    work = [i for i, text in enumerate(solution) if not A.is_terminal(A.parse_action(text))]
    if not work or deviation > work[-1]:
        return None
    part = next((p for p in candidate.parts if p.start <= deviation < p.end), None)
    if part is None or (deviation == 0 and len(candidate.parts) == 1):
        return None
    end = min(part.end, work[-1] + 1)
    steps = [t for t in solution[deviation:end] if not A.is_terminal(A.parse_action(t))]
    if not steps:
        return None
    steps.append(A.render_action(A.Done()))
    digest = hashlib.sha256(f"{candidate.id}:{deviation}".encode()).hexdigest()[:10]
    task = json.loads(json.dumps(candidate.task))
    task["id"] = f"verigen-sub-{digest}"
    task["instruction"] = part.instruction
    task["evaluator"] = {**task["evaluator"], "code": part.code, "entry": part.entry}
    metadata = {
        **json.loads(json.dumps(candidate.metadata)),
        "family": "subtask",
        "augmentation": "trajectory_subtask",
        "parent": candidate.id,
        "deviation_step": deviation,
        "difficulty": "easy",
        "estimated_steps": len(steps),
        "setup_actions": candidate.setup_actions + prefix,
    }
    if "stated" in metadata:  # the values of the other sub-goals are no longer the task's
        metadata["stated"] = [v for v in metadata["stated"] if str(v) in part.instruction or str(v) in part.code]
    metadata.pop("spec", None)
    return Candidate(task, steps, metadata, [Part(part.instruction, part.code, part.entry, 0, len(steps))])


UNSOLVED = (EpisodeStatus.FAILURE, EpisodeStatus.NO_VERDICT)


def subtasks_from_failures(
    records: Sequence[EpisodeRecord],
    tasks: Mapping[str, Candidate],
    pass_rates: Mapping[str, float],
    judger_chat=None,
    max_pass_rate: float = 0.5,
    max_tasks: int | None = None,
) -> list[Candidate]:
    """Sub-tasks of the tasks whose pass rate is at most `max_pass_rate`, one per distinct
    deviation point of their unsolved episodes, the hardest tasks' first (at most `max_tasks`).

    The deviation is located in the reference solution, whose parts name the sub-goal: an
    episode whose replies leave the reference solution's path before its deviation (it
    followed a different successful path) gives no sub-task.
    """
    by_task: dict[str, list[EpisodeRecord]] = {}
    for record in records:
        by_task.setdefault(record.task_id, []).append(record)
    failing = sorted(
        (pass_rates.get(t, 0.0), t) for t in by_task if t in tasks and pass_rates.get(t, 0.0) <= max_pass_rate
    )
    out: dict[str, Candidate] = {}
    for _, task_id in failing:
        candidate, runs = tasks[task_id], by_task[task_id]
        successes = [list(r.replies) for r in runs if r.status is EpisodeStatus.SUCCESS]
        for record in runs:
            if max_tasks is not None and len(out) >= max_tasks:
                return list(out.values())
            if record.status not in UNSOLVED:
                continue
            steps = list(record.replies)
            if successes:  # where it leaves the successful path it followed longest
                deviation = max(earliest_deviation(steps, success) for success in successes)
            elif judger_chat is not None:
                try:
                    deviation = deviation_by_judger(judger_chat, candidate, steps)
                except (ValueError, ProposalError) as error:  # an unusable reply costs one episode, not the run
                    log.warning("no deviation for episode %s of %s: %s", record.episode_id, task_id, error)
                    continue
            else:
                deviation = earliest_deviation(steps, candidate.solution)
            if earliest_deviation(steps[:deviation], candidate.solution) < deviation:
                continue
            sub = subtask_at(candidate, deviation, steps[:deviation])
            if sub is not None:
                out.setdefault(sub.id, sub)
    return list(out.values())


def _touched_paths(candidate: Candidate) -> set[str]:
    spec = candidate.metadata.get("stated", [])
    return {str(s) for s in spec if str(s).startswith("/")}


def _gui_steps(candidate: Candidate) -> list[str]:
    return [json.dumps(s, sort_keys=True) for s in candidate.task.get("config", []) if s.get("type") in GUI_STEPS]


def compatible(a: Candidate, b: Candidate) -> bool:
    """Two tasks can run one after the other in one environment: they touch different
    paths, and open at most one application window between them (or the same one)."""
    if not _touched_paths(a) or _touched_paths(a) & _touched_paths(b):
        return False
    gui_a, gui_b = _gui_steps(a), _gui_steps(b)
    return not gui_a or not gui_b or gui_a == gui_b


def compose(a: Candidate, b: Candidate) -> Candidate:
    """One task with both objectives: chained instruction, AND-ed judge, joined setup and solution."""
    done = A.render_action(A.Done())
    first = [t for t in a.solution if not A.is_terminal(A.parse_action(t))]
    second = [t for t in b.solution if not A.is_terminal(A.parse_action(t))]
    digest = hashlib.sha256(f"{a.id}+{b.id}".encode()).hexdigest()[:10]
    entry = f"check_composed__{digest}"
    code = (
        a.judge_code + "\n\n" + b.judge_code + f"\n\ndef {entry}():\n"
        f"    return min({a.judge_entry}(), {b.judge_entry}())\n"
    )
    instruction = f"{a.instruction.rstrip('.')}. Then: {b.instruction}"
    config = list(a.task.get("config", [])) + [s for s in b.task.get("config", []) if s not in a.task.get("config", [])]
    task = {
        **json.loads(json.dumps(a.task)),
        "id": f"verigen-composed-{digest}",
        "instruction": instruction,
        "config": config,
        "evaluator": {
            "func": "python_judge",
            "code": code,
            "entry": entry,
            "timeout": max(a.task["evaluator"]["timeout"], b.task["evaluator"]["timeout"]),
        },
    }
    shift = len(first)
    parts = [Part(p.instruction, p.code, p.entry, p.start, min(p.end, shift)) for p in a.parts] + [
        Part(p.instruction, p.code, p.entry, p.start + shift, min(p.end + shift, shift + len(second))) for p in b.parts
    ]
    parts[-1].end = shift + len(second) + 1  # the final Done belongs to the last goal
    metadata = {
        "app": a.metadata.get("app"),
        "family": "composed",
        "augmentation": "trajectory_composed",
        "parents": [a.id, b.id],
        "difficulty": "hard",
        "estimated_steps": shift + len(second) + 1,
        "stated": list(a.metadata.get("stated", [])) + list(b.metadata.get("stated", [])),
    }
    return Candidate(task, first + second + [done], metadata, parts)


def compose_solved(
    tasks: list[Candidate],
    pass_rates: dict[str, float],
    embed: Callable[[list[str]], np.ndarray],
    min_pass_rate: float = 0.8,
    threshold: float = 0.6,
    max_tasks: int = 10,
) -> list[Candidate]:
    """Harder tasks from clusters of similar solved tasks of one application."""
    solved = [t for t in tasks if pass_rates.get(t.id, 0.0) >= min_pass_rate]
    by_app: dict[str, list[Candidate]] = {}
    for task in solved:
        by_app.setdefault(str(task.metadata.get("app")), []).append(task)
    out: list[Candidate] = []
    for _app, group in sorted(by_app.items()):
        if len(group) < 2:
            continue
        vectors = np.asarray(embed([t.instruction for t in group]), np.float32)
        for cluster in threshold_clusters(vectors @ vectors.T, threshold):
            for i, j in zip(cluster, cluster[1:]):
                if len(out) < max_tasks and compatible(group[i], group[j]):
                    out.append(compose(group[i], group[j]))
    return out


def describe(candidates: list[Candidate]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "augmentation": c.metadata.get("augmentation"), "instruction": c.instruction} for c in candidates
    ]


@dataclasses.dataclass
class RunSynthesis:
    """What trajectory-guided synthesis made of a training run: the real pass rates of
    its tasks, sub-tasks of the failed ones, harder tasks composed from the solved ones,
    and the ids of logged tasks missing from the loaded tasks."""

    pass_rates: dict[str, float]
    subtasks: list[Candidate]
    composed: list[Candidate]
    unknown_tasks: list[str]


def from_run(
    records: Sequence[EpisodeRecord],
    tasks: Mapping[str, Candidate],
    embed: Callable[[list[str]], np.ndarray],
    judger_chat=None,
    max_pass_rate: float = 0.5,
    min_pass_rate: float = 0.8,
    threshold: float = 0.6,
    max_subtasks: int = 20,
    max_composed: int = 10,
) -> RunSynthesis:
    """Sub-tasks of the run's failed tasks (pass rate <= max_pass_rate) from their unsolved
    episodes, and tasks composed from its solved ones (pass rate >= min_pass_rate).

    records: the run's episode log; tasks: the tasks it trained on, by id."""
    if not 0.0 <= max_pass_rate < min_pass_rate <= 1.0:
        raise ValueError(f"need 0 <= max_pass_rate < min_pass_rate <= 1, got {max_pass_rate} and {min_pass_rate}")
    if not records:
        raise ValueError("the episode log holds no episodes")
    rates = episode_log.pass_rates(records)
    logged = sorted({r.task_id for r in records})
    unknown = [t for t in logged if t not in tasks]
    if len(unknown) == len(logged):
        raise ValueError(
            f"none of the {len(logged)} tasks of the episode log is among the {len(tasks)} loaded "
            f"tasks (e.g. {unknown[:3]}): are the task folders the run's?"
        )
    subtasks = subtasks_from_failures(records, tasks, rates, judger_chat, max_pass_rate, max_subtasks)
    composed = compose_solved(
        [tasks[t] for t in logged if t in tasks], rates, embed, min_pass_rate, threshold, max_composed
    )
    return RunSynthesis(rates, subtasks, composed, unknown)
