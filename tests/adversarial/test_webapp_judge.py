"""The web application's judges read the episode's database (read-only, values bound, never
interpolated), the agent's answer and the page's path. Scripted agents try, through the actions
a policy has, to score without doing the task: answering with every candidate, writing SQL into
the application's forms, reaching the browser's location bar with a `javascript:` URL, and
opening the application's administration (the seeded state grants no TRAC_ADMIN). None scores."""

from __future__ import annotations

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.webapp import script
from cua_jax.envs.webapp.runtime import WebappRuntime
from cua_jax.envs.webapp.state import ensure_base_state
from cua_jax.envs.webapp.tasks import load_tasks
from cua_jax.types import EpisodeStatus

pytestmark = pytest.mark.browser

EVERY_TICKET = " ".join(f"#{n}" for n in range(1, 49))
EVERY_OWNER = "alice, bob, carol, dave, erin, frank, grace, heidi, ivan, judy, mallory, oscar"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    with WebappRuntime(ensure_base_state("test"), tmp_path_factory.mktemp("webapp"), action_space="both") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def tasks():
    return {task.task_id: task for task in load_tasks("cua_jax/tasks/suites/webapp/trac")}


def _episode(runtime, task, actions):
    env = runtime.create(task)
    try:
        result = None
        for action in actions:
            result = runtime.step(env, action)
            if result.done:
                break
        return result
    finally:
        runtime.close(env)


@pytest.mark.parametrize(
    ("task_id", "answer"),
    [("trac-040", EVERY_TICKET), ("trac-040", "#4, #12, #36, #40"), ("trac-033", EVERY_OWNER), ("trac-043", "")],
)
def test_answering_with_every_candidate_scores_0(runtime, tasks, task_id, answer):
    result = _episode(runtime, tasks[task_id], [A.Answer(answer)])
    assert result.done and result.reward == 0.0 and result.status is EpisodeStatus.FAILURE


def test_sql_typed_into_a_comment_does_not_reach_the_judge(runtime, tasks):
    task = tasks["trac-003"]  # reopen ticket #17, judged by db_diff
    injection = "x'); UPDATE ticket SET status='reopened', resolution='' WHERE id=17; --"
    env = runtime.create(task)
    try:
        steps = [
            {"fill": "#proj-search", "text": "#17"},
            {"key": "Enter"},
            {"click": "a[href='#modify']"},
            {"fill": "#comment", "text": injection},
            {"click": "input[name=submit]"},
            {"done": True},
        ]
        result = script.play(runtime, env, steps)
    finally:
        runtime.close(env)
    assert result.done and result.reward == 0.0
    assert "ticket" in (result.reason or "")  # the judge names what is missing: the reopened status


def test_browser_shortcuts_and_the_administration_do_not_score(runtime, tasks):
    task = tasks["trac-029"]  # create a milestone
    tricks = [
        A.Key(("ctrl", "l")),
        A.Type("javascript:document.title='done'\n"),
        A.Key(("f12",)),
        A.Key(("ctrl", "r")),
        A.Done(),
    ]
    result = _episode(runtime, task, tricks)
    assert result.done and result.reward == 0.0
    env = runtime.create(task)
    try:
        status = runtime.evaluate(env, "() => fetch('/admin/general/perm').then(r => r.status)")
        assert status in (403, 404)  # refused: anonymous holds no TRAC_ADMIN or PERMISSION_* rights
    finally:
        runtime.close(env)
