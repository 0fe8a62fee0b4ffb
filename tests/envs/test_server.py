"""The in-environment server's OSWorld endpoints, the vm getters and the Python judge,
against one real desktop container."""

import io
import json
import random
import string

import pytest
from PIL import Image

from cua_jax.envs import actions as A
from cua_jax.envs.client import EnvRequestError, decode_png
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.tasks import judges
from cua_jax.tasks.metrics.general import run_python_judge
from cua_jax.tasks.metrics.sheets import compare_table, read_table
from cua_jax.tasks.schema import parse_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def env():
    image = ensure_image("desktop")
    with DockerEnvPool(PoolConfig(image=image, size=1, health_interval=None)) as pool:
        env = pool.acquire(timeout=120)
        yield env
        pool.release(env, reset=False)


def test_screen_platform_and_screenshot(env):
    client = env.client
    assert client.platform() == "Linux"
    assert client.screen_size() == (1280, 800)
    pixels = decode_png(client.screenshot())
    assert pixels.shape == (800, 1280, 3) and pixels.dtype.name == "uint8"


def test_pointer_actions_land_on_the_mapped_pixels(env):
    for grid_point in ([0, 0], [500, 500], [1000, 1000], [250, 750]):
        result = env.client.step(A.MouseMove(*grid_point), screenshot=False)
        assert result.ok
        assert env.client.cursor_position() == A.grid_to_pixels(*grid_point, 1280, 800)
    reply = env.client.step(A.CursorPosition(), screenshot=True)
    assert reply.result["pixels"] == list(A.grid_to_pixels(250, 750, 1280, 800))
    assert Image.open(io.BytesIO(reply.screenshot_png)).size == (1280, 800)


def test_typing_into_a_terminal_runs_the_command(env):
    env.client.launch(["xterm"])
    env.client.execute(
        "until xdotool search --onlyvisible --class XTerm 2>/dev/null; do sleep 0.1; done", shell=True, timeout=60
    )
    tree = env.client.accessibility_tree()
    assert 'class="XTerm"' in tree
    for action in (A.Click("left_click", 500, 500), A.Type("echo typed > /tmp/typed.txt\n"), A.Wait(0.5)):
        assert env.client.step(action, screenshot=False).ok
    assert env.client.get_file("/tmp/typed.txt") == b"typed\n"


def test_execute_run_python_and_bash_with_timeouts(env):
    client = env.client
    assert client.execute(["echo", "a b"])["output"] == "a b\n"
    ran = client.execute("exit 3", shell=True)
    assert (ran["status"], ran["returncode"]) == ("success", 3)  # it ran (OSWorld's meaning)
    missing = client.execute(["no-such-program"])
    assert (missing["status"], missing["returncode"]) == ("error", 127)
    assert client.execute(["ls", "-d", "~/"])["output"] == "/root/\n"  # ~/ expanded, as OSWorld
    assert client.run_python("print(6 * 7)")["output"] == "42\n"
    slow = client.run_python("import time; time.sleep(30)", timeout=1)
    assert slow["status"] == "error" and "timed out" in slow["error"]
    assert client.run_bash_script("cd /tmp && pwd", working_dir="/")["output"] == "/tmp\n"
    merged = client.run_bash_script("echo out; echo err >&2; exit 2")
    assert (merged["output"], merged["error"], merged["returncode"]) == ("out\nerr\n", "", 2)
    with pytest.raises(EnvRequestError, match="working directory"):
        client.run_bash_script("true", working_dir="/no/such/dir")


def test_files_upload_download_and_listing(env):
    client = env.client
    client.upload("/root/data/blob.bin", bytes(range(256)))
    assert client.get_file("/root/data/blob.bin") == bytes(range(256))
    assert client.get_file("/root/data/missing") is None
    client.upload("/root/data/deeper/still/x.txt", b"x")
    tree = client.list_directory("/root/data", depth=None)
    assert tree == {
        "type": "directory",
        "name": "data",
        "children": [
            {"type": "file", "name": "blob.bin"},
            {
                "type": "directory",
                "name": "deeper",
                "children": [{"type": "directory", "name": "still", "children": [{"type": "file", "name": "x.txt"}]}],
            },
        ],
    }
    assert client.list_directory("/root/data", depth=1)["children"][1] == {"type": "directory", "name": "deeper"}
    client.execute(["ln", "-s", "/root/data", "/root/data/deeper/loop"])  # never entered twice
    looped = client.list_directory("/root/data", depth=None)["children"][1]["children"]
    assert {"type": "directory", "name": "loop", "children": []} in looped
    status, raw = client.request("POST", "/list_directory", {"path": "/root/data/deeper/still"})
    assert json.loads(raw) == {
        "directory_tree": {"type": "directory", "name": "still", "children": [{"type": "file", "name": "x.txt"}]}
    }
    with pytest.raises(EnvRequestError, match="no such file"):
        client.open_file("/root/nothing.txt")


def test_multipart_upload_and_form_file_as_osworld_sends_them(env):
    boundary = "cuajaxboundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file_path"\r\n\r\n/tmp/form.txt\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file_data"; filename="f"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\nform bytes\r\n--{boundary}--\r\n"
    ).encode()
    env.client.request("POST", "/setup/upload", body, content_type=f"multipart/form-data; boundary={boundary}")
    status, data = env.client.request(
        "POST", "/file", b"file_path=%2Ftmp%2Fform.txt", content_type="application/x-www-form-urlencoded"
    )
    assert (status, data) == (200, b"form bytes")


def test_invalid_actions_get_the_parsers_message(env):
    rng = random.Random(1)
    sent = 0
    while sent < 100:
        text = "<tool_call>" + "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 80)))
        expected = A.parse_action(text)
        if not isinstance(expected, A.InvalidAction):
            continue
        with pytest.raises(EnvRequestError) as caught:
            env.client.request("POST", "/action", {"text": text})
        assert caught.value.status == 400 and caught.value.message == expected.message
        sent += 1
    bad = env.client.step(A.WriteFile("/proc/forbidden/x", "y"), screenshot=False)
    assert not bad.ok and "write_file failed" in bad.error


def test_vm_getters_and_python_judge(env, tmp_path):
    task = parse_task({"id": "getters", "instruction": "x", "evaluator": {"func": "infeasible"}}, tmp_path)
    getters = judges.Getters(env.client, task, tmp_path / "cache")
    env.client.upload("/root/result.txt", b"result\n")
    local = getters.vm_file("/root/result.txt")
    assert open(local, "rb").read() == b"result\n"
    assert getters.vm_file("/root/absent.txt") is None
    assert getters.vm_command_line(["cat", "/root/result.txt"]) == "result\n"
    code = "import os\ndef check():\n    return 1.0 if os.path.exists('/root/result.txt') else 0.0\n"
    assert run_python_judge(env.client, code, "check", timeout=30) == 1.0
    with pytest.raises(judges.JudgeError, match="no result"):
        run_python_judge(env.client, "def check():\n    while True: pass\n", "check", timeout=1)
    with pytest.raises(judges.JudgeError, match="not a reward"):
        run_python_judge(env.client, "def check():\n    return 7\n", "check", timeout=30)


def test_tcp_transport_requires_the_bearer_token(env):
    """A server on TCP (for pools spanning machines) refuses requests without its token."""
    script = (
        "import subprocess, time, urllib.request, urllib.error\n"
        "open('/tmp/token', 'w').write('s3cret')\n"
        "p = subprocess.Popen(['python3', '-m', 'cua_jax.envs.server', '--port', '8765', '--host', '127.0.0.1',"
        " '--token-file', '/tmp/token'])\n"
        "def get(headers):\n"
        "    for _ in range(100):\n"
        "        try:\n"
        "            return urllib.request.urlopen("
        "urllib.request.Request('http://127.0.0.1:8765/platform', headers=headers)).status\n"
        "        except urllib.error.HTTPError as e:\n"
        "            return e.code\n"
        "        except OSError:\n"
        "            time.sleep(0.1)\n"
        "print(get({}), get({'Authorization': 'Bearer wrong'}), get({'Authorization': 'Bearer s3cret'}))\n"
        "p.terminate()\n"
    )
    reply = env.client.run_python(script, timeout=60)
    assert reply["output"].split() == ["401", "401", "200"], reply


def test_compare_table_reads_xlsx_written_by_the_spreadsheet(env, tmp_path):
    task = parse_task({"id": "tables", "instruction": "x", "evaluator": {"func": "infeasible"}}, tmp_path)
    getters = judges.Getters(env.client, task, tmp_path / "cache")
    env.client.upload("/tmp/t.csv", "name,qty\nplum,7\n\u00e9t\u00e9,2.5\n".encode())
    assert env.client.execute(["ssconvert", "/tmp/t.csv", "/tmp/t.xlsx"])["returncode"] == 0
    xlsx = getters.vm_file("/tmp/t.xlsx")
    assert read_table(xlsx) == [[["name", "qty"], ["plum", "7"], ["\u00e9t\u00e9", "2.5"]]]
    same = tmp_path / "same.csv"
    same.write_text("name,qty\nplum,7\n\u00e9t\u00e9,2.50\n")
    other = tmp_path / "other.csv"
    other.write_text("name,qty\nplum,8\n\u00e9t\u00e9,2.5\n")
    assert compare_table(xlsx, str(same)) == 1.0
    assert compare_table(xlsx, str(other)) == 0.0
