"""The candidate task that moves through the loop, its feedback and its validation record.

A candidate is an OSWorld task JSON object (cua_jax.tasks.schema) whose evaluator is a
Python judge (`python_judge`: `code` defines the no-argument `entry`, run inside the
environment), plus what the loop needs besides: a reference solution (the action texts
a policy would emit, cua_jax.envs.actions), the metadata of ScaleCUA Table 5 (app,
difficulty, estimated steps, augmentation type) and `parts`: the sub-goals it is made
of, each with its own judge and the slice of the solution that reaches it (trajectory-
guided synthesis splits tasks along them).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

ROLES = ("proposer", "rule", "judger", "checker", "fixer")


@dataclasses.dataclass
class Feedback:
    """One role's verdict on a candidate: pass/fail, a score in [0, 1] and the reasons."""

    role: str
    passed: bool
    reasons: list[str] = dataclasses.field(default_factory=list)
    score: float | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r} (roles: {ROLES})")

    def summary(self) -> str:
        verdict = "pass" if self.passed else "fail"
        return f"{self.role}: {verdict}" + (f" ({'; '.join(self.reasons)})" if self.reasons else "")


@dataclasses.dataclass
class Part:
    """One sub-goal: its instruction, its judge and the solution steps [start, end) reaching it."""

    instruction: str
    code: str
    entry: str
    start: int
    end: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Candidate:
    """A task under synthesis.

    task: the OSWorld task JSON (dict) with a python_judge evaluator.
    solution: the reference solution, one action text per step.
    metadata: app, difficulty, estimated_steps, family, spec (the template's parameters),
        augmentation, setup_actions (action texts replayed after `config`: the prefix of a
        trajectory-guided sub-task).
    parts: the sub-goals (a single-goal task has one part covering the whole solution).
    history: every Feedback it received, in order; repairs: what the fixer changed.
    """

    task: dict[str, Any]
    solution: list[str]
    metadata: dict[str, Any]
    parts: list[Part] = dataclasses.field(default_factory=list)
    history: list[Feedback] = dataclasses.field(default_factory=list)
    repairs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.task.get("id", "?"))

    @property
    def instruction(self) -> str:
        return str(self.task.get("instruction", ""))

    @property
    def judge_code(self) -> str:
        return str(self.task.get("evaluator", {}).get("code", ""))

    @property
    def judge_entry(self) -> str:
        return str(self.task.get("evaluator", {}).get("entry", ""))

    @property
    def setup_actions(self) -> list[str]:
        return list(self.metadata.get("setup_actions", []))

    def copy(self) -> Candidate:
        return copy.deepcopy(self)

    def last(self, role: str) -> Feedback | None:
        for feedback in reversed(self.history):
            if feedback.role == role:
                return feedback
        return None

    def validation_record(self) -> dict[str, Any]:
        """ScaleCUA Table 5's validation field: judger pass and score, rule pass,
        execution-in-the-loop pass, and the repair history."""
        judger, rule, checker = self.last("judger"), self.last("rule"), self.last("checker")
        return {
            "judger_pass": None if judger is None else judger.passed,
            "judger_score": None if judger is None else judger.score,
            "judger_reasons": [] if judger is None else judger.reasons,
            "rule_pass": None if rule is None else rule.passed,
            "rule_reasons": [] if rule is None else rule.reasons,
            "execution_pass": None if checker is None else checker.passed,
            "execution_detail": {} if checker is None else checker.detail,
            "repair_history": self.repairs,
        }

    def to_task_json(self) -> dict[str, Any]:
        """The accepted task as written: the OSWorld JSON with metadata and validation."""
        task = copy.deepcopy(self.task)
        task["metadata"] = {
            **copy.deepcopy(self.metadata),
            "reference_solution": list(self.solution),
            "parts": [p.to_json() for p in self.parts],
        }
        task["validation"] = self.validation_record()
        return task

    @classmethod
    def from_task_json(cls, value: dict[str, Any]) -> Candidate:
        """Read back a task written by `to_task_json` (validation history is not restored)."""
        task = copy.deepcopy(value)
        metadata = task.pop("metadata", {})
        task.pop("validation", None)
        solution = list(metadata.pop("reference_solution", []))
        parts = [Part(**p) for p in metadata.pop("parts", [])]
        return cls(task=task, solution=solution, metadata=metadata, parts=parts)


def judge_name(app: str, prop: str, code_seed: str) -> str:
    """A judge function name in ScaleCUA's style: check_<app>_<property>__<hash>."""
    digest = hashlib.sha256(code_seed.encode()).hexdigest()[:8]
    clean = lambda s: "".join(c if c.isalnum() else "_" for c in s.lower())
    return f"check_{clean(app)}_{clean(prop)}__{digest}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
