"""`python -m experiments.tasks check DIR`: every task file of a folder classified, runnable
here or why not, with counts per domain and per reason."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from experiments import tasks as tasks_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLOUD_URL = "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/os/data.csv"


def task(task_id: str, config=(), related_apps=(), **evaluator) -> dict:
    return {
        "id": task_id,
        "snapshot": "desktop",
        "instruction": "x",
        "source": "test",
        "related_apps": list(related_apps),
        "config": list(config),
        "evaluator": evaluator
        or {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": ["cat", "/a"]},
            "expected": {"type": "rule", "rules": {"expected": "a"}},
        },
    }


@pytest.fixture
def examples(tmp_path) -> pathlib.Path:
    """A small OSWorld-style folder: examples/<domain>/<id>.json and its index file."""
    files = {
        "os/runnable.json": task(
            "runnable",
            [{"type": "launch", "parameters": {"command": ["xterm"]}}, {"type": "sleep", "parameters": {"seconds": 1}}],
        ),
        "os/mail.json": task("mail", related_apps=["thunderbird"]),
        "chrome/tabs.json": task(
            "tabs",
            [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.example.org"]}}],
            ["chrome"],
        ),
        "chrome/broken.json": task("broken", [{"type": "activate_window", "parameters": {"strict": True}}]),
        "calc/cloud.json": task(
            "cloud", [{"type": "download", "parameters": {"files": [{"url": CLOUD_URL, "path": "/a"}]}}]
        ),
        "calc/tabs-metric.json": task(
            "tabs-metric",
            func="is_expected_tabs",
            result={"type": "open_tabs_info"},
            expected={"type": "rule", "rules": {"type": "url", "urls": []}},
        ),
    }
    root = tmp_path / "examples"
    for name, value in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(value))
    (root / "os" / "truncated.json").write_text('{"id": "truncated", ')
    (tmp_path / "test_all.json").write_text(json.dumps({"os": ["runnable"]}))  # an index, not a task
    (root / "test_small.json").write_text(json.dumps({"os": ["mail"]}))
    return root


def rows_by_id(rows):
    return {row["id"]: row for row in rows}


def test_check_classifies_every_file(examples, tmp_path, capsys):
    assert tasks_cli.main(["check", str(examples), "--apps", "xterm,sleep", "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    rows = rows_by_id(json.loads((tmp_path / "rows.json").read_text()))
    assert set(rows) == {"runnable", "mail", "tabs", "broken", "cloud", "tabs-metric", "truncated"}
    assert rows["runnable"]["status"] == "runnable" and rows["runnable"]["reasons"] == []
    assert rows["mail"]["reasons"] == ["needs app: thunderbird"]
    assert rows["tabs"]["reasons"] == ["needs app: chromium", "needs network: https://www.example.org"]
    assert rows["cloud"]["reasons"] == [f"needs network: {CLOUD_URL}"]
    assert rows["tabs-metric"]["reasons"][0].startswith("metric not implemented: is_expected_tabs (")  # and why
    assert "getter not implemented: open_tabs_info" in rows["tabs-metric"]["reasons"]
    assert rows["broken"]["status"] == "schema error"
    assert rows["broken"]["reasons"] == [
        "task 'broken': config[0].parameters.window_name: 'activate_window' needs parameter 'window_name'"
    ]
    assert rows["truncated"]["status"] == "schema error" and "not valid JSON" in rows["truncated"]["reasons"][0]
    assert {row["domain"] for row in rows.values()} == {"os", "chrome", "calc"}
    # the table: a row per file, then per-domain counts and the tasks per reason
    assert re.search(r"^chrome/broken\.json +schema error +task 'broken': config\[0\]", out, re.M)
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    # domain, files, parsed, runnable, flagged untouched, not runnable, schema errors
    assert lines["calc"][:7] == ["calc", "2", "2", "0", "0", "2", "0"]
    assert lines["chrome"][:7] == ["chrome", "2", "1", "0", "0", "1", "1"]
    assert lines["os"][:7] == ["os", "3", "2", "1", "0", "1", "1"]
    assert lines["(all)"][:7] == ["(all)", "7", "5", "1", "0", "4", "2"]
    assert "needs network: huggingface.co" in out and "needs app: thunderbird" in out and "schema error  " in out


def test_a_web_page_the_task_names_needs_the_network(examples):
    """A page the instruction names, or a rule's expected URL, is a network need (the agent
    would have to reach it); loopback pages are not."""
    (examples / "os" / "stream.json").write_text(
        json.dumps(
            {
                **task("stream"),
                "instruction": "Play https://video.example.com/watch?v=1 and open http://127.0.0.1:8000/local",
                "evaluator": {
                    "func": "exact_match",
                    "result": {"type": "vm_command_line", "command": ["cat", "/a"]},
                    "expected": {
                        "type": "rule",
                        "rules": {"type": "url", "url": "https://video.example.com/watch?v=1"},
                    },
                },
            }
        )
    )
    rows = rows_by_id(tasks_cli.classify(examples, {"xterm", "sleep"}))
    assert rows["stream"]["reasons"] == ["needs network: https://video.example.com/watch?v=1"]


def test_a_task_the_untouched_record_flags_is_not_runnable(examples):
    """`untouched` records each runnable task judged with nothing done (by file digest and
    image); check then counts a task its setup alone passes as flagged, with its score."""
    from cua_jax.eval.untouched import UntouchedRecord

    record = UntouchedRecord(examples)
    result = {"id": "runnable", "status": "success", "reward": 1.0, "reason": None, "start_s": 1.0, "judge_s": 0.1}
    record.put(examples / "os" / "runnable.json", result, "cua-jax/desktop:abc")
    reread = UntouchedRecord(examples)
    rows = rows_by_id(tasks_cli.classify(examples, {"xterm", "sleep"}, "cua-jax/desktop:abc", untouched=reread))
    assert rows["runnable"]["status"] == "trivially satisfied"
    assert rows["runnable"]["reasons"] == ["trivially satisfied: scores 1 untouched (its setup alone passes the judge)"]
    # Another image's record, or an edited task, is checked again: runnable until then.
    rows = rows_by_id(tasks_cli.classify(examples, {"xterm", "sleep"}, "cua-jax/desktop:new", untouched=reread))
    assert rows["runnable"]["status"] == "runnable"
    edited = examples / "os" / "runnable.json"
    edited.write_text(edited.read_text().replace('"x"', '"y"'))
    rows = rows_by_id(tasks_cli.classify(examples, {"xterm", "sleep"}, "cua-jax/desktop:abc", untouched=reread))
    assert rows["runnable"]["status"] == "runnable"


def test_a_download_mirror_makes_cloud_files_local(examples, tmp_path):
    mirror = tmp_path / "mirror"
    local = mirror / "huggingface.co" / CLOUD_URL.split("huggingface.co/", 1)[1]
    local.parent.mkdir(parents=True)
    local.write_text("a,b\n")
    rows = rows_by_id(tasks_cli.classify(examples, {"xterm", "sleep"}, mirror=str(mirror)))
    assert rows["cloud"]["status"] == "runnable"


def test_the_entry_point_runs_and_refuses_a_missing_folder(examples, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "experiments.tasks", "check", str(examples), "--apps", "none", "--summary"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "needs app: xterm" in done.stdout and "TASK FILE" not in done.stdout  # --summary: the tables only
    missing = subprocess.run(
        [sys.executable, "-m", "experiments.tasks", "check", str(tmp_path / "nowhere"), "--apps", "none"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.docker
def test_check_probes_the_image(examples, capsys):
    assert tasks_cli.main(["check", str(examples), "--image", "desktop"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("os/")}
    assert "runnable" in rows["os/runnable.json"] and "not runnable" not in rows["os/runnable.json"]  # xterm is there
    assert "needs app: thunderbird" in rows["os/mail.json"]
    # OSWorld's "os" snapshot starts on the osworld image, which the desktop image is not built from.
    (examples / "os" / "runnable.json").write_text(
        (examples / "os" / "runnable.json").read_text().replace('"snapshot": "desktop"', '"snapshot": "os"')
    )
    assert tasks_cli.main(["check", str(examples), "--image", "desktop"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("os/runnable.json"))
    assert "not runnable  needs image: osworld (snapshot 'os'; desktop is not built from it)" in line
