"""Scripted solutions of the desktop suite: for each task, a reply sequence that solves it
and one that does not (the tests expect rewards 1 and 0). Each reply is the text a policy
would emit, rendered from the action grammar."""

from __future__ import annotations

import pathlib

from cua_jax.envs import actions as A

SUITE_DIR = pathlib.Path(__file__).parent


def _texts(*actions: A.Action) -> list[str]:
    return [A.render_action(a) for a in actions]


def _terminal(line: str) -> list[str]:
    return _texts(A.Click("left_click", 500, 500), A.Type(line + "\n"), A.Wait(1.0), A.Done())


def _editor(value: str) -> list[str]:
    return _texts(
        A.Key(("ctrl", "home")),
        A.Key(("down",)),
        A.Key(("shift", "end")),
        A.Type(f"beta = {value}"),
        A.Key(("ctrl", "s")),
        A.Wait(1.0),
        A.Done(),
    )


def _spreadsheet(value: str) -> list[str]:
    return _texts(
        A.Key(("ctrl", "home")),
        A.Key(("down",)),
        A.Key(("down",)),
        A.Key(("right",)),
        A.Type(f"{value}\n"),
        A.Key(("ctrl", "s")),
        A.Wait(1.5),
        A.Done(),
    )


SOLUTIONS: dict[str, list[str]] = {
    "terminal-create-file": _terminal("echo 'hello from the desktop' > /root/hello.txt"),
    "editor-edit-line": _editor("2"),
    "spreadsheet-fill-cell": _spreadsheet("5"),
    "write-settings-json": _texts(A.WriteFile("/root/settings.json", '{"theme": "dark", "font_size": 12}'), A.Done()),
    "infeasible-photo-editor": _texts(A.Screenshot(), A.Fail()),
}

WRONG_SOLUTIONS: dict[str, list[str]] = {
    "terminal-create-file": _terminal("echo 'hello' > /root/hello.txt"),
    "editor-edit-line": _editor("3"),
    "spreadsheet-fill-cell": _spreadsheet("6"),
    "write-settings-json": _texts(A.WriteFile("/root/settings.json", '{"theme": "light", "font_size": 12}'), A.Done()),
    "infeasible-photo-editor": _texts(A.Done()),
}
