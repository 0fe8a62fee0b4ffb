# Single job: whether a task can run in an environment image here, and every reason it cannot.
"""Whether this project can run a task in a given environment image, and why not.

A task parses when it follows the schema (cua_jax.tasks.schema), which knows every setup
step and getter OSWorld defines. It is runnable here when it also meets these:

  * every application it relies on is in the image: its `related_apps` (OSWorld's names:
    "chrome" is Chromium, "libreoffice_calc" LibreOffice Calc, "vs_code" VS Code, ...),
    every program its setup commands run (`sudo`, `unzip`, `gimp`, ...), and the Python
    modules those commands import (`python -c "import pyautogui; ..."`);
  * nothing needs the network, which environments do not have: a download is a local
    file, a loopback URL or a URL the download mirror holds (cua_jax.tasks.fetch), and no
    command installs packages (`apt-get install`, `pip install pysrt`) or fetches URLs;
  * the project implements each of its setup steps, getters and metrics
    (IMPLEMENTED_STEPS / IMPLEMENTED_GETTERS, the metric registry).

    needs(task)                        -> [Need]: what the task relies on (no environment)
    download_urls(task)                -> the cloud files a download mirror must hold for it
    runnable(task, image_apps)         -> (ok, reasons), e.g. (False, ["needs app: thunderbird",
                                          "needs network: https://huggingface.co/..."])
    probe_image("cua-jax/osworld:..", names) / check_environment(task, client)
                                       -> which of those apps an image / a live environment has

The same function decides for the setup (judges.set_up raises SetupError with the
reasons, before any step runs) and for `python -m experiments.tasks check`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Collection, Iterable, Iterator

from cua_jax.envs.client import EnvClient
from cua_jax.tasks import fetch, schema
from cua_jax.tasks.schema import Task

# Getters that read Chrome's profile files (cua_jax.tasks.getters.Getters.chrome_profile_file).
CHROME_PROFILE_GETTERS = frozenset(schema.CHROME_PROFILE_GETTERS)
# The setup steps and getters cua_jax.tasks.judges implements (judges asserts on import that
# they are OSWorld's names and that each getter has its method).
IMPLEMENTED_STEPS = frozenset(
    {
        "download",
        "upload",
        "upload_file",
        "open",
        "launch",
        "execute",
        "command",
        "sleep",
        "activate_window",
        "close_window",
        "chrome_open_tabs",
        "chrome_close_tabs",
        "change_wallpaper",
    }
)
IMPLEMENTED_GETTERS = (
    frozenset(
        {
            "vm_file",
            "cloud_file",
            "cache_file",
            "local_file",
            "content_from_vm_file",
            "vm_command_line",
            "vm_command_error",
            "vm_terminal_output",
            "accessibility_tree",
            "list_directory",
            "vm_screen_size",
            "vm_window_size",
            "vm_wallpaper",
            "rule",
            "time_diff_range",
            "gimp_config_file",
            "vlc_config",
            "vlc_playing_info",
            "default_video_player",
            "vscode_config",
            "audio_in_slide",
            "background_image_in_slide",
            "conference_city_in_order",
        }
    )
    | CHROME_PROFILE_GETTERS
)
# Applications by the name reasons use, and what shows one is installed: a command on the
# PATH or an absolute path that exists (any of them). Anything else a task names is a
# command of that name.
APPS: dict[str, tuple[str, ...]] = {
    "chromium": ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser"),
    "libreoffice": ("libreoffice", "soffice"),
    "libreoffice_calc": (
        "localc",
        "/usr/share/applications/libreoffice-calc.desktop",
        "/usr/lib/libreoffice/program/libsclo.so",
    ),
    "libreoffice_writer": (
        "lowriter",
        "/usr/share/applications/libreoffice-writer.desktop",
        "/usr/lib/libreoffice/program/libswlo.so",
    ),
    "libreoffice_impress": ("loimpress", "/usr/share/applications/libreoffice-impress.desktop"),
    "vs_code": ("code",),
    "terminal": ("gnome-terminal", "xterm", "x-terminal-emulator"),
}
# Programs that are one of the applications above.
PROGRAM_APPS = {
    "google-chrome": "chromium",
    "google-chrome-stable": "chromium",
    "chromium": "chromium",
    "chromium-browser": "chromium",
    "soffice": "libreoffice",
    "localc": "libreoffice_calc",
    "lowriter": "libreoffice_writer",
    "loimpress": "libreoffice_impress",
    "code": "vs_code",
}
# OSWorld's snapshot names (the VM snapshot a task starts from) -> the image of launch/images
# with that snapshot's applications; other names are images' own names ("osworld", "desktop").
SNAPSHOT_IMAGES = {
    "os": "osworld",
    "libreoffice_calc": "osworld",
    "libreoffice_writer": "osworld",
    "libreoffice_impress": "osworld",
    "chrome": "osworld_apps",
    "gimp": "osworld_apps",
    "vlc": "osworld_apps",
    "thunderbird": "osworld_apps",
    "multiapps": "osworld_apps",
    "base_setup": "osworld_apps",
    "vscode": "osworld_apps",
    "vs_code": "osworld_apps",
}
# OSWorld's (and VeriGen's) related_apps values; None: names no application ("os", a file type).
RELATED_APPS: dict[str, str | None] = {
    "chrome": "chromium",
    "google-chrome": "chromium",
    "browser": "chromium",
    "libreoffice_calc": "libreoffice_calc",
    "libreoffice calc": "libreoffice_calc",
    "calc": "libreoffice_calc",
    "libreoffice_writer": "libreoffice_writer",
    "writer": "libreoffice_writer",
    "libreoffice_impress": "libreoffice_impress",
    "impress": "libreoffice_impress",
    "vscode": "vs_code",
    "vs_code": "vs_code",
    "ubuntu_media_player": "totem",
    "os": None,
    "pdf": None,
    "image": None,
    "ubuntu": None,
    "files": None,  # VeriGen's file tasks: the file system, no application
}
# GSettings schemas that only a GNOME session installs (OSWorld's VM runs GNOME).
GNOME_SHELL_SCHEMAS = ("org.gnome.shell", "org.gnome.mutter")
# Getters and steps that read an application's state or files.
GETTER_APPS = {
    "vm_terminal_output": ("gnome-terminal",),
    "vlc_config": ("vlc",),
    "vlc_playing_info": ("vlc",),
    "default_video_player": ("vlc", "xdg-mime"),
    "gimp_config_file": ("gimp",),
    "vscode_config": ("vs_code", "python"),
    "vm_wallpaper": ("gsettings",),
    **{name: ("chromium",) for name in CHROME_PROFILE_GETTERS},
}
STEP_APPS = {
    "chrome_open_tabs": ("chromium",),
    "chrome_close_tabs": ("chromium",),
    "login": ("chromium",),
    "update_browse_history": ("chromium",),
    "change_wallpaper": ("gsettings",),
}
BROWSER_GETTERS = frozenset(name for name, spec in schema.GETTERS.items() if schema.OPEN in spec[1]) - {"replay"}
# What an unimplemented step or getter would fetch: the reason names it.
NETWORK_STEPS = {
    "googledrive": "Google Drive",
    "login": "Google Drive",
    "proxy": "a proxy server",
    "update_browse_history": "huggingface.co",
}
NETWORK_GETTERS = {
    "googledrive_file": "Google Drive",
    "number_of_search_results": "google.com",
    "info_from_website": None,
    "page_info": None,
    "pdf_from_url": None,
    "gotoRecreationPage_and_get_html_content": "recreation.gov",
}

# Words that start no program: shell keywords and builtins, and prefixes before the program.
_SHELL_WORDS = frozenset(
    "if then else elif fi for while until do done case esac in function select { } [ [[ ]] ! "
    "cd export echo printf history source . set unset read exit return local alias true false "
    "test type eval shift trap wait declare readonly umask ulimit : builtin".split()
)
_PREFIXES = frozenset({"nohup", "exec", "time", "command", "nice", "stdbuf", "setsid"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n", ";;", "|&"})
_REDIRECTS = re.compile(r"^\d*[<>]")
_PYTHON = re.compile(r"^python(\d(\.\d+)?)?$")
_IMPORT = re.compile(r"(?:^|[;\n])\s*(?:import\s+([\w., ]+)|from\s+([\w.]+)\s+import)")
_FIND_SPEC = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"


@dataclasses.dataclass(frozen=True)
class Need:
    """One thing a task relies on.

    kind: "app" (name: an APPS key or a program), "module" ("interpreter:module"),
        "network" (a URL or the command that would use it), "file" (a local file to
        upload), or "step" / "getter" / "metric" (a type the project does not implement).
    where: the task field it comes from ("config[2]", "evaluator.result[0]", ...).
    """

    kind: str
    name: str
    where: str = ""
    why: str = ""  # what an unimplemented type would take, when known

    @property
    def reason(self) -> str:
        if self.kind == "app":
            return f"needs app: {self.name}"
        if self.kind == "module":
            return f"needs python module: {self.name.split(':', 1)[1]}"
        if self.kind == "network":
            return f"needs network: {self.name}"
        if self.kind == "file":
            return f"needs file: {self.name}"
        what = {"step": "setup step", "getter": "getter", "metric": "metric"}[self.kind]
        return f"{what} not implemented: {self.name}" + (f" ({self.why})" if self.why else "")

    @property
    def group(self) -> str:
        """The reason without its per-task detail, for counting: a URL's host, a command's tool."""
        if self.kind == "network":
            parsed = urllib.parse.urlsplit(self.name)
            if parsed.scheme and parsed.hostname:
                return f"needs network: {parsed.hostname}"
            services = set(NETWORK_STEPS.values()) | {v for v in NETWORK_GETTERS.values() if v}
            return f"needs network: {self.name if self.name in services else self.name.split(' ')[0]}"
        if self.kind == "file":
            return "needs file"
        return self.reason.split(" (", 1)[0]


# ------------------------------------------------------------------------------------
# What a task needs
# ------------------------------------------------------------------------------------


def _words(script: str) -> list[str]:
    """Shell words and operators of a script (quotes removed); newlines are separators."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()<>\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the words are a fair guess
        return script.split()


def _simple_commands(script: str) -> list[list[str]]:
    commands, current, skip_next = [], [], False
    for word in _words(script):
        if word in _SEPARATORS:
            commands.append(current)
            current = []
        elif skip_next:
            skip_next = False
        elif _REDIRECTS.match(word) and set(word) <= set("0123456789<>&"):
            skip_next = not word.endswith("&")  # 2>&1 names no file
        else:
            current.append(word)
    commands.append(current)
    return [c for c in commands if c]


def _program(words: list[str]) -> tuple[list[str], list[str]]:
    """(the prefix programs such as sudo, the command from its program on)."""
    prefixes, i = [], 0
    while i < len(words):
        word = words[i]
        if re.match(r"^[A-Za-z_]\w*=", word):  # VAR=value
            i += 1
        elif word in ("do", "then", "else", "elif", "if", "while", "until", "!", "{", "time"):
            i += 1
        elif word in ("for", "case", "select", "function"):
            return prefixes, []
        elif word == "sudo":
            prefixes.append("sudo")
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in ("-u", "-g", "-p", "-C", "-h") else 1
        elif word in ("env", *_PREFIXES):
            if word == "env":
                prefixes.append("env")
            i += 1
        else:
            return prefixes, words[i:]
    return prefixes, []


def _is_url(word: str) -> bool:
    return word.startswith(("http://", "https://", "ftp://", "git@", "ssh://", "git://"))


def _network_use(program: str, args: list[str]) -> str | None:
    """The network use of one command ("apt-get install jq"), or None."""
    words = [a for a in args if not a.startswith("-")]
    line = " ".join([program, *args])[:120]
    if (
        program in ("apt", "apt-get", "aptitude")
        and words[:1]
        and words[0]
        in ("install", "update", "upgrade", "full-upgrade", "dist-upgrade", "download", "source", "build-dep")
    ):
        return line
    if program in ("pip", "pip3") and words[:1] == ["install"]:
        local = all("/" in w or w.endswith((".whl", ".tar.gz", ".zip")) or w == "." for w in words[1:])
        return None if local and words[1:] else line
    if program == "code" and "--install-extension" in args:
        target = (
            args[args.index("--install-extension") + 1] if args.index("--install-extension") + 1 < len(args) else ""
        )
        return None if target.endswith(".vsix") else line
    if program == "git" and words[:1] and words[0] in ("clone", "fetch", "pull", "push", "ls-remote"):
        return line if any(_is_url(w) for w in words) else None
    if program in ("curl", "wget", "aria2c", "ssh", "scp", "rsync", "ftp"):
        hosts = [urllib.parse.urlsplit(w).hostname for w in words if _is_url(w)]
        return line if any(h not in fetch.LOOPBACK_HOSTS for h in hosts) or program in ("ssh", "scp") else None
    if program in ("snap", "flatpak", "npm", "conda", "gem") and words[:1] == ["install"]:
        return line
    return None


def _python_needs(interpreter: str, args: list[str], where: str) -> list[Need]:
    needs: list[Need] = []
    if "-m" in args and args.index("-m") + 1 < len(args):
        module_args = args[args.index("-m") + 1 :]
        use = _network_use(module_args[0], module_args[1:])
        if use:
            needs.append(Need("network", use, where))
    if "-c" in args and args.index("-c") + 1 < len(args):
        code = args[args.index("-c") + 1]
        for plain, source in _IMPORT.findall(code):
            for part in plain.split(",") if plain else [source]:
                module = part.strip().split(" ")[0].split(".")[0]
                if module and module not in sys.stdlib_module_names and module != "__future__":
                    needs.append(Need("module", f"{interpreter}:{module}", where))
    return needs


def command_needs(command: str | list[str], shell: bool, where: str = "") -> list[Need]:
    """The programs, Python modules and network uses of one setup command."""
    if isinstance(command, list) and not shell:
        commands = [list(command)]
    else:
        commands = _simple_commands(command if isinstance(command, str) else " ".join(command))
    needs: list[Need] = []
    for words in commands:
        prefixes, rest = _program(words)
        needs += [Need("app", p, where) for p in prefixes]
        if not rest:
            continue
        path, args = rest[0], rest[1:]
        program = path.rsplit("/", 1)[-1]
        if (
            program in _SHELL_WORDS
            or not program
            or any(c in path for c in "$`(){}")
            or ("/" in path and not path.startswith("/"))
        ):  # a script the setup made, a variable
            continue
        needs.append(Need("app", PROGRAM_APPS.get(program, program), where))
        if program == "gsettings" and any(arg.startswith(GNOME_SHELL_SCHEMAS) for arg in args):
            needs.append(Need("app", "gnome-shell", where))  # the schema exists only with GNOME's shell
        if program in ("bash", "sh", "zsh", "dash") and "-c" in args and args.index("-c") + 1 < len(args):
            needs += command_needs(args[args.index("-c") + 1], True, where)
        elif _PYTHON.match(program):
            needs += _python_needs(program, args, where)
        else:
            use = _network_use(program, args)
            if use:
                needs.append(Need("network", use, where))
    return needs


def _url_needs(url: str, where: str, base_dir: str, mirror) -> list[Need]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("http", "https"):
        return [Need("network", url, where)] if fetch.needs_network(url, mirror) else []
    if parsed.scheme in ("", "file"):
        local = fetch.resolve_local(urllib.parse.unquote(parsed.path) if parsed.scheme else url, base_dir)
        return [] if local.is_file() else [Need("file", str(local), where)]
    return [Need("network", url, where)]


def _files_fetched(part: schema.Step | schema.Getter) -> list[str]:
    """What a download step or a cloud_file getter fetches: URLs or local paths."""
    if isinstance(part, schema.Step) and part.type == "download":
        return [entry["url"] for entry in part.parameters["files"]]
    if isinstance(part, schema.Getter) and part.type == "cloud_file":
        paths = part.parameters["path"]
        return list(paths) if isinstance(paths, list) else [paths]
    return []


def _step_needs(step: schema.Step, where: str, base_dir: str, mirror) -> list[Need]:
    p = step.parameters
    needs = [Need("app", app, where) for app in STEP_APPS.get(step.type, ())]
    if step.type not in IMPLEMENTED_STEPS:
        needs.append(Need("step", step.type, where))
    if step.type in NETWORK_STEPS:
        needs.append(Need("network", NETWORK_STEPS[step.type], where))
    for url in _files_fetched(step):
        needs += _url_needs(url, where, base_dir, mirror)
    if step.type in ("upload", "upload_file"):
        for entry in p["files"]:
            needs += _url_needs(entry["local_path"], where, base_dir, None)
    elif step.type in ("launch", "execute", "command", "execute_with_verification"):
        needs += command_needs(p["command"], bool(p.get("shell", False)), where)
    elif step.type == "chrome_open_tabs":
        needs += [
            Need("network", url, where)
            for url in p["urls_to_open"]
            if urllib.parse.urlsplit(url).scheme not in ("file", "about", "chrome", "data")
            and urllib.parse.urlsplit(url if "://" in url else "http://" + url).hostname not in fetch.LOOPBACK_HOSTS
        ]
    return needs


def _getter_needs(getter: schema.Getter, where: str, base_dir: str, mirror) -> list[Need]:
    needs = [Need("app", app, where) for app in GETTER_APPS.get(getter.type, ())]
    if getter.type in BROWSER_GETTERS:
        needs.append(Need("app", "chromium", where))
    if getter.type not in IMPLEMENTED_GETTERS:
        needs.append(Need("getter", getter.type, where))
    if getter.type == "vscode_config":
        needs.append(Need("module", "python:pyautogui", where))
    if getter.type in NETWORK_GETTERS:
        target = NETWORK_GETTERS[getter.type] or str(
            getter.parameters.get("url") or getter.parameters.get("path") or "the web"
        )
        needs.append(Need("network", target, where))
    for path in _files_fetched(getter):
        needs += _url_needs(path, where, base_dir, mirror)
    return needs


def _metric_needs(name: str, where: str) -> list[Need]:
    """A metric OSWorld defines that the registry (cua_jax.tasks.metrics) does not implement."""
    if name in schema.UNIMPLEMENTED_METRICS or name not in schema.METRICS:
        return [Need("metric", name, where, schema.UNIMPLEMENTED_METRICS.get(name, ""))]
    return []


def _task_parts(task: Task) -> Iterator[tuple[str, schema.Step | schema.Getter | str]]:
    """(where, part) in task order: the setup and postconfig steps, then per check its
    metric's name and its getters."""
    for i, step in enumerate(task.config):
        yield f"config[{i}]", step
    evaluator = task.evaluator
    for i, step in enumerate(evaluator.postconfig):
        yield f"evaluator.postconfig[{i}]", step
    listed = len(evaluator.checks) > 1
    for i, check in enumerate(evaluator.checks):
        suffix = f"[{i}]" if listed else ""
        yield f"evaluator.func{suffix}", check.func
        if evaluator.infeasible:
            continue  # judged on the last action alone: its getters never run
        for name, getter in (("result", check.result), ("expected", check.expected)):
            if getter is not None:
                yield f"evaluator.{name}{suffix}", getter


_WEB_URL = re.compile(r"https?://[^\s\"'<>)]+")


def _web_urls(value: object) -> list[str]:
    """The http(s) URLs of other hosts than the loopback named anywhere in `value` (a string,
    or the lists and dicts of a rule)."""
    if isinstance(value, str):
        found = _WEB_URL.findall(value)
        return [url for url in found if urllib.parse.urlsplit(url).hostname not in fetch.LOOPBACK_HOSTS]
    if isinstance(value, dict):
        return [url for item in value.values() for url in _web_urls(item)]
    if isinstance(value, (list, tuple)):
        return [url for item in value for url in _web_urls(item)]
    return []


def needs(task: Task, mirror=None) -> list[Need]:
    """Everything `task` relies on, in task order (without asking any environment).
    mirror: the download mirror (fetch.download_mirror's default when None). A web page the
    instruction names, or a rule's expected URL (a video to stream, a page to open), is a
    network need: the agent would have to reach it."""
    out: list[Need] = [Need("network", url, "instruction") for url in dict.fromkeys(_web_urls(task.instruction))]
    for name in task.related_apps:
        app = RELATED_APPS[name.lower()] if name.lower() in RELATED_APPS else name
        if app:
            out.append(Need("app", app, "related_apps"))
    for where, part in _task_parts(task):
        if isinstance(part, schema.Step):
            out += _step_needs(part, where, task.base_dir, mirror)
        elif isinstance(part, schema.Getter):
            out += _getter_needs(part, where, task.base_dir, mirror)
            if part.type == "rule":
                out += [Need("network", url, where) for url in dict.fromkeys(_web_urls(part.parameters))]
        else:
            out += _metric_needs(part, where)
    return out


def download_urls(task: Task) -> list[str]:
    """The http(s) URLs of other hosts that `task` downloads, each once, in task order:
    its download steps' files and its cloud_file getters' paths, what a download mirror
    must hold for it (`python -m experiments.tasks mirror`). Web pages a browser opens
    and commands' network use are not downloads; loopback URLs are fetched directly."""
    urls: list[str] = []
    for _, part in _task_parts(task):
        for url in _files_fetched(part) if not isinstance(part, str) else ():
            if fetch.is_remote(url) and url not in urls:
                urls.append(url)
    return urls


def task_image(task: Task) -> str:
    """The image of launch/images that `task` starts on: its snapshot's (SNAPSHOT_IMAGES), or
    the image its snapshot names."""
    return SNAPSHOT_IMAGES.get(task.snapshot, task.snapshot)


def image_mismatch(task: Task, image: str) -> str | None:
    """Why `task` does not run on image `image` (a name under launch/images): it starts on
    another image that `image` is not built from (`images.lineage`); None when it does."""
    from cua_jax.envs import images

    wanted = task_image(task)
    if wanted in images.lineage(image):
        return None
    return f"needs image: {wanted} (snapshot {task.snapshot!r}; {image} is not built from it)"


def probe_names(task_needs: Iterable[Need]) -> list[str]:
    """The apps and modules among `task_needs` that an image must be asked about."""
    return sorted({n.name for n in task_needs if n.kind in ("app", "module")})


def runnable(
    task: Task, image_apps: Collection[str], mirror=None, task_needs: list[Need] | None = None
) -> tuple[bool, list[str]]:
    """(True, []) when the project can run `task` in an image holding `image_apps` (the
    apps and "interpreter:module" names probe_image / check_environment found), else
    (False, the reasons, each once, in task order)."""
    present = set(image_apps)
    reasons: list[str] = []
    for need in needs(task, mirror) if task_needs is None else task_needs:
        if need.kind == "app" and need.name in present:
            continue
        if need.kind == "module":
            interpreter = need.name.split(":", 1)[0]
            if need.name in present or interpreter not in present:
                continue  # a missing interpreter is its own reason
        if need.reason not in reasons:
            reasons.append(need.reason)
    return not reasons, reasons


# ------------------------------------------------------------------------------------
# Asking an image or an environment what it holds
# ------------------------------------------------------------------------------------


def probe_script(names: Iterable[str]) -> str:
    """A POSIX shell script printing "+<name>" for each app / "interpreter:module" present."""
    lines = []
    for name in sorted(set(names)):
        if ":" in name:
            interpreter, module = name.split(":", 1)
            test = f"{shlex.quote(interpreter)} -c {shlex.quote(_FIND_SPEC)} {shlex.quote(module)}"
        else:
            test = " || ".join(
                f"[ -e {shlex.quote(alt)} ]" if alt.startswith("/") else f"command -v {shlex.quote(alt)}"
                for alt in APPS.get(name, (name,))
            )
        lines.append(f"if {{ {test}; }} >/dev/null 2>&1; then echo {shlex.quote('+' + name)}; fi")
    return "\n".join(lines) + "\n"


def _present(output: str) -> set[str]:
    return {line[1:].strip() for line in output.splitlines() if line.startswith("+")}


def probe_image(image: str, names: Iterable[str], timeout: float = 120.0) -> set[str]:
    """Which of `names` the Docker image `image` holds (one throwaway container, no network)."""
    names = sorted(set(names))
    if not names:
        return set()
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", probe_script(names)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot probe image {image}: {done.stderr.strip()[-500:]}")
    return _present(done.stdout)


_PROBED: weakref.WeakKeyDictionary[EnvClient, dict[str, bool]] = weakref.WeakKeyDictionary()
_PROBED_LOCK = threading.Lock()


def probe_environment(client: EnvClient, names: Iterable[str]) -> set[str]:
    """Which of `names` a live environment holds; remembered per client (an environment
    keeps its image)."""
    with _PROBED_LOCK:
        known = dict(_PROBED.get(client, {}))
    missing = sorted(set(names) - set(known))
    if missing:
        reply = client.execute(["sh", "-c", probe_script(missing)], timeout=60)
        found = _present(reply.get("output", ""))
        known.update({name: name in found for name in missing})
        with _PROBED_LOCK:
            _PROBED.setdefault(client, {}).update(known)
    return {name for name in names if known.get(name)}


def check_environment(task: Task, client: EnvClient, mirror=None) -> tuple[bool, list[str]]:
    """runnable() for the image of `client`'s live environment."""
    task_needs = needs(task, mirror)
    return runnable(task, probe_environment(client, probe_names(task_needs)), mirror, task_needs)
