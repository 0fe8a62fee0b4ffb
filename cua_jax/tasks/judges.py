"""Running a task against an environment: setup steps, getters, metrics and the verdict.

OSWorld's evaluator: reward = metric(result_getter(env, result), expected_getter(env,
expected), **options), combined over several metrics by `conj` ("and": 0 as soon as
one metric is 0, else their mean; "or": 1 as soon as one is 1, else their maximum).

Metrics (cua_jax.tasks.metrics, dispatched through its registry) are plain functions of
host-side values (file paths, strings, rule dicts) and never execute task-supplied code;
one OSWorld defines but this project does not implement raises JudgeError. A Python judge
(`python_judge`, ScaleCUA App. B) runs inside the environment through /run_python with a
timeout, never in this process.

Setup (`set_up`): first whether the environment can run the task at all
(cua_jax.tasks.runnable: its apps, no network, implemented steps / getters / metrics),
then its `config` steps as OSWorld runs them (`run_steps`; files come from the host:
local paths, loopback URLs or the download mirror: cua_jax.tasks.fetch). The evaluator's `postconfig` steps
run before judging; there, as in OSWorld, a command's exit status reports on the agent's
work instead of failing the step (run_steps says which failures fail where).

Errors are sorted for fault attribution (cua_jax.envs.faults):
    SetupError   a setup step failed, or the task cannot run in this environment
                 (the reason says why: "needs app: thunderbird"): quarantine.
    JudgeError   the judge itself broke (bad rules, crashing judge code): quarantine.
    EnvError     (cua_jax.envs.client) the environment broke: quarantine.
A missing result file or a wrong value is the agent's doing and simply scores 0.
"""

from __future__ import annotations

import base64
import collections
import csv
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import pathlib
import posixpath
import shutil
import time
import traceback
import urllib.parse
import zipfile
from typing import Any
from xml.etree import ElementTree

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvClient, EnvError, EnvRequestError
from cua_jax.tasks import metrics, runnable
from cua_jax.tasks.fetch import fetch, resolve_local
from cua_jax.tasks.metrics import JudgeError  # raised by the metrics too
from cua_jax.tasks.metrics.base import load_result, noting_malformed_results
from cua_jax.tasks.metrics.general import infeasible
from cua_jax.tasks.runnable import IMPLEMENTED_GETTERS, IMPLEMENTED_STEPS
from cua_jax.tasks.schema import GETTERS, SETUP_STEPS, Check, Getter, Step, Task

log = logging.getLogger(__name__)


class SetupError(RuntimeError):
    """A setup or postconfig step failed."""


# ------------------------------------------------------------------------------------
# Setup and postconfig
# ------------------------------------------------------------------------------------

CLIENT_PASSWORD = "password"  # the user's password in OSWorld's images: {CLIENT_PASSWORD}
WINDOW_WAIT = 5.0  # seconds activate_window / close_window wait for their window to appear
EXECUTE_TIMEOUT = 120.0  # seconds a command may run unless its step says (OSWorld's server's limit)
CHROME_WAIT = 30.0  # seconds the chrome_* steps wait for Chromium's debugging endpoint
CHROMIUM_NAMES = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser")

# Scripts the environment's Python runs (through /run_python), sent as their files hold them.
ENV_SCRIPTS_DIR = pathlib.Path(__file__).resolve().parent / "env_scripts"


def _env_script(name: str) -> str:
    return (ENV_SCRIPTS_DIR / name).read_text(encoding="utf-8")


# Run inside the environment by the server's Python (which has python-xlib): find the first
# window whose title (or "res_name.res_class" with by_class) contains the name, any case
# (strict: equals it), as wmctrl -a / -c match; activate it or ask it to close.
_WINDOW_SCRIPT = _env_script("window.py")

# Run inside the environment (standard library only): Chromium's remote-debugging HTTP
# endpoints on localhost (OSWorld's 9222, or the 1337 its Chrome listens on), to open tabs
# (the first replaces the start tab, as OSWorld's setup does) or close those at given URLs.
_CHROME_SCRIPT = _env_script("chrome_tabs.py")


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
    mirror: the download mirror (judges.fetch).
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


# ------------------------------------------------------------------------------------
# Getters
# ------------------------------------------------------------------------------------


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


# OSWorld's get_default_video_player asks xdg-mime about these video types.
VIDEO_TYPES = (
    "3gp",
    "3gpp",
    "3gpp2",
    "avi",
    "divx",
    "dv",
    "fli",
    "flv",
    "mp2t",
    "mp4",
    "mp4v-es",
    "mpeg",
    "mpeg-system",
    "msvideo",
    "ogg",
    "quicktime",
    "vnd.divx",
    "vnd.mpegurl",
    "vnd.rn-realvideo",
    "webm",
    "x-anim",
    "x-avi",
    "x-flc",
    "x-fli",
    "x-flv",
    "x-m4v",
    "x-matroska",
    "x-mpeg",
    "x-mpeg-system",
    "x-mpeg2",
    "x-ms-asf",
    "x-ms-asf-plugin",
    "x-ms-asx",
    "x-ms-wm",
    "x-ms-wmv",
    "x-ms-wmx",
    "x-ms-wvx",
    "x-msvideo",
    "x-nsv",
    "x-ogm",
    "x-ogm+ogg",
    "x-theora",
    "x-theora+ogg",
)
_VLC_STATUS_SCRIPT = _env_script("vlc_status.py")


class Getters:
    """Getters bound to one environment and task. Each returns a host-side value: a file
    the getter copied into `cache_dir` (OSWorld's `dest` names it; None when the file is
    missing), a string, a dict, or a list of those (`multi`)."""

    def __init__(self, client: EnvClient, task: Task, cache_dir: str | pathlib.Path):
        self.client, self.task = client, task
        self.cache_dir = pathlib.Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def get(self, getter: Getter | None) -> Any:
        if getter is None:
            return None
        if getter.type not in IMPLEMENTED_GETTERS:
            raise JudgeError(f"getter not implemented: {getter.type}")
        return getattr(self, getter.type)(**getter.parameters)

    # ---- files --------------------------------------------------------------------------
    def _save(self, name: str, data: bytes) -> str:
        local = self.cache_dir / name
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        return str(local)

    def vm_file(
        self,
        path,
        dest=None,
        multi: bool = False,
        gives=None,
        time_suffix: bool = False,
        time_format: str = "%Y%m%d_%H%M%S",
    ) -> Any:
        """Copy files out of the environment into the cache (as `dest`; default: the file's
        own name). One local path (None when the file is missing); with `multi`, `path` and
        `dest` are lists and the result lists the files at the indices `gives` (default
        [0]; one index gives a single path, as in OSWorld)."""
        paths = list(path) if multi else [path]
        if dest is None:
            dests = [pathlib.PurePosixPath(p).name for p in paths]
        else:
            dests = list(dest) if multi else [dest]
        if time_suffix and not multi:
            stem, suffix = os.path.splitext(dests[0])
            dests = [f"{stem}_{datetime.datetime.now().strftime(time_format)}{suffix}"]
        wanted = set(gives or [0])
        out = []
        for index, (vm_path, name) in enumerate(zip(paths, dests)):
            data = self.client.get_file(vm_path)
            local = None if data is None else self._save(name, data)
            if index in wanted:
                out.append(local)
        return out[0] if len(out) == 1 else out

    def cloud_file(self, path, dest=None, multi: bool = False, gives=None) -> Any:
        """Files fetched once (a local path, loopback URL, or mirrored URL) into the cache;
        `multi` / `gives` as for vm_file."""
        paths = list(path) if multi else [path]
        dests = (list(dest) if multi else [dest]) if dest is not None else [None] * len(paths)
        wanted = set(gives or [0])
        return self._pick([self._cloud(p, d) for p, d in zip(paths, dests)], wanted)

    @staticmethod
    def _pick(values: list[Any], wanted: set[int]) -> Any:
        out = [value for index, value in enumerate(values) if index in wanted]
        return out[0] if len(out) == 1 else out

    def _cloud(self, path: str, dest: str | None) -> str:
        key = hashlib.sha256(path.encode()).hexdigest()[:16]
        local = self.cache_dir / "cloud" / key / (dest or pathlib.PurePosixPath(urllib.parse.urlsplit(path).path).name)
        if not local.exists():
            try:
                data = fetch(path, self.task.base_dir)
            except (OSError, ValueError) as error:
                raise JudgeError(f"cannot fetch expected file {path}: {error}") from None
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
        return str(local)

    def cache_file(self, path: str) -> str:
        """A file a setup / postconfig command left in the cache (its `stdout` / `stderr`)."""
        local = self.cache_dir / path
        if not local.is_file():
            raise JudgeError(f"no file {path!r} in the judge's cache (no step wrote it)")
        return str(local)

    def local_file(self, path: str) -> str:
        local = resolve_local(path, self.task.base_dir)
        if not local.is_file():
            raise JudgeError(f"expected file {local} does not exist")
        return str(local)

    def content_from_vm_file(self, path: str, file_type: str, file_content: str) -> Any:
        """Part of a file's content: for xlsx, "last_row" (the first sheet's last row with a
        value, as strings; empty cells "nan", as pandas writes them)."""
        if (file_type, file_content) != ("xlsx", "last_row"):
            raise JudgeError(f"content_from_vm_file reads xlsx last_row, not {file_type} {file_content}")

        def rows_with_values(local: str) -> list[tuple]:
            import openpyxl

            sheet = openpyxl.load_workbook(local, read_only=True, data_only=True).worksheets[0]
            return [row for row in sheet.iter_rows(values_only=True) if any(v is not None for v in row)]

        rows = load_result(rows_with_values, self.vm_file(path), "xlsx")
        if rows is None:
            return None
        return [("nan" if v is None else str(v)) for v in rows[-1]] if len(rows) > 1 else None

    # ---- commands and the screen --------------------------------------------------------
    def vm_command_line(self, command, shell: bool = False, timeout: float = 60.0) -> str:
        """A command's standard output inside the environment."""
        return self.client.execute(command, shell=shell, timeout=timeout).get("output", "")

    def vm_command_error(self, command, shell: bool = False, timeout: float = 60.0) -> str:
        """A command's standard error inside the environment."""
        return self.client.execute(command, shell=shell, timeout=timeout).get("error", "")

    def _osworld(self, method: str, path: str, form: dict[str, str] | None = None) -> bytes | None:
        """An OSWorld endpoint of the server: the body, or None where it answers 404 (none)."""
        body = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            return self.client.request(method, path, body, content_type="application/x-www-form-urlencoded")[1]
        except EnvRequestError as error:
            if error.status == 404 and error.message.startswith("no endpoint"):
                raise JudgeError(f"the environment's server has no {path} endpoint") from None
            if error.status == 404:
                return None
            raise

    def vm_terminal_output(self) -> str | None:
        """The text of the focused terminal (OSWorld: GNOME Terminal's, None when none is)."""
        body = self._osworld("GET", "/terminal")
        return None if body is None else json.loads(body).get("output")

    def accessibility_tree(self) -> str:
        return self.client.accessibility_tree()

    def list_directory(self, path: str) -> dict | None:
        """OSWorld's directory tree of `path` (every level); None when it is no directory."""
        try:
            return self.client.list_directory(path, depth=None)
        except EnvRequestError:
            return None

    def vm_screen_size(self) -> dict[str, int]:
        width, height = self.client.screen_size()
        return {"width": width, "height": height}

    def vm_window_size(self, app_class_name: str) -> dict | None:
        """{width, height} of the first window of that WM_CLASS; None when there is none."""
        body = self._osworld("POST", "/window_size", {"app_class_name": app_class_name})
        return None if body is None else json.loads(body)

    def vm_wallpaper(self, dest: str) -> str:
        """The desktop's wallpaper image, saved as `dest` (empty when none is set, as OSWorld)."""
        return self._save(dest, self._osworld("POST", "/wallpaper") or b"")

    # ---- rules --------------------------------------------------------------------------
    def rule(self, rules: dict) -> dict:
        return rules

    def time_diff_range(self, diff_range_in_minutes: float) -> float:
        return diff_range_in_minutes

    # ---- applications -------------------------------------------------------------------
    def gimp_config_file(self, file_name: str, dest: str) -> str | None:
        return self.vm_file(f"~/.config/GIMP/2.10/{file_name}", dest)

    def vlc_config(self, dest: str) -> str | None:
        return self.vm_file("~/.config/vlc/vlcrc", dest)

    def vlc_playing_info(self, dest: str) -> str | None:
        """VLC's status.xml from its HTTP interface (port 8080, password "password")."""
        reply = self.client.run_python(_VLC_STATUS_SCRIPT, timeout=30)
        lines = [line for line in reply.get("output", "").splitlines() if line.startswith("{")]
        status = json.loads(lines[-1]) if lines else {}
        return self._save(dest, base64.b64decode(status["b64"])) if "b64" in status else None

    def default_video_player(self) -> str:
        """The application xdg-mime names for most video types ('unknown' when none)."""
        script = "for t in " + " ".join(VIDEO_TYPES) + "; do xdg-mime query default video/$t; echo; done"
        output = self.client.execute(script, shell=True, timeout=60).get("output", "")
        apps = [line + "\n" for line in output.splitlines() if line.strip()]
        return collections.Counter(apps).most_common(1)[0][0] if apps else "unknown"

    def vscode_config(self, vscode_extension_command: str, path: str, dest: str) -> str | None:
        """Run a VS Code command (its palette, by pyautogui inside the environment), then
        copy the file it writes."""
        for code in (
            "pyautogui.hotkey('ctrl', 'shift', 'p')",
            f"pyautogui.typewrite({vscode_extension_command!r})",
            "pyautogui.press('enter')",
        ):
            self.client.execute(["python", "-c", f"import pyautogui; {code}"], timeout=30)
        time.sleep(1.0)
        return self.vm_file(path, dest)

    def _slide_part(self, ppt_file_path: str, slide_index: int, dest: str, kind: str) -> str | None:
        """A slide's audio or background image: extracted from the presentation, or copied
        from the environment when the slide links to a file there."""
        local = self.vm_file(ppt_file_path)
        if local is None:
            return None
        slide = f"ppt/slides/slide{int(slide_index) + 1}.xml"
        rels = f"ppt/slides/_rels/slide{int(slide_index) + 1}.xml.rels"
        try:
            with zipfile.ZipFile(local) as archive:
                names = set(archive.namelist())
                image_id = None
                if kind == "image":
                    if slide not in names:
                        return None
                    root = ElementTree.fromstring(archive.read(slide))
                    p = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
                    a = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
                    r = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
                    blips = [b for bg in root.iter(p + "bgPr") for b in bg.iter(a + "blip")]
                    if not blips:
                        return None
                    image_id = blips[0].get(r + "embed")
                if rels not in names:
                    return None
                ns = "{http://schemas.openxmlformats.org/package/2006/relationships}"
                for rel in ElementTree.fromstring(archive.read(rels)).iter(ns + "Relationship"):
                    if kind not in rel.get("Type", "") or (image_id is not None and rel.get("Id") != image_id):
                        continue
                    target = rel.get("Target", "")
                    if target.startswith("file://"):
                        return self.vm_file(target[len("file://") :], dest)
                    inner = posixpath.normpath(posixpath.join("ppt/slides", target))
                    return self._save(dest, archive.read(inner)) if inner in names else None
        except (zipfile.BadZipFile, ElementTree.ParseError):
            return None
        return None

    def audio_in_slide(self, ppt_file_path: str, slide_index: int, dest: str) -> str | None:
        return self._slide_part(ppt_file_path, slide_index, dest, "audio")

    def background_image_in_slide(self, ppt_file_path: str, slide_index: int, dest: str) -> str | None:
        return self._slide_part(ppt_file_path, slide_index, dest, "image")

    def conference_city_in_order(self, csv_path: str) -> list[str]:
        """The third column of a csv file beside the task, below its header row."""
        local = self.local_file(csv_path)
        with open(local, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        return [row[2] for row in rows[1:] if len(row) > 2]


assert IMPLEMENTED_GETTERS <= set(GETTERS) and all(callable(getattr(Getters, g)) for g in IMPLEMENTED_GETTERS)
assert IMPLEMENTED_STEPS <= set(SETUP_STEPS)


# ------------------------------------------------------------------------------------
# The verdict
# ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judge's verdict: the reward in [0, 1], and a note ("path: error") for each of the
    agent's files the metrics found malformed in their format (each scored 0)."""

    reward: float
    malformed_results: tuple[str, ...] = ()


def verdict(
    task: Task,
    client: EnvClient,
    cache_dir: str | pathlib.Path,
    last_action: A.Action | A.InvalidAction | None = None,
    judge: Any = None,
) -> Verdict:
    """`evaluate`'s reward with the notes of the agent's malformed files beside it."""
    with noting_malformed_results() as malformed:
        reward = evaluate(task, client, cache_dir, last_action, judge)
    return Verdict(reward, tuple(malformed))


def evaluate(
    task: Task,
    client: EnvClient,
    cache_dir: str | pathlib.Path,
    last_action: A.Action | A.InvalidAction | None = None,
    judge: Any = None,
) -> float:
    """Run postconfig, then the task's metrics; the reward in [0, 1] (`verdict`: with the notes
    of the agent's malformed files).

    judge runs judge code (`python_judge`) in the environment: a desktop pool's
    `ContainerJudge`, apart from what the agent can change. None: through the environment's
    server (`client.run_python`), for environments without one (a remote server).

    An infeasible task (metric `infeasible`) is judged on the last action alone. Raises
    SetupError (postconfig), JudgeError or EnvError when no verdict can be reached.
    """
    evaluator = task.evaluator
    if evaluator.infeasible:
        return infeasible(last_action=last_action)
    if isinstance(last_action, A.Fail):
        return 0.0  # declared infeasible a feasible task
    run_steps(evaluator.postconfig, client, task.base_dir, cache_dir=cache_dir, postconfig=True)
    getters = Getters(client, task, cache_dir)
    scores = []
    for check in evaluator.checks:
        score = _score(check, getters, evaluator, client, client if judge is None else judge)
        if evaluator.conj == "and" and score == 0.0:
            return 0.0
        if evaluator.conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    return sum(scores) / len(scores) if evaluator.conj == "and" else max(scores)


def _score(check: Check, getters: Getters, evaluator, client: EnvClient, judge: Any) -> float:
    """One metric's reward: its getter values (as many as it takes; the expected one only
    when the task names it, as OSWorld calls metrics) and options, through the registry."""
    entry = metrics.lookup(check.func)
    getter_values = [getters.get(g) for g in (check.result, check.expected)[: entry.arity]]
    if entry.arity == 2 and check.expected is None:
        getter_values = getter_values[:1]
    context = {"client": client, "judge": judge, "evaluator": evaluator, "last_action": None}
    try:
        score = float(entry.fn(*getter_values, **check.options, **{k: context[k] for k in entry.needs}))
    except (JudgeError, EnvError):
        raise
    except Exception as error:
        # The traceback is in the message: the message is what the episode's fault records.
        where = "".join(traceback.format_exception(error)).rstrip()
        raise JudgeError(f"metric {check.func} failed: {type(error).__name__}: {error}\n{where}") from error
    if not 0.0 <= score <= 1.0:
        raise JudgeError(f"metric {check.func} gave {score}, not a reward in [0, 1]")
    return score


def clear_cache(cache_dir: str | pathlib.Path) -> None:
    shutil.rmtree(cache_dir, ignore_errors=True)
