"""Web application tasks in WebArena's JSON format, one file each.

Fields read (WebArena's): `task_id`, `intent`, `start_url` (a path on the capsule's own site,
e.g. "/ticket/5"; WebArena's `__TRAC__` site placeholder before it is dropped), `require_reset`
(every capsule episode starts from its own branch, so it always holds), `eval` (the judges'
spec, `judges.py`). cua_jax's own: `resources` (the task's resource contract: which state is
authoritative, derived, ephemeral) and `scripts` (`solution` and `near_miss`, steps the
validation command plays; `script.py`). A malformed file raises TaskFileError naming the file
and the field.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from cua_jax.envs.webapp.judges import validate_eval

SITE_PLACEHOLDERS = ("__TRAC__",)  # WebArena writes a site's base URL as a placeholder
RESOURCE_CLASSES = ("authoritative", "derived", "ephemeral")
VALIDATION_FILE = "validation.json"  # the validation command's results beside the tasks (`script.py`), no task


class TaskFileError(ValueError):
    """A task file that is not a valid task: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class WebappTask:
    """One task. start_url: the path the episode opens on the capsule's site."""

    task_id: str
    intent: str
    start_url: str
    eval: Mapping[str, Any]
    resources: Mapping[str, tuple[str, ...]]
    scripts: Mapping[str, tuple[Mapping[str, Any], ...]]
    origin: str = ""
    sites: tuple[str, ...] = ("trac",)


def _field(data: Mapping[str, Any], name: str, kind: type, origin: str) -> Any:
    if name not in data:
        raise TaskFileError(f"{origin}: the task has no {name!r} field")
    value = data[name]
    if not isinstance(value, kind):
        raise TaskFileError(f"{origin}: {name!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def parse_task(data: Any, origin: str = "<task>") -> WebappTask:
    """The task of one file's JSON object."""
    if not isinstance(data, dict):
        raise TaskFileError(f"{origin}: a task file holds one JSON object, got {type(data).__name__}")
    task_id = str(_field(data, "task_id", (str, int), origin))
    intent = _field(data, "intent", str, origin).strip()
    if not intent:
        raise TaskFileError(f"{origin}: 'intent' is empty")
    start_url = _field(data, "start_url", str, origin)
    for placeholder in SITE_PLACEHOLDERS:
        start_url = start_url.replace(placeholder, "")
    if not start_url.startswith("/"):
        raise TaskFileError(f"{origin}: 'start_url' must be a path on the site (\"/...\"), got {start_url!r}")
    spec = _field(data, "eval", dict, origin)
    try:
        validate_eval(spec, origin)
    except ValueError as error:
        raise TaskFileError(str(error)) from None
    resources_raw = data.get("resources", {})
    if not isinstance(resources_raw, dict) or set(resources_raw) - set(RESOURCE_CLASSES):
        raise TaskFileError(f"{origin}: 'resources' must map some of {RESOURCE_CLASSES} to lists of resources")
    resources = {name: tuple(str(r) for r in resources_raw.get(name, ())) for name in RESOURCE_CLASSES}
    scripts_raw = data.get("scripts", {})
    if not isinstance(scripts_raw, dict):
        raise TaskFileError(f"{origin}: 'scripts' must map script names to lists of steps")
    scripts = {}
    for name, steps in scripts_raw.items():
        if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
            raise TaskFileError(f"{origin}: 'scripts.{name}' must be a list of step objects")
        scripts[name] = tuple(steps)
    sites = tuple(data.get("sites", ("trac",)))
    return WebappTask(task_id, intent, start_url, spec, resources, scripts, origin, sites)


def load_task(path: str | pathlib.Path) -> WebappTask:
    path = pathlib.Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TaskFileError(f"{path}: not JSON ({error})") from None
    return parse_task(data, str(path))


def load_tasks(folder: str | pathlib.Path) -> list[WebappTask]:
    """Every task file (*.json but the validation file) of `folder`, sorted by file name;
    duplicate ids raise."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise TaskFileError(f"{folder}: no such task folder")
    tasks = [load_task(path) for path in sorted(folder.glob("*.json")) if path.name != VALIDATION_FILE]
    if not tasks:
        raise TaskFileError(f"{folder}: no task files (*.json)")
    seen: dict[str, str] = {}
    for task in tasks:
        if task.task_id in seen:
            raise TaskFileError(f"{task.origin}: task_id {task.task_id!r} is taken by {seen[task.task_id]}")
        seen[task.task_id] = task.origin
    return tasks
