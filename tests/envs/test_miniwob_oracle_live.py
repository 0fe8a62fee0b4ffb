"""The oracle on real pages: every task it scripts, a few seeds, in both action spaces.

One runtime whose steps accept both kinds of action serves the whole module; episodes run
concurrently. The oracle reads each page as the demonstrator does (the DOM parsed back from
its text; without geometry for the "elements" space). The measured rates over 100 seeds are
in the oracle's docstring (`python -m experiments.benchmarks.oracle_coverage`).
"""

from __future__ import annotations

import pytest

from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS
from experiments.benchmarks.oracle_coverage import run_episodes
from tests.support.miniwob import BASIC_TASKS

pytestmark = [pytest.mark.browser]

SEEDS = (0, 1)
ACTION_SPACES = ("coordinates", "elements")
NEW_TASKS = tuple(task for task in ORACLE_TASKS if task not in BASIC_TASKS)
CONCURRENCY = 8
TIME_LIMIT_S = 60.0


@pytest.fixture(scope="module")
def episodes():
    # A generous time limit: the test is about the oracle's choices, not this machine's speed.
    runtime = CapsuleRuntime(include_dom_text=True, action_space="both", time_limit_s=TIME_LIMIT_S, call_timeout_s=600)
    try:
        jobs = [(task, seed) for task in NEW_TASKS for seed in SEEDS]

        async def run_all():
            out = []
            for space in ACTION_SPACES:
                out += await run_episodes(runtime, jobs, space, CONCURRENCY)
            return out

        yield runtime.run_async(run_all())
    finally:
        runtime.shutdown()


def test_the_oracle_scripts_at_least_twenty_tasks_beyond_the_basic_eight():
    assert set(BASIC_TASKS) <= set(ORACLE_TASKS)
    assert len(NEW_TASKS) >= 20


@pytest.mark.parametrize("action_space", ACTION_SPACES)
def test_the_oracle_solves_every_new_task(episodes, action_space):
    mine = [e for e in episodes if e.action_space == action_space]
    assert {(e.task, e.seed) for e in mine} == {(t, s) for t in NEW_TASKS for s in SEEDS}
    failures = [f"{e.task} seed {e.seed}: {e.reason}" for e in mine if not e.success]
    # click-test-2 / click-button-sequence: where the other button covers the centre of the one
    # to click, click_element lands on the other one (a few seeds in a hundred); allow one in fifty.
    assert len(failures) <= max(1, len(mine) // 50), failures
