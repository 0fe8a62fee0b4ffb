"""OSWorld task JSON: parsing and validation. A malformed task names its bad field.

A task (OSWorld's format, with the Python judge of ScaleCUA App. B as an extra metric):

    {
      "id": "terminal-create-file",
      "snapshot": "desktop",                       # the environment image
      "instruction": "Create ~/hello.txt ...",
      "source": "cua_jax desktop suite",
      "config": [{"type": "upload", "parameters": {"files": [{"local_path": "...", "path": "..."}]}},
                 {"type": "open", "parameters": {"path": "/root/notes.txt"}}],
      "related_apps": ["terminal"],
      "evaluator": {
        "postconfig": [...setup steps run before judging...],
        "func": "compare_text_file",               # or a list, combined by "conj": "and"/"or"
        "result":   {"type": "vm_file", "path": "/root/hello.txt"},
        "expected": {"type": "rule", "rules": {"expected": "hello"}},
        "options":  {}
      }
    }

Setup steps (`config`, `postconfig`): download {files: [{url, path}]} (url: a local path,
file:// URL or a loopback http URL, fetched on the host and uploaded), upload {files:
[{local_path, path}]}, launch {command, shell?}, open {path}, execute / command
{command, shell?}, sleep {seconds}.

Getters: vm_file {path}, vm_command_line {command, shell?}, rule {rules}, local_file
{path}, cloud_file {path: URL or local path} (fetched once into a host cache).
Metrics: exact_match, check_include_exclude, compare_text_file, check_json,
compare_table (csv, xlsx), infeasible (the agent must declare FAIL), python_judge
(`evaluator.code` defines `evaluator.entry`, a function of no arguments returning a
reward in [0, 1]; it runs inside the environment with `evaluator.timeout`).
Relative local paths are resolved against the task file's folder.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

# The parameters each setup step, getter and metric needs (required, optional).
SETUP_STEPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "download": (("files",), ()),
    "upload": (("files",), ()),
    "launch": (("command",), ("shell",)),
    "open": (("path",), ("timeout",)),
    "execute": (("command",), ("shell", "timeout")),
    "command": (("command",), ("shell", "timeout")),
    "sleep": (("seconds",), ()),
}
GETTERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vm_file": (("path",), ("dest", "multi", "gives")),
    "vm_command_line": (("command",), ("shell", "timeout")),
    "rule": (("rules",), ()),
    "local_file": (("path",), ()),
    "cloud_file": (("path",), ("dest",)),
}
METRICS: dict[str, int] = {  # metric -> number of getter values it takes (result, expected)
    "exact_match": 2,
    "check_include_exclude": 2,
    "compare_text_file": 2,
    "check_json": 2,
    "compare_table": 2,
    "infeasible": 0,
    "python_judge": 0,
}
CONJUNCTIONS = ("and", "or")


class TaskSchemaError(ValueError):
    """A task file does not follow the schema; the message names the task and the field."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One setup / postconfig step."""

    type: str
    parameters: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Getter:
    type: str
    parameters: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Check:
    """One metric with its getters: metric(result_getter(), expected_getter(), **options)."""

    func: str
    result: Getter | None
    expected: Getter | None
    options: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Evaluator:
    checks: tuple[Check, ...]
    conj: str = "and"
    postconfig: tuple[Step, ...] = ()
    code: str | None = None  # python_judge source
    entry: str | None = None  # python_judge function name
    timeout: float = 60.0

    @property
    def infeasible(self) -> bool:
        return any(check.func == "infeasible" for check in self.checks)


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    instruction: str
    config: tuple[Step, ...]
    evaluator: Evaluator
    snapshot: str = "desktop"
    source: str = ""
    related_apps: tuple[str, ...] = ()
    base_dir: str = "."  # relative local paths resolve here
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


class _Fields:
    """Reads fields of one JSON object, naming the path of any bad one."""

    def __init__(self, task_id: str, path: str, value: Any):
        self.task_id, self.path = task_id, path
        if not isinstance(value, dict):
            self.fail(f"must be a JSON object, got {type(value).__name__}")
        self.value = value

    def fail(self, problem: str, field: str | None = None):
        where = f"{self.path}.{field}" if field and self.path else (field or self.path or "(task)")
        raise TaskSchemaError(f"task '{self.task_id}': {where}: {problem}")

    def get(self, field: str, kind, required: bool = True, default=None):
        if field not in self.value:
            if required:
                self.fail("is required", field)
            return default
        value = self.value[field]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool) and bool not in _kinds(kind)):
            names = "/".join(k.__name__ for k in _kinds(kind))
            self.fail(f"must be {names}, got {type(value).__name__}", field)
        return value

    def at(self, field: str) -> str:
        return f"{self.path}.{field}" if self.path else field


def _kinds(kind) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _check_params(fields: _Fields, spec: tuple[tuple[str, ...], tuple[str, ...]], what: str) -> dict[str, Any]:
    params = fields.value
    required, optional = spec
    for name in required:
        if name not in params:
            fields.fail(f"{what} needs parameter '{name}'", name)
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        fields.fail(f"{what} takes no parameter '{unknown[0]}' (takes: {', '.join(required + optional)})", unknown[0])
    return dict(params)


def _files(fields: _Fields, keys: tuple[str, str]) -> None:
    files = fields.get("files", list)
    if not files:
        fields.fail("must list at least one file", "files")
    for i, entry in enumerate(files):
        item = _Fields(fields.task_id, f"{fields.at('files')}[{i}]", entry)
        for key in keys:
            if not item.get(key, str):
                item.fail("must not be empty", key)


def _command(fields: _Fields) -> None:
    command = fields.get("command", (str, list))
    if not command or (isinstance(command, list) and not all(isinstance(c, str) for c in command)):
        fields.fail("must be a non-empty string or list of strings", "command")


def _step(task_id: str, path: str, value: Any) -> Step:
    fields = _Fields(task_id, path, value)
    kind = fields.get("type", str)
    if kind not in SETUP_STEPS:
        fields.fail(f"unknown setup step '{kind}' (known: {', '.join(SETUP_STEPS)})", "type")
    params = _Fields(task_id, fields.at("parameters"), fields.get("parameters", dict, required=False, default={}))
    checked = _check_params(params, SETUP_STEPS[kind], f"'{kind}'")
    if kind == "download":
        _files(params, ("url", "path"))
    elif kind == "upload":
        _files(params, ("local_path", "path"))
    elif kind in ("launch", "execute", "command"):
        _command(params)
    elif kind == "open":
        params.get("path", str)
    elif kind == "sleep":
        seconds = params.get("seconds", (int, float))
        if not 0 <= seconds <= 600:
            params.fail("must be between 0 and 600", "seconds")
    return Step(kind, checked)


def _getter(task_id: str, path: str, value: Any) -> Getter:
    fields = _Fields(task_id, path, value)
    kind = fields.get("type", str)
    if kind not in GETTERS:
        fields.fail(f"unknown getter '{kind}' (known: {', '.join(GETTERS)})", "type")
    params = {k: v for k, v in fields.value.items() if k != "type"}
    checked = _check_params(_Fields(task_id, path, params), GETTERS[kind], f"getter '{kind}'")
    if kind == "vm_command_line":
        _command(fields)
    elif kind == "rule":
        fields.get("rules", dict)
    else:
        fields.get("path", str)
    return Getter(kind, checked)


def _as_list(value: Any, n: int) -> list[Any]:
    return value if isinstance(value, list) else [value] * n


def _evaluator(task_id: str, value: Any) -> Evaluator:
    fields = _Fields(task_id, "evaluator", value)
    func = fields.get("func", (str, list))
    funcs = [func] if isinstance(func, str) else func
    if not funcs:
        fields.fail("must name at least one metric", "func")
    n = len(funcs)
    listed = isinstance(func, list)
    for name in ("result", "expected", "options"):
        entry = fields.value.get(name)
        if listed and entry is not None and isinstance(entry, list) and len(entry) != n:
            fields.fail(f"lists {len(entry)} entries but 'func' lists {n}", name)
    results = _as_list(fields.value.get("result"), n)
    expecteds = _as_list(fields.value.get("expected"), n)
    options = _as_list(fields.value.get("options") or {}, n)
    checks = []
    for i, metric in enumerate(funcs):
        suffix = f"[{i}]" if listed else ""
        if not isinstance(metric, str) or metric not in METRICS:
            fields.fail(f"unknown metric {metric!r} (known: {', '.join(METRICS)})", "func" + suffix)
        getters: list[Getter | None] = []
        for name, entries in (("result", results), ("expected", expecteds)):
            entry = entries[i]
            if METRICS[metric] == 0:
                getters.append(None if entry is None else _getter(task_id, f"evaluator.{name}{suffix}", entry))
            elif entry is None:
                fields.fail(f"metric '{metric}' needs a '{name}' getter", name + suffix)
            else:
                getters.append(_getter(task_id, f"evaluator.{name}{suffix}", entry))
        option = options[i] if options[i] is not None else {}
        if not isinstance(option, dict):
            fields.fail("must be a JSON object", "options" + suffix)
        checks.append(Check(metric, getters[0], getters[1], dict(option)))
    conj = fields.get("conj", str, required=False, default="and")
    if conj not in CONJUNCTIONS:
        fields.fail(f"must be 'and' or 'or', got {conj!r}", "conj")
    postconfig = tuple(
        _step(task_id, f"evaluator.postconfig[{i}]", step)
        for i, step in enumerate(fields.get("postconfig", list, required=False, default=[]))
    )
    code = entry = None
    timeout = fields.get("timeout", (int, float), required=False, default=60.0)
    if "python_judge" in funcs:
        code = fields.get("code", str)
        entry = fields.get("entry", str)
        try:
            compile(code, f"<judge of {task_id}>", "exec")
        except SyntaxError as error:
            fields.fail(f"is not valid Python: {error}", "code")
        if f"def {entry}(" not in code:
            fields.fail(f"the code defines no function '{entry}'", "entry")
    return Evaluator(tuple(checks), conj, postconfig, code, entry, float(timeout))


def parse_task(value: Any, base_dir: str | pathlib.Path = ".") -> Task:
    """Validate a decoded task JSON object; raises TaskSchemaError naming the bad field."""
    task_id = value.get("id", "?") if isinstance(value, dict) else "?"
    fields = _Fields(str(task_id), "", value)
    task_id = fields.get("id", str)
    if not task_id:
        fields.fail("must not be empty", "id")
    instruction = fields.get("instruction", str)
    if not instruction.strip():
        fields.fail("must not be empty", "instruction")
    config = tuple(_step(task_id, f"config[{i}]", s) for i, s in enumerate(fields.get("config", list, required=False, default=[])))
    apps = fields.get("related_apps", list, required=False, default=[])
    if not all(isinstance(a, str) for a in apps):
        fields.fail("must be a list of strings", "related_apps")
    return Task(
        id=task_id, instruction=instruction, config=config, evaluator=_evaluator(task_id, fields.get("evaluator", dict)),
        snapshot=fields.get("snapshot", str, required=False, default="desktop"),
        source=fields.get("source", str, required=False, default=""), related_apps=tuple(apps),
        base_dir=str(base_dir), raw=value,
    )


def load_task(path: str | pathlib.Path) -> Task:
    """Read and validate one task file."""
    path = pathlib.Path(path)
    try:
        value = json.loads(path.read_text())
    except ValueError as error:
        raise TaskSchemaError(f"{path}: not valid JSON: {error}") from None
    try:
        return parse_task(value, path.parent)
    except TaskSchemaError as error:
        raise TaskSchemaError(f"{path}: {error}") from None


def load_suite(folder: str | pathlib.Path) -> list[Task]:
    """Every task (*.json) of a folder, sorted by file name."""
    return [load_task(p) for p in sorted(pathlib.Path(folder).glob("*.json"))]
