"""A task's setup on an environment: OSWorld's `config` steps before an episode and the
evaluator's `postconfig` steps before judging.

Setup (`set_up`; `set_up_task` replays setup actions after it): first whether the environment can run the task at all
(cua_jax.tasks.runnable: its apps, no network, implemented steps / getters / metrics),
then its `config` steps as OSWorld runs them (`run_steps`; files come from the host:
local paths, loopback URLs or the download mirror: cua_jax.tasks.fetch). The evaluator's `postconfig` steps
run before judging; there, as in OSWorld, a command's exit status reports on the agent's
work instead of failing the step (run_steps says which failures fail where).
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvClient, EnvRequestError
from cua_jax.tasks import runnable
from cua_jax.tasks.fetch import fetch
from cua_jax.tasks.runnable import IMPLEMENTED_STEPS
from cua_jax.tasks.schema import SETUP_STEPS, Step, Task

log = logging.getLogger(__name__)


class SetupError(RuntimeError):
    """A setup or postconfig step failed."""


CLIENT_PASSWORD = "password"  # the user's password in OSWorld's images: {CLIENT_PASSWORD}
WINDOW_WAIT = 5.0  # seconds activate_window / close_window wait for their window to appear
EXECUTE_TIMEOUT = 120.0  # seconds a command may run unless its step says (OSWorld's server's limit)
CHROME_WAIT = 30.0  # seconds the chrome_* steps wait for Chromium's debugging endpoint
CHROMIUM_NAMES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser")

# Scripts the environment's Python runs (through /run_python), sent as their files hold them.
ENV_SCRIPTS_DIR = pathlib.Path(__file__).resolve().parent / "env_scripts"


def env_script(name: str) -> str:
    """The text of env_scripts/`name`, as the environment's Python runs it."""
    return (ENV_SCRIPTS_DIR / name).read_text(encoding="utf-8")


# Run inside the environment by the server's Python (which has python-xlib): find the first
# window whose title (or "res_name.res_class" with by_class) contains the name, any case
# (strict: equals it), as wmctrl -a / -c match; activate it or ask it to close.
_WINDOW_SCRIPT = env_script("window.py")

# Run inside the environment (standard library only): Chromium's remote-debugging HTTP
# endpoints on localhost (OSWorld's 9222, or the 1337 its Chrome listens on), to open tabs
# (the first replaces the start tab, as OSWorld's setup does) or close those at given URLs.
_CHROME_SCRIPT = env_script("chrome_tabs.py")


def _run_script(client: EnvClient, script: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one of the scripts above inside the environment; its JSON reply."""
    code = f"{script}\nmain(json.loads({json.dumps(args)!r}))\n"
    reply = client.run_python(code, timeout=timeout)
    for line in reversed(reply.get("output", "").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SetupError(f"the environment's Python failed: {(reply.get('error') or reply.get('output', ''))[-400:]}")


class _Steps:
    """Runs setup steps on one environment (see run_steps)."""

    def __init__(
        self,
        client: EnvClient,
        base_dir: str,
        cache_dir: str | pathlib.Path | None,
        postconfig: bool,
        mirror: str | pathlib.Path | None,
    ):
        self.client, self.base_dir, self.postconfig, self.mirror = client, base_dir, postconfig, mirror
        self.cache_dir = pathlib.Path(cache_dir) if cache_dir is not None else None
        self._screen: tuple[int, int] | None = None

    def run(self, step: Step) -> None:
        if step.type not in IMPLEMENTED_STEPS:
            raise SetupError(f"setup step not implemented: {step.type}")
        p = step.parameters
        if step.type in ("download", "upload", "upload_file"):
            for entry in p["files"]:
                source = entry["url"] if step.type == "download" else entry["local_path"]
                data = fetch(source, self.base_dir, mirror=self.mirror)
                self.client.upload(entry["path"], data)
        elif step.type == "launch":
            self.client.launch(self.browser(p["command"]), shell=p.get("shell", False))
        elif step.type == "open":
            self.client.open_file(p["path"], timeout=float(p.get("timeout", 60.0)))
        elif step.type in ("execute", "command"):
            self.execute(p)
        elif step.type == "sleep":
            time.sleep(float(p["seconds"]))
        elif step.type in ("activate_window", "close_window"):
            self.window(step.type.split("_")[0], p)
        elif step.type in ("chrome_open_tabs", "chrome_close_tabs"):
            action, urls = (
                ("open", p["urls_to_open"]) if step.type == "chrome_open_tabs" else ("close", p["urls_to_close"])
            )
            reply = _run_script(
                self.client,
                _CHROME_SCRIPT,
                {"action": action, "urls": urls, "wait": CHROME_WAIT},
                CHROME_WAIT + 60 + 15 * len(urls),
            )
            if "error" in reply:
                raise SetupError(reply["error"])
        elif step.type == "change_wallpaper":
            self.execute(
                {"command": ["gsettings", "set", "org.gnome.desktop.background", "picture-uri", f"file://{p['path']}"]}
            )

    def browser(self, command: str | list[str]) -> str | list[str]:
        """OSWorld launches `google-chrome`; where the image has Chromium under another name
        (chromium, chromium-browser), that one starts with the same arguments."""
        if not isinstance(command, list) or not command or command[0] not in CHROMIUM_NAMES:
            return command
        found = self.client.execute(["sh", "-c", "command -v " + " ".join(CHROMIUM_NAMES)], timeout=30)
        names = [line.rsplit("/", 1)[-1] for line in found.get("output", "").split()]
        return command if command[0] in names or not names else [names[0], *command[1:]]

    def placeholders(self, command: str | list[str]) -> str | list[str]:
        """OSWorld's {CLIENT_PASSWORD}, {SCREEN_WIDTH}, {SCREEN_HEIGHT} and their _HALF forms."""
        if "{" not in json.dumps(command):
            return command
        if self._screen is None and "{SCREEN_" in json.dumps(command):
            self._screen = self.client.screen_size()
        width, height = self._screen or (0, 0)
        values = {
            "{CLIENT_PASSWORD}": CLIENT_PASSWORD,
            "{SCREEN_WIDTH_HALF}": str(width // 2),
            "{SCREEN_HEIGHT_HALF}": str(height // 2),
            "{SCREEN_WIDTH}": str(width),
            "{SCREEN_HEIGHT}": str(height),
        }

        def fill(text: str) -> str:
            for key, value in values.items():
                text = text.replace(key, value)
            return text

        return fill(command) if isinstance(command, str) else [fill(part) for part in command]

    def execute(self, p: dict[str, Any]) -> None:
        """Run a command to completion. With `until`, re-run it (within `timeout`) until its
        exit status, output or error says so. A nonzero exit status fails the step unless
        `check` is false, which is the default in postconfig (OSWorld's, which never
        checks: a postconfig command such as `diff` or `killall` reports on the agent's work)."""
        command, shell = self.placeholders(p["command"]), p.get("shell", False)
        timeout, until = float(p.get("timeout", EXECUTE_TIMEOUT)), p.get("until") or {}
        deadline = time.monotonic() + timeout
        while True:
            reply = self.client.execute(command, shell=shell, timeout=timeout)
            met = (
                ("returncode" in until and reply.get("returncode") == until["returncode"])
                or ("stdout" in until and until["stdout"] in reply.get("output", ""))
                or ("stderr" in until and until["stderr"] in reply.get("error", ""))
            )
            if not until or met:
                break
            if time.monotonic() >= deadline:
                if self.postconfig:
                    log.warning("postconfig command %s never met %s", command, until)
                    break
                raise SetupError(f"the command never met {until} within {timeout:g}s")
            time.sleep(0.3)
        for key, field in (("stdout", "output"), ("stderr", "error")):
            if key in p:
                self.capture(p[key], reply.get(field) or "")
        if p.get("check", not self.postconfig) and not until and reply.get("returncode") != 0:
            raise SetupError(f"exit status {reply.get('returncode')}: {(reply.get('error') or '')[:300]}")

    def capture(self, name: str, text: str) -> None:
        if self.cache_dir is None:
            log.warning("no cache folder for the command output %s; dropped", name)
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        (self.cache_dir / name).write_text(text)

    def window(self, action: str, p: dict[str, Any]) -> None:
        wait = float(p.get("timeout", WINDOW_WAIT))
        args = {
            "action": action,
            "name": p["window_name"],
            "strict": p.get("strict", False),
            "by_class": p.get("by_class", False),
            "wait": wait,
        }
        if not _run_script(self.client, _WINDOW_SCRIPT, args, wait + 30).get("found"):
            what = "class" if args["by_class"] else "title"
            message = f"no window whose {what} {'is' if args['strict'] else 'contains'} {p['window_name']!r}"
            if p.get("check", False):
                raise SetupError(message)
            log.warning("%s_window: %s; going on", action, message)  # as OSWorld (wmctrl's status is ignored)


def run_steps(
    steps: tuple[Step, ...],
    client: EnvClient,
    base_dir: str,
    *,
    cache_dir: str | pathlib.Path | None = None,
    postconfig: bool = False,
    mirror: str | pathlib.Path | None = None,
) -> None:
    """Run setup (or postconfig) steps in order; SetupError names the failing step.

    cache_dir: where `stdout` / `stderr` of commands go (the judge's cache: `cache_file`).
    postconfig: the evaluator's steps, run after the agent acted. There a command's exit
        status does not fail its step (it reports on the agent's work: `diff`, `killall`),
        as in OSWorld, which judges whatever state results; in the setup it does (unless
        the step says `"check": false`): a start state that could not be made is a setup
        failure. activate_window / close_window never fail for want of a window (OSWorld
        ignores wmctrl's status; a title that differs from OSWorld's images is common)
        unless the step says `"check": true`. A step that cannot run at all (a file that
        cannot be fetched) fails in both modes.
    mirror: the download mirror (cua_jax.tasks.fetch).
    EnvUnreachable / EnvServerError from a dead environment propagate unchanged.
    """
    runner = _Steps(client, base_dir, cache_dir, postconfig, mirror)
    for index, step in enumerate(steps):
        try:
            runner.run(step)
        except (SetupError, EnvRequestError, OSError, ValueError) as error:
            raise SetupError(f"step {index} ({step.type}) failed: {error}") from None


def set_up(
    task: Task, client: EnvClient, cache_dir: str | pathlib.Path | None = None, mirror: str | pathlib.Path | None = None
) -> None:
    """Prepare `task` on `client`'s environment: first whether it can run there at all
    (cua_jax.tasks.runnable: apps, network, implemented steps, getters and metrics; a
    SetupError lists every reason it cannot), then its `config` steps."""
    ok, reasons = runnable.check_environment(task, client, mirror=mirror)
    if not ok:
        raise SetupError(f"task {task.id!r} cannot run in this environment: {'; '.join(reasons)}")
    run_steps(task.config, client, task.base_dir, cache_dir=cache_dir, mirror=mirror)


def set_up_task(task: Task, client: EnvClient, setup_actions: list[str] | None = None) -> None:
    """The task's whole setup on `client`'s environment: whether the environment can run it
    at all (cua_jax.tasks.runnable), its `config` steps, then the action texts `setup_actions`
    (None: the task file's `metadata.setup_actions`: a synthesized sub-task starts where a
    trajectory prefix left the screen). A terminal action replays as nothing.
    SetupError names the failing step or action, or why the task cannot run here."""
    set_up(task, client)
    if setup_actions is None:
        setup_actions = (task.raw.get("metadata") or {}).get("setup_actions", [])
    for index, text in enumerate(setup_actions):
        action = A.parse_action(text)
        if isinstance(action, A.InvalidAction):
            raise SetupError(f"{task.id}: setup action {index} {text!r} is invalid: {action.message}")
        if A.is_terminal(action):
            continue
        result = client.step(action, screenshot=False)
        if not result.ok:
            raise SetupError(f"{task.id}: replaying setup action {index} failed: {result.error}")


assert IMPLEMENTED_STEPS <= set(SETUP_STEPS)
