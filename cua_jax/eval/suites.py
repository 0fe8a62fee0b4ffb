"""Evaluation suites: named task lists, each run on fixed seeds.

    suite = load_suite("browsergym")      # or a folder of OSWorld-format task files
    suite.catalog                         # the tasks our environments run (a TaskCatalog)
    suite.skipped                         # task -> why it is not run
    suite.seeds(3)                        # (SEED_START, SEED_START + 1, SEED_START + 2)

Suites:
  miniwob     every MiniWoB++ task the installed package ships (`miniwob.task_names()`)
  browsergym  BrowserGym's MiniWoB list (`browsergym.miniwob.ALL_MINIWOB_TASKS`, 125 tasks)
  webgum      the 56-task subset WebGUM and HTML-T5 report on (`WEBGUM_TASKS`)
  desktop, os the OSWorld-format suites under cua_jax/tasks/suites/
  any folder  OSWorld-format task files (`cua_jax.tasks.sources.load_task_folder`), or
              WebArena-format ones, the `webapp` kind's (cua_jax/tasks/suites/webapp/trac)

A listed MiniWoB task the installed package does not ship is skipped with that reason.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from cua_jax.envs.miniwob import task_names
from cua_jax.tasks.sources import TaskCatalog, desktop_task, load_task_folder, miniwob_tasks, scan_task_folder

# Evaluation seeds start past training's and the held-out evaluation's
# (env.eval_seed_start = 1_000_000), so no suite seed is ever trained on.
SEED_START = 2_000_000

BROWSERGYM_TASKS = (
    "ascending-numbers",
    "bisect-angle",
    "book-flight",
    "book-flight-nodelay",
    "buy-ticket",
    "choose-date",
    "choose-date-easy",
    "choose-date-medium",
    "choose-date-nodelay",
    "choose-list",
    "circle-center",
    "click-button",
    "click-button-sequence",
    "click-checkboxes",
    "click-checkboxes-large",
    "click-checkboxes-soft",
    "click-checkboxes-transfer",
    "click-collapsible",
    "click-collapsible-2",
    "click-collapsible-2-nodelay",
    "click-collapsible-nodelay",
    "click-color",
    "click-dialog",
    "click-dialog-2",
    "click-link",
    "click-menu",
    "click-menu-2",
    "click-option",
    "click-pie",
    "click-pie-nodelay",
    "click-scroll-list",
    "click-shades",
    "click-shape",
    "click-tab",
    "click-tab-2",
    "click-tab-2-easy",
    "click-tab-2-hard",
    "click-tab-2-medium",
    "click-test",
    "click-test-2",
    "click-test-transfer",
    "click-widget",
    "copy-paste",
    "copy-paste-2",
    "count-shape",
    "count-sides",
    "daily-calendar",
    "drag-box",
    "drag-circle",
    "drag-cube",
    "drag-items",
    "drag-items-grid",
    "drag-shapes",
    "drag-shapes-2",
    "drag-single-shape",
    "drag-sort-numbers",
    "draw-circle",
    "draw-line",
    "email-inbox",
    "email-inbox-delete",
    "email-inbox-forward",
    "email-inbox-forward-nl",
    "email-inbox-forward-nl-turk",
    "email-inbox-important",
    "email-inbox-nl-turk",
    "email-inbox-noscroll",
    "email-inbox-reply",
    "email-inbox-star-reply",
    "enter-date",
    "enter-password",
    "enter-text",
    "enter-text-2",
    "enter-text-dynamic",
    "enter-time",
    "find-greatest",
    "find-midpoint",
    "find-word",
    "focus-text",
    "focus-text-2",
    "form-sequence",
    "form-sequence-2",
    "form-sequence-3",
    "generate-number",
    "grid-coordinate",
    "guess-number",
    "highlight-text",
    "highlight-text-2",
    "hot-cold",
    "identify-shape",
    "login-user",
    "login-user-popup",
    "multi-layouts",
    "multi-orderings",
    "navigate-tree",
    "number-checkboxes",
    "odd-or-even",
    "order-food",
    "phone-book",
    "read-table",
    "read-table-2",
    "resize-textarea",
    "right-angle",
    "scroll-text",
    "scroll-text-2",
    "search-engine",
    "sign-agreement",
    "simple-algebra",
    "simple-arithmetic",
    "social-media",
    "social-media-all",
    "social-media-some",
    "stock-market",
    "terminal",
    "text-editor",
    "text-transform",
    "tic-tac-toe",
    "unicode-test",
    "use-autocomplete",
    "use-autocomplete-nodelay",
    "use-colorwheel",
    "use-colorwheel-2",
    "use-slider",
    "use-slider-2",
    "use-spinner",
    "visual-addition",
)

# The 56-task subset of WebGUM (Furuta et al., 2023) and HTML-T5 (Gur et al., 2022), as
# AgentLab lists it (`webgum_tasks` in src/agentlab/experiments/task_collections.py, commit
# 17d1ab97876b4700924e593b30f0a6ade2975d91) and as the rows of AutoWebGLM's per-task table of
# HTML-T5-XL scores (arXiv 2404.03648, App. E, Table 8); the two give the same 56 names.
WEBGUM_TASKS = (
    "book-flight",
    "choose-date",
    "choose-date-easy",
    "choose-date-medium",
    "choose-list",
    "click-button",
    "click-button-sequence",
    "click-checkboxes",
    "click-checkboxes-large",
    "click-checkboxes-soft",
    "click-checkboxes-transfer",
    "click-collapsible",
    "click-collapsible-2",
    "click-color",
    "click-dialog",
    "click-dialog-2",
    "click-link",
    "click-menu",
    "click-option",
    "click-pie",
    "click-scroll-list",
    "click-shades",
    "click-shape",
    "click-tab",
    "click-tab-2",
    "click-tab-2-hard",
    "click-test",
    "click-test-2",
    "click-widget",
    "count-shape",
    "email-inbox",
    "email-inbox-forward-nl",
    "email-inbox-forward-nl-turk",
    "email-inbox-nl-turk",
    "enter-date",
    "enter-password",
    "enter-text",
    "enter-text-dynamic",
    "enter-time",
    "focus-text",
    "focus-text-2",
    "grid-coordinate",
    "guess-number",
    "identify-shape",
    "login-user",
    "login-user-popup",
    "multi-layouts",
    "multi-orderings",
    "navigate-tree",
    "search-engine",
    "social-media",
    "social-media-all",
    "social-media-some",
    "tic-tac-toe",
    "use-autocomplete",
    "use-spinner",
)

SUITES_DIR = pathlib.Path(__file__).resolve().parents[1] / "tasks" / "suites"
MINIWOB_SUITES = ("miniwob", "browsergym", "webgum")
FOLDER_SUITES = ("desktop", "os", "apps")
SUITE_NAMES = MINIWOB_SUITES + FOLDER_SUITES


@dataclasses.dataclass(frozen=True)
class Suite:
    """name; catalog: the tasks run, in order; skipped: task -> why it is not run;
    seed_start: the first of the fixed seeds every task is run on; folder: where a suite of
    task files was read from (None for MiniWoB lists); task_filter: how a run reads that folder
    (config.env.task_filter: "runnable" where the suite holds the folder's runnable tasks only,
    as OSWorld's)."""

    name: str
    catalog: TaskCatalog
    skipped: Mapping[str, str] = dataclasses.field(default_factory=dict)
    seed_start: int = SEED_START
    folder: str | None = None
    task_filter: str = "all"

    @property
    def task_ids(self) -> list[str]:
        return self.catalog.task_ids

    def seeds(self, count: int) -> tuple[int, ...]:
        """The suite's first `count` seeds (the same in every evaluation)."""
        if count < 1:
            raise ValueError(f"a suite is run on at least one seed, got {count}")
        return tuple(range(self.seed_start, self.seed_start + count))

    def restricted(self, tasks: Sequence[str]) -> Suite:
        """The suite on `tasks` only (in the suite's order); a task it does not hold raises."""
        keep = set(tasks)
        unknown = sorted(keep - set(self.task_ids) - set(self.skipped))
        if unknown:
            raise ValueError(f"suite {self.name!r} has no task {unknown}")
        return dataclasses.replace(
            self,
            catalog=TaskCatalog([t for t in self.catalog if t.task_id in keep]),
            skipped={t: why for t, why in self.skipped.items() if t in keep},
        )


def miniwob_suite(name: str, tasks: Sequence[str]) -> Suite:
    """A MiniWoB++ list intersected with the tasks the installed package ships."""

    shipped = set(task_names())
    skipped = {t: "the installed MiniWoB++ package does not ship it" for t in tasks if t not in shipped}
    return Suite(name, TaskCatalog(miniwob_tasks([t for t in tasks if t in shipped])), skipped)


@functools.lru_cache(maxsize=32)
def _probed(tag: str, names: tuple[str, ...]) -> frozenset[str]:
    from cua_jax.tasks.runnable import probe_image

    return frozenset(probe_image(tag, names))


def classify_task_files(
    files: Sequence[Any],
    task_needs: Mapping[Any, list],
    image_apps: Collection[str],
    mirror: str | None = None,
    image_name: str | None = None,
    image_tag: str | None = None,
    record: Any = None,
) -> list[dict[str, Any]]:
    """One row per task file (`scan_task_folder`'s, in order): {path, domain, id, status,
    reasons, groups}; status "runnable", "not runnable" or "schema error", or a flag of the
    folder's untouched record. task_needs: `runnable.needs` of each parsed file (by path);
    image_apps: what the image holds (`runnable.probe_image`). image_name: the image's name
    under launch/images, whose tasks are those of its lineage (a task that starts on another
    image is not runnable, the reason names it). record: the folder's `UntouchedRecord`: a
    runnable task its entries for `image_tag` flag is "trivially satisfied" (or "untouched
    run failed") with the flag as its reason. What `python -m experiments.tasks check`
    prints and `runnable_task_folder` keeps."""
    from cua_jax.tasks import runnable as R

    rows = []
    for file in files:
        row = {"path": str(file.path), "domain": file.domain, "id": file.task.id if file.task else file.path.stem}
        if file.task is None:
            message = str(file.error).split(": ", 1)[1] if ": " in str(file.error) else str(file.error)
            rows.append({**row, "status": "schema error", "reasons": [message], "groups": ["schema error"]})
            continue
        found = task_needs[file.path]
        ok, reasons = R.runnable(file.task, image_apps, mirror, found)
        groups = []
        for need in found:
            if need.reason in reasons and need.group not in groups:
                groups.append(need.group)
        mismatch = R.image_mismatch(file.task, image_name) if image_name is not None else None
        if mismatch is not None:
            ok, reasons, groups = False, [mismatch, *reasons], [mismatch.split(" (", 1)[0], *groups]
        status = "runnable" if ok else "not runnable"
        flagged = record.flag(file.path, image_tag) if ok and record is not None and image_tag else None
        if flagged is not None:
            status, reasons, groups = flagged.split(":", 1)[0], [flagged], [flagged.split(":", 1)[0]]
        rows.append({**row, "status": status, "reasons": reasons, "groups": groups})
    return rows


def runnable_task_folder(
    folder: str | os.PathLike, image: str | None = None, mirror: str | None = None
) -> tuple[list[Any], dict[str, str]]:
    """The desktop tasks of `folder` that run here, and why each other task file does not (by
    task id, or by path for a file that breaks the schema): `classify_task_files` on `image`
    (a name under launch/images; default: the one of the tasks' images built from the others,
    else osworld_apps), the download mirror and the folder's untouched record
    (`cua_jax.eval.untouched`). What OSWorld's evaluation_examples/examples becomes a suite
    and a run's task folder by (env.task_filter "runnable"). Probes the image (one throwaway
    container; built when missing)."""
    from cua_jax.envs import images
    from cua_jax.eval.untouched import UntouchedRecord
    from cua_jax.tasks import runnable as R

    root = pathlib.Path(folder)
    files = scan_task_folder(root)
    parsed = [file for file in files if file.task is not None]
    if image is None:
        known = set(images.image_names())
        image = images.covering_image({R.task_image(f.task) for f in parsed if R.task_image(f.task) in known})
        image = image or "osworld_apps"
    tag = images.ensure_image(image)
    needs = {file.path: R.needs(file.task, mirror) for file in parsed}
    apps = _probed(tag, tuple(sorted({name for found in needs.values() for name in R.probe_names(found)})))
    rows = classify_task_files(files, needs, apps, mirror, image, tag, UntouchedRecord(root))
    tasks, skipped = [], {}
    for file, row in zip(files, rows):
        if row["status"] == "runnable":
            tasks.append(desktop_task(file))
        elif file.task is None:
            skipped[str(file.path.relative_to(root))] = f"schema error: {row['reasons'][0]}"
        else:  # by id; by path where another file has the id (OSWorld's -win.json copies)
            key = file.task.id if file.task.id not in skipped else str(file.path.relative_to(root))
            skipped[key] = "; ".join(row["reasons"])
    return tasks, skipped


def osworld_suite(folder: str | os.PathLike, mirror: str | None = None) -> Suite:
    """OSWorld's task files (its evaluation_examples/examples, domains by subfolder) as a suite:
    the tasks that run here, the rest skipped with the reason (`runnable_task_folder`)."""
    tasks, skipped = runnable_task_folder(folder, mirror=mirror)
    return Suite("osworld", TaskCatalog(tasks), skipped, folder=str(folder), task_filter="runnable")


def load_suite(name_or_folder: str | os.PathLike) -> Suite:
    """A named suite (SUITE_NAMES) or a folder of OSWorld-format task files; a name that is
    neither raises, listing the names."""
    name = str(name_or_folder)
    if name == "miniwob":
        return miniwob_suite(name, task_names())
    if name == "browsergym":
        return miniwob_suite(name, BROWSERGYM_TASKS)
    if name == "webgum":
        return miniwob_suite(name, WEBGUM_TASKS)
    folder = SUITES_DIR / name if name in FOLDER_SUITES else pathlib.Path(name)
    if not folder.is_dir():
        raise ValueError(f"suite {name!r} is neither one of {SUITE_NAMES} nor a folder of task files")
    if is_webapp_folder(folder):  # WebArena-format tasks: the `webapp` kind's (importing it registers it)
        from cua_jax.environments.webapp_env import WebappConfig, webapp_tasks

        return Suite(folder.name, TaskCatalog(webapp_tasks(WebappConfig(suite_dir=str(folder)))), folder=str(folder))
    return Suite(folder.name, TaskCatalog(load_task_folder(folder)), folder=str(folder))


def is_webapp_folder(folder: pathlib.Path) -> bool:
    """Whether `folder`'s task files are WebArena's format (`intent` and `start_url`) rather than
    OSWorld's: the first file decides."""
    first = next(iter(sorted(folder.glob("*.json"))), None)
    if first is None:
        return False
    try:
        data = json.loads(first.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "intent" in data and "start_url" in data
