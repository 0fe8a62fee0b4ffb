"""The osworld_apps image (launch/images/osworld_apps, built FROM osworld) and the apps suite
(cua_jax/tasks/suites/apps): OSWorld's Chrome, GIMP, VLC, Thunderbird and Nautilus tasks on a
real dockerd.

The Chrome profile getters read what Chromium (OSWorld's `google-chrome`) writes, VLC's
status comes from its HTTP interface inside the container, Thunderbird's window has the class
OSWorld's tasks close, the image holds the other applications OSWorld's tasks name (socat,
xdg-utils); the suite runs through `python -m experiments.evaluate --policy=oracle
--suite=apps` (the pool picks osworld_apps for the tasks' snapshots), the random policy scores
0 on them in OSWorld's layout (`--suite=osworld`), with the Thunderbird task's profile a cloud
file mirrored from a loopback server (`python -m experiments.tasks mirror`), and
`python -m experiments.tasks untouched` judges each untouched and flags a task whose setup
alone passes its judge.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.eval.suites import osworld_suite
from cua_jax.tasks import judges
from cua_jax.tasks import runnable as R
from cua_jax.tasks.getters import Getters
from cua_jax.tasks.metrics.browser import is_expected_bookmarks
from cua_jax.tasks.schema import Step, load_suite
from cua_jax.tasks.setup_steps import SetupError, run_steps
from cua_jax.tasks.suites.apps.solutions import IMAGE, SOLUTIONS, SUITE_DIR
from experiments import tasks as task_cli
from tests.envs.test_osworld_image import run
from tests.tasks.test_mirror_download import run as mirror_into
from tests.tasks.test_mirror_download import serve, serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = {task.id: task for task in load_suite(SUITE_DIR)}


def test_every_apps_task_has_a_solution_in_the_action_grammar():
    assert set(TASKS) == set(SOLUTIONS) and len(TASKS) == 5
    assert {R.task_image(task) for task in TASKS.values()} == {IMAGE}
    for task_id, replies in SOLUTIONS.items():
        for text in replies:
            assert not isinstance(A.parse_action(text, "coordinates"), A.InvalidAction), (task_id, text)


@pytest.mark.docker
@pytest.mark.slow
def test_the_applications_and_their_getters_on_a_real_container(tmp_path):
    image = ensure_image(IMAGE)
    names = ["chromium", "socat", "thunderbird", "gimp", "vlc", "nautilus", "xdg-mime", "xdg-settings", "soffice"]
    assert R.probe_image(image, names) == set(names)
    with DockerEnvPool(PoolConfig(image=image, size=1, cpus=1.0, memory="2g", call_timeout=60.0)) as pool:
        env = pool.acquire(timeout=300)
        try:
            client = env.client
            getters = Getters(client, TASKS["chrome-do-not-track"], tmp_path / "cache")
            # Chromium as google-chrome, its profile where OSWorld's getters read Chrome's.
            client.launch(["google-chrome", "--remote-debugging-port=1337"])
            run(client, "until [ -s ~/.config/google-chrome/Default/Preferences ]; do sleep 0.2; done")
            assert "Chrome/" in run(
                client,
                'python3 -c "import urllib.request as u; '
                "print(u.urlopen('http://127.0.0.1:1337/json/version').read().decode())\"",
            )
            assert getters.enable_do_not_track() == "false"
            assert getters.new_startup_page() == "true"  # a fresh profile opens the new tab page
            assert getters.chrome_font_size()["default_font_size"] == 16
            assert getters.bookmarks() == []  # no Bookmarks file yet
            # The settings a user makes, written as Chromium keeps them (it rewrites them on exit).
            run(
                client,
                "pkill -f ^/usr/lib/chromium/; while pgrep -f ^/usr/lib/chromium/ >/dev/null; do sleep 0.2; done",
            )
            edit = (
                "import json, os; base = os.path.expanduser('~/.config/google-chrome'); "
                "p = base + '/Default/Preferences'; d = json.load(open(p)); "
                "d.update(enable_do_not_track=True, session={'restore_on_startup': 4}); "
                "d.setdefault('profile', {})['name'] = 'Research'; "
                "d['webkit'] = {'webprefs': {'default_font_size': 24}}; "
                "d['default_search_provider_data'] = {'template_url_data': {'short_name': 'Bing'}}; "
                "json.dump(d, open(p, 'w')); "
                "bar = {'children': [{'type': 'folder', 'name': 'Favorites', 'children': []}]}; "
                "json.dump({'roots': {'bookmark_bar': bar}}, open(base + '/Default/Bookmarks', 'w'))"
            )
            client.execute(["python3", "-c", edit], timeout=30)
            assert getters.enable_do_not_track() == "true"
            # What an agent could write instead of the setting: a truthy string Chrome ignores,
            # or a file Chrome cannot read; neither turns the switch on.
            for tampered in ('{"enable_do_not_track": "false"}', '{"enable_do_not_track": 1}', "not json"):
                client.upload("/home/user/.config/google-chrome/Default/Copy", tampered.encode())
                client.execute(
                    ["sh", "-c", "cd ~/.config/google-chrome/Default && cp Preferences Kept && mv Copy Preferences"]
                )
                assert getters.enable_do_not_track() == "false", tampered
                client.execute(["sh", "-c", "cd ~/.config/google-chrome/Default && mv Kept Preferences"])
            assert getters.new_startup_page() == "false"
            assert getters.profile_name() == "Research"
            assert getters.chrome_font_size() == {"default_font_size": 24}
            assert getters.default_search_engine() == "Bing"
            rules = {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}
            assert is_expected_bookmarks(getters.bookmarks(), rules) == 1.0
            # VLC's Lua HTTP interface (vlcrc), read inside the container with no network.
            client.launch(["vlc"])
            deadline = time.monotonic() + 60
            status = None
            while status is None and time.monotonic() < deadline:
                status = getters.vlc_playing_info("status.xml")
                time.sleep(0.5)
            assert status is not None and "<state>stopped</state>" in open(status).read()
            # Thunderbird's main window has the class OSWorld's tasks close before judging.
            client.launch(["/usr/bin/thunderbird"])
            close = {"window_name": "Mail.thunderbird", "strict": True, "by_class": True, "timeout": 60, "check": True}
            run_steps([Step("close_window", close)], client, str(tmp_path))
            # closing that window quits Thunderbird (which then writes prefs.js)
            quit_wait = "for i in $(seq 100); do ps -C thunderbird -o stat= | grep -qv Z || exit 0; sleep 0.2; done"
            run(client, quit_wait + "; exit 1")
            with pytest.raises(SetupError, match="no window whose class is 'Mail.thunderbird'"):
                run_steps([Step("close_window", {**close, "timeout": 1})], client, str(tmp_path))
            # Nautilus's bookmark judge counts only a bookmark of the folder itself.
            bookmarks = "/home/user/.config/gtk-3.0/bookmarks"
            for near_miss in (
                "file:///home/user/Projects2",
                "file:///home/user/Projects/old",
                "# file:///home/user/Projects",
            ):
                client.upload(bookmarks, f"file:///home/user/Documents\n{near_miss}\n".encode())
                assert judges.evaluate(TASKS["nautilus-bookmark"], client, tmp_path / "judge") == 0.0, near_miss
            client.upload(bookmarks, b"file:///home/user/Documents\nfile:///home/user/Projects Projects\n")
            assert judges.evaluate(TASKS["nautilus-bookmark"], client, tmp_path / "judge") == 1.0
        finally:
            pool.release(env)


# OSWorld's Thunderbird tasks download one profile (.thunderbird/t5q2a5hp.default-release)
# from Google Drive and unpack it over the home folder.
PROFILE_URL = "https://drive.usercontent.google.com/download?id=tb-profile&export=download&authuser=0&confirm=t"


def _profile_tarball() -> bytes:
    """The apps suite's Thunderbird profile as OSWorld's thunderbird-profile.tar.gz holds its own."""
    folder = SUITE_DIR / "thunderbird-profile"
    members = {
        ".thunderbird/profiles.ini": folder / "profiles.ini",
        ".thunderbird/installs.ini": folder / "installs.ini",
        ".thunderbird/t5q2a5hp.default-release/prefs.js": folder / "prefs.js",
    }
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, path in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = path.stat().st_size, 0o644
            tar.addfile(info, io.BytesIO(path.read_bytes()))
    return data.getvalue()


def _osworld_folder(root):
    """The apps suite's tasks in OSWorld's layout (examples/<app>/<id>.json), the Thunderbird
    task's profile a cloud file as in OSWorld's, beside a file that breaks the schema and a task
    that needs a web page."""
    for task_id, task in TASKS.items():
        (root / task.related_apps[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(SUITE_DIR / f"{task_id}.json", root / task.related_apps[0] / f"{task_id}.json")
    thunderbird = root / "thunderbird" / "thunderbird-new-mail-alert.json"
    task = json.loads(thunderbird.read_text())
    archive = "/home/user/thunderbird-profile.tar.gz"
    task["config"][0] = {"type": "download", "parameters": {"files": [{"url": PROFILE_URL, "path": archive}]}}
    unpack = ["tar", "-xzv", "--recursive-unlink", "-f", archive, "-C", "/home/user/"]
    task["config"].insert(1, {"type": "execute", "parameters": {"command": unpack}})
    thunderbird.write_text(json.dumps(task))
    (root / "os").mkdir()
    (root / "os" / "broken.json").write_text(json.dumps({"id": "broken", "instruction": "x", "evaluator": {}}))
    web = json.loads((SUITE_DIR / "chrome-do-not-track.json").read_text())
    web.update(id="web", instruction="Open https://www.example.org/news in Chrome.")
    (root / "chrome" / "web.json").write_text(json.dumps(web))
    return root


def _mirror_from_loopback(folder, mirror) -> None:
    """`python -m experiments.tasks mirror` fetches the folder's cloud files from a loopback
    server standing in for Google Drive; `check --mirror` then counts their tasks runnable."""
    with serving() as server:
        serve(server, PROFILE_URL, {"body": _profile_tarball()})
        assert mirror_into(folder, mirror, server) == 0


@pytest.mark.docker
@pytest.mark.slow
def test_the_suite_through_the_entrypoint_solved_by_the_oracle_and_0_untouched(tmp_path):
    """`--policy=oracle --suite=apps` solves each task; `--policy=random --suite=osworld` on
    the tasks in OSWorld's layout scores each 0, judged at the turn limit on the state reached
    (as OSWorld scores its step limit), lists what it did not run and why, and reports the
    steps used, the Thunderbird task set up from its profile mirrored from a loopback server;
    `python -m experiments.tasks untouched` flags a task its setup alone passes, which the
    osworld suite then leaves out."""
    image = ensure_image(IMAGE)
    env = {**os.environ, "PYTHONPATH": REPO}

    def evaluate(*flags):
        done = subprocess.run(
            [sys.executable, "-m", "experiments.evaluate", "--seeds=1", "--workers=2", *flags],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]

    evaluate("--policy=oracle", "--suite=apps", f"--out={tmp_path / 'oracle'}")
    summary = json.loads((tmp_path / "oracle" / "turns_15_temperature_1" / "summary.json").read_text())
    assert {task: row["successes"] for task, row in summary["tasks"].items()} == dict.fromkeys(TASKS, 1)

    folder, mirror = _osworld_folder(tmp_path / "examples"), tmp_path / "mirror"

    def thunderbird_row():
        rows = task_cli.classify(folder, image=image, mirror=str(mirror), image_name=IMAGE)
        return next((row["status"], row["reasons"]) for row in rows if row["id"] == "thunderbird-new-mail-alert")

    assert thunderbird_row() == ("not runnable", [f"needs network: {PROFILE_URL}"])
    _mirror_from_loopback(folder, mirror)
    assert thunderbird_row() == ("runnable", [])

    out = tmp_path / "random"
    osworld = ("--suite=osworld", f"--osworld={folder}", f"--mirror={mirror}")
    evaluate("--policy=random", *osworld, "--turn_budgets=2", f"--out={out}")
    summary = json.loads((out / "turns_2_temperature_1" / "summary.json").read_text())
    assert {task: row["successes"] for task, row in summary["tasks"].items()} == dict.fromkeys(TASKS, 0)
    assert set(summary["domains"]) == {"chrome", "gimp", "vlc", "thunderbird", "nautilus"}
    assert summary["steps"]["all"] == 2.0
    assert summary["skipped"]["web"] == "needs network: https://www.example.org/news"
    assert summary["skipped"]["os/broken.json"].startswith("schema error: ")
    # Out of turns, each episode was judged on the state it reached (OSWorld's step limit).
    records = [json.loads(line) for line in (out / "turns_2_temperature_1" / "results.jsonl").read_text().splitlines()]
    assert {r["status"] for r in records} == {"failure"} and len(records) == len(TASKS)

    # A judge its setup alone passes: flagged by `untouched`, left out by the suite.
    chrome = folder / "chrome" / "chrome-do-not-track.json"
    chrome.write_text(chrome.read_text().replace('"expected": "true"', '"expected": "false"'))
    assert task_cli.main(["untouched", str(folder), "--image", IMAGE, "--workers", "3", "--mirror", str(mirror)]) == 0
    record = json.loads((folder / ".untouched.json").read_text())
    assert {entry["id"]: (entry["status"], entry["reward"]) for entry in record["tasks"].values()} == {
        "chrome-do-not-track": ("success", 1.0),
        **{task_id: ("failure", 0.0) for task_id in TASKS if task_id != "chrome-do-not-track"},
    }
    assert all(entry["start_s"] > 0 and entry["judge_s"] >= 0 for entry in record["tasks"].values())
    suite = osworld_suite(folder, mirror=str(mirror))
    assert suite.skipped["chrome-do-not-track"] == (
        "trivially satisfied: scores 1 untouched (its setup alone passes the judge)"
    )
    assert set(suite.task_ids) == set(TASKS) - {"chrome-do-not-track"}
