"""Capsules that share renderer processes (cells), warm pages and fork by captured state, on a
real Chromium: storage isolation by site, a renderer crash's blast radius, warm-page resets."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime, SharedBrowserBackend
from cua_jax.envs.faults import FaultKind
from cua_jax.envs.miniwob_oracle import oracle_action
from cua_jax.types import EpisodeStatus
from tests.support.capsules import NOTHING, READ_EVERYTHING, WRITE_EVERYTHING

pytestmark = [pytest.mark.browser]

CELLS = 2


@pytest.fixture(scope="module")
def runtime():
    rt = CapsuleRuntime(SharedBrowserBackend(renderers=CELLS), warm_pages=2, call_timeout_s=600)
    yield rt
    rt.shutdown()


def test_capsules_sharing_a_renderer_share_no_storage(runtime):
    # Pages (warm ones too) go to the cell with the fewest: six capsules fill both cells.
    envs = [runtime.create("click-button", seed=i) for i in range(6)]
    try:
        writer = envs[0]
        same_cell = next(e for e in envs[1:] if runtime.cell_of(e) == runtime.cell_of(writer))
        other_cell = next(e for e in envs if runtime.cell_of(e) != runtime.cell_of(writer))
        runtime.evaluate(writer, WRITE_EVERYTHING, writer)
        # The writer sees its own data; the parent-domain cookies were refused.
        assert runtime.evaluate(writer, READ_EVERYTHING) == [1, 1, f"owner={writer}", ["capsule-store"]]
        for reader in (same_cell, other_cell):
            assert runtime.evaluate(reader, READ_EVERYTHING) == NOTHING, reader
        # A reset is a new generation on a new site: nothing of the previous one carries over.
        runtime.reset(writer, seed=5)
        assert runtime.evaluate(writer, READ_EVERYTHING) == NOTHING
    finally:
        for e in envs:
            runtime.close(e)


def test_warm_pages_begin_episodes_on_loaded_pages_with_the_same_observations(runtime):
    env = runtime.create("click-checkboxes", seed=3)
    try:
        first = runtime.observe(env)
        deadline = time.monotonic() + 60
        while len(runtime._warm.get("click-checkboxes", [])) < runtime.warm_pages and time.monotonic() < deadline:
            time.sleep(0.1)
        warm_before = runtime.warm_builds
        again = runtime.reset(env, seed=3)
        assert runtime.warm_builds == warm_before + 1, "the reset did not take a warm page"
        assert again.same_as(first)
        # The warm page plays the episode exactly as a freshly loaded one.
        obs = again
        while not (result := runtime.step(env, oracle_action(obs))).done:
            obs = result.observation
        assert result.success
    finally:
        runtime.close(env)


def test_fork_by_capture_where_exact_and_by_replay_with_a_reason_elsewhere(runtime):
    env = runtime.create("enter-text", seed=5)  # two oracle steps: the field clicked, the text typed
    button = runtime.create("click-button-sequence", seed=2)
    try:
        obs = runtime.observe(env)
        for _ in range(2):
            obs = runtime.step(env, oracle_action(obs)).observation
        before = runtime.fork_methods["capture"]
        twin = runtime.fork(env)
        assert runtime.fork_methods["capture"] == before + 1
        assert runtime.observe(twin).same_as(runtime.observe(env))
        action = oracle_action(runtime.observe(env))
        a, b = runtime.step(env, action), runtime.step(twin, action)
        assert (a.done, a.reward, a.status) == (b.done, b.reward, b.status) and a.observation.same_as(b.observation)

        # A task whose own click handler ran keeps state in closures: its fork replays.
        result = runtime.step(button, oracle_action(runtime.observe(button)))
        assert not result.done
        snapshot = runtime.snapshot(button)
        assert snapshot.page_state is None and snapshot.replay_reason
        replayed = runtime.fork(snapshot)
        assert runtime.fork_methods[f"replay: {snapshot.replay_reason}"] >= 1
        assert runtime.observe(replayed).same_as(result.observation)
        for e in (twin, replayed):
            runtime.close(e)
    finally:
        runtime.close(env)
        runtime.close(button)


def test_a_renderer_crash_quarantines_exactly_the_capsules_of_its_cell():
    """Kill renderer processes one at a time until one that hosts capsules dies: exactly the
    capsules of one cell end (their steps say the renderer crashed), the others play on, the
    browser is not relaunched, and a reset brings a quarantined capsule back."""
    with CapsuleRuntime(SharedBrowserBackend(renderers=3), call_timeout_s=600) as rt:
        envs = [rt.create("click-checkboxes", seed=i) for i in range(6)]
        cells = {e: rt.cell_of(e) for e in envs}
        assert sorted(cells.values()) == [0, 0, 1, 1, 2, 2]
        quarantined: list[str] = []
        for pid in rt.backend.renderer_pids():
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not (quarantined := [e for e in envs if rt.quarantine_reason(e)]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if quarantined:
                break
        assert quarantined, "no renderer hosted a capsule"
        crashed_cell = cells[quarantined[0]]
        cell_envs = [e for e in envs if cells[e] == crashed_cell]
        # Each page of the dead renderer reports its own crash: wait for the cell's last report,
        # then for a stray report from another cell, before judging the blast radius.
        deadline = time.monotonic() + 10
        while set(quarantined) != set(cell_envs) and time.monotonic() < deadline:
            time.sleep(0.1)
            quarantined = [e for e in envs if rt.quarantine_reason(e)]
        time.sleep(0.5)
        quarantined = [e for e in envs if rt.quarantine_reason(e)]
        assert quarantined == cell_envs  # blast radius: one cell
        for e in envs:
            result = rt.step(e, A.Click("left_click", 900, 40))  # on the task's instructions: harmless
            if e in quarantined:
                assert result.status is EpisodeStatus.QUARANTINED
                assert result.fault.kind is FaultKind.RENDERER_CRASHED and e in result.quarantine_reason
            else:
                assert result.status is None and result.observation is not None, (e, result.quarantine_reason)
        assert rt.backend.restarts == 0 and len(rt.renderer_crashes) == len(quarantined)
        back = rt.reset(quarantined[0], seed=1)
        assert rt.quarantine_reason(quarantined[0]) is None
        assert rt.step(quarantined[0], oracle_action(back)).status is not EpisodeStatus.QUARANTINED
