"""MiniWoB's reward is read from the page's own globals (WOB_DONE_GLOBAL, WOB_REWARD_GLOBAL),
which only the task's scripts set. Scripted agents try, through the actions a policy has, to
reach those globals or the page around them without doing the task: browser shortcuts
(reload, back, close, the location bar with a `javascript:` URL, developer tools, print),
script typed into the page, pointer actions outside the task, and pressing Enter in the one
task with a form (guess-number). None ends the episode or moves its page: the reward stays the
failure's. A page that does leave its task's document ends the episode PAGE_LEFT_TASK, which
the shipped config scores as the agent's failure (the tasks' pages never navigate by
themselves)."""

import asyncio

import pytest

from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleOptions
from cua_jax.envs.faults import Attribution, FaultKind, episode_outcome
from cua_jax.types import EpisodeStatus
from experiments.configs.base import base_config

RUN_RULE = Attribution(agent_faults=tuple(base_config().advantage.agent_faults))
SCRIPT = "javascript:core.endEpisode(1, true)"

TRICKS = {
    "reload (F5, ctrl+r)": [A.Key(("f5",)), A.Key(("ctrl", "r"))],
    "history back (alt+left)": [A.Key(("alt", "left"))],
    "close the tab (ctrl+w, alt+f4)": [A.Key(("ctrl", "w")), A.Key(("alt", "f4"))],
    "a javascript: URL in the location bar": [A.Key(("ctrl", "l")), A.Type(SCRIPT + "\n")],
    "developer tools and print": [A.Key(("ctrl", "shift", "i")), A.Key(("f12",)), A.Key(("ctrl", "p"))],
    "script typed into the page": [A.Click("left_click", 80, 120), A.Type(SCRIPT + "\n")],
    "pointer outside the task": [A.Click("left_click", 5000, 5000), A.Scroll("down", 50), A.Scroll("up", 50)],
}
TASKS = ("click-button", "enter-text", "text-editor")


@pytest.fixture(scope="module")
def runtime():
    runtime = CapsuleOptions(renderers=2, warm_pages=0).runtime(
        include_dom_text=True, action_space="both", time_limit_s=600
    )
    yield runtime
    runtime.shutdown()


async def episode(runtime, task, actions):
    """Reset `task`, take `actions`; the url at reset, the last transition and the page's
    (url, done, reward) after it."""
    env = MiniWoBEnvironment(runtime, time_limit_s=600)
    try:
        await env.reset(task, 11)
        url = await env._call(runtime.aevaluate(env.env_id, "() => location.href"))
        transition = None
        for action in [*actions, A.Wait(0.3)]:
            transition = await env.step(action)
            if transition.done:
                break
        page = None
        if not transition.done:
            page = await env._call(
                runtime.aevaluate(env.env_id, "() => [location.href, WOB_DONE_GLOBAL, WOB_REWARD_GLOBAL]")
            )
        return url, transition, page
    finally:
        await env.close()


def test_no_action_reaches_the_reward_globals(runtime):
    """Every trick on every task (concurrently, a capsule each), and Enter in guess-number's form."""
    plays = [(task, trick, actions) for task in TASKS for trick, actions in TRICKS.items()]
    plays.append(("guess-number", "Enter in the only form", [A.Click("left_click", 80, 110), A.Type("10\n")]))

    async def all_plays():
        return await asyncio.gather(*(episode(runtime, task, actions) for task, _, actions in plays))

    results = asyncio.run_coroutine_threadsafe(all_plays(), runtime.loop).result(600)
    for (task, trick, _), (url, transition, page) in zip(plays, results):
        assert transition.reward == 0.0 and not transition.done, (task, trick, transition)
        assert page == [url, False, 0], (task, trick, page)  # on its task, still running, unpaid


def test_a_page_that_leaves_its_task_is_the_agents_failure(runtime):
    """A page navigated away from its task's document (forced here: no action of a policy does
    it on these tasks) ends the episode with PAGE_LEFT_TASK, scored as the agent's failure under
    the shipped config, and quarantined under a rule that owns no fault."""

    async def episode():
        env = MiniWoBEnvironment(runtime, time_limit_s=600)
        try:
            await env.reset("click-button", 5)
            await env._call(runtime.aevaluate(env.env_id, "() => { location.href = 'about:blank'; }"))
            await asyncio.sleep(0.5)
            return await env.step(A.Click("left_click", 80, 120))
        finally:
            await env.close()

    transition = asyncio.run_coroutine_threadsafe(episode(), runtime.loop).result(300)
    assert transition.done and transition.fault is not None and transition.fault.kind is FaultKind.PAGE_LEFT_TASK
    assert "about:blank" in transition.fault.detail
    owned = episode_outcome(fault=transition.fault, rule=RUN_RULE)
    assert (owned.status, owned.reward) == (EpisodeStatus.FAILURE, 0.0)
    assert episode_outcome(fault=transition.fault, rule=Attribution()).status is EpisodeStatus.QUARANTINED
