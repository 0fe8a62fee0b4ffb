"""Metrics, host-side getters, downloads and the verdict combination of the judges."""

import ast
import datetime
import functools
import http.server
import json
import logging
import pathlib
import threading
import zipfile

import pytest

from cua_jax.envs import actions as A
from cua_jax.tasks import fetch, judges, setup_steps
from cua_jax.tasks.metrics.data import check_json
from cua_jax.tasks.metrics.general import infeasible
from cua_jax.tasks.metrics.sheets import compare_table
from cua_jax.tasks.metrics.text import check_include_exclude, compare_text_file, exact_match
from cua_jax.tasks.schema import Step, parse_task


def write(path, text):
    path.write_text(text)
    return str(path)


def test_exact_match_and_include_exclude():
    assert exact_match("abc", {"expected": "abc"}) == 1.0
    assert exact_match("abc\n", {"expected": "abc"}) == 0.0
    assert exact_match(None, {"expected": None}) == 0.0
    with pytest.raises(judges.JudgeError, match="need 'expected'"):
        exact_match("abc", {"wanted": "abc"})
    rules = {"include": ["a", "b"], "exclude": ["z"]}
    assert check_include_exclude("xaby", rules) == 1.0
    assert check_include_exclude("xay", rules) == 0.0
    assert check_include_exclude("abz", rules) == 0.0
    assert check_include_exclude(None, rules) == 0.0


def test_compare_text_file(tmp_path):
    expected = write(tmp_path / "e.txt", "Hello  world\n")
    assert compare_text_file(write(tmp_path / "a.txt", "Hello  world\n"), expected) == 1.0
    assert compare_text_file(write(tmp_path / "b.txt", "hello world"), expected) == 0.0
    assert compare_text_file(str(tmp_path / "b.txt"), expected, ignore_blanks=True, ignore_case=True) == 1.0
    assert compare_text_file(None, expected) == 0.0
    with pytest.raises(judges.JudgeError, match="expected file"):
        compare_text_file(expected, str(tmp_path / "missing.txt"))


def test_check_json(tmp_path):
    path = write(tmp_path / "s.json", json.dumps({"a": {"b": [1, 2]}, "c": "x"}))
    rules = {
        "expect": [
            {"key": ["a", "b", 1], "method": "eq", "ref": 2},
            {"key": ["a", "b"], "method": "has", "ref": 1},
            {"key": ["c"], "method": "exists"},
        ],
        "unexpect": [{"key": ["d"], "method": "exists"}],
    }
    assert check_json(path, rules) == 1.0
    assert check_json(path, {"expect": [{"key": ["c"], "method": "eq", "ref": "y"}]}) == 0.0
    assert check_json(path, {"unexpect": [{"key": ["c"], "method": "ne", "ref": "y"}]}) == 0.0
    assert check_json(write(tmp_path / "bad.json", "{"), rules) == 0.0
    assert check_json(None, rules) == 0.0
    with pytest.raises(judges.JudgeError, match="bad check_json rule"):
        check_json(path, {"expect": [{"key": ["c"], "method": "approximately"}]})


def test_compare_table_csv(tmp_path):
    expected = write(tmp_path / "e.csv", "item,qty\npear,5\n")
    assert compare_table(write(tmp_path / "a.csv", "item,qty\npear,5.0,\n\n"), expected) == 1.0
    assert compare_table(write(tmp_path / "b.csv", "item,qty\npear,6\n"), expected) == 0.0
    assert compare_table(str(tmp_path / "none.csv"), expected) == 0.0
    assert compare_table(write(tmp_path / "c.xlsx", "not a zip"), expected) == 0.0
    with pytest.raises(judges.JudgeError, match="reads .csv and .xlsx"):
        compare_table(write(tmp_path / "d.ods", "x"), write(tmp_path / "e.ods", "x"))


def test_infeasible_looks_at_the_last_action():
    assert infeasible(last_action=A.Fail()) == 1.0
    assert infeasible(last_action=A.Done()) == 0.0
    assert infeasible(last_action=A.InvalidAction("x")) == 0.0


@pytest.fixture(scope="module")
def loopback_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    (root / "expected.txt").write_text("served text\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_local_file_loopback_and_mirrored_urls_only(tmp_path, loopback_server, monkeypatch):
    write(tmp_path / "local.txt", "local")
    assert fetch.fetch("local.txt", str(tmp_path)) == b"local"
    assert fetch.fetch(f"file://{tmp_path}/local.txt", "/") == b"local"
    assert fetch.fetch(f"{loopback_server}/expected.txt", "/") == b"served text\n"
    monkeypatch.delenv(fetch.DOWNLOAD_MIRROR_ENV, raising=False)
    with pytest.raises(fetch.NetworkNeeded, match="needs network: http://example.com/x"):
        fetch.fetch("http://example.com/x", "/")
    # a download mirror serves cloud URLs by host and path (a query joins the file name)
    mirror = tmp_path / "mirror"
    (mirror / "huggingface.co/datasets/x").mkdir(parents=True)
    (mirror / "drive.google.com").mkdir()
    write(mirror / "huggingface.co/datasets/x/a b.txt", "mirrored")
    write(mirror / "drive.google.com/uc?id=7&export=download", "by query")
    url = "https://huggingface.co/datasets/x/a%20b.txt"
    assert fetch.fetch(url, "/", mirror=mirror) == b"mirrored"
    assert fetch.fetch("https://drive.google.com/uc?id=7&export=download", "/", mirror=mirror) == b"by query"
    assert fetch.needs_network(url) and not fetch.needs_network(url, mirror)
    monkeypatch.setenv(fetch.DOWNLOAD_MIRROR_ENV, str(mirror))
    assert fetch.fetch(url, "/") == b"mirrored" and not fetch.needs_network(url)
    with pytest.raises(fetch.NetworkNeeded, match="needs network: https://huggingface.co/datasets/x/other.txt"):
        fetch.fetch("https://huggingface.co/datasets/x/other.txt", "/")
    assert not fetch.needs_network(f"{loopback_server}/expected.txt") and not fetch.needs_network("/local/path")
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        fetch.fetch("ftp://127.0.0.1/x", "/")


def test_env_scripts_compile_and_define_what_judges_calls():
    # They run only inside an environment (python-xlib, Chromium, VLC); a syntax error would
    # show there as a failed setup step, so catch it here.
    scripts = {path.name: path.read_text() for path in setup_steps.ENV_SCRIPTS_DIR.glob("*.py")}
    assert set(scripts) == {"window.py", "chrome_tabs.py", "vlc_status.py"}
    for name, text in scripts.items():
        names = {node.name for node in ast.parse(text, name).body if isinstance(node, ast.FunctionDef)}
        assert name == "vlc_status.py" or "main" in names, name


def test_host_getters(tmp_path, loopback_server):
    write(tmp_path / "expected.txt", "e")
    task = parse_task({"id": "g", "instruction": "x", "evaluator": {"func": "infeasible"}}, tmp_path)
    getters = judges.Getters(None, task, tmp_path / "cache")
    assert getters.rule({"expected": 1}) == {"expected": 1}
    assert getters.local_file("expected.txt") == str(tmp_path / "expected.txt")
    with pytest.raises(judges.JudgeError, match="does not exist"):
        getters.local_file("nope.txt")
    cached = getters.cloud_file(f"{loopback_server}/expected.txt")
    assert open(cached).read() == "served text\n"
    assert getters.cloud_file(f"{loopback_server}/expected.txt") == cached  # fetched once
    with pytest.raises(judges.JudgeError, match="cannot fetch"):
        getters.cloud_file(f"{loopback_server}/absent.txt")


def test_setup_errors_name_the_step(tmp_path):
    steps = (Step("sleep", {"seconds": 0}), Step("download", {"files": [{"url": "missing.bin", "path": "/x"}]}))
    with pytest.raises(judges.SetupError, match=r"step 1 \(download\) failed: no such file"):
        judges.run_steps(steps, None, str(tmp_path))


def verdict(tmp_path, evaluator, last_action=A.Done()):  # noqa: B008 - an action is immutable
    task = parse_task({"id": "v", "instruction": "x", "evaluator": evaluator}, tmp_path)
    return judges.evaluate(task, None, tmp_path / "cache", last_action=last_action)


def test_a_malformed_result_file_scores_0_and_is_noted_in_the_verdict(tmp_path, caplog):
    write(tmp_path / "result.docx", "not a zip archive")
    import docx

    docx.Document().save(tmp_path / "expected.docx")
    task = parse_task(
        {
            "id": "m",
            "instruction": "x",
            "evaluator": {
                "func": "compare_docx_files",
                "result": {"type": "local_file", "path": "result.docx"},
                "expected": {"type": "local_file", "path": "expected.docx"},
            },
        },
        tmp_path,
    )
    with caplog.at_level(logging.INFO, logger="cua_jax.tasks.metrics.base"):
        judged = judges.verdict(task, None, tmp_path / "cache", last_action=A.Done())
    assert judged.reward == 0.0 and len(judged.malformed_results) == 1
    assert judged.malformed_results[0].startswith(f"{tmp_path / 'result.docx'}: PackageNotFoundError")
    assert any(judged.malformed_results[0] in record.getMessage() for record in caplog.records)
    assert judges.verdict(task, None, tmp_path / "cache", last_action=A.Fail()).malformed_results == ()


def test_conjunctions_combine_like_osworld(tmp_path):
    write(tmp_path / "a.txt", "a")
    write(tmp_path / "b.txt", "b")
    same = {
        "func": "compare_text_file",
        "result": {"type": "local_file", "path": "a.txt"},
        "expected": {"type": "local_file", "path": "a.txt"},
    }
    differ = {**same, "expected": {"type": "local_file", "path": "b.txt"}}

    def combined(conj, *checks):
        return {"conj": conj, **{key: [c[key] for c in checks] for key in ("func", "result", "expected")}}

    assert verdict(tmp_path, combined("and", same, same)) == 1.0
    assert verdict(tmp_path, combined("and", same, differ)) == 0.0
    assert verdict(tmp_path, combined("or", differ, same)) == 1.0
    assert verdict(tmp_path, combined("or", differ, differ)) == 0.0
    assert verdict(tmp_path, same, last_action=A.Fail()) == 0.0  # declared a feasible task infeasible
    assert verdict(tmp_path, {"func": "infeasible"}, last_action=A.Fail()) == 1.0


# ------------------------------------------------------------------------------------
# OSWorld's setup steps and getters, against a scripted client
# ------------------------------------------------------------------------------------


class ScriptedClient:
    """The calls of EnvClient these tests need: files in a dict, commands answered by a function."""

    def __init__(self, files=None, answer=None):
        self.files = dict(files or {})
        self.answer = answer or (lambda command, shell: {"output": "", "error": "", "returncode": 0})
        self.commands = []

    def execute(self, command, shell=False, timeout=60.0):
        self.commands.append(command)
        return {"status": "success", **self.answer(command, shell)}

    def get_file(self, path):
        return self.files.get(path)

    def upload(self, path, data):
        self.files[path] = data

    def launch(self, command, shell=False):
        self.commands.append(("launch", command))
        return 1

    def screen_size(self):
        return 1280, 800


def test_execute_substitutes_placeholders_checks_status_and_captures_output(tmp_path):
    client = ScriptedClient(
        answer=lambda command, shell: {
            "output": "out\n",
            "error": "err\n",
            "returncode": 1 if "diff" in str(command) else 0,
        }
    )
    steps = (
        Step("execute", {"command": ["echo", "{SCREEN_WIDTH}x{SCREEN_HEIGHT_HALF}", "{CLIENT_PASSWORD}"]}),
        Step("command", {"command": "echo {SCREEN_WIDTH_HALF}", "shell": True, "stdout": "o.txt"}),
    )
    judges.run_steps(steps, client, str(tmp_path), cache_dir=tmp_path / "cache")
    assert client.commands == [["echo", "1280x400", setup_steps.CLIENT_PASSWORD], "echo 640"]
    assert (tmp_path / "cache" / "o.txt").read_text() == "out\n"
    differ = (Step("execute", {"command": ["diff", "a", "b"], "stdout": "diff.out", "stderr": "diff.err"}),)
    with pytest.raises(judges.SetupError, match=r"step 0 \(execute\) failed: exit status 1: err"):
        judges.run_steps(differ, client, str(tmp_path), cache_dir=tmp_path / "cache")
    # postconfig reports on the agent's work: a nonzero exit status is an outcome, as in OSWorld
    judges.run_steps(differ, client, str(tmp_path), cache_dir=tmp_path / "cache", postconfig=True)
    assert (tmp_path / "cache" / "diff.err").read_text() == "err\n"
    with pytest.raises(judges.SetupError, match="exit status 1"):  # unless the step asks to check it
        judges.run_steps(
            (Step("execute", {"command": ["diff"], "check": True}),), client, str(tmp_path), postconfig=True
        )


def test_execute_until_reruns_the_command_until_it_is_met(tmp_path):
    calls = []

    def answer(command, shell):
        calls.append(command)
        return {"output": "ready" if len(calls) >= 3 else "", "error": "", "returncode": 1}

    judges.run_steps(
        (Step("execute", {"command": ["probe"], "until": {"stdout": "ready"}}),), ScriptedClient(answer=answer), "/"
    )
    assert len(calls) == 3
    never = Step("execute", {"command": ["probe"], "until": {"returncode": 0}, "timeout": 0.5})
    with pytest.raises(judges.SetupError, match="never met"):
        judges.run_steps((never,), ScriptedClient(answer=answer), "/")


def test_steps_the_project_does_not_run_fail_by_name(tmp_path):
    with pytest.raises(
        judges.SetupError, match=r"step 0 \(googledrive\) failed: setup step not implemented: googledrive"
    ):
        judges.run_steps((Step("googledrive", {"operation": [], "args": []}),), ScriptedClient(), "/")
    step = Step("download", {"files": [{"url": "https://example.com/f.xlsx", "path": "/home/user/f.xlsx"}]})
    with pytest.raises(judges.SetupError, match=r"failed: needs network: https://example.com/f.xlsx"):
        judges.run_steps((step,), ScriptedClient(), "/", mirror=tmp_path)


def test_google_chrome_launches_as_the_chromium_the_image_has():
    client = ScriptedClient(
        answer=lambda command, shell: {"output": "/usr/bin/chromium\n", "error": "", "returncode": 0}
    )
    steps = (
        Step("launch", {"command": ["google-chrome", "--remote-debugging-port=1337"]}),
        Step("launch", {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}),
    )
    judges.run_steps(steps, client, "/")
    assert [c for c in client.commands if c[0] == "launch"] == [
        ("launch", ["chromium", "--remote-debugging-port=1337"]),
        ("launch", ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]),
    ]


def getters_for(tmp_path, client):
    task = parse_task({"id": "g", "instruction": "x", "evaluator": {"func": "infeasible"}}, tmp_path)
    return judges.Getters(client, task, tmp_path / "cache")


def test_vm_file_lists_multi_gives_and_time_suffix(tmp_path):
    getters = getters_for(tmp_path, ScriptedClient({"/h/a.txt": b"a", "/h/b.txt": b"b"}))
    assert open(getters.vm_file("/h/a.txt", "mine.txt")).read() == "a"
    assert getters.vm_file("/h/missing.txt") is None
    both = getters.vm_file(
        ["/h/a.txt", "/h/b.txt", "/h/c.txt"], ["1.txt", "2.txt", "3.txt"], multi=True, gives=[0, 1, 2]
    )
    assert [p and open(p).read() for p in both] == ["a", "b", None]
    # gives picks the files the metric sees; one index gives one path (OSWorld's shape)
    assert getters.vm_file(["/h/a.txt", "/h/b.txt"], ["1.txt", "2.txt"], multi=True, gives=[1]).endswith("2.txt")
    assert getters.vm_file(["/h/a.txt", "/h/b.txt"], ["1.txt", "2.txt"], multi=True).endswith("1.txt")
    stamped = getters.vm_file("/h/a.txt", "a.txt", time_suffix=True, time_format="%Y")
    assert pathlib.Path(stamped).name == f"a_{datetime.date.today().year}.txt"


def test_unimplemented_getters_fail_as_the_judges_fault(tmp_path):
    task = parse_task(
        {
            "id": "g",
            "instruction": "x",
            "evaluator": {
                "func": "exact_match",
                "result": {"type": "open_tabs_info"},
                "expected": {"type": "rule", "rules": {}},
            },
        }
    )
    with pytest.raises(judges.JudgeError, match="getter not implemented: open_tabs_info"):
        getters_for(tmp_path, ScriptedClient()).get(task.evaluator.checks[0].result)


def test_cloud_cache_and_local_file_getters(tmp_path):
    write(tmp_path / "e1.txt", "one")
    write(tmp_path / "e2.txt", "two")
    write(tmp_path / "cities.csv", "name,year,city\nA,2020,Paris\nB,2021,Rome\n")
    getters = getters_for(tmp_path, ScriptedClient())
    assert open(getters.cloud_file("e1.txt", "gold.txt")).read() == "one"
    pair = getters.cloud_file(["e1.txt", "e2.txt"], ["g1.txt", "g2.txt"], multi=True, gives=[0, 1])
    assert [open(p).read() for p in pair] == ["one", "two"]
    with pytest.raises(judges.JudgeError, match="needs network"):
        getters.cloud_file("https://huggingface.co/datasets/x/never-mirrored.txt")
    (tmp_path / "cache" / "diff.out").write_text("")
    assert getters.cache_file("diff.out") == str(tmp_path / "cache" / "diff.out")
    with pytest.raises(judges.JudgeError, match="no step wrote it"):
        getters.cache_file("absent.out")
    assert getters.conference_city_in_order("cities.csv") == ["Paris", "Rome"]
    assert getters.time_diff_range(5) == 5 and getters.rule({"a": 1}) == {"a": 1}


def test_content_from_vm_file_reads_an_xlsx_last_row(tmp_path):
    import openpyxl

    book = openpyxl.Workbook()
    for row in (["name", "qty", "note"], ["pear", 5, None], ["fig", 2.5, "ok"]):
        book.active.append(row)
    book.save(tmp_path / "t.xlsx")
    getters = getters_for(
        tmp_path, ScriptedClient({"/h/t.xlsx": (tmp_path / "t.xlsx").read_bytes(), "/h/bad.xlsx": b"x"})
    )
    assert getters.content_from_vm_file("/h/t.xlsx", "xlsx", "last_row") == ["fig", "2.5", "ok"]
    assert getters.content_from_vm_file("/h/missing.xlsx", "xlsx", "last_row") is None
    assert getters.content_from_vm_file("/h/bad.xlsx", "xlsx", "last_row") is None
    with pytest.raises(judges.JudgeError, match="reads xlsx last_row"):
        getters.content_from_vm_file("/h/t.xlsx", "csv", "last_row")


def presentation(tmp_path, linked_audio=False) -> bytes:
    """A minimal .pptx: slide 1 with a background image and an audio clip (embedded or linked)."""
    slide = (
        '<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" '
        'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
        'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
        '<p:cSld><p:bg><p:bgPr><a:blipFill><a:blip r:embed="rId2"/></a:blipFill></p:bgPr></p:bg></p:cSld></p:sld>'
    )
    audio = "file:///home/user/clip.mp3" if linked_audio else "../media/clip.mp3"
    rels = (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" '
        'Target="../media/image1.png"/>'
        '<Relationship Id="rId3" Type="http://schemas.microsoft.com/office/2007/relationships/media" '
        f'Target="{audio}"/>'
        '<Relationship Id="rId4" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/audio" '
        f'Target="{audio}"/></Relationships>'
    )
    path = tmp_path / "deck.pptx"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ppt/slides/slide1.xml", slide)
        archive.writestr("ppt/slides/_rels/slide1.xml.rels", rels)
        archive.writestr("ppt/media/image1.png", b"PNG")
        archive.writestr("ppt/media/clip.mp3", b"MP3")
    return path.read_bytes()


def test_slide_getters_extract_or_copy_the_media(tmp_path):
    client = ScriptedClient({"/h/deck.pptx": presentation(tmp_path), "/home/user/clip.mp3": b"LINKED"})
    getters = getters_for(tmp_path, client)
    assert open(getters.background_image_in_slide("/h/deck.pptx", 0, "bg.png"), "rb").read() == b"PNG"
    assert open(getters.audio_in_slide("/h/deck.pptx", "0", "a.mp3"), "rb").read() == b"MP3"
    assert getters.audio_in_slide("/h/deck.pptx", 3, "a.mp3") is None  # no such slide
    client.files["/h/deck.pptx"] = presentation(tmp_path, linked_audio=True)
    assert open(getters.audio_in_slide("/h/deck.pptx", 0, "linked.mp3"), "rb").read() == b"LINKED"


# ------------------------------------------------------------------------------------
# What a task needs, and whether an image can run it (cua_jax.tasks.runnable)
# ------------------------------------------------------------------------------------


def osworld_task(**evaluator):
    """A task as OSWorld writes them (its shapes: string booleans, placeholders, URLs)."""
    return parse_task(
        {
            "id": "osworld-like",
            "snapshot": "chrome",
            "instruction": "do it",
            "source": "x",
            "related_apps": ["chrome", "os"],
            "config": [
                {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
                {
                    "type": "chrome_open_tabs",
                    "parameters": {"urls_to_open": ["https://www.example.org", "http://127.0.0.1:8000/x"]},
                },
                {
                    "type": "download",
                    "parameters": {
                        "files": [
                            {
                                "url": "https://huggingface.co/datasets/xlangai/f/resolve/main/a.xlsx",
                                "path": "/home/user/a.xlsx",
                            }
                        ]
                    },
                },
                {
                    "type": "execute",
                    "parameters": {"command": ["python", "-c", "import pyautogui, time; import os.path"]},
                },
                {
                    "type": "execute",
                    "parameters": {
                        "command": "echo {CLIENT_PASSWORD} | sudo -S apt-get install jq -y && unzip x.zip",
                        "shell": "true",
                    },
                },
                {"type": "command", "parameters": {"command": ["pip", "install", "./local.whl"]}},
                {"type": "activate_window", "parameters": {"window_name": "Google Chrome", "strict": True}},
            ],
            "evaluator": evaluator
            or {
                "func": ["exact_match", "exact_match"],
                "result": [
                    {"type": "open_tabs_info"},
                    {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a.xlsx"},
                ],
                "expected": [{"type": "rule", "rules": {"expected": 1}}, {"type": "rule", "rules": {"expected": 2}}],
            },
        }
    )


def test_needs_of_an_osworld_task():
    from cua_jax.tasks import runnable

    found = runnable.needs(osworld_task())
    by_kind = {}
    for need in found:
        by_kind.setdefault(need.kind, []).append(need.name)
    assert sorted(set(by_kind["app"])) == ["apt-get", "chromium", "pip", "python", "sudo", "unzip"]
    assert by_kind["module"] == ["python:pyautogui"]  # the standard library needs nothing
    assert by_kind["network"] == [
        "https://www.example.org",
        "https://huggingface.co/datasets/xlangai/f/resolve/main/a.xlsx",
        "apt-get install jq -y",
    ]  # the loopback tab and the local wheel do not
    assert by_kind["getter"] == ["open_tabs_info"]
    chrome = [n for n in found if n.name == "chromium"]
    assert [n.where for n in chrome] == ["related_apps", "config[0]", "config[1]", "evaluator.result[0]"]
    groups = {n.group for n in found if n.kind == "network"}
    assert groups == {"needs network: www.example.org", "needs network: huggingface.co", "needs network: apt-get"}


@pytest.mark.parametrize(
    "command, shell, apps, network",
    [
        (["python3", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's')"], False, ["python3"], []),
        ("VLC_VERBOSE=-1 vlc --no-audio video.mp4", True, ["vlc"], []),
        (["/bin/bash", "-c", "cd /home/user && unzip -q a.zip && rm a.zip"], False, ["bash", "unzip", "rm"], []),
        ("export X=1\ngnome-terminal --maximize 2>&1 > /dev/null &", True, ["gnome-terminal"], []),
        ('[ ! -f "$F" ] && echo \'{}\' > "$F" || (grep -q x "$F" && sed -i s/a/b/ "$F")', True, ["grep", "sed"], []),
        ("./setup.sh; for f in *.txt; do cat $f; done", True, ["cat"], []),
        (
            ["code", "--install-extension", "ms-python.python"],
            False,
            ["vs_code"],
            ["code --install-extension ms-python.python"],
        ),
        (["code", "--install-extension", "/tmp/eval-0.0.1.vsix"], False, ["vs_code"], []),
        ("pip install PyMuPDF", True, ["pip"], ["pip install PyMuPDF"]),
        (["python", "-m", "pip", "install", "pysrt"], False, ["python"], ["pip install pysrt"]),
        (
            "git clone https://github.com/x/y && git remote add origin /home/user/r",
            True,
            ["git", "git"],
            ["git clone https://github.com/x/y"],
        ),
        ("curl -s http://127.0.0.1:8080/status", True, ["curl"], []),
        ("echo password | sudo -S -u user libreoffice --calc", True, ["sudo", "libreoffice"], []),
        (
            "gsettings set org.gnome.shell favorite-apps \"['thunderbird.desktop']\"",
            True,
            ["gsettings", "gnome-shell"],
            [],
        ),
        ("gsettings set org.gnome.desktop.interface color-scheme prefer-dark", True, ["gsettings"], []),
    ],
)
def test_command_needs(command, shell, apps, network):
    from cua_jax.tasks import runnable

    found = runnable.command_needs(command, shell)
    assert [n.name for n in found if n.kind == "app"] == apps
    assert [n.name for n in found if n.kind == "network"] == network


def test_runnable_names_every_reason_once():
    from cua_jax.tasks import runnable

    task = osworld_task()
    ok, reasons = runnable.runnable(task, image_apps=set())
    assert not ok
    assert reasons == [
        "needs app: chromium",
        "needs network: https://www.example.org",
        "needs network: https://huggingface.co/datasets/xlangai/f/resolve/main/a.xlsx",
        "needs app: python",
        "needs app: sudo",
        "needs app: apt-get",
        "needs network: apt-get install jq -y",
        "needs app: unzip",
        "needs app: pip",
        "getter not implemented: open_tabs_info",
    ]
    everything = {"chromium", "python", "sudo", "apt-get", "unzip", "pip"}
    _, reasons = runnable.runnable(task, everything)
    assert "needs python module: pyautogui" in reasons and not any(r.startswith("needs app") for r in reasons)
    assert runnable.runnable(task, everything | {"python:pyautogui"})[1] == [
        "needs network: https://www.example.org",
        "needs network: https://huggingface.co/datasets/xlangai/f/resolve/main/a.xlsx",
        "needs network: apt-get install jq -y",
        "getter not implemented: open_tabs_info",
    ]
    # an infeasible task is judged on its last action: its getters never run
    infeasible = parse_task(
        {
            "id": "i",
            "instruction": "x",
            "related_apps": ["thunderbird"],
            "evaluator": {"func": "infeasible", "result": {"type": "bookmarks"}},
        }
    )
    assert runnable.runnable(infeasible, set()) == (False, ["needs app: thunderbird"])
    assert runnable.runnable(infeasible, {"thunderbird"}) == (True, [])


def test_probe_script_runs_in_a_posix_shell():
    import subprocess

    from cua_jax.tasks import runnable

    names = ["sh", "not-a-program-anywhere", "python3:json", "python3:no_such_module_here", "terminal"]
    script = runnable.probe_script(names)
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert runnable._present(output) >= {"sh", "python3:json"}
    assert not runnable._present(output) & {"not-a-program-anywhere", "python3:no_such_module_here"}
