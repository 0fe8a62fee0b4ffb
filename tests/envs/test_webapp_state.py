"""The Trac base state builds deterministically under the application's Python, and every Trac
task file parses and refers to entities that state has."""

import json
import pathlib
import re
import sqlite3
import subprocess

import pytest

from cua_jax.envs.webapp import judges
from cua_jax.envs.webapp.server import app_python
from cua_jax.envs.webapp.tasks import VALIDATION_FILE

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILDER = ROOT / "cua_jax" / "envs" / "webapp" / "trac_state.py"
TASKS = ROOT / "cua_jax" / "tasks" / "suites" / "webapp" / "trac"


def _run_builder(*args: str) -> str:
    result = subprocess.run(
        [app_python(), str(BUILDER), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture(scope="module")
def test_state(tmp_path_factory):
    out = tmp_path_factory.mktemp("trac") / "state"
    _run_builder("build", "--out", str(out), "--scale", "test")
    return out


def test_building_twice_gives_the_same_content(test_state, tmp_path):
    again = tmp_path / "again"
    _run_builder("build", "--out", str(again), "--scale", "test")
    assert _run_builder("digest", str(test_state)) == _run_builder("digest", str(again))


def test_the_builder_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    result = subprocess.run(
        [app_python(), str(BUILDER), "build", "--out", str(tmp_path), "--scale", "test"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and "non-empty" in result.stderr


def _task_files():
    return sorted(path for path in TASKS.glob("*.json") if path.name != VALIDATION_FILE)


REQUIRED_FIELDS = (
    "task_id",
    "sites",
    "intent",
    "intent_template",
    "start_url",
    "require_reset",
    "require_login",
    "storage_state",
    "eval",
    "resources",
    "scripts",
)
STEP_KINDS = ({"click"}, {"fill", "text"}, {"key"}, {"answer"}, {"done"})


def test_every_task_file_parses_with_a_valid_eval_and_scripts():
    files = _task_files()
    assert len(files) >= 40
    ids = set()
    for path in files:
        task = json.loads(path.read_text())
        for field in REQUIRED_FIELDS:
            assert field in task, f"{path.name}: missing field {field!r}"
        assert task["task_id"] == path.stem and task["task_id"] not in ids, path.name
        ids.add(task["task_id"])
        assert task["sites"] == ["trac"] and task["start_url"].startswith("/"), path.name
        judges.validate_eval(task["eval"], path.name)
        assert set(task["resources"]) == {"authoritative", "derived", "ephemeral"}, path.name
        for script in ("solution", "near_miss"):
            steps = task["scripts"][script]
            assert steps and all(set(s) in STEP_KINDS for s in steps), f"{path.name}: scripts.{script}"
            assert set(steps[-1]) in ({"answer"}, {"done"}), f"{path.name}: scripts.{script} must end the episode"
        asks = "string_match" in task["eval"]["eval_types"]
        assert ("answer" in task["scripts"]["solution"][-1]) == asks, f"{path.name}: answer step vs string_match"


def test_tasks_refer_to_entities_of_the_test_state(test_state):
    db = sqlite3.connect(f"file:{test_state / 'db' / 'trac.db'}?mode=ro", uri=True)
    tickets = {r[0] for r in db.execute("SELECT id FROM ticket")}
    pages = {r[0] for r in db.execute("SELECT DISTINCT name FROM wiki")}
    milestones = {r[0] for r in db.execute("SELECT name FROM milestone")}
    named_tickets = set(range(1, 49))
    assert named_tickets <= tickets
    for path in _task_files():
        task = json.loads(path.read_text())
        url = task["start_url"].split("?")[0]
        if m := re.fullmatch(r"/ticket/(\d+)", url):
            assert int(m.group(1)) in named_tickets, f"{path.name}: start_url names a ticket outside the named set"
        if m := re.fullmatch(r"/wiki/(.+)", url):
            assert m.group(1) in pages, f"{path.name}: start_url names a missing wiki page"
        if m := re.fullmatch(r"/milestone/(.+)", url):
            assert m.group(1) in milestones, f"{path.name}: start_url names a missing milestone"
        # Tickets the task's text names (#N) are named ones, so the task holds at every scale.
        for number in re.findall(r"#(\d+)", task["intent"]):
            assert int(number) in named_tickets, f"{path.name}: intent names ticket #{number}"
