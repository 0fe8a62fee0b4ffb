"""The rule validator: static checks of a candidate before anyone spends an environment on it.

Checks (each failure is a reason naming the problem):
    schema        the task parses as OSWorld task JSON (cua_jax.tasks.schema)
    judge         the evaluator is a python_judge whose entry is a top-level function of
                  no arguments, with a timeout within bounds
    deterministic the judge imports nothing random or clock-based
    bounded time  no `while` loops, no recursion, no two-argument iter()
    no network    no network modules; setup commands call no network tools, downloads are local
    no writes     the judge opens nothing for writing and calls no file-system mutator;
                  setup writes only under the allowed roots
    solution      every reference-solution step is a valid action of the grammar
"""

from __future__ import annotations

import ast
import shlex
import threading
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.tasks.schema import TaskSchemaError, parse_task
from cua_jax.tasks.verigen.candidate import Candidate, Feedback

ALLOWED_IMPORTS = frozenset(
    {
        "os",
        "os.path",
        "json",
        "re",
        "csv",
        "zipfile",
        "xml",
        "xml.etree",
        "xml.etree.ElementTree",
        "pathlib",
        "math",
        "string",
        "collections",
    }
)
NONDETERMINISTIC = frozenset({"random", "time", "datetime", "uuid", "secrets"})
NETWORK = frozenset({"socket", "urllib", "http", "requests", "ftplib", "smtplib", "ssl", "asyncio", "aiohttp"})
MUTATORS = frozenset(
    {
        "remove",
        "unlink",
        "rename",
        "replace",
        "makedirs",
        "mkdir",
        "rmdir",
        "removedirs",
        "system",
        "popen",
        "spawnl",
        "spawnv",
        "execv",
        "execl",
        "fork",
        "kill",
        "chmod",
        "chown",
        "truncate",
        "symlink",
        "link",
        "write_text",
        "write_bytes",
        "touch",
        "rmtree",
        "move",
        "copy",
        "copyfile",
        "utime",
    }
)
FORBIDDEN_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "input", "breakpoint"})
NETWORK_TOOLS = frozenset(
    {"curl", "wget", "ssh", "scp", "nc", "ncat", "telnet", "ftp", "rsync", "apt", "apt-get", "pip"}
)
WRITABLE_ROOTS = ("/root/", "/tmp/")
MAX_JUDGE_TIMEOUT = 30.0
# CPython 3.11's ast.parse is not safe to run from several threads at once ("AST
# constructor recursion depth mismatch"); candidates are validated in parallel.
_AST_LOCK = threading.Lock()


def _module_root(name: str) -> str:
    return name.split(".")[0]


def judge_problems(code: str, entry: str) -> list[str]:
    """Why a judge's source is unsafe or unsound (empty when it passes)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(code)
    except SyntaxError as error:
        return [f"the judge is not valid Python: {error}"]
    problems = []
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if entry not in functions:
        problems.append(f"the judge defines no top-level function '{entry}'")
    else:
        args = functions[entry].args
        if args.args or args.posonlyargs or args.kwonlyargs or args.vararg or args.kwarg:
            problems.append(f"the judge function '{entry}' must take no arguments")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                root = _module_root(name)
                if root in NONDETERMINISTIC:
                    problems.append(f"not deterministic: imports '{name}'")
                elif root in NETWORK:
                    problems.append(f"uses the network: imports '{name}'")
                elif name not in ALLOWED_IMPORTS and root not in ALLOWED_IMPORTS:
                    problems.append(f"imports '{name}', which judges may not use")
        elif isinstance(node, ast.While):
            problems.append(f"unbounded time: a while loop at line {node.lineno}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in FORBIDDEN_BUILTINS:
                problems.append(f"calls '{name}' at line {node.lineno}")
            elif name in MUTATORS and isinstance(func, ast.Attribute):
                problems.append(f"writes to the environment: calls '.{name}' at line {node.lineno}")
            elif name == "open" and _opens_for_writing(node):
                problems.append(f"writes to the environment: opens a file for writing at line {node.lineno}")
            elif name == "iter" and len(node.args) == 2:
                problems.append(f"unbounded time: two-argument iter() at line {node.lineno}")
    for name, function in functions.items():
        if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(function)
        ):
            problems.append(f"unbounded time: '{name}' calls itself")
    return problems


def _opens_for_writing(node: ast.Call) -> bool:
    mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return True  # a computed mode cannot be shown to be read-only
    return any(flag in mode.value for flag in "wax+")


def _command_words(command: Any) -> list[str]:
    if isinstance(command, list):
        return [str(c) for c in command]
    try:
        return shlex.split(str(command))
    except ValueError:
        return str(command).split()


def setup_problems(steps: list[dict[str, Any]]) -> list[str]:
    problems = []
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("parameters", {}), dict):
            problems.append(f"setup step {index} must be an object with a 'parameters' object")
            continue
        kind, params = step.get("type"), step.get("parameters", {})
        if kind in ("execute", "command", "launch"):
            words = _command_words(params.get("command", ""))
            tools = sorted({w.rsplit("/", 1)[-1] for w in words} & NETWORK_TOOLS)
            if tools:
                problems.append(f"uses the network: setup step {index} runs {tools[0]}")
            targets = [
                w
                for w in words
                if w.startswith("/")
                and not w.startswith(WRITABLE_ROOTS)
                and w.rstrip("/") not in ("/root", "/tmp")
                and not w.startswith(("/usr/", "/bin/"))
            ]
            if targets:
                problems.append(f"writes outside the environment's work roots: setup step {index} names {targets[0]}")
        for entry in params.get("files", []) if kind in ("download", "upload") else []:
            if not isinstance(entry, dict):
                continue  # the schema check names it
            if not str(entry.get("path", "")).startswith(WRITABLE_ROOTS):
                problems.append(
                    f"writes outside the environment's work roots: setup step {index} writes {entry.get('path')}"
                )
            url = str(entry.get("url", ""))
            if url.startswith(("http://", "https://")) and url.split("/")[2].split(":")[0] not in (
                "127.0.0.1",
                "localhost",
            ):
                problems.append(f"uses the network: setup step {index} downloads {url}")
    return problems


def validate(candidate: Candidate) -> Feedback:
    """The rule validator's verdict on a candidate."""
    problems: list[str] = []
    try:
        task = parse_task(candidate.task)
    except TaskSchemaError as error:
        return Feedback("rule", False, [f"schema: {error}"], 0.0)
    evaluator = task.evaluator
    if [c.func for c in evaluator.checks] != ["python_judge"]:
        problems.append("the evaluator must be exactly one python_judge")
    elif not 0 < evaluator.timeout <= MAX_JUDGE_TIMEOUT:
        problems.append(f"unbounded time: judge timeout {evaluator.timeout}s is outside (0, {MAX_JUDGE_TIMEOUT}]")
    if evaluator.code is not None:
        problems += judge_problems(evaluator.code, evaluator.entry or "")
    problems += setup_problems(list(candidate.task.get("config", [])))
    if not candidate.solution:
        problems.append("the reference solution is empty")
    for index, text in enumerate(candidate.solution + candidate.setup_actions):
        action = A.parse_action(text)
        if isinstance(action, A.InvalidAction):
            problems.append(f"solution step {index} is not a valid action: {action.message}")
    difficulty = candidate.metadata.get("difficulty")
    if difficulty not in ("easy", "medium", "hard"):
        problems.append(f"metadata.difficulty must be easy/medium/hard, got {difficulty!r}")
    steps = candidate.metadata.get("estimated_steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        problems.append(f"metadata.estimated_steps must be a positive integer, got {steps!r}")
    return Feedback("rule", not problems, problems, 1.0 if not problems else 0.0)
