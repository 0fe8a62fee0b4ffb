"""Tasks judged untouched: each task set up for real on its image and judged with nothing
done (its first reply `done`), which must score 0. A task that scores more was passed by its
setup alone (OSWorld's "uninstall Mahjongg" on an image that never had it): it is flagged
"trivially satisfied" with its score and left out of suites; a task whose setup or judge
fails untouched is flagged with the fault. The record, <task folder>/.untouched.json
(`python -m experiments.tasks untouched DIR`), keeps each task's result with its file's
sha256 and the image's tag, so an edited task, or one whose image changed, is checked again:

    {"format": 1, "tasks": {"<relative path>":
        {"id", "sha256", "image", "status", "reward", "reason", "start_s", "judge_s"}}}
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cua_jax.environments.desktop_env import DesktopEpisode
from cua_jax.envs import actions as A
from cua_jax.tasks.schema import Task

RECORD_NAME = ".untouched.json"
FORMAT = 1


def file_digest(path: str | os.PathLike) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def judge_untouched(pool: Any, task: Task) -> dict[str, Any]:
    """Set `task` up on an environment of `pool`, declare it done at once, judge it: the
    outcome's status, reward and reason, with the seconds to a started task (acquire and
    setup) and to a verdict (postconfig, getters, metrics)."""
    started = time.monotonic()
    episode = DesktopEpisode(pool, task, max_turns=1)
    episode.start()
    if not episode.done:
        episode.step(A.render_action(A.Done()))
    judging = time.monotonic()
    outcome = episode.finish()
    ended = time.monotonic()
    return {
        "id": task.id,
        "status": outcome.status.value,
        "reward": float(outcome.reward),
        "reason": outcome.reason,
        "start_s": round(judging - started, 3),
        "judge_s": round(ended - judging, 3),
    }


def flag(entry: Mapping[str, Any] | None) -> str | None:
    """Why a task's untouched record keeps it out of suites, or None (scored 0, or never
    checked): "trivially satisfied: ..." when it scored above 0, "untouched run failed: ..."
    when its setup or judge failed."""
    if entry is None:
        return None
    if entry["status"] == "quarantined":
        return f"untouched run failed: {entry.get('reason') or 'quarantined'}"
    if entry["reward"] > 0:
        return f"trivially satisfied: scores {entry['reward']:g} untouched (its setup alone passes the judge)"
    return None


class UntouchedRecord:
    """A task folder's record of untouched runs (see the module doc); thread-safe writes."""

    def __init__(self, folder: str | os.PathLike, path: str | os.PathLike | None = None):
        self.folder = pathlib.Path(folder)
        self.path = pathlib.Path(path) if path is not None else self.folder / RECORD_NAME
        self.tasks: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path.is_file():
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"{self.path}: not an untouched record of format {FORMAT}")
            self.tasks = dict(data.get("tasks", {}))

    def _key(self, task_path: str | os.PathLike) -> str:
        return str(pathlib.Path(task_path).resolve().relative_to(self.folder.resolve()))

    def entry(self, task_path: str | os.PathLike, image: str) -> dict[str, Any] | None:
        """The task file's entry on `image` (a tag), None when it has none, the file changed
        since, or it was checked on another image."""
        entry = self.tasks.get(self._key(task_path))
        if entry is None or entry.get("sha256") != file_digest(task_path) or entry.get("image") != image:
            return None
        return entry

    def flag(self, task_path: str | os.PathLike, image: str) -> str | None:
        return flag(self.entry(task_path, image))

    def put(self, task_path: str | os.PathLike, result: Mapping[str, Any], image: str) -> None:
        with self._lock:
            self.tasks[self._key(task_path)] = {**result, "sha256": file_digest(task_path), "image": image}
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_text(json.dumps({"format": FORMAT, "tasks": self.tasks}, indent=1))
            os.replace(temporary, self.path)


def run_untouched(
    pool: Any,
    tasks: Iterable[tuple[str | os.PathLike, Task]],
    record: UntouchedRecord,
    image: str,
    workers: int,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """`judge_untouched` on every (task file, task), `workers` at a time on `pool`, each
    result put in the record as it comes (so a killed run resumes where the caller leaves out
    the tasks `record.entry` already holds); the results by task file."""
    todo = [(str(path), task) for path, task in tasks]
    out: dict[str, dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as executor:
        futures = {executor.submit(judge_untouched, pool, task): path for path, task in todo}
        for future in concurrent.futures.as_completed(futures):
            path = futures[future]
            result = future.result()
            record.put(path, result, image)
            out[path] = result
            if on_result is not None:
                on_result(path, result)
    return out
