"""The programmatic judger, checker and fixer (the LLM ones are in cua_jax.tasks.verigen.llm).

ProgrammaticJudger   static semantic review: the instruction states every value the task
                     depends on (metadata.stated) and every path it names is the one the
                     judge inspects.
Checker              the dry run in a live environment through the probe: set up, judge
                     the untouched state (must be 0), act toward the goal, judge again
                     (must be 1). `ScriptedChecker` acts with the reference solution.
TemplateFixer        re-renders the failing component (instruction, judge, setup) of a
                     template candidate from its family spec.
"""

from __future__ import annotations

import dataclasses
import re
import time

from cua_jax.envs.client import EnvError
from cua_jax.tasks import judges
from cua_jax.tasks.schema import TaskSchemaError, parse_task
from cua_jax.tasks.verigen import templates
from cua_jax.tasks.verigen.candidate import Candidate, Feedback, Part
from cua_jax.tasks.verigen.probe import InteractionProbe, ProbeError, ProbeSession

_PATH = re.compile(r"/root/[\w./-]*\w")


class ProgrammaticJudger:
    name = "programmatic"

    def review(self, candidate: Candidate) -> Feedback:
        instruction, code = candidate.instruction, candidate.judge_code
        checks: list[tuple[bool, str]] = []
        for value in candidate.metadata.get("stated", []):
            checks.append(
                (str(value) in instruction, f"the instruction does not state '{value}', which the judge requires")
            )
        for path in _PATH.findall(instruction):
            checks.append((path in code, f"the judge does not inspect {path}, the path the instruction names"))
        checks.append((len(instruction.split()) >= 5, "the instruction is too short to be meaningful"))
        checks.append(
            (
                bool(candidate.metadata.get("stated")) or bool(_PATH.findall(instruction)),
                "the instruction names no concrete file or value to check",
            )
        )
        reasons = [reason for ok, reason in checks if not ok]
        score = sum(ok for ok, _ in checks) / len(checks)
        return Feedback("judger", not reasons, reasons, score)


@dataclasses.dataclass
class CheckOutcome:
    initial: float | None = None
    final: float | None = None
    actions: list[str] = dataclasses.field(default_factory=list)
    environment: str = ""


class Checker:
    """The dry run. Subclasses choose the actions (`plan`); the verdict logic is shared.

    judge_timeout_cap: the judge's timeout is clamped to this many seconds, so a judge
    that loops forever costs at most that and is rejected with the reason.
    """

    name = "checker"

    def __init__(self, probe: InteractionProbe, judge_timeout_cap: float = 10.0, infra_retries: int = 1):
        self.probe, self.judge_timeout_cap, self.infra_retries = probe, judge_timeout_cap, infra_retries

    def plan(self, candidate: Candidate, session: ProbeSession) -> list[str]:
        raise NotImplementedError

    def check(self, candidate: Candidate) -> Feedback:
        try:
            task = parse_task(candidate.task)
        except TaskSchemaError as error:
            return Feedback("checker", False, [f"schema: {error}"], 0.0)
        timeout = min(task.evaluator.timeout, self.judge_timeout_cap)
        task = dataclasses.replace(task, evaluator=dataclasses.replace(task.evaluator, timeout=timeout))
        for attempt in range(self.infra_retries + 1):
            started, outcome = time.monotonic(), CheckOutcome()
            try:
                reasons = self._dry_run(candidate, task, outcome)
            except (EnvError, ProbeError) as error:  # the environment broke, not the candidate
                if attempt < self.infra_retries:
                    continue
                reasons = [f"environment fault: {error}"]
            detail = {
                "initial_score": outcome.initial,
                "final_score": outcome.final,
                "environment": outcome.environment,
                "seconds": round(time.monotonic() - started, 2),
                "actions": outcome.actions,
            }
            return Feedback("checker", not reasons, reasons, 1.0 if not reasons else 0.0, detail)
        raise AssertionError("unreachable")

    def _dry_run(self, candidate: Candidate, task, outcome: CheckOutcome) -> list[str]:
        with self.probe.session() as session:
            outcome.environment = session.name
            try:
                session.setup(task, candidate.setup_actions)
            except judges.SetupError as error:
                return [f"setup failed: {error}"]
            try:
                outcome.initial = session.judge(task)
            except judges.JudgeError as error:
                return [f"the judge fails on the initial state: {error}"]
            if outcome.initial != 0.0:
                return [f"the judge scores the untouched initial state {outcome.initial}, not 0"]
            try:
                outcome.actions = self.plan(candidate, session)
            except ValueError as error:
                return [f"no plan toward the goal: {error}"]
            for index, text in enumerate(outcome.actions):
                result = session.act(text)
                if not result.ok:
                    return [f"step {index} toward the goal was rejected: {result.error}"]
            try:
                outcome.final = session.judge(task)
            except judges.JudgeError as error:
                return [f"the judge fails on the solved state: {error}"]
            if outcome.final != 1.0:
                return [f"the judge scores the solved state {outcome.final}, not 1"]
        return []


class ScriptedChecker(Checker):
    """Acts with the candidate's reference solution."""

    name = "scripted"

    def plan(self, candidate: Candidate, session: ProbeSession) -> list[str]:
        return list(candidate.solution)


class TemplateFixer:
    """Repairs a template candidate by re-rendering what its feedback blames.

    judger feedback -> the instruction and the judge (the judger reviews both);
    rule or checker feedback -> the judge, the setup and the solution.
    Candidates without a family spec (composed, sub-tasks) cannot be repaired here.
    """

    name = "template"

    def fix(self, candidate: Candidate, feedback: list[Feedback]) -> Candidate | None:
        family, spec = candidate.metadata.get("family"), candidate.metadata.get("spec")
        if family not in templates.FAMILIES or spec is None:
            return None
        fresh = templates.render(family, spec)
        fixed, changed = candidate.copy(), []
        roles = {f.role for f in feedback if not f.passed}
        if "judger" in roles and fixed.task["instruction"] != fresh.task["instruction"]:
            fixed.task["instruction"] = fresh.task["instruction"]
            changed.append("instruction")
        if roles & {"rule", "checker", "judger"}:
            for field in ("code", "entry", "timeout"):
                if fixed.task["evaluator"].get(field) != fresh.task["evaluator"][field]:
                    fixed.task["evaluator"][field] = fresh.task["evaluator"][field]
                    changed.append(f"evaluator.{field}")
        if roles & {"rule", "checker"}:
            if fixed.task["config"] != fresh.task["config"]:
                fixed.task["config"] = fresh.task["config"]
                changed.append("config")
            if fixed.solution != fresh.solution:
                fixed.solution = fresh.solution
                changed.append("solution")
        if not changed:
            return None
        fixed.parts = [Part(fixed.instruction, fixed.judge_code, fixed.judge_entry, 0, len(fixed.solution))]
        fixed.repairs.append(
            {
                "round": len(fixed.repairs) + 1,
                "by": self.name,
                "changed": changed,
                "feedback": [f.summary() for f in feedback if not f.passed],
            }
        )
        return fixed
