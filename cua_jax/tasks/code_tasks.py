"""Code tasks: a bug in a real Python repository, judged by the repository's own tests.

A task file (OSWorld's shape; `snapshot` names the environment image):

    {
      "id": "code-toolz-0007",
      "snapshot": "code",
      "instruction": "...an issue report built from the failing tests...",
      "source": "bug injection into toolz 1.0.0 (swapped operator)",
      "config": [{"type": "code_repository", "parameters": {"package": "toolz",
                  "bug": [{"path": "toolz/itertoolz.py", "start": 120,
                           "old": ["    if n < 0:"], "new": ["    if n <= 0:"]}]}}],
      "evaluator": {"func": "pytest",
                    "options": {"test_files": ["toolz/tests"],
                                "fail_to_pass": ["toolz.tests.test_itertoolz::test_take"],
                                "clean_failures": [], "timeout": 300}},
      "metadata": {"mutation": {...}, "oracle": [...the reverse hunks...]}
    }

A hunk replaces the lines `old` (which must be there) at 1-based line `start` of `path` by
`new`; the oracle fix is the bug's hunks reversed. Tests are named as in pytest's JUnit XML
report (`<classname>::<name>`). The judge passes a task when every `fail_to_pass` test passes
and no other test of `test_files` fails, apart from `clean_failures` (tests that fail on the
clean repository too).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

from cua_jax.tasks.code_packages import PACKAGES

SNAPSHOT = "code"
EVALUATOR = "pytest"


class CodeTaskError(ValueError):
    """A malformed code task file; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Hunk:
    path: str
    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    def reversed(self) -> Hunk:
        return Hunk(self.path, self.start, self.new, self.old)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start, "old": list(self.old), "new": list(self.new)}


@dataclasses.dataclass(frozen=True)
class CodeTask:
    id: str
    instruction: str
    package: str
    bug: tuple[Hunk, ...]
    test_files: tuple[str, ...]
    fail_to_pass: tuple[str, ...]
    clean_failures: tuple[str, ...] = ()
    timeout: float = 300.0
    oracle: tuple[Hunk, ...] = ()
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    kind = "code"


def _need(condition: bool, where: str, field: str, problem: str) -> None:
    if not condition:
        raise CodeTaskError(f"{where}: field '{field}' {problem}")


def _strings(value: Any, where: str, field: str, allow_empty: bool = True) -> tuple[str, ...]:
    _need(isinstance(value, list) and all(isinstance(v, str) for v in value), where, field, "must be a list of strings")
    _need(allow_empty or len(value) > 0, where, field, "must not be empty")
    return tuple(value)


def _hunks(value: Any, where: str, field: str) -> tuple[Hunk, ...]:
    _need(isinstance(value, list) and value, where, field, "must be a non-empty list of hunks")
    hunks = []
    for i, h in enumerate(value):
        at = f"{field}[{i}]"
        _need(
            isinstance(h, dict) and set(h) == {"path", "start", "old", "new"},
            where,
            at,
            "must be an object with exactly 'path', 'start', 'old', 'new'",
        )
        _need(
            isinstance(h["path"], str)
            and h["path"]
            and not h["path"].startswith("/")
            and ".." not in h["path"].split("/"),
            where,
            f"{at}.path",
            "must be a path inside the repository",
        )
        _need(isinstance(h["start"], int) and h["start"] >= 1, where, f"{at}.start", "must be an integer >= 1")
        hunks.append(
            Hunk(h["path"], h["start"], _strings(h["old"], where, f"{at}.old"), _strings(h["new"], where, f"{at}.new"))
        )
    return tuple(hunks)


def parse_code_task(value: Any, where: str = "<task>") -> CodeTask:
    """A CodeTask from decoded JSON; CodeTaskError names `where` and the bad field."""
    _need(isinstance(value, dict), where, "(top level)", "must be a JSON object")
    _need(isinstance(value.get("id"), str) and value["id"], where, "id", "must be a non-empty string")
    where = f"{where} ({value['id']})"
    _need(value.get("snapshot") == SNAPSHOT, where, "snapshot", f"must be {SNAPSHOT!r}, got {value.get('snapshot')!r}")
    _need(
        isinstance(value.get("instruction"), str) and value["instruction"].strip(),
        where,
        "instruction",
        "must be a non-empty string",
    )
    config = value.get("config")
    _need(
        isinstance(config, list)
        and len(config) == 1
        and isinstance(config[0], dict)
        and config[0].get("type") == "code_repository",
        where,
        "config",
        "must hold exactly one step of type 'code_repository'",
    )
    params = config[0].get("parameters")
    _need(isinstance(params, dict), where, "config[0].parameters", "must be an object")
    _need(
        isinstance(params.get("package"), str) and params["package"],
        where,
        "config[0].parameters.package",
        "must name a repository of the code image",
    )
    bug = _hunks(params.get("bug"), where, "config[0].parameters.bug")
    evaluator = value.get("evaluator")
    _need(
        isinstance(evaluator, dict) and evaluator.get("func") == EVALUATOR,
        where,
        "evaluator.func",
        f"must be {EVALUATOR!r}",
    )
    options = evaluator.get("options")
    _need(isinstance(options, dict), where, "evaluator.options", "must be an object")
    timeout = options.get("timeout", 300.0)
    _need(isinstance(timeout, (int, float)) and timeout > 0, where, "evaluator.options.timeout", "must be > 0")
    metadata = value.get("metadata") or {}
    _need(isinstance(metadata, dict), where, "metadata", "must be an object")
    oracle = (
        _hunks(metadata["oracle"], where, "metadata.oracle")
        if "oracle" in metadata
        else tuple(h.reversed() for h in reversed(bug))
    )
    return CodeTask(
        id=value["id"],
        instruction=value["instruction"],
        package=params["package"],
        bug=bug,
        test_files=_strings(options.get("test_files"), where, "evaluator.options.test_files", allow_empty=False),
        fail_to_pass=_strings(options.get("fail_to_pass"), where, "evaluator.options.fail_to_pass", allow_empty=False),
        clean_failures=_strings(options.get("clean_failures", []), where, "evaluator.options.clean_failures"),
        timeout=float(timeout),
        oracle=oracle,
        raw=value,
    )


def load_code_task(path: str | pathlib.Path) -> CodeTask:
    path = pathlib.Path(path)
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CodeTaskError(f"{path}: not valid JSON ({error})") from None
    return parse_code_task(value, str(path))


_TASK_KEYS = ("id", "instruction", "evaluator")


def load_code_suite(folder: str | pathlib.Path) -> list[CodeTask]:
    """Every task file (*.json) of `folder`, sorted by file name; ids must be unique. A JSON
    file with none of a task's keys (the suite's validation.json) holds no task and is skipped."""
    tasks = []
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        try:
            value = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise CodeTaskError(f"{path}: not valid JSON ({error})") from None
        if isinstance(value, dict) and not any(key in value for key in _TASK_KEYS):
            continue
        tasks.append(parse_code_task(value, str(path)))
    seen: dict[str, str] = {}
    for task in tasks:
        if task.id in seen:
            raise CodeTaskError(f"{folder}: task id {task.id!r} appears twice")
        seen[task.id] = task.id
    return tasks


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The judge's reading of one test run: the reward, and why."""

    reward: float
    fail_to_pass_passed: int
    fail_to_pass_total: int
    broken: tuple[str, ...]  # other tests that fail now (a regression)

    @property
    def solved(self) -> bool:
        return self.fail_to_pass_passed == self.fail_to_pass_total and not self.broken


def verdict(task: CodeTask, outcomes: dict[str, str], partial_credit: bool = False) -> Verdict:
    """Reward from per-test outcomes ("passed" / "failed" / "error" / "skipped"): 1 when every
    fail_to_pass test passes and no other test fails (clean_failures apart), else 0; with
    partial_credit, the fraction of fail_to_pass tests that pass when nothing else broke."""
    passed = sum(outcomes.get(t) == "passed" for t in task.fail_to_pass)
    excused = set(task.fail_to_pass) | set(task.clean_failures)
    broken = tuple(sorted(t for t, o in outcomes.items() if o in ("failed", "error") and t not in excused))
    total = len(task.fail_to_pass)
    if broken:
        reward = 0.0
    elif partial_credit:
        reward = passed / total
    else:
        reward = float(passed == total)
    return Verdict(reward, passed, total, broken)


def judge_request(
    package: str, hunks: Sequence[Hunk], test_files: Sequence[str], timeout: float, isolated: bool = True
) -> dict:
    """The runner's judge request for a tree reset to `package` with the bug `hunks`: the verdict's
    tests run on the clean repository with the bug and the work tree's versions of the package's
    source files only (launch/images/code/runner.py). `isolated=False` asks for the former judge
    in the work tree itself, the baseline of experiments/benchmarks/code_env.py and nothing else."""
    request = {
        "op": "judge",
        "package": package,
        "hunks": [h.to_json() for h in hunks],
        "sources": list(PACKAGES[package].sources),
        "test_files": list(test_files),
        "timeout": timeout,
    }
    if not isolated:
        request["isolated"] = False
    return request
