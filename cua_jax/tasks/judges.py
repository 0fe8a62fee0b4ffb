"""Running a task against an environment: setup steps, getters, metrics and the verdict.

OSWorld's evaluator: reward = metric(result_getter(env, result), expected_getter(env,
expected), **options), combined over several metrics by `conj` ("and": 0 as soon as
one metric is 0, else their mean; "or": 1 as soon as one is 1, else their maximum).

Metrics (cua_jax.tasks.metrics, dispatched through its registry) are plain functions of
host-side values (file paths, strings, rule dicts) and never execute task-supplied code;
one OSWorld defines but this project does not implement raises JudgeError. A Python judge
(`python_judge`, ScaleCUA App. B) runs inside the environment through /run_python with a
timeout, never in this process.

Setup (`set_up`, `set_up_task`; cua_jax.tasks.setup_steps): whether the environment can run
the task at all, then its `config` steps; the evaluator's `postconfig` steps run before
judging. Getters (cua_jax.tasks.getters) read the values the metrics compare.

Errors are sorted for fault attribution (cua_jax.envs.faults):
    SetupError   a setup step failed, or the task cannot run in this environment
                 (the reason says why: "needs app: thunderbird"): quarantine.
    JudgeError   the judge itself broke (bad rules, crashing judge code): quarantine.
    EnvError     (cua_jax.envs.client) the environment broke: quarantine.
A missing result file or a wrong value is the agent's doing and simply scores 0.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import traceback
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvClient, EnvError
from cua_jax.tasks import metrics
from cua_jax.tasks.getters import Getters
from cua_jax.tasks.metrics import JudgeError  # raised by the metrics too
from cua_jax.tasks.metrics.base import noting_malformed_results
from cua_jax.tasks.metrics.general import infeasible
from cua_jax.tasks.schema import Check, Task
from cua_jax.tasks.setup_steps import SetupError, run_steps, set_up, set_up_task

__all__ = [
    "Getters",
    "JudgeError",
    "SetupError",
    "Verdict",
    "clear_cache",
    "evaluate",
    "run_steps",
    "set_up",
    "set_up_task",
    "verdict",
]


# ------------------------------------------------------------------------------------
# The verdict
# ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judge's verdict: the reward in [0, 1], and a note ("path: error") for each of the
    agent's files the metrics found malformed in their format (each scored 0)."""

    reward: float
    malformed_results: tuple[str, ...] = ()


def verdict(
    task: Task,
    client: EnvClient,
    cache_dir: str | pathlib.Path,
    last_action: A.Action | A.InvalidAction | None = None,
    judge: Any = None,
) -> Verdict:
    """`evaluate`'s reward with the notes of the agent's malformed files beside it."""
    with noting_malformed_results() as malformed:
        reward = evaluate(task, client, cache_dir, last_action, judge)
    return Verdict(reward, tuple(malformed))


def evaluate(
    task: Task,
    client: EnvClient,
    cache_dir: str | pathlib.Path,
    last_action: A.Action | A.InvalidAction | None = None,
    judge: Any = None,
) -> float:
    """Run postconfig, then the task's metrics; the reward in [0, 1] (`verdict`: with the notes
    of the agent's malformed files).

    judge runs judge code (`python_judge`) in the environment: a desktop pool's
    `ContainerJudge`, apart from what the agent can change. None: through the environment's
    server (`client.run_python`), for environments without one (a remote server).

    An infeasible task (metric `infeasible`) is judged on the last action alone. Raises
    SetupError (postconfig), JudgeError or EnvError when no verdict can be reached.
    """
    evaluator = task.evaluator
    if evaluator.infeasible:
        return infeasible(last_action=last_action)
    if isinstance(last_action, A.Fail):
        return 0.0  # declared infeasible a feasible task
    run_steps(evaluator.postconfig, client, task.base_dir, cache_dir=cache_dir, postconfig=True)
    getters = Getters(client, task, cache_dir)
    scores = []
    for check in evaluator.checks:
        score = _score(check, getters, evaluator, client, client if judge is None else judge)
        if evaluator.conj == "and" and score == 0.0:
            return 0.0
        if evaluator.conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    return sum(scores) / len(scores) if evaluator.conj == "and" else max(scores)


def _score(check: Check, getters: Getters, evaluator, client: EnvClient, judge: Any) -> float:
    """One metric's reward: its getter values (as many as it takes; the expected one only
    when the task names it, as OSWorld calls metrics) and options, through the registry."""
    entry = metrics.lookup(check.func)
    getter_values = [getters.get(g) for g in (check.result, check.expected)[: entry.arity]]
    if entry.arity == 2 and check.expected is None:
        getter_values = getter_values[:1]
    context = {"client": client, "judge": judge, "evaluator": evaluator, "last_action": None}
    try:
        score = float(entry.fn(*getter_values, **check.options, **{k: context[k] for k in entry.needs}))
    except (JudgeError, EnvError):
        raise
    except Exception as error:
        # The traceback is in the message: the message is what the episode's fault records.
        where = "".join(traceback.format_exception(error)).rstrip()
        raise JudgeError(f"metric {check.func} failed: {type(error).__name__}: {error}\n{where}") from error
    if not 0.0 <= score <= 1.0:
        raise JudgeError(f"metric {check.func} gave {score}, not a reward in [0, 1]")
    return score


def clear_cache(cache_dir: str | pathlib.Path) -> None:
    shutil.rmtree(cache_dir, ignore_errors=True)
