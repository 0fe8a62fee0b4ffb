"""The code environment's actions: Qwen tool calls for a shell, a file editor and submit.

    <tool_call>{"name": "bash", "arguments": {"command": "pytest -x -q", "timeout": 60}}</tool_call>
    <tool_call>{"name": "str_replace_editor", "arguments": {"command": "str_replace",
        "path": "toolz/itertoolz.py", "old_str": "...", "new_str": "..."}}</tool_call>
    <tool_call>{"name": "submit", "arguments": {}}</tool_call>

`parse_code_action` reads a reply into a `CodeAction` (or an `actions.InvalidAction` naming the
problem); `render_code_action` writes one back. `cua_jax.environments.code_env` runs them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from cua_jax.envs import actions as A

TOOL_NAMES = ("bash", "str_replace_editor", "submit")
EDITOR_COMMANDS = ("view", "create", "str_replace", "insert")
MAX_COMMAND_CHARS = 20_000
MAX_FILE_CHARS = 100_000  # one exec argument carries the request: the kernel caps it at 128 KiB


@dataclasses.dataclass(frozen=True)
class Bash:
    command: str
    timeout: float | None = None  # None: the environment's default


@dataclasses.dataclass(frozen=True)
class Edit:
    command: str
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Submit:
    pass


CodeAction = Bash | Edit | Submit


class _Bad(Exception):
    pass


def _text_arg(args: dict, name: str, required: bool = True, limit: int = MAX_FILE_CHARS) -> str | None:
    value = args.get(name)
    if value is None:
        if required:
            raise _Bad(f"'{name}' is required")
        return None
    if not isinstance(value, str):
        raise _Bad(f"'{name}' must be a string")
    if len(value) > limit:
        raise _Bad(f"'{name}' is {len(value)} characters; at most {limit}")
    return value


def _int_arg(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"'{name}' must be an integer")
    return value


def parse_code_arguments(name: Any, args: Any) -> CodeAction | A.InvalidAction:
    """A code action from a tool call's name and (decoded) arguments, or why it is invalid."""
    try:
        if name not in TOOL_NAMES:
            raise _Bad(f"unknown tool {str(name)[:60]!r}; the tools are {', '.join(TOOL_NAMES)}")
        if not isinstance(args, dict):
            raise _Bad("'arguments' must be a JSON object")
        if name == "submit":
            return Submit()
        if name == "bash":
            command = _text_arg(args, "command", limit=MAX_COMMAND_CHARS)
            if not command.strip():
                raise _Bad("'command' is empty")
            timeout = args.get("timeout")
            if timeout is not None:
                if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
                    raise _Bad("'timeout' must be a number of seconds in (0, 3600]")
                timeout = float(timeout)
            return Bash(command, timeout)
        command = args.get("command")
        if command not in EDITOR_COMMANDS:
            raise _Bad(f"'command' must be one of {', '.join(EDITOR_COMMANDS)}")
        path = _text_arg(args, "path", limit=4096)
        if command == "view":
            view_range = args.get("view_range")
            if view_range is not None:
                if not (isinstance(view_range, list) and len(view_range) == 2):
                    raise _Bad("'view_range' must be [first, last] (last -1: to the end)")
                view_range = (_int_arg(view_range[0], "view_range"), _int_arg(view_range[1], "view_range"))
            return Edit("view", path, view_range=view_range)
        if command == "create":
            return Edit("create", path, file_text=_text_arg(args, "file_text"))
        if command == "str_replace":
            old = _text_arg(args, "old_str")
            if not old:
                raise _Bad("'old_str' is empty")
            return Edit("str_replace", path, old_str=old, new_str=_text_arg(args, "new_str", required=False) or "")
        return Edit(
            "insert",
            path,
            insert_line=_int_arg(args.get("insert_line"), "insert_line"),
            new_str=_text_arg(args, "new_str"),
        )
    except _Bad as error:
        return A.InvalidAction(
            f"{name}: {error}" if name in TOOL_NAMES else str(error),
            json.dumps({"name": name, "arguments": args}, default=repr)[:2000],
        )


_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def parse_code_action(text: Any) -> CodeAction | A.InvalidAction:
    """The one tool call of the policy's reply (free text may precede it; a missing closing
    tag is tolerated), or an InvalidAction saying what is wrong. Never raises."""
    if not isinstance(text, str):
        return A.InvalidAction(f"expected text, got {type(text).__name__}")
    calls = _CALL.findall(text)
    if len(calls) != 1:
        return A.InvalidAction(
            "no tool call found: end your reply with one <tool_call>{...}</tool_call>"
            if not calls
            else f"found {len(calls)} tool calls; emit exactly one per turn",
            text[-2000:],
        )
    try:
        call = json.loads(calls[0].strip())
    except (ValueError, RecursionError) as error:
        return A.InvalidAction(f"the tool call is not valid JSON ({error})".replace("\n", " "), text[-2000:])
    if not isinstance(call, dict):
        return A.InvalidAction("the tool call must be a JSON object with 'name' and 'arguments'", text[-2000:])
    return parse_code_arguments(call.get("name"), call.get("arguments", {}))


def render_code_action(action: CodeAction) -> str:
    """The tool call text of `action`; parse_code_action(render_code_action(a)) == a."""
    if isinstance(action, Submit):
        name, args = "submit", {}
    elif isinstance(action, Bash):
        name, args = "bash", {"command": action.command}
        if action.timeout is not None:
            args["timeout"] = action.timeout
    else:
        name, args = "str_replace_editor", {"command": action.command, "path": action.path}
        for field in ("file_text", "old_str", "new_str", "insert_line"):
            if getattr(action, field) is not None:
                args[field] = getattr(action, field)
        if action.view_range is not None:
            args["view_range"] = list(action.view_range)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


TOOL_DESCRIPTION = (
    "You work in a Python repository at /work/repo (the current directory) inside a container without network.\n"
    'Tools (call exactly one per turn as <tool_call>{"name": ..., "arguments": {...}}</tool_call>):\n'
    '- bash: {"command": "...", "timeout": seconds (optional)} runs a shell command; '
    "you see its exit code, stdout and stderr.\n"
    '- str_replace_editor: {"command": "view", "path": P, "view_range": [first, last] (optional)} '
    "shows a file with line numbers or lists a directory;\n"
    '  {"command": "create", "path": P, "file_text": "..."} writes a file;\n'
    '  {"command": "str_replace", "path": P, "old_str": "...", "new_str": "..."} '
    "replaces old_str, which must occur exactly once;\n"
    '  {"command": "insert", "path": P, "insert_line": N, "new_str": "..."} '
    "inserts text after line N (0: at the top).\n"
    "  Paths are relative to /work/repo; files outside it cannot be edited.\n"
    "- submit: {} ends the episode; the repository's tests then judge your fix."
)

# The system prompt of a code episode (`CodeEnvironment.system_prompt`, shown by the agent loop).
SYSTEM_PROMPT = (
    f"{TOOL_DESCRIPTION}\nThink briefly, then reply with exactly one tool call.\nExample reply:\n"
    + render_code_action(Bash("python -m pytest -x -q", timeout=60))
)
