"""The MiniWoB++ tasks the installed `miniwob` package ships: their HTML folder and names."""

from __future__ import annotations

import difflib
import functools
import pathlib


class UnknownTaskError(ValueError):
    """A task name that the installed MiniWoB++ package does not ship."""


def html_dir() -> pathlib.Path:
    """The `html/` folder of the installed `miniwob` package (holds miniwob/, core/, common/)."""
    import miniwob

    path = pathlib.Path(miniwob.__file__).parent / "html"
    if not (path / "miniwob").is_dir() or not (path / "core" / "core.js").is_file():
        raise FileNotFoundError(f"the installed miniwob package has no task HTML under {path}")
    return path


@functools.lru_cache(maxsize=1)
def task_names() -> tuple[str, ...]:
    """Every MiniWoB++ task the installed package ships (the file stems of html/miniwob/*.html)."""
    return tuple(sorted(p.stem for p in (html_dir() / "miniwob").glob("*.html")))


def check_task(task: str) -> str:
    """Return `task` if the package ships it, else raise UnknownTaskError naming close matches."""
    if not isinstance(task, str) or task not in task_names():
        close = difflib.get_close_matches(str(task), task_names(), n=3)
        hint = (
            f"; did you mean {', '.join(close)}?" if close else f"; {len(task_names())} tasks exist, e.g. click-button"
        )
        raise UnknownTaskError(f"unknown MiniWoB task {task!r}{hint}")
    return task
