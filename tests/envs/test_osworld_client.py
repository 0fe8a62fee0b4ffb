"""OSWorld's own client (`desktop_env.controllers.python.PythonController`, unchanged) drives
a real desktop container through the pool's loopback endpoint (cua_jax.envs.osworld_bridge).

The pyautogui half (`execute_python_command`, `execute_action` with computer_13 actions)
needs an image with `python` and pyautogui: launch/images/osworld/ when it exists and
builds; on the plain desktop image that half is skipped, saying why. The first two tests
check the bridge alone, with no Docker.
"""

import http.server
import io
import socket
import socketserver
import subprocess
import threading
import time

import pytest
import requests
from PIL import Image

from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import IMAGES_DIR, ensure_image
from cua_jax.envs.osworld_bridge import LoopbackBridge

PythonController = pytest.importorskip("desktop_env.controllers.python").PythonController


# ---- the bridge alone (no Docker) -------------------------------------------------------
class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def address_string(self):
        return "unix"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def unix_echo_server(tmp_path):
    path = str(tmp_path / "echo.sock")
    server = socketserver.ThreadingUnixStreamServer(path, _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def test_bridge_forwards_to_the_unix_socket_and_closes(unix_echo_server):
    with pytest.raises(ValueError, match="loopback"):
        LoopbackBridge(unix_echo_server, host="0.0.0.0")
    bridge = LoopbackBridge(unix_echo_server)
    host, port = bridge.address
    assert host == "127.0.0.1" and port > 0
    payload = bytes(range(256)) * 8192  # 2 MiB each way
    with requests.Session() as session:  # keep-alive: several requests on one connection
        for _ in range(3):
            assert session.post(f"http://{host}:{port}/x", data=payload, timeout=10).content == payload
    bridge.close()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()


def test_bridge_to_a_missing_socket_drops_the_connection(tmp_path):
    with LoopbackBridge(str(tmp_path / "absent.sock")) as bridge:
        with pytest.raises(requests.ConnectionError):
            requests.get("http://{}:{}/screenshot".format(*bridge.address), timeout=10)


# ---- a real desktop ---------------------------------------------------------------------
def _image() -> tuple[str, str]:
    """The image to drive, and which one it is and why (for a skip message)."""
    if (IMAGES_DIR / "osworld" / "Dockerfile").is_file():
        try:
            return ensure_image("osworld"), "the osworld image"
        except subprocess.CalledProcessError as error:  # its failed build must not hide these checks
            return ensure_image("desktop"), f"launch/images/osworld/ did not build ({error})"
    return ensure_image("desktop"), "the desktop image (launch/images/osworld/ does not exist yet)"


@pytest.fixture(scope="module")
def desktop():
    image, note = _image()
    with DockerEnvPool(PoolConfig(image=image, size=1, health_interval=None, memory="2g")) as pool:
        env = pool.acquire(timeout=180)
        host, port = pool.osworld_endpoint(env)
        assert pool.osworld_endpoint(env) == (host, port)  # one endpoint per environment
        yield pool, env, PythonController(host, port), note


def _url(controller, path):
    return controller.http_server + path


def _open_terminal(env) -> str | None:
    """Open a terminal window (the image's own) and wait for it; its WM_CLASS, or None."""
    for command, wm_class in ((["xterm"], "XTerm"), (["gnome-terminal", "--wait"], "Gnome-terminal")):
        if env.client.execute(f"command -v {command[0]}", shell=True)["returncode"] == 0:
            env.client.launch(command)
            found = env.client.execute(
                f"until xdotool search --onlyvisible --class {wm_class} 2>/dev/null; do sleep 0.1; done",
                shell=True,
                timeout=30,
            )
            assert found["returncode"] == 0, found
            return wm_class
    return None


@pytest.mark.docker
@pytest.mark.slow
def test_screenshot_and_screen_size(desktop):
    _, env, controller, _ = desktop
    size = controller.get_vm_screen_size()
    assert size == {"width": 1280, "height": 800}
    png = controller.get_screenshot()
    assert png is not None and png.startswith(b"\x89PNG")
    assert Image.open(io.BytesIO(png)).size == (size["width"], size["height"])
    assert env.client.screenshot().startswith(b"\x89PNG")  # the project's client, on its socket


@pytest.mark.docker
@pytest.mark.slow
def test_files_and_directory_tree(desktop):
    _, env, controller, _ = desktop
    desktop_path = controller.get_vm_desktop_path()
    assert desktop_path and desktop_path.endswith("/Desktop")
    root = f"{desktop_path}/osworld"
    uploads = {f"{root}/a.txt": b"alpha\n", f"{root}/sub/b.bin": bytes(range(256)) * 64}
    for path, data in uploads.items():  # the multipart form OSWorld's SetupController sends
        reply = requests.post(
            _url(controller, "/setup/upload"), data={"file_path": path}, files={"file_data": ("f", data)}, timeout=30
        )
        assert reply.status_code == 200, reply.text
    for path, data in uploads.items():
        assert controller.get_file(path) == data
    missing = requests.post(_url(controller, "/file"), data={"file_path": f"{root}/none"}, timeout=10)
    assert missing.status_code == 404

    tree = controller.get_vm_directory_tree(root)
    assert tree == {
        "type": "directory",
        "name": "osworld",
        "children": [
            {"type": "file", "name": "a.txt"},
            {"type": "directory", "name": "sub", "children": [{"type": "file", "name": "b.bin"}]},
        ],
    }
    shallow = env.client.list_directory(root, depth=1)  # the project's client: the tree, depth-limited
    assert shallow["children"] == [{"type": "file", "name": "a.txt"}, {"type": "directory", "name": "sub"}]
    assert env.client.list_directory(root, depth=None) == tree


@pytest.mark.docker
@pytest.mark.slow
def test_python_and_bash_scripts(desktop):
    _, _, controller, _ = desktop
    python = controller.run_python_script("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert (python["status"], python["output"], python["return_code"]) == ("success", "42\n", 0)
    assert python["message"] == "42\n\nwarn\n" and python["need_more"] is False
    failed = controller.run_python_script("raise SystemExit(3)")
    assert failed["status"] == "error" and failed["return_code"] == 3

    bash = controller.run_bash_script("echo out; echo err >&2; exit 3", timeout=10)
    assert bash == {"status": "error", "output": "out\nerr\n", "error": "", "returncode": 3}
    began = time.monotonic()
    slow = controller.run_bash_script("sleep 30", timeout=1)
    assert slow["status"] == "error" and "timed out" in slow["output"] and slow["returncode"] == -1
    assert time.monotonic() - began < 10  # answered once, not retried
    assert controller.run_bash_script("pwd", working_dir="/tmp")["output"] == "/tmp\n"


@pytest.mark.docker
@pytest.mark.slow
def test_window_terminal_wallpaper_and_recording(desktop, tmp_path):
    _, env, controller, _ = desktop
    assert requests.get(_url(controller, "/terminal"), timeout=10).json() == {"output": None, "status": "success"}
    assert controller.get_terminal_output() is None

    assert (
        requests.post(
            _url(controller, "/window_size"), data={"app_class_name": "nothing-like-it"}, timeout=10
        ).status_code
        == 404
    )
    wm_class = _open_terminal(env)
    assert wm_class is not None, "the image has no terminal"
    assert (
        requests.post(
            _url(controller, "/window_size"), data={"app_class_name": wm_class.lower()}, timeout=10
        ).status_code
        == 200
    )  # WM_CLASS matches in any case
    size = controller.get_vm_window_size(wm_class)
    assert size["width"] > 100 and size["height"] > 100

    wallpaper = requests.post(_url(controller, "/wallpaper"), timeout=10)
    if wallpaper.status_code == 200:  # an image whose desktop names a wallpaper
        assert wallpaper.content
    else:
        assert wallpaper.status_code == 404 and "no wallpaper" in wallpaper.json()["error"]

    started = requests.post(_url(controller, "/start_recording"), timeout=30)
    if started.status_code == 501:  # the image has no ffmpeg: said so, not a server failure
        assert "ffmpeg" in started.json()["message"]
    else:
        assert started.status_code == 200, started.text
        time.sleep(1)
        dest = tmp_path / "recording.mp4"
        controller.end_recording(str(dest))
        assert dest.read_bytes()[4:8] == b"ftyp"


@pytest.mark.docker
@pytest.mark.slow
def test_execute_pyautogui_and_computer_13_actions(desktop):
    _, env, controller, note = desktop
    probe = controller.execute_python_command("print('ready')")
    assert probe is not None and probe["status"] in ("success", "error")
    if probe["returncode"] != 0:
        pytest.skip(
            f"{note} has no `python` with pyautogui, which OSWorld's execute_python_command "
            f"runs: {(probe['error'] or probe.get('message', '')).strip()[-200:]}"
        )
    assert probe["output"] == "ready\n"
    assert controller.get_vm_platform() == "Linux"

    controller.execute_action({"action_type": "MOVE_TO", "x": 100, "y": 200})
    assert env.client.cursor_position() == (100, 200)
    controller.execute_action({"action_type": "CLICK", "x": 640, "y": 400, "button": "left"})
    assert env.client.cursor_position() == (640, 400)

    wm_class = _open_terminal(env)
    assert wm_class is not None, "the image has no terminal"
    controller.execute_action({"action_type": "CLICK", "x": 640, "y": 400})
    controller.execute_action({"action_type": "TYPING", "text": "garbage"})
    controller.execute_action({"action_type": "HOTKEY", "keys": ["ctrl", "u"]})  # clears the line
    controller.execute_action({"action_type": "TYPING", "text": "echo 'typed it' > /tmp/osworld_typed.txt"})
    controller.execute_action({"action_type": "PRESS", "key": "enter"})
    deadline = time.monotonic() + 10
    while env.client.get_file("/tmp/osworld_typed.txt") is None:
        assert time.monotonic() < deadline, "the typed command did not run"
        time.sleep(0.2)
    assert env.client.get_file("/tmp/osworld_typed.txt") == b"typed it\n"
    if wm_class == "Gnome-terminal":  # its text is on the accessibility bus, as in OSWorld's VMs
        assert "echo 'typed it' > /tmp/osworld_typed.txt" in controller.get_terminal_output()


@pytest.mark.docker
@pytest.mark.slow
def test_endpoint_closes_with_its_environment(desktop):
    pool, env, _, _ = desktop
    old = pool.osworld_endpoint(env)
    fresh = pool.reset(env)  # recreate: a new container, so a new endpoint
    with pytest.raises(OSError):
        socket.create_connection(old, timeout=2).close()
    host, port = pool.osworld_endpoint(fresh)
    assert PythonController(host, port).get_vm_screen_size() == {"width": 1280, "height": 800}
    pool.close()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()
