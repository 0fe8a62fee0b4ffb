"""OSWorld's setup steps and getters on a real desktop container (the desktop image).

Task files are written here in OSWorld's format (examples/<domain>/<id>.json, its
parameter shapes) and run through judges.set_up / judges.evaluate on one pool of two
environments: downloads from local paths, file:// URLs and the download mirror, commands
with OSWorld's placeholders and `until`, windows activated and closed as wmctrl matches
them, tabs opened and closed on a Chromium debugging endpoint, every getter that needs no
network, and tasks this image cannot run failing at setup with their reason.
"""

import json
import pathlib

import pytest

from cua_jax.environments.desktop_env import DesktopEpisode
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.tasks import judges
from cua_jax.tasks.schema import Step, load_task
from cua_jax.types import EpisodeStatus

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def pool():
    image = ensure_image("desktop")
    with DockerEnvPool(
        PoolConfig(image=image, size=2, cpus=1.0, memory="1g", call_timeout=30.0, health_interval=None)
    ) as pool:
        yield pool


@pytest.fixture
def client(pool):
    env = pool.acquire(timeout=180)
    yield env.client
    pool.release(env)  # recreated in the background: every test starts on a fresh desktop


def task_file(root: pathlib.Path, domain: str, task: dict) -> pathlib.Path:
    """Write `task` as OSWorld lays its files out: examples/<domain>/<id>.json."""
    path = root / "examples" / domain / f"{task['id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(task, indent=1))
    return path


def osworld_task(task_id: str, config: list, evaluator: dict, related_apps=()) -> dict:
    return {
        "id": task_id,
        "snapshot": "os",
        "instruction": "Check the setup.",
        "source": "test",
        "trajectory": "trajectories/",
        "related_apps": list(related_apps),
        "proxy": False,
        "fixed_ip": False,
        "possibility_of_env_change": "low",
        "config": config,
        "evaluator": evaluator,
    }


def shell(client, command: str) -> str:
    return client.execute(command, shell=True, timeout=30)["output"]


def test_setup_steps_prepare_the_desktop(client, tmp_path):
    (tmp_path / "examples" / "os" / "files").mkdir(parents=True)
    (tmp_path / "examples" / "os" / "files" / "notes.txt").write_text("local notes\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    mirror = tmp_path / "mirror"
    (mirror / "huggingface.co" / "datasets" / "demo").mkdir(parents=True)
    (mirror / "huggingface.co" / "datasets" / "demo" / "a.txt").write_text("from the mirror\n")
    config = [
        {
            "type": "download",
            "parameters": {
                "files": [
                    {"url": "files/notes.txt", "path": "/root/Desktop/notes.txt"},
                    {"url": f"file://{tmp_path}/data.csv", "path": "/root/data.csv"},
                    {"url": "https://huggingface.co/datasets/demo/a.txt", "path": "/root/mirrored.txt"},
                ]
            },
        },
        {
            "type": "upload_file",
            "parameters": {"files": [{"local_path": "files/notes.txt", "path": "/tmp/up/notes.txt"}]},
        },
        {"type": "command", "parameters": {"command": ["mkdir", "-p", "/root/made"]}},
        {
            "type": "execute",
            "parameters": {
                "command": "echo {SCREEN_WIDTH}x{SCREEN_HEIGHT_HALF} > /root/made/screen.txt",
                "shell": "true",
            },
        },
        {"type": "launch", "parameters": {"command": ["sh", "-c", "sleep 1; echo ready > /tmp/flag"]}},
        {
            "type": "execute",
            "parameters": {"command": ["cat", "/tmp/flag"], "until": {"stdout": "ready"}, "timeout": 30},
        },
        {"type": "launch", "parameters": {"command": ["xterm", "-T", "alpha-window"]}},
        {"type": "launch", "parameters": {"command": "xterm -T beta-window"}},
        {"type": "activate_window", "parameters": {"window_name": "ALPHA-WIN"}},  # any case, part of the title
        {"type": "open", "parameters": {"path": "/root/Desktop/notes.txt"}},
        {"type": "activate_window", "parameters": {"window_name": "beta-window", "strict": True}},
        {"type": "sleep", "parameters": {"seconds": 0.3}},
    ]
    evaluator = {
        "func": ["exact_match", "check_include_exclude"],
        "result": [
            {"type": "vm_command_line", "command": ["cat", "/root/made/screen.txt"]},
            {
                "type": "vm_command_line",
                "shell": True,
                "command": "xdotool getactivewindow getwindowname; "
                "cat /root/mirrored.txt /root/data.csv /tmp/up/notes.txt",
            },
        ],
        "expected": [
            {"type": "rule", "rules": {"expected": "1280x400\n"}},
            {
                "type": "rule",
                "rules": {
                    "include": ["beta-window", "from the mirror", "a,b", "local notes"],
                    "exclude": ["alpha-window"],
                },
            },
        ],
    }
    task = load_task(task_file(tmp_path, "os", osworld_task("setup-steps", config, evaluator, ["os", "terminal"])))
    judges.set_up(task, client, tmp_path / "cache", mirror=mirror)
    assert "notes.txt" in client.accessibility_tree()  # opened in its editor
    assert judges.evaluate(task, client, tmp_path / "cache") == 1.0
    # activate_window brought each window to the front in turn
    judges.run_steps((Step("activate_window", {"window_name": "alpha-window", "strict": True}),), client, "/")
    assert shell(client, "sleep 0.3; xdotool getactivewindow getwindowname") == "alpha-window\n"


def test_window_steps_match_like_wmctrl_and_postconfig_goes_on(client, tmp_path):
    config = [
        {"type": "launch", "parameters": {"command": ["xterm", "-T", "Gamma Term"]}},
        {"type": "activate_window", "parameters": {"window_name": "xterm.XTerm", "strict": True, "by_class": True}},
        {"type": "close_window", "parameters": {"window_name": "Gamma Term", "strict": True}},
    ]
    evaluator = {
        "postconfig": [
            {"type": "close_window", "parameters": {"window_name": "no-such-window", "timeout": 1}},
            {
                "type": "execute",
                "parameters": {"command": ["diff", "/etc/hostname", "/etc/shells"], "stdout": "diff.out"},
            },
        ],
        "func": "check_list",
        "result": {"type": "cache_file", "path": "diff.out"},
        "expected": {"type": "rule", "rules": {"expect": ["^> /bin/sh$"]}},
    }
    task = load_task(task_file(tmp_path, "os", osworld_task("windows", config, evaluator)))
    judges.set_up(task, client, tmp_path / "cache")
    assert shell(client, "sleep 0.5; xdotool search --name 'Gamma Term' | wc -l") == "0\n"  # closed
    # the evaluator's steps report on the agent's work: diff's exit status 1 does not fail
    # them, and diff's output reaches the judge through the cache
    assert judges.evaluate(task, client, tmp_path / "cache") == 1.0
    judges.run_steps(
        (
            Step("launch", {"command": ["xterm", "-T", "gamma"]}),
            Step("activate_window", {"window_name": "GAMMA"}),  # waits for it to appear
            Step("activate_window", {"window_name": "no-such", "timeout": 1}),
        ),
        client,
        "/",
    )  # goes on, as OSWorld
    with pytest.raises(judges.SetupError, match="no window whose title is 'GAMMA'"):  # strict: whole title, same case
        judges.run_steps(
            (Step("activate_window", {"window_name": "GAMMA", "strict": True, "timeout": 1, "check": True}),),
            client,
            "/",
        )
    with pytest.raises(
        judges.SetupError, match=r"step 0 \(close_window\) failed: no window whose class contains 'no-such'"
    ):
        judges.run_steps(
            (Step("close_window", {"window_name": "no-such", "by_class": True, "timeout": 1, "check": True}),),
            client,
            "/",
        )
    with pytest.raises(judges.SetupError, match="exit status 1"):  # in the setup a failing command fails the step
        judges.run_steps((Step("execute", {"command": ["false"]}),), client, "/")


def test_tasks_the_image_cannot_run_fail_at_setup_with_their_reason(pool, client, tmp_path):
    first = {"type": "command", "parameters": {"command": ["touch", "/root/step-ran"]}}
    cloud = {
        "type": "download",
        "parameters": {
            "files": [
                {
                    "url": "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/x.xlsx",
                    "path": "/root/x.xlsx",
                }
            ]
        },
    }
    cases = [
        (osworld_task("mail", [first], {"func": "infeasible"}, ["thunderbird"]), ["needs app: thunderbird"]),
        (
            osworld_task("cloud", [first, cloud], {"func": "infeasible"}),
            ["needs network: https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/x.xlsx"],
        ),
        (
            osworld_task(
                "tabs",
                [first, {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["http://127.0.0.1/"]}}],
                {"func": "infeasible"},
            ),
            ["needs app: chromium"],
        ),
        (
            osworld_task(
                "pyautogui",
                [
                    first,
                    {
                        "type": "execute",
                        "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's')"]},
                    },
                ],
                {"func": "infeasible"},
            ),
            ["needs app: python"],
        ),
        (
            osworld_task(
                "audio",
                [first],
                {
                    "func": "compare_audios",
                    "result": {"type": "vm_file", "path": "/a.mp3", "dest": "a.mp3"},
                    "expected": {"type": "vm_file", "path": "/b.mp3", "dest": "b.mp3"},
                },
            ),
            ["metric not implemented: compare_audios"],
        ),
        (
            osworld_task(
                "tabs-getter",
                [first],
                {
                    "func": "exact_match",
                    "result": {"type": "open_tabs_info"},
                    "expected": {"type": "rule", "rules": {"expected": []}},
                },
            ),
            ["needs app: chromium", "getter not implemented: open_tabs_info"],
        ),
    ]
    for raw, reasons in cases:
        task = load_task(task_file(tmp_path, "os", raw))
        with pytest.raises(judges.SetupError) as caught:
            judges.set_up(task, client)
        message = str(caught.value)
        assert message.startswith(f"task '{task.id}' cannot run in this environment: "), message
        assert all(reason in message for reason in reasons), (reasons, message)
    assert client.get_file("/root/step-ran") is None  # nothing ran: the check comes first
    # an episode of such a task is quarantined at its start, with the reason
    episode = DesktopEpisode(pool, load_task(task_file(tmp_path, "os", cases[0][0])))
    episode.start()
    outcome = episode.finish()
    assert outcome.status is EpisodeStatus.QUARANTINED and "needs app: thunderbird" in outcome.reason


def test_getters_on_a_real_desktop(client, tmp_path):
    import openpyxl

    book = openpyxl.Workbook()
    for row in (["item", "qty"], ["pear", 5]):
        book.active.append(row)
    book.save(tmp_path / "stock.xlsx")
    client.upload("/root/stock.xlsx", (tmp_path / "stock.xlsx").read_bytes())
    shell(
        client,
        "mkdir -p /root/tree/sub ~/.config/GIMP/2.10 ~/.config/vlc && touch /root/tree/a.txt /root/tree/sub/b.txt"
        " && echo 'gimp settings' > ~/.config/GIMP/2.10/sessionrc && echo 'vlc settings' > ~/.config/vlc/vlcrc"
        " && echo one > /root/one.txt && echo three > /root/three.txt",
    )
    judges.run_steps(
        (
            Step("launch", {"command": ["xterm", "-T", "sized-window", "-geometry", "40x10+0+0"]}),
            Step("activate_window", {"window_name": "sized-window"}),
        ),
        client,
        "/",
    )
    getter_specs = [
        {
            "type": "vm_file",
            "path": ["/root/one.txt", "/root/two.txt", "/root/three.txt"],
            "dest": ["one.txt", "two.txt", "three.txt"],
            "multi": True,
            "gives": [0, 1, 2],
        },
        {"type": "vm_command_line", "command": "echo out; echo err >&2", "shell": True},
        {"type": "vm_command_error", "command": "echo out; echo err >&2", "shell": True},
        {"type": "list_directory", "path": "/root/tree"},
        {"type": "content_from_vm_file", "path": "/root/stock.xlsx", "file_type": "xlsx", "file_content": "last_row"},
        {"type": "accessibility_tree"},
        {"type": "vm_screen_size"},
        {"type": "vm_window_size", "app_class_name": "xterm"},
        {"type": "vm_terminal_output"},
        {"type": "vm_wallpaper", "dest": "wallpaper.png"},
        {"type": "gimp_config_file", "file_name": "sessionrc", "dest": "sessionrc"},
        {"type": "vlc_config", "dest": "vlcrc"},
        {"type": "default_video_player"},
        {"type": "time_diff_range", "diff_range_in_minutes": 3},
    ]
    evaluator = {
        "func": ["exact_match"] * len(getter_specs),
        "result": getter_specs,
        "expected": [{"type": "rule", "rules": {"expected": None}}] * len(getter_specs),
    }
    task = load_task(task_file(tmp_path, "os", osworld_task("getters", [], evaluator)))
    getters = judges.Getters(client, task, tmp_path / "cache")
    values = [getters.get(check.result) for check in task.evaluator.checks]
    files, out, err, tree, last_row, tree_xml, screen, window, terminal, wallpaper, gimp, vlc, player, minutes = values
    assert [f and open(f).read() for f in files] == ["one\n", None, "three\n"]
    assert (out, err) == ("out\n", "err\n")
    assert tree == {
        "type": "directory",
        "name": "tree",
        "children": [
            {"type": "file", "name": "a.txt"},
            {"type": "directory", "name": "sub", "children": [{"type": "file", "name": "b.txt"}]},
        ],
    }
    assert last_row == ["pear", "5"]
    assert "sized-window" in tree_xml
    assert screen == {"width": 1280, "height": 800}
    assert set(window) == {"width", "height"} and 0 < window["width"] <= 1280
    assert terminal is None  # OSWorld reads GNOME Terminal's text; this image has none (runnable says so)
    assert open(wallpaper, "rb").read() == b""  # no wallpaper set: an empty file, as OSWorld writes
    assert (open(gimp).read(), open(vlc).read()) == ("gimp settings\n", "vlc settings\n")
    assert player == "unknown" and minutes == 3


FAKE_CHROMIUM = r"""
import http.server, itertools, json, urllib.parse
pages = [{"id": "start", "type": "page", "url": "chrome://newtab/"}]
ids = itertools.count(1)

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, value):
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/json/version":
            return self.reply({"Browser": "Chromium/fake"})
        if path == "/json/list":
            return self.reply(pages)
        if path.startswith("/json/close/"):
            pages[:] = [p for p in pages if p["id"] != path.rsplit("/", 1)[1]]
            return self.reply("Target is closing")
        self.send_error(404)

    def do_PUT(self):
        path, _, query = self.path.partition("?")
        if path != "/json/new":
            return self.send_error(405)
        page = {"id": f"tab{next(ids)}", "type": "page", "url": urllib.parse.unquote(query)}
        pages.append(page)
        self.reply(page)

http.server.ThreadingHTTPServer(("127.0.0.1", 9222), Handler).serve_forever()
"""


def test_chrome_tab_steps_drive_the_debugging_endpoint(client):
    """Chromium's remote-debugging HTTP endpoints, served here by a stand-in on port 9222."""
    tabs = "import json, urllib.request; print(json.dumps([p['url'] for p in json.load(urllib.request.urlopen('http://127.0.0.1:9222/json/list'))]))"
    judges.run_steps(
        (
            Step("launch", {"command": ["python3", "-c", FAKE_CHROMIUM]}),
            Step("chrome_open_tabs", {"urls_to_open": ["https://www.example.org/a", "example.com/b"]}),
        ),
        client,
        "/",
    )
    listed = lambda: json.loads(client.run_python(tabs)["output"])
    assert listed() == ["https://www.example.org/a", "example.com/b"]  # the first replaced the start tab
    judges.run_steps((Step("chrome_close_tabs", {"urls_to_close": ["https://example.org/a/"]}),), client, "/")
    assert listed() == ["example.com/b"]  # matched as OSWorld compares URLs (no www., no final /)
