"""Getters: the values a task's metrics compare, read from the environment (files,
command output, application state) or from beside the task file (`Getters`)."""

from __future__ import annotations

import base64
import collections
import csv
import datetime
import hashlib
import json
import os
import pathlib
import posixpath
import time
import urllib.parse
import zipfile
from typing import Any
from xml.etree import ElementTree

from cua_jax.envs.client import EnvClient, EnvRequestError
from cua_jax.tasks.fetch import fetch, resolve_local
from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics.base import load_result
from cua_jax.tasks.runnable import IMPLEMENTED_GETTERS
from cua_jax.tasks.schema import GETTERS, Getter, Task
from cua_jax.tasks.setup_steps import env_script

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
_VLC_STATUS_SCRIPT = env_script("vlc_status.py")


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

    # ---- Chrome's profile ---------------------------------------------------------------
    # OSWorld's Chrome getters read the profile's JSON files on the machine (Linux: under
    # ~/.config/google-chrome, where the osworld_apps image's `google-chrome` keeps Chromium's
    # profile). Each answers what OSWorld's does for a missing or unreadable file.
    CHROME_PROFILE = "~/.config/google-chrome"

    def chrome_profile_file(self, name: str) -> dict | None:
        """The JSON object of a file of Chrome's profile (`Default/Preferences`, `Local
        State`, `Default/Bookmarks`); None when it is missing or not a JSON object. The agent
        can write these files (it owns the profile, as on OSWorld's machine): a setting's
        file is the setting, whichever way it was changed."""
        data = self.client.get_file(f"{self.CHROME_PROFILE}/{name}")
        if not data:
            return None
        try:
            value = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def _preferences(self) -> dict:
        return self.chrome_profile_file("Default/Preferences") or {}

    def default_search_engine(self) -> str:
        data = self._preferences()
        return data.get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")

    def enabled_experiments(self) -> list:
        local_state = self.chrome_profile_file("Local State") or {}
        return local_state.get("browser", {}).get("enabled_labs_experiments", [])

    def chrome_language(self) -> str:
        local_state = self.chrome_profile_file("Local State") or {}
        return local_state.get("intl", {}).get("app_locale", "en-US")

    def profile_name(self) -> str | None:
        return self._preferences().get("profile", {}).get("name")

    def chrome_font_size(self) -> dict:
        default = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
        data = self.chrome_profile_file("Default/Preferences")
        if data is None:
            return {"default_fixed_font_size": 13, "default_font_size": 16}
        return data.get("webkit", {}).get("webprefs", default)

    def bookmarks(self) -> Any:
        data = self.chrome_profile_file("Default/Bookmarks")
        return [] if data is None else data.get("roots", {})

    # A switch is on where Chrome's Preferences hold the boolean true, the only value Chrome
    # honours (OSWorld's getters take any truthy value: a string "false" written into the
    # file would pass them, and leave the browser's setting off).
    def enable_do_not_track(self) -> str:
        return "true" if self._preferences().get("enable_do_not_track") is True else "false"

    def enable_enhanced_safety_browsing(self) -> str:
        data = self.chrome_profile_file("Default/Preferences")
        if data is None:
            return "Google"  # OSWorld's answer when the file cannot be read
        return "true" if data.get("safebrowsing", {}).get("enhanced") is True else "false"

    def new_startup_page(self) -> str:
        data = self.chrome_profile_file("Default/Preferences")
        if data is None:
            return "Google"
        if "session" not in data:  # a fresh profile opens the new tab page
            return "true"
        return "true" if data.get("session", {}).get("restore_on_startup", {}) == 5 else "false"

    def data_delete_automacally(self) -> str:
        data = self.chrome_profile_file("Default/Preferences")
        if data is None or "profile" not in data:
            return "Google"
        return "true" if data["profile"].get("default_content_setting_values") is not None else "false"

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
