"""Running a task against an environment: setup steps, getters, metrics and the verdict.

OSWorld's evaluator: reward = metric(result_getter(env, result), expected_getter(env,
expected), **options), combined over several metrics by `conj` ("and": 0 as soon as
one metric is 0, else their mean; "or": 1 as soon as one is 1, else their maximum).

Metrics are plain functions of host-side values (file paths, strings, rule dicts) and
never execute task-supplied code. A Python judge (`python_judge`, ScaleCUA App. B) runs
inside the environment through /run_python with a timeout, never in this process.

Errors are sorted for fault attribution (cua_jax.envs.faults):
    SetupError   a setup step failed (the task could not be prepared): quarantine.
    JudgeError   the judge itself broke (bad rules, crashing judge code): quarantine.
    EnvError     (cua_jax.envs.client) the environment broke: quarantine.
A missing result file or a wrong value is the agent's doing and simply scores 0.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import pathlib
import re
import shutil
import time
import urllib.parse
import urllib.request
import zipfile
from typing import Any, Callable
from xml.etree import ElementTree

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvClient, EnvError, EnvRequestError
from cua_jax.tasks.schema import GETTERS, METRICS, Check, Getter, Step, Task

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
JUDGE_MARKER = "__cua_jax_judge_result__"


class SetupError(RuntimeError):
    """A setup or postconfig step failed."""


class JudgeError(RuntimeError):
    """The judge could not reach a verdict through no fault of the agent."""


# ------------------------------------------------------------------------------------
# Fetching local / loopback resources on the host
# ------------------------------------------------------------------------------------


def _resolve_local(path: str, base_dir: str) -> pathlib.Path:
    candidate = pathlib.Path(path).expanduser()
    return candidate if candidate.is_absolute() else pathlib.Path(base_dir) / candidate


def fetch(url: str, base_dir: str, timeout: float = 30.0) -> bytes:
    """The bytes behind a local path, a file:// URL or a loopback http(s) URL.

    Environments have no network, so downloads happen here and are uploaded; other hosts
    are refused.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("", "file"):
        path = _resolve_local(urllib.parse.unquote(parsed.path) if parsed.scheme else url, base_dir)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        return path.read_bytes()
    if parsed.scheme in ("http", "https"):
        if parsed.hostname not in LOOPBACK_HOSTS:
            raise PermissionError(f"only loopback URLs may be downloaded, not {parsed.hostname}")
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    raise ValueError(f"unsupported URL scheme '{parsed.scheme}' in {url}")


# ------------------------------------------------------------------------------------
# Setup and postconfig
# ------------------------------------------------------------------------------------


def run_steps(steps: tuple[Step, ...], client: EnvClient, base_dir: str) -> None:
    """Run setup (or postconfig) steps in order; SetupError names the failing step.

    EnvUnreachable / EnvServerError from a dead environment propagate unchanged.
    """
    for index, step in enumerate(steps):
        p = step.parameters
        try:
            if step.type in ("download", "upload"):
                for entry in p["files"]:
                    source = entry["url"] if step.type == "download" else entry["local_path"]
                    data = fetch(source, base_dir)
                    client.upload(entry["path"], data)
            elif step.type == "launch":
                client.launch(p["command"], shell=bool(p.get("shell", False)))
            elif step.type == "open":
                client.open_file(p["path"], timeout=float(p.get("timeout", 60.0)))
            elif step.type in ("execute", "command"):
                reply = client.execute(p["command"], shell=bool(p.get("shell", False)),
                                       timeout=float(p.get("timeout", 60.0)))
                if reply.get("returncode") != 0:
                    raise SetupError(f"exit status {reply.get('returncode')}: {reply.get('error', '')[:300]}")
            elif step.type == "sleep":
                time.sleep(float(p["seconds"]))
            else:
                raise SetupError(f"unknown step type {step.type}")
        except (SetupError, EnvRequestError, OSError, ValueError) as error:
            raise SetupError(f"step {index} ({step.type}) failed: {error}") from None


# ------------------------------------------------------------------------------------
# Getters
# ------------------------------------------------------------------------------------


class Getters:
    """Getters bound to one environment and task. Each returns a host-side value."""

    def __init__(self, client: EnvClient, task: Task, cache_dir: str | pathlib.Path):
        self.client, self.task = client, task
        self.cache_dir = pathlib.Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def get(self, getter: Getter | None) -> Any:
        if getter is None:
            return None
        return getattr(self, getter.type)(**getter.parameters)

    def vm_file(self, path: str, dest: str | None = None, multi: bool = False, gives=None) -> Any:
        """Copy files out of the environment; the local path, or None when missing."""
        if multi:
            dests = dest or [None] * len(path)
            return [self.vm_file(p, d) for p, d in zip(path, dests)]
        data = self.client.get_file(path)
        if data is None:
            return None
        local = self.cache_dir / "vm" / (dest or pathlib.PurePosixPath(path).name)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        return str(local)

    def vm_command_line(self, command, shell: bool = False, timeout: float = 60.0) -> str:
        """A command's standard output inside the environment."""
        return self.client.execute(command, shell=shell, timeout=timeout).get("output", "")

    def rule(self, rules: dict) -> dict:
        return rules

    def local_file(self, path: str) -> str:
        local = _resolve_local(path, self.task.base_dir)
        if not local.is_file():
            raise JudgeError(f"expected file {local} does not exist")
        return str(local)

    def cloud_file(self, path: str, dest: str | None = None) -> str:
        """A file fetched once (from a local path or loopback URL) into the cache."""
        key = hashlib.sha256(path.encode()).hexdigest()[:16]
        local = self.cache_dir / "cloud" / key / (dest or pathlib.PurePosixPath(urllib.parse.urlsplit(path).path).name)
        if not local.exists():
            try:
                data = fetch(path, self.task.base_dir)
            except (OSError, ValueError) as error:
                raise JudgeError(f"cannot fetch expected file {path}: {error}") from None
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
        return str(local)


assert set(GETTERS) <= {name for name in dir(Getters) if not name.startswith("_")}


# ------------------------------------------------------------------------------------
# Metrics: value(s) in, reward in [0, 1] out
# ------------------------------------------------------------------------------------


def exact_match(result: Any, rules: dict, **_) -> float:
    """1 when the result equals rules['expected'] exactly."""
    return float(result is not None and result == _rule(rules, "expected"))


def check_include_exclude(result: Any, rules: dict, **_) -> float:
    """1 when the text contains every rules['include'] string and no rules['exclude'] one."""
    if result is None:
        return 0.0
    text = str(result)
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return float(all(s in text for s in include) and not any(s in text for s in exclude))


def _read_text(path: str | None) -> str | None:
    if path is None or not pathlib.Path(path).is_file():
        return None
    return pathlib.Path(path).read_text(encoding="utf-8", errors="replace")


def compare_text_file(result_path: str | None, expected_path: str | None,
                      ignore_blanks: bool = False, ignore_case: bool = False, **_) -> float:
    """1 when two text files hold the same text (optionally ignoring whitespace runs / case)."""
    result, expected = _read_text(result_path), _read_text(expected_path)
    if expected is None:
        raise JudgeError(f"expected file {expected_path} is missing")
    if result is None:
        return 0.0
    if ignore_blanks:
        result, expected = re.sub(r"\s+", " ", result).strip(), re.sub(r"\s+", " ", expected).strip()
    if ignore_case:
        result, expected = result.lower(), expected.lower()
    return float(result == expected)


_MISSING = object()


def _json_key(value: Any, key: list) -> Any:
    for part in key:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and -len(value) <= part < len(value):
            value = value[part]
        else:
            return _MISSING
    return value


JSON_METHODS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda value, ref: value == ref,
    "ne": lambda value, ref: value is not _MISSING and value != ref,
    "has": lambda value, ref: isinstance(value, (list, str, dict)) and ref in value,
    "exists": lambda value, ref: value is not _MISSING,
}


def check_json(result_path: str | None, rules: dict, **_) -> float:
    """1 when the JSON file meets every rules['expect'] item and no rules['unexpect'] one.

    Items are {"key": [path...], "method": eq|ne|has|exists, "ref": value}.
    """
    text = _read_text(result_path)
    if text is None:
        return 0.0
    try:
        data = json.loads(text)
    except ValueError:
        return 0.0  # the agent wrote something that is not JSON

    def holds(item: dict) -> bool:
        method = item.get("method", "eq")
        if method not in JSON_METHODS or not isinstance(item.get("key"), list):
            raise JudgeError(f"bad check_json rule {item!r}: needs a 'key' list and a method of {list(JSON_METHODS)}")
        return JSON_METHODS[method](_json_key(data, item["key"]), item.get("ref"))

    return float(all(holds(i) for i in rules.get("expect", [])) and not any(holds(i) for i in rules.get("unexpect", [])))


def _xlsx_sheets(path: str) -> dict[str, list[list[str]]]:
    """The cell values of every sheet of an xlsx file, as strings (standard library only)."""
    ns = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main",
          "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships"}
    with zipfile.ZipFile(path) as archive:
        shared = []
        if "xl/sharedStrings.xml" in archive.namelist():
            root = ElementTree.fromstring(archive.read("xl/sharedStrings.xml"))
            shared = ["".join(t.text or "" for t in si.iter(f"{{{ns['m']}}}t")) for si in root.findall("m:si", ns)]
        rels = ElementTree.fromstring(archive.read("xl/_rels/workbook.xml.rels"))
        targets = {rel.get("Id"): rel.get("Target") for rel in rels}
        workbook = ElementTree.fromstring(archive.read("xl/workbook.xml"))
        sheets = {}
        for sheet in workbook.find("m:sheets", ns):
            target = targets[sheet.get(f"{{{ns['r']}}}id")].lstrip("/")
            target = target if target.startswith("xl/") else "xl/" + target
            root = ElementTree.fromstring(archive.read(target))
            rows: dict[int, dict[int, str]] = {}
            for cell in root.iter(f"{{{ns['m']}}}c"):
                column, row = _cell_index(cell.get("r"))
                kind = cell.get("t", "n")
                value = cell.find("m:v", ns)
                if kind == "s" and value is not None:
                    text = shared[int(value.text)]
                elif kind == "inlineStr":
                    text = "".join(t.text or "" for t in cell.iter(f"{{{ns['m']}}}t"))
                else:
                    text = value.text if value is not None and value.text is not None else ""
                rows.setdefault(row, {})[column] = text
            width = max((max(r) + 1 for r in rows.values() if r), default=0)
            height = max(rows, default=-1) + 1
            sheets[sheet.get("name")] = [[rows.get(r, {}).get(c, "") for c in range(width)] for r in range(height)]
        return sheets


def _cell_index(ref: str) -> tuple[int, int]:
    match = re.fullmatch(r"([A-Z]+)(\d+)", ref or "")
    if not match:
        raise JudgeError(f"bad cell reference {ref!r} in the spreadsheet")
    column = 0
    for char in match.group(1):
        column = column * 26 + ord(char) - ord("A") + 1
    return column - 1, int(match.group(2)) - 1


def read_table(path: str) -> list[list[list[str]]]:
    """The sheets of a csv or xlsx file, each a list of rows of string cells."""
    suffix = pathlib.Path(path).suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            return [list(csv.reader(handle))]
    if suffix == ".xlsx":
        return list(_xlsx_sheets(path).values())
    raise JudgeError(f"compare_table reads .csv and .xlsx files, not '{suffix}'")


def _normalise_cell(text: str) -> Any:
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return round(number, 9) if math.isfinite(number) else text


def _normalise_sheet(rows: list[list[str]]) -> list[list[Any]]:
    cells = [[_normalise_cell(c) for c in row] for row in rows]
    for row in cells:
        while row and row[-1] == "":
            row.pop()
    while cells and not cells[-1]:
        cells.pop()
    return cells


def compare_table(result_path: str | None, expected_path: str | None, **_) -> float:
    """1 when two tables (csv / xlsx, any mix) hold the same cells in every sheet.

    Numbers compare by value ("5" == "5.0"); trailing empty cells and rows are ignored.
    """
    if expected_path is None:
        raise JudgeError("compare_table has no expected table")
    if result_path is None or not pathlib.Path(result_path).is_file():
        return 0.0
    expected = [_normalise_sheet(s) for s in read_table(expected_path)]
    try:
        result = [_normalise_sheet(s) for s in read_table(result_path)]
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, UnicodeError):
        return 0.0  # the agent saved something unreadable
    return float(result == expected)


def infeasible(*_, last_action: A.Action | A.InvalidAction | None = None, **__) -> float:
    """1 when the agent declared the task infeasible (its last action is FAIL)."""
    return float(isinstance(last_action, A.Fail))


def _rule(rules: Any, key: str) -> Any:
    if not isinstance(rules, dict) or key not in rules:
        raise JudgeError(f"the expected rules need '{key}', got {rules!r}")
    return rules[key]


METRIC_FUNCTIONS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "compare_text_file": compare_text_file,
    "check_json": check_json,
    "compare_table": compare_table,
    "infeasible": infeasible,
}
assert set(METRIC_FUNCTIONS) | {"python_judge"} == set(METRICS)


# ------------------------------------------------------------------------------------
# The Python judge, run inside the environment
# ------------------------------------------------------------------------------------

_JUDGE_RUNNER = """
import json as _json
{code}

_value = {entry}()
print({marker!r} + _json.dumps(float(_value)))
"""


def run_python_judge(client: EnvClient, code: str, entry: str, timeout: float) -> float:
    """Run judge code inside the environment; its entry function returns a reward in [0, 1]."""
    reply = client.run_python(_JUDGE_RUNNER.format(code=code, entry=entry, marker=JUDGE_MARKER), timeout=timeout)
    for line in reversed(reply.get("output", "").splitlines()):
        if line.startswith(JUDGE_MARKER):
            value = float(line[len(JUDGE_MARKER):])
            if not 0.0 <= value <= 1.0:
                raise JudgeError(f"the judge returned {value}, not a reward in [0, 1]")
            return value
    raise JudgeError(f"the judge gave no result: {reply.get('error', '')[-500:]}")


# ------------------------------------------------------------------------------------
# The verdict
# ------------------------------------------------------------------------------------


def evaluate(task: Task, client: EnvClient, cache_dir: str | pathlib.Path,
             last_action: A.Action | A.InvalidAction | None = None) -> float:
    """Run postconfig, then the task's metrics; the reward in [0, 1].

    An infeasible task (metric `infeasible`) is judged on the last action alone. Raises
    SetupError (postconfig), JudgeError or EnvError when no verdict can be reached.
    """
    evaluator = task.evaluator
    if evaluator.infeasible:
        return infeasible(last_action=last_action)
    if isinstance(last_action, A.Fail):
        return 0.0  # declared infeasible a feasible task
    run_steps(evaluator.postconfig, client, task.base_dir)
    getters = Getters(client, task, cache_dir)
    scores = []
    for check in evaluator.checks:
        score = _score(check, getters, evaluator, client)
        if evaluator.conj == "and" and score == 0.0:
            return 0.0
        if evaluator.conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    return sum(scores) / len(scores) if evaluator.conj == "and" else max(scores)


def _score(check: Check, getters: Getters, evaluator, client: EnvClient) -> float:
    if check.func == "python_judge":
        return run_python_judge(client, evaluator.code, evaluator.entry, evaluator.timeout)
    result = getters.get(check.result)
    expected = getters.get(check.expected)
    try:
        score = float(METRIC_FUNCTIONS[check.func](result, expected, **check.options))
    except (JudgeError, EnvError):
        raise
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        raise JudgeError(f"metric {check.func} failed: {type(error).__name__}: {error}") from None
    return score


def clear_cache(cache_dir: str | pathlib.Path) -> None:
    shutil.rmtree(cache_dir, ignore_errors=True)
