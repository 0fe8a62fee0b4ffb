"""Where a run's tasks come from: MiniWoB++ task lists, folders of OSWorld-format task JSON
and folders of code tasks (`load_code_tasks`: bugs in Python repositories, run in code
containers), gathered into one `TaskCatalog` the trainer samples from and the rollout workers run.

    catalog = TaskCatalog(miniwob_tasks(["click-button", "focus-text"], tiers=[0, 1])
                          + load_task_folder("cua_jax/tasks/suites/desktop"))
    catalog["terminal-create-file"].kind        # "desktop": runs on a pooled Docker desktop
    catalog.pool(domain_weights={"desktop": 2}) # the sampler's TaskPool, with domain priors

A folder holds task files (a JSON object with an "evaluator"), found at any depth:
  * OSWorld's layout, `examples/<domain>/<id>.json`: the domain is the sub-folder;
  * VeriGen's output (`experiments/synthesize.py`: tasks/*.json beside judges/*.py, and the
    same under augmented/ and from_run/): a `tasks` folder names no domain, so its files take
    the folder above it (the output folder's own name for the top level);
  * a flat folder (the desktop suite): the folder's own name.
A "domain" field of the file wins over its place. Other JSON files (OSWorld's
test_all.json index, VeriGen's reports) hold no task and are skipped; a file that looks
like a task (an "id", "instruction" or "evaluator") and breaks the schema is an error
naming the file and field. A task whose evaluator is `infeasible` (the right answer is to
declare failure) is infeasible: DTAC's infeasible share draws from those.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.envs.miniwob import check_task
from cua_jax.tasks.code_tasks import load_code_suite
from cua_jax.tasks.pool import PoolTask, TaskPool
from cua_jax.tasks.schema import Task, TaskSchemaError, parse_task

MINIWOB_DOMAIN = "miniwob"
_TASK_KEYS = ("id", "instruction", "evaluator")


@dataclasses.dataclass(frozen=True)
class SourceTask:
    """One task a run can draw.

    kind: what runs it ("miniwob": a capsule of the shared browser; "desktop": a pooled
        Docker desktop; "code": a code container; or a plugin kind registered in
        `cua_jax.environments.kinds`). spec: what that environment's reset takes
        (the MiniWoB task name, the desktop `schema.Task`, or the `code_tasks.CodeTask`).
        origin: the file or list it came from (for errors).
    """

    task_id: str
    kind: str
    domain: str
    tier: int
    feasible: bool
    spec: Any
    origin: str = ""

    def pool_task(self) -> PoolTask:
        return PoolTask(self.task_id, self.domain, self.tier, self.feasible, {"kind": self.kind, "origin": self.origin})


def miniwob_tasks(names: Sequence[str], tiers: Sequence[int] | None = None) -> list[SourceTask]:
    """MiniWoB++ tasks by name (domain "miniwob"; tiers default to 0). An unknown name raises."""
    tiers = [0] * len(names) if tiers is None else list(tiers)
    if len(tiers) != len(names):
        raise ValueError(f"{len(tiers)} tiers for {len(names)} MiniWoB tasks")
    out = []
    for name, tier in zip(names, tiers):
        check_task(name)
        out.append(SourceTask(name, "miniwob", MINIWOB_DOMAIN, int(tier), True, name, "miniwob"))
    return out


def _looks_like_task(value: Any) -> bool:
    return isinstance(value, dict) and any(key in value for key in _TASK_KEYS)


def _domain_of(path: pathlib.Path, root: pathlib.Path) -> str:
    """The folder that names `path`'s domain: the nearest folder above it that is not a
    `tasks` folder, below or at the root (the root's own name)."""
    parts = [part for part in path.relative_to(root).parent.parts if part != "tasks"]
    return parts[-1] if parts else root.resolve().name


@dataclasses.dataclass(frozen=True)
class TaskFile:
    """One task file of a folder: its domain and tier, and the parsed task or why it is
    not one (the schema error naming the file and field)."""

    path: pathlib.Path
    domain: str
    tier: int
    task: Task | None
    error: TaskSchemaError | None = None


def scan_task_folder(folder: str | pathlib.Path) -> list[TaskFile]:
    """Every task file under `folder` (any depth, sorted by path), parsed or not: a file that
    breaks the schema comes with its error instead of a task. JSON files holding no task
    are skipped; see the module doc for domains."""
    root = pathlib.Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"task folder {str(folder)!r} does not exist")
    out = []
    for path in sorted(root.rglob("*.json")):
        domain = _domain_of(path, root)
        try:
            value = json.loads(path.read_text())
        except ValueError as error:
            out.append(TaskFile(path, domain, 0, None, TaskSchemaError(f"{path}: not valid JSON: {error}")))
            continue
        if not _looks_like_task(value):
            continue
        domain = value.get("domain", domain)
        tier = value.get("tier", (value.get("metadata") or {}).get("tier", 0))
        try:
            task = parse_task(value, path.parent)
            if not isinstance(domain, str) or not domain:
                raise TaskSchemaError(f"task {task.id!r}: field 'domain' must be a non-empty string, got {domain!r}")
            if isinstance(tier, bool) or not isinstance(tier, int) or tier < 0:
                raise TaskSchemaError(f"task {task.id!r}: field 'tier' must be an int >= 0, got {tier!r}")
        except TaskSchemaError as error:
            domain = domain if isinstance(domain, str) and domain else _domain_of(path, root)
            out.append(TaskFile(path, domain, 0, None, TaskSchemaError(f"{path}: {error}")))
            continue
        out.append(TaskFile(path, domain, tier, task))
    return out


def desktop_task(file: TaskFile) -> SourceTask:
    """The desktop task of a parsed task file (feasible unless its evaluator is `infeasible`)."""
    task = file.task
    return SourceTask(task.id, "desktop", file.domain, file.tier, not task.evaluator.infeasible, task, str(file.path))


def load_task_folder(folder: str | pathlib.Path) -> list[SourceTask]:
    """Every desktop task under `folder` (any depth, sorted by path); see the module doc.
    The first file that breaks the schema raises its error."""
    out = []
    for file in scan_task_folder(folder):
        if file.error is not None:
            raise file.error
        out.append(desktop_task(file))
    if not out:
        raise ValueError(f"task folder {str(folder)!r} holds no task files (JSON objects with an 'evaluator')")
    return out


def load_code_tasks(folder: str | pathlib.Path, task_ids: Sequence[str] = ()) -> list[SourceTask]:
    """The code tasks of `folder` (`code_tasks.load_code_suite`: bugs in real Python repositories,
    judged by their tests; the suite is cua_jax/tasks/suites/code), all of them or those of
    `task_ids` in that order (an id the folder lacks raises). The domain is the task's package."""

    suite = load_code_suite(folder)
    if not suite:
        raise ValueError(f"code task folder {str(folder)!r} holds no task files")
    by_id = {task.id: task for task in suite}
    missing = [task_id for task_id in task_ids if task_id not in by_id]
    if missing:
        raise ValueError(f"code task folder {str(folder)!r} has no tasks {missing}")
    chosen = [by_id[task_id] for task_id in dict.fromkeys(task_ids)] if task_ids else suite
    return [
        SourceTask(task.id, "code", task.package, 0, True, task, str(pathlib.Path(folder) / f"{task.id}.json"))
        for task in chosen
    ]


def parse_domain_weights(entries: Iterable[str]) -> dict[str, float]:
    """("desktop=2", "miniwob=1") -> {"desktop": 2.0, "miniwob": 1.0}; a malformed entry raises."""
    weights: dict[str, float] = {}
    for entry in entries:
        domain, sep, value = str(entry).partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not sep or not domain.strip() or not np.isfinite(weight) or weight <= 0:
            raise ValueError(f"domain weight {entry!r} is not 'domain=weight' with a weight > 0")
        if domain.strip() in weights:
            raise ValueError(f"domain {domain.strip()!r} is weighted twice")
        weights[domain.strip()] = weight
    return weights


class TaskCatalog:
    """The run's tasks by id; ids must be unique across sources. A task's kind is resolved
    where its environment is made (`cua_jax.environments.kinds`, which names the known ones)."""

    def __init__(self, tasks: Sequence[SourceTask]):
        if not tasks:
            raise ValueError("a task catalog needs at least one task")
        self._tasks: dict[str, SourceTask] = {}
        for task in tasks:
            if task.task_id in self._tasks:
                raise ValueError(
                    f"task id {task.task_id!r} appears twice: in {self._tasks[task.task_id].origin} "
                    f"and in {task.origin}"
                )
            self._tasks[task.task_id] = task

    def __getitem__(self, task_id: str) -> SourceTask:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"task {task_id!r} is not in the run's task catalog") from None

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __iter__(self):
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def task_ids(self) -> list[str]:
        return list(self._tasks)

    @property
    def kinds(self) -> set[str]:
        return {task.kind for task in self._tasks.values()}

    def domains(self) -> dict[str, str]:
        """task id -> domain."""
        return {task.task_id: task.domain for task in self._tasks.values()}

    def pool(
        self, domain_weights: Mapping[str, float] | None = None, task_ids: Sequence[str] | None = None
    ) -> TaskPool:
        """The sampler's pool of the tasks `task_ids` (None: every task). With `domain_weights`,
        each task's prior weight gives its domain a share of the draws proportional to
        domain_weights[domain] (1 when unlisted), spread evenly over the domain's tasks; without,
        every task weighs the same. A weight for an unknown domain raises."""
        chosen = list(self._tasks.values()) if task_ids is None else [self[task_id] for task_id in task_ids]
        tasks = [task.pool_task() for task in chosen]
        if not domain_weights:
            return TaskPool(tasks)
        weights = dict(domain_weights)
        domains = [task.domain for task in chosen]
        unknown = sorted(set(weights) - set(domains))
        if unknown:
            raise ValueError(
                f"domain weights name {unknown}, which no task has; the domains are {sorted(set(domains))}"
            )
        counts = {domain: domains.count(domain) for domain in set(domains)}
        prior = np.asarray([weights.get(d, 1.0) / counts[d] for d in domains], np.float32)
        return TaskPool(tasks, prior=prior / prior.max())
