# Single job: the OSWorld task format: parsing and validating task JSON into typed tasks.
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

With a list of metrics, `result`, `expected` and `options` are lists of the same length
(null or {} where a metric takes no such value); a single getter or options object is
shared by every metric. An empty getter object ({}) means none.

The schema knows every setup step and getter type OSWorld defines (its
desktop_env/controllers/setup.py and evaluators/getters), with their parameters. Knowing
a type is not running it: which types this project runs, and which tasks it can run in a
given image, is cua_jax.tasks.runnable's business; a task it cannot run parses and fails
at setup with the reason.

Setup steps (`config`, `postconfig`), as OSWorld runs them:
    download {files: [{url, path}]}       url: a local path, file:// URL, loopback URL, or a
                                          URL found in the download mirror (cua_jax.tasks.fetch);
                                          fetched on the host and uploaded to `path`
    upload / upload_file {files: [{local_path, path}]}
    open {path}                           opens a file in its application
    launch {command, shell?}              starts a program, does not wait
    execute / command {command, shell?, stdout?, stderr?, until?, timeout?, check?}
                                          runs to completion (check: a nonzero exit status
                                          fails the step; default: in config, not in
                                          postconfig); {SCREEN_WIDTH} etc. are
                                          substituted; stdout/stderr: cache file names for
                                          the output (the `cache_file` getter reads them);
                                          until: {returncode|stdout|stderr}, re-run until met
    sleep {seconds}
    activate_window / close_window {window_name, strict?, by_class?, timeout?, check?}
                                          matched as wmctrl does; waits `timeout` seconds for
                                          the window; check: a missing window fails the step
    chrome_open_tabs {urls_to_open} / chrome_close_tabs {urls_to_close}
                                          through Chromium's remote-debugging endpoint
    change_wallpaper {path}               GNOME's background setting (gsettings)
    execute_with_verification, tidy_desktop, act, replay, proxy, googledrive, login,
    update_browse_history                 parsed, not run by this project

Getters: see GETTERS. The project's own: local_file {path} (a file beside the task).
Metrics: every metric of OSWorld's evaluators, implemented or listed with the reason it
is not (cua_jax.tasks.metrics: METRICS, KNOWN_UNIMPLEMENTED), e.g. exact_match,
compare_text_file, check_json, compare_table (csv, xlsx; OSWorld's rules),
compare_docx_files, compare_pptx_files, compare_pdfs, compare_images; infeasible (the
agent must declare FAIL); python_judge (`evaluator.code` defines `evaluator.entry`, a
function of no arguments returning a reward in [0, 1]; it runs inside the environment
with `evaluator.timeout`).
Relative local paths are resolved against the task file's folder.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any

from cua_jax.tasks import metrics as _metric_registry

# A type's parameters: (required, optional). OPEN among the optional ones: the type takes
# parameters this schema does not check (a type the project parses but does not run).
OPEN = "*"
SETUP_STEPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "download": (("files",), ()),
    "upload": (("files",), ()),
    "upload_file": (("files",), ()),
    "launch": (("command",), ("shell",)),
    "open": (("path",), ("timeout",)),
    "execute": (("command",), ("shell", "stdout", "stderr", "until", "timeout", "check")),
    "command": (("command",), ("shell", "stdout", "stderr", "until", "timeout", "check")),
    "sleep": (("seconds",), ()),
    "activate_window": (("window_name",), ("strict", "by_class", "timeout", "check")),
    "close_window": (("window_name",), ("strict", "by_class", "timeout", "check")),
    "chrome_open_tabs": (("urls_to_open",), ()),
    "chrome_close_tabs": (("urls_to_close",), ()),
    "change_wallpaper": (("path",), ()),
    "execute_with_verification": (("command",), ("verification", "max_wait_time", "check_interval", "shell")),
    "tidy_desktop": ((), (OPEN,)),
    "act": (("action_seq",), ()),
    "replay": (("trajectory",), ()),
    "proxy": ((), ("client_password",)),
    "googledrive": (("operation", "args"), ("settings_file",)),
    "login": (("platform",), ("settings_file",)),
    "update_browse_history": (("history",), ()),
}
_FILE = ("path",), ("dest", "multi", "gives")
# The getters that read Chrome's profile files (they take no parameters).
CHROME_PROFILE_GETTERS = (
    "default_search_engine",
    "bookmarks",
    "enabled_experiments",
    "chrome_language",
    "chrome_font_size",
    "profile_name",
    "enable_do_not_track",
    "enable_enhanced_safety_browsing",
    "new_startup_page",
    "data_delete_automacally",
)
GETTERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # files
    "vm_file": (("path",), ("dest", "multi", "gives", "time_suffix", "time_format")),
    "cloud_file": _FILE,
    "cache_file": (("path",), ()),
    "local_file": (("path",), ()),
    "content_from_vm_file": (("path", "file_type", "file_content"), ()),
    # commands and the screen
    "vm_command_line": (("command",), ("shell", "timeout")),
    "vm_command_error": (("command",), ("shell", "timeout")),
    "vm_terminal_output": ((), ()),
    "accessibility_tree": ((), ()),
    "list_directory": (("path",), ()),
    "vm_screen_size": ((), ()),
    "vm_window_size": (("app_class_name",), ()),
    "vm_wallpaper": (("dest",), ()),
    # rules
    "rule": (("rules",), ()),
    "rule_relativeTime": (("rules",), ()),
    "time_diff_range": (("diff_range_in_minutes",), ()),
    # applications' files and state
    "gimp_config_file": (("file_name", "dest"), ()),
    "vlc_config": (("dest",), ()),
    "vlc_playing_info": (("dest",), ()),
    "default_video_player": ((), ()),
    "vscode_config": (("vscode_extension_command", "path", "dest"), ()),
    "audio_in_slide": (("ppt_file_path", "slide_index", "dest"), ()),
    "background_image_in_slide": (("ppt_file_path", "slide_index", "dest"), ()),
    "conference_city_in_order": (("csv_path",), ()),
    "replay": ((), (OPEN,)),
    # Chrome's profile files (~/.config/google-chrome: Preferences, Local State, Bookmarks)
    **{name: ((), ()) for name in CHROME_PROFILE_GETTERS},
    # the browser's other state (its debugging protocol, databases, the web)
    **{
        name: ((), (OPEN,))
        for name in (
            "cookie_data",
            "open_tabs_info",
            "pdf_from_url",
            "shortcuts_on_desktop",
            "history",
            "page_info",
            "number_of_search_results",
            "googledrive_file",
            "active_tab_info",
            "enable_safe_browsing",
            "find_unpacked_extension_path",
            "active_tab_html_parse",
            "active_tab_url_parse",
            "gotoRecreationPage_and_get_html_content",
            "url_dashPart",
            "active_url_from_accessTree",
            "find_installed_extension_name",
            "info_from_website",
            "macys_product_url_parse",
            "url_path_parse",
            "chrome_appearance_mode_ui",
            "chrome_color_scheme",
        )
    },
}
# Metrics, from their registry (cua_jax.tasks.metrics): metric -> number of getter values it
# takes (result, expected), and how many of those a task must name. A metric OSWorld defines
# but this project does not implement (UNIMPLEMENTED_METRICS: name -> reason) parses, with
# any getters, and fails when judged.
METRICS: dict[str, int] = {name: entry.arity for name, entry in _metric_registry.METRICS.items()}
METRIC_REQUIRED: dict[str, int] = {name: entry.required for name, entry in _metric_registry.METRICS.items()}
UNIMPLEMENTED_METRICS: dict[str, str] = dict(_metric_registry.KNOWN_UNIMPLEMENTED)
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
    if unknown and OPEN not in optional:
        fields.fail(f"{what} takes no parameter '{unknown[0]}' (takes: {', '.join(required + optional)})", unknown[0])
    return dict(params)


# ---- parameter checks: each validates fields.value[name] and returns its normal form ----


def _text(fields: _Fields, name: str) -> str:
    value = fields.get(name, str)
    if not value.strip():
        fields.fail("must not be empty", name)
    return value


def _file_name(fields: _Fields, name: str, value: Any = None, where: str | None = None) -> str:
    """A file name in the judge's cache folder: no folders, no '..'."""
    value = fields.value[name] if value is None else value
    if not isinstance(value, str) or not value or "/" in value or "\\" in value or value in (".", ".."):
        fields.fail(f"must be a file name (no folders), got {value!r}", where or name)
    return value


def _flag(fields: _Fields, name: str) -> bool:
    """A boolean; OSWorld's files also write "true" / "false" as strings."""
    value = fields.value[name]
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        fields.fail(f"must be true or false, got {value!r}", name)
    return value


def _number(low: float, high: float | None = None, low_open: bool = False) -> Callable[[_Fields, str], float]:
    def check(fields: _Fields, name: str) -> float:
        value = fields.get(name, (int, float))
        if value < low or (low_open and value == low) or (high is not None and value > high):
            bounds = (
                f"> {low:g}"
                if low_open and high is None
                else f"between {low:g} and {high:g}"
                if high
                else f">= {low:g}"
            )
            fields.fail(f"must be {bounds}, got {value!r}", name)
        return value

    return check


def _command(fields: _Fields, name: str = "command") -> str | list[str]:
    command = fields.get(name, (str, list))
    if not command or (isinstance(command, list) and not all(isinstance(c, str) for c in command)):
        fields.fail("must be a non-empty string or list of strings", name)
    return command


def _strings(fields: _Fields, name: str) -> list[str]:
    value = fields.get(name, list)
    if not value or not all(isinstance(v, str) and v for v in value):
        fields.fail("must be a non-empty list of non-empty strings", name)
    return value


def _files(keys: tuple[str, str]) -> Callable[[_Fields, str], list[dict[str, Any]]]:
    def check(fields: _Fields, name: str) -> list[dict[str, Any]]:
        files = fields.get(name, list)
        if not files:
            fields.fail("must list at least one file", name)
        for i, entry in enumerate(files):
            item = _Fields(fields.task_id, f"{fields.at(name)}[{i}]", entry)
            for key in keys:
                if not item.get(key, str):
                    item.fail("must not be empty", key)
        return files

    return check


def _until(fields: _Fields, name: str) -> dict[str, Any]:
    until = fields.get(name, dict)
    unknown = sorted(set(until) - {"returncode", "stdout", "stderr"})
    if unknown:
        fields.fail(f"knows returncode, stdout and stderr, not '{unknown[0]}'", name)
    return until


def _of(kind) -> Callable[[_Fields, str], Any]:
    return lambda fields, name: fields.get(name, kind)


def _slide_index(fields: _Fields, name: str) -> int:
    value = fields.value[name]
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fields.fail(f"must be an integer >= 0, got {value!r}", name)
    return value


PARAMETERS: dict[str, Callable[[_Fields, str], Any]] = {
    "command": _command,
    "shell": _flag,
    "strict": _flag,
    "by_class": _flag,
    "check": _flag,
    "multi": _flag,
    "time_suffix": _flag,
    "seconds": _number(0, 600),
    "timeout": _number(0, low_open=True),
    "max_wait_time": _number(0, low_open=True),
    "check_interval": _number(0, low_open=True),
    "diff_range_in_minutes": _number(0),
    "path": _text,
    "window_name": _text,
    "app_class_name": _text,
    "file_name": _text,
    "file_type": _text,
    "file_content": _text,
    "vscode_extension_command": _text,
    "ppt_file_path": _text,
    "csv_path": _text,
    "time_format": _text,
    "platform": _text,
    "settings_file": _text,
    "trajectory": _text,
    "client_password": _of(str),
    "stdout": _file_name,
    "stderr": _file_name,
    "dest": _file_name,
    "until": _until,
    "rules": _of((dict, list)),
    "verification": _of(dict),
    "urls_to_open": _strings,
    "urls_to_close": _strings,
    "action_seq": _of(list),
    "history": _of(list),
    "operation": _of(list),
    "args": _of(list),
    "slide_index": _slide_index,
}


def _checked(
    fields: _Fields,
    spec: tuple[tuple[str, ...], tuple[str, ...]],
    what: str,
    special: dict[str, Callable[[_Fields, str], Any]] | None = None,
) -> dict[str, Any]:
    """The parameters of one step / getter, each checked and normalised."""
    params = _check_params(fields, spec, what)
    if OPEN in spec[1]:
        return params  # a type this project does not run: taken as written
    for name in params:
        check = (special or {}).get(name) or PARAMETERS.get(name)
        if check is not None:
            params[name] = check(fields, name)
    return params


_STEP_SPECIAL = {
    "download": {"files": _files(("url", "path"))},
    "upload": {"files": _files(("local_path", "path"))},
    "upload_file": {"files": _files(("local_path", "path"))},
}


def _step(task_id: str, path: str, value: Any) -> Step:
    fields = _Fields(task_id, path, value)
    kind = fields.get("type", str)
    if kind not in SETUP_STEPS:
        fields.fail(f"unknown setup step '{kind}' (known: {', '.join(SETUP_STEPS)})", "type")
    params = _Fields(task_id, fields.at("parameters"), fields.get("parameters", dict, required=False, default={}))
    return Step(kind, _checked(params, SETUP_STEPS[kind], f"'{kind}'", _STEP_SPECIAL.get(kind)))


def _file_getter(fields: _Fields, params: dict[str, Any]) -> None:
    """vm_file / cloud_file: one path (and dest), or with `multi` lists of them; `gives`
    picks which of the files the metric gets (default [0])."""
    multi = params.get("multi", False)
    paths = params["path"]
    if multi:
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
            fields.fail("must be a non-empty list of paths when 'multi' is true", "path")
        dests = params.get("dest")
        if dests is not None:
            if not isinstance(dests, list) or len(dests) != len(paths):
                fields.fail(f"must list one file name per path ({len(paths)})", "dest")
            for i, dest in enumerate(dests):
                _file_name(fields, "dest", dest, f"dest[{i}]")
    else:
        if not isinstance(paths, str) or not paths:
            fields.fail("must be a non-empty string (a list needs 'multi': true)", "path")
        if "dest" in params:
            _file_name(fields, "dest")
    if "gives" in params:
        gives = params["gives"]
        count = len(paths) if multi else 1
        if (
            not isinstance(gives, list)
            or not gives
            or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < count for g in gives)
        ):
            fields.fail(f"must be a non-empty list of file indices in [0, {count})", "gives")


def _getter(task_id: str, path: str, value: Any) -> Getter:
    fields = _Fields(task_id, path, value)
    kind = fields.get("type", str)
    if kind not in GETTERS:
        fields.fail(f"unknown getter '{kind}' (known: {', '.join(GETTERS)})", "type")
    params = {k: v for k, v in fields.value.items() if k != "type"}
    inner = _Fields(task_id, path, params)
    special = {"path": lambda f, n: f.value[n], "dest": lambda f, n: f.value[n], "gives": lambda f, n: f.value[n]}
    if kind not in ("vm_file", "cloud_file"):
        special = {"path": _file_name} if kind == "cache_file" else None
    checked = _checked(inner, GETTERS[kind], f"getter '{kind}'", special)
    if kind in ("vm_file", "cloud_file"):
        _file_getter(inner, checked)
    return Getter(kind, checked)


def _no_getter(entry: Any) -> bool:
    return entry is None or entry == {}


def _per_metric(fields: _Fields, name: str, n: int, listed: bool) -> list[Any]:
    """`name`'s entry for each of the n metrics."""
    entry = fields.value.get(name)
    if isinstance(entry, list):
        if not listed:
            fields.fail("must be one object when 'func' names one metric", name)
        if len(entry) != n:
            fields.fail(f"lists {len(entry)} entries but 'func' lists {n}", name)
        return entry
    return [entry] * n


def _evaluator(task_id: str, value: Any) -> Evaluator:
    fields = _Fields(task_id, "evaluator", value)
    func = fields.get("func", (str, list))
    funcs = [func] if isinstance(func, str) else func
    if not funcs or any(f == "" for f in funcs):
        fields.fail("must name at least one metric", "func")
    n = len(funcs)
    listed = isinstance(func, list)
    results = _per_metric(fields, "result", n, listed)
    expecteds = _per_metric(fields, "expected", n, listed)
    options = _per_metric(fields, "options", n, listed)
    checks = []
    for i, metric in enumerate(funcs):
        suffix = f"[{i}]" if listed else ""
        if not isinstance(metric, str) or (metric not in METRICS and metric not in UNIMPLEMENTED_METRICS):
            fields.fail(f"unknown metric {metric!r} (known: {', '.join(METRICS)})", "func" + suffix)
        getters: list[Getter | None] = []
        for j, (name, entries) in enumerate((("result", results), ("expected", expecteds))):
            entry = None if _no_getter(entries[i]) else entries[i]
            if entry is None:
                if j < METRIC_REQUIRED.get(metric, 0):
                    fields.fail(f"metric '{metric}' needs a '{name}' getter", name + suffix)
                getters.append(None)
            elif 0 < METRICS.get(metric, 2) <= j:  # (a metric of no getter values ignores any)
                fields.fail(f"metric '{metric}' takes no '{name}' getter", name + suffix)
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


def _source(fields: _Fields) -> str:
    """Where the task comes from: a string, or (some OSWorld files) a list of them."""
    source = fields.get("source", (str, list), required=False, default="")
    if isinstance(source, list):
        if not all(isinstance(s, str) for s in source):
            fields.fail("must be a string or a list of strings", "source")
        source = " ".join(source)
    return source


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
    config = tuple(
        _step(task_id, f"config[{i}]", s) for i, s in enumerate(fields.get("config", list, required=False, default=[]))
    )
    apps = fields.get("related_apps", list, required=False, default=[])
    if not all(isinstance(a, str) for a in apps):
        fields.fail("must be a list of strings", "related_apps")
    return Task(
        id=task_id,
        instruction=instruction,
        config=config,
        evaluator=_evaluator(task_id, fields.get("evaluator", dict)),
        snapshot=fields.get("snapshot", str, required=False, default="desktop"),
        source=_source(fields),
        related_apps=tuple(apps),
        base_dir=str(base_dir),
        raw=value,
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
