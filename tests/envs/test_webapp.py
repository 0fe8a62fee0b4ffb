"""Web application capsules over one shared Trac server (`cua_jax.envs.webapp`): scripted
solutions and near-misses judged on the database, isolation between capsules and generations,
fork mid-episode, a killed server, and a page that tries to reach another capsule's site."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.webapp import judges, script
from cua_jax.envs.webapp.branches import overlay_mounts
from cua_jax.envs.webapp.runtime import WebappRuntime
from cua_jax.envs.webapp.state import ensure_base_state
from cua_jax.envs.webapp.tasks import TaskFileError, load_tasks, parse_task
from cua_jax.types import EpisodeStatus, FaultKind

pytestmark = pytest.mark.browser

SUITE = "cua_jax/tasks/suites/webapp/trac"
# A sample of the suite: a status change, a question, a comment, a wiki edit (the validation
# command, `python -m cua_jax.envs.webapp.script`, plays them all).
SAMPLE = ("trac-001", "trac-002", "trac-010", "trac-030")
TICKET = 19  # the ticket trac-001's start page shows


# A comment on the ticket the page shows, through its form, as an agent leaves one.
def _comment(runtime, env: str, text: str) -> None:
    steps = ({"click": "a[href='#modify']"}, {"fill": "#comment", "text": text}, {"click": "input[name=submit]"})
    script.play(runtime, env, steps)


@pytest.fixture(scope="module")
def tasks():
    return {task.task_id: task for task in load_tasks(SUITE)}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    with WebappRuntime(
        ensure_base_state("test"), tmp_path_factory.mktemp("webapp"), viewport=(800, 600), action_space="elements"
    ) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def overlay_runtime(tmp_path_factory):
    """Branches as overlay mounts (on CI's ext4 a copy-up is a full copy; on XFS, a clone)."""
    workdir = tmp_path_factory.mktemp("webapp-overlay")
    why = overlay_mounts(workdir)
    if why is not None:
        pytest.skip(f"no overlay branches here: {why}")
    with WebappRuntime(
        ensure_base_state("test"), workdir, viewport=(800, 600), action_space="elements", branch_by="overlay"
    ) as runtime:
        yield runtime


@pytest.fixture(params=["auto", "overlay"])
def any_runtime(request):
    """The runtime by the method its workdir picks, and by overlay branches."""
    return request.getfixturevalue("runtime" if request.param == "auto" else "overlay_runtime")


def _comments(database, ticket: int) -> list[str]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT newvalue FROM ticket_change WHERE ticket=? AND field='comment'", (ticket,))
        return [row[0] for row in rows]


def test_the_suite_parses_and_a_bad_task_file_names_its_field(tasks):
    assert len(tasks) >= 40
    with pytest.raises(TaskFileError, match="t.json: the task has no 'intent' field"):
        parse_task({"task_id": "x", "start_url": "/", "eval": {"eval_types": ["db_diff"]}}, "t.json")
    with pytest.raises(TaskFileError, match="unknown"):
        parse_task({"task_id": "x", "intent": "i", "start_url": "/", "eval": {"eval_types": ["llm"]}}, "t.json")


@pytest.mark.parametrize("task_id", SAMPLE)
def test_a_solution_scores_1_and_a_near_miss_and_nothing_score_0(runtime, tasks, task_id):
    scores, solutions = script.validate(runtime, [tasks[task_id]])
    assert scores[task_id] == {"solution": 1.0, "near_miss": 0.0, "nothing": 0.0}
    # The committed validation file's recorded solution is the one played now (the oracle replays it).
    assert tuple(solutions[task_id]) == script.demonstrations(SUITE)[task_id]


def test_pages_show_marked_elements_that_element_actions_reach(runtime, tasks):
    env = runtime.create(tasks["trac-001"])
    try:
        observation = runtime.observe(env)
        assert observation.screenshot.shape == (600, 800, 3) and observation.url == tasks["trac-001"].start_url
        links = [e for e in observation.dom if e.tag == "A" and e.text]
        assert links and all(e.ref > 0 for e in observation.dom)
        step = runtime.step(env, A.ClickElement(10_000))
        assert "does not exist" in step.invalid_action and not step.done
        step = runtime.step(env, A.FillElement(links[0].ref, "text"))
        assert "cannot be filled" in step.invalid_action
    finally:
        runtime.close(env)


def test_concurrent_writes_stay_in_their_capsule_and_generation(runtime, tasks):
    task = tasks["trac-001"]
    envs = [runtime.create(task), runtime.create(task)]
    try:
        base_comments = _comments(runtime.database(envs[0]), TICKET)
        errors: list[BaseException] = []

        def write(env: str, n: int) -> None:
            try:
                for i in range(n):
                    _comment(runtime, env, f"from {env} #{i}")
            except Exception as error:  # noqa: BLE001 - the main thread asserts there was none
                errors.append(error)

        writers = [threading.Thread(target=write, args=(env, 2)) for env in envs]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        assert not errors
        for env in envs:
            new = _comments(runtime.database(env), TICKET)[len(base_comments) :]
            assert new == [f"from {env} #{i}" for i in range(2)]  # its own, in order, and no other's
        old_database = runtime.database(envs[0])
        runtime.reset(envs[0])  # a new generation: the base state again
        assert runtime.database(envs[0]) != old_database and not old_database.exists()
        assert _comments(runtime.database(envs[0]), TICKET) == base_comments
        assert len(_comments(runtime.database(envs[1]), TICKET)) == len(base_comments) + 2
    finally:
        for env in envs:
            runtime.close(env)


def test_trials_of_concurrent_writes_never_cross_capsules_or_generations(any_runtime):
    from experiments.benchmarks.webapp_isolation import run_trials

    result = run_trials(any_runtime, capsules=3, trials=6, reset_every=2)
    assert result["writes"] == 18 and result["refused"] == 0 and result["resets"] == 3
    assert result["crossings"] == 0


def test_a_fork_mid_episode_carries_the_database_exactly_and_diverges_after(any_runtime, tasks):
    runtime = any_runtime
    parent = runtime.create(tasks["trac-001"])
    try:
        _comment(runtime, parent, "before the fork")
        child = runtime.fork(parent)
        try:
            assert judges.diff_databases(str(runtime.database(parent)), str(runtime.database(child))) == []
            assert runtime.observe(child).url == runtime.observe(parent).url
            _comment(runtime, child, "after, in the child")
            assert _comments(runtime.database(parent), TICKET)[-1] == "before the fork"
            assert _comments(runtime.database(child), TICKET)[-1] == "after, in the child"
            snapshot = runtime.snapshot(child)
            runtime.restore(parent, snapshot)
            assert _comments(runtime.database(parent), TICKET)[-1] == "after, in the child"
        finally:
            runtime.close(child)
    finally:
        runtime.close(parent)


def test_a_page_cannot_reach_another_capsules_site(runtime, tasks):
    envs = [runtime.create(tasks["trac-001"]), runtime.create(tasks["trac-001"])]
    try:
        other_site = f"http://{envs[1]}.test:{runtime.server.port}/ticket/5"
        status = runtime.evaluate(
            envs[0], "(url) => fetch(url, {mode: 'no-cors'}).then(r => r.status, e => -1)", other_site
        )
        assert status in (0, -1, 403)  # refused by the server (an opaque no-cors answer reads 0)
        before = runtime.server.control_blocking("stats")["refused"]
        runtime.evaluate(envs[0], "(url) => { const i = new Image(); i.src = url; }", other_site)
        deadline = time.monotonic() + 10
        while runtime.server.control_blocking("stats")["refused"] == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert runtime.server.control_blocking("stats")["refused"] > before
    finally:
        for env in envs:
            runtime.close(env)


def test_a_killed_server_quarantines_its_capsules_and_comes_back(runtime, tasks):
    env = runtime.create(tasks["trac-001"])
    try:
        starts = runtime.server.starts
        os.kill(runtime.server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while runtime.server.starts == starts and time.monotonic() < deadline:
            time.sleep(0.1)
        step = runtime.step(env, A.Done())
        assert step.status is EpisodeStatus.QUARANTINED
        assert step.fault.kind is FaultKind.APP_SERVER_CRASHED and "killed by signal 9" in step.fault.reason
        assert runtime.server.alive() and runtime.server_crashes
        observation = runtime.reset(env)  # a fresh generation on the restarted server
        assert observation.url == tasks["trac-001"].start_url and runtime.quarantine_reason(env) is None
    finally:
        runtime.close(env)


def test_a_workdir_too_long_for_the_servers_socket_is_refused_by_name(tmp_path):
    from cua_jax.envs.webapp.server import AppServer

    with pytest.raises(ValueError, match="over AF_UNIX's 107: choose a shorter workdir"):
        AppServer(tmp_path / ("w" * 120))
