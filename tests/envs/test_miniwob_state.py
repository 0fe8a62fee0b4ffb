"""Forks by captured page state on real Chromium: a restored page looks and pays as its source."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import (
    CHROMIUM_ARGS,
    CHROMIUM_EXECUTABLE,
    VIEWPORT,
    MiniWoBPage,
    MiniWoBServer,
    click_point,
)
from cua_jax.envs.miniwob_oracle import oracle_action
from cua_jax.envs.miniwob_state import (
    PageState,
    StateRestoreMismatch,
    capture_state,
    install_state_recorder,
    restore_state,
)

pytestmark = [pytest.mark.browser]

# Generous: MiniWoB's 10 s limits are wall-clock time, and this machine may be busy.
TIME_LIMIT_MS = 60_000
MAX_STEPS = 15


@pytest.fixture(scope="module")
def server():
    s = MiniWoBServer()
    yield s
    s.close()


@dataclasses.dataclass
class Chromium:
    """A headless Chromium and the event loop it lives on."""

    browser: Any
    loop: asyncio.AbstractEventLoop

    def run(self, test: Callable[[Any], Awaitable[None]]) -> None:
        """Run `test(browser)`, then close the pages it opened."""

        async def run_and_close():
            try:
                await test(self.browser)
            finally:
                for context in self.browser.contexts:
                    await context.close()

        self.loop.run_until_complete(run_and_close())


@pytest.fixture(scope="module")
def chromium():
    from playwright.async_api import async_playwright

    loop = asyncio.new_event_loop()
    playwright = loop.run_until_complete(async_playwright().start())
    browser = loop.run_until_complete(
        playwright.chromium.launch(executable_path=CHROMIUM_EXECUTABLE, headless=True, args=list(CHROMIUM_ARGS))
    )
    yield Chromium(browser, loop)
    loop.run_until_complete(browser.close())
    loop.run_until_complete(playwright.stop())
    loop.close()


async def open_task(browser, server: MiniWoBServer, task: str, recorder: bool = True) -> MiniWoBPage:
    context = await browser.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    if recorder:
        await install_state_recorder(page)
    miniwob_page = MiniWoBPage(page, task)
    await miniwob_page.load(server.task_url(task))
    return miniwob_page


async def oracle_prefix(page: MiniWoBPage, steps: int):
    observation = await page.observe()
    for _ in range(steps):
        await page.perform(oracle_action(observation))
        observation, state = await page.observe_with_state()
        assert not state.done, "the prefix must leave the episode running"
    return observation


async def fork_by_state(source: MiniWoBPage, target: MiniWoBPage, seed: int) -> PageState:
    state = await capture_state(source.page)
    assert isinstance(state, PageState), state
    await target.begin_episode(seed, TIME_LIMIT_MS)
    await restore_state(target.page, state)
    await target.set_elapsed_ms(await source.elapsed_ms())
    return state


async def finish_alike(source: MiniWoBPage, fork: MiniWoBPage, next_action=oracle_action):
    """Observations equal now and after each same next action; the same reward at the end."""
    for _ in range(MAX_STEPS):
        (a, a_state), (b, b_state) = await source.observe_with_state(), await fork.observe_with_state()
        assert b.same_as(a)
        assert (b_state.done, b_state.raw_reward, b_state.reason) == (a_state.done, a_state.raw_reward, a_state.reason)
        if a_state.done:
            return a_state
        action = next_action(a)
        await source.perform(action)
        await fork.perform(action)
    raise AssertionError(f"no episode end within {MAX_STEPS} steps")


@pytest.mark.parametrize(
    "task,seed,prefix",
    [("click-checkboxes", 10, 2), ("enter-text", 5, 2), ("enter-text", 6, 1), ("click-option", 3, 1)],
)
def test_restored_page_looks_and_pays_as_its_source(server, chromium, task, seed, prefix):
    async def run(browser):
        source, fork = await open_task(browser, server, task), await open_task(browser, server, task)
        await source.begin_episode(seed, TIME_LIMIT_MS)
        await oracle_prefix(source, prefix)
        state = await fork_by_state(source, fork, seed)
        if task == "enter-text":  # the field is focused; once typed into, it holds the text
            assert state.focus_path is not None and any(f.value for f in state.fields) == (prefix > 1)
        end = await finish_alike(source, fork)
        assert end.success

    chromium.run(run)


def test_select_and_keyboard_focus_are_restored(server, chromium):
    async def run(browser):
        source, fork = await open_task(browser, server, "choose-list"), await open_task(browser, server, "choose-list")
        await source.begin_episode(4, TIME_LIMIT_MS)
        for key in ("tab", "down", "down"):  # focus the select by keyboard, move its choice
            await source.perform(A.Key((key,)))
        state = await fork_by_state(source, fork, 4)
        select = next(f for f in state.fields if f.kind == "SELECT")
        assert select.options_selected.index(True) == 2 and state.focus_visible

        def submit(observation):
            button = next(e for e in observation.dom if e.tag == "BUTTON")
            return A.Click("left_click", *click_point(button))

        end = await finish_alike(source, fork, submit)
        assert end.done

    chromium.run(run)


def test_capture_is_refused_with_the_reason(server, chromium):
    async def run(browser):
        page = await open_task(browser, server, "click-button-sequence")
        await page.begin_episode(1, TIME_LIMIT_MS)
        assert isinstance(await capture_state(page.page), PageState)  # nothing ran yet
        await oracle_prefix(page, 1)  # the first button's handler remembers it was pressed
        reason = await capture_state(page.page)
        assert isinstance(reason, str) and "task code ran: click listener on BUTTON" in reason
        await page.begin_episode(2, TIME_LIMIT_MS)  # a new episode starts a new record
        assert isinstance(await capture_state(page.page), PageState)
        await page.perform(A.Done())
        assert "the episode has ended" in await capture_state(page.page)

        bare = await open_task(browser, server, "click-checkboxes", recorder=False)
        await bare.begin_episode(1, TIME_LIMIT_MS)
        assert "install_state_recorder" in await capture_state(bare.page)

    chromium.run(run)


def test_click_checkboxes_over_seeds(server, chromium):
    async def run(browser):
        # One source page and one fork page over all seeds: pages that ran earlier episodes.
        source = await open_task(browser, server, "click-checkboxes")
        fork = await open_task(browser, server, "click-checkboxes")
        for seed in range(8):
            await source.begin_episode(seed, TIME_LIMIT_MS)
            observation = await source.observe()
            for _ in range(seed % 4):  # prefixes of 0 to 3 checkbox clicks, never the submit
                action = oracle_action(observation)
                submit = next(e for e in observation.dom if e.id == "subbtn")
                if (action.x, action.y) == click_point(submit):
                    break
                await source.perform(action)
                observation = await source.observe()
            await fork_by_state(source, fork, seed)
            assert (await finish_alike(source, fork)).success, seed

    chromium.run(run)


def test_restore_onto_another_page_or_a_tampered_state_is_a_mismatch(server, chromium):
    async def run(browser):
        source, fork = await open_task(browser, server, "enter-text"), await open_task(browser, server, "enter-text")
        await source.begin_episode(5, TIME_LIMIT_MS)
        await oracle_prefix(source, 2)
        state = await capture_state(source.page)
        assert isinstance(state, PageState)
        await fork.begin_episode(5, TIME_LIMIT_MS)
        with pytest.raises(StateRestoreMismatch, match="fingerprint"):
            await restore_state(fork.page, dataclasses.replace(state, fingerprint="0" * 64))
        await fork.begin_episode(6, TIME_LIMIT_MS)  # another seed: another problem
        with pytest.raises(StateRestoreMismatch):
            await restore_state(fork.page, state)
        await fork.begin_episode(5, 20_000)
        with pytest.raises(StateRestoreMismatch, match="time limit"):
            await restore_state(fork.page, state)

    chromium.run(run)
