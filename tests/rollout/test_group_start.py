"""A group's start (AgentConfig.group_start): "fresh" resets every environment, "shared" resets
one and starts the others from its `shared_state()`; a fault of the first start leaves the
others to reset on their own. And who owns a fault a step reports (AgentConfig.agent_faults)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cua_jax.context.segment import make_segmenter
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvironmentFault, EnvObservation, EnvReset, EnvTransition
from cua_jax.envs.faults import Fault, FaultKind, episode_outcome
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop
from cua_jax.rollout.engine import EngineHealth, FinishReason, Generation, RolloutEngine
from cua_jax.types import EpisodeStatus


class DoneEngine(RolloutEngine):
    """Replies `done` to every request."""

    def __init__(self, tokenizer, end_of_turn_id):
        self.ids = np.asarray(
            [*tokenizer.encode(A.render_action(A.Done()), add_special_tokens=False), end_of_turn_id], np.int32
        )

    def generate(self, requests, sampling):
        return [Generation(self.ids, np.zeros(len(self.ids), np.float32), FinishReason.STOP, 0) for _ in requests]

    def update_weights(self, params, version):
        pass

    def health(self):
        return EngineHealth(True, 0)


class CountingEnv(AgentEnvironment):
    """Each fresh reset draws a new screen (so fresh starts differ); reset_to shows the shared one."""

    draws = iter(range(1, 10**6))

    def __init__(self, fail_reset: bool = False):
        self.calls: list[str] = []
        self.fail_reset = fail_reset
        self.screen = None

    async def _reset(self, task, seed):
        self.calls.append("reset")
        if self.fail_reset:
            raise EnvironmentFault(Fault(FaultKind.SETUP_FAILED, "setup step 0 failed"))
        self.screen = np.full((32, 32, 3), next(self.draws), np.uint8)
        return EnvReset("click it", EnvObservation((self.screen,)))

    async def _shared_state(self):
        self.calls.append("shared_state")
        return self.screen

    async def _reset_to(self, task, seed, state):
        self.calls.append("reset_to")
        self.screen = state
        return EnvReset("click it", EnvObservation((state,)))

    async def _step(self, action):
        return EnvTransition(None, 1.0, episode_outcome(verdict=1.0))

    async def end_episode(self):
        self.calls.append("end_episode")


@pytest.mark.parametrize("group_start", ["fresh", "shared"])
def test_shared_start_resets_one_environment_and_starts_the_others_from_it(renderer, group_start):
    loop = AgentLoop(
        DoneEngine(renderer.tokenizer, renderer.end_of_turn_id),
        make_segmenter("whole_trajectory", renderer),
        AgentConfig(max_turns=2, max_context_tokens=2048, group_start=group_start),
    )
    envs = [CountingEnv() for _ in range(4)]
    rollouts = asyncio.run(loop.run_group(envs, "task", seed=7))
    firsts = [r.episode.turns[0].images[0] for r in rollouts]
    assert [r.episode.status for r in rollouts] == [EpisodeStatus.SUCCESS] * 4
    if group_start == "shared":
        assert envs[0].calls == ["reset", "shared_state", "end_episode"]
        assert all(env.calls == ["reset_to", "end_episode"] for env in envs[1:])
        assert all(np.array_equal(first, firsts[0]) for first in firsts)
    else:
        assert all(env.calls == ["reset", "end_episode"] for env in envs)
        assert len({int(first[0, 0, 0]) for first in firsts}) == 4


def test_a_failed_first_start_quarantines_its_episode_and_the_others_reset_on_their_own(renderer):
    loop = AgentLoop(
        DoneEngine(renderer.tokenizer, renderer.end_of_turn_id),
        make_segmenter("whole_trajectory", renderer),
        AgentConfig(max_turns=2, max_context_tokens=2048, group_start="shared"),
    )
    envs = [CountingEnv(fail_reset=True)] + [CountingEnv() for _ in range(2)]
    rollouts = asyncio.run(loop.run_group(envs, "task", seed=7))
    assert rollouts[0].episode.status is EpisodeStatus.QUARANTINED
    assert rollouts[0].episode.quarantine_reason.startswith(FaultKind.SETUP_FAILED.value)
    assert [r.episode.status for r in rollouts[1:]] == [EpisodeStatus.SUCCESS] * 2
    assert all(env.calls == ["reset", "end_episode"] for env in envs)


def test_group_start_is_checked():
    with pytest.raises(ValueError, match="group_start 'forked' is unknown"):
        AgentConfig(group_start="forked")


class FaultingStepEnv(CountingEnv):
    """Its first step ends the episode with `kind`, as an environment reports a fault."""

    def __init__(self, kind: FaultKind):
        super().__init__()
        self.kind = kind

    async def _step(self, action):
        fault = Fault(self.kind, "caused by the step")
        return EnvTransition(None, 0.0, episode_outcome(fault=fault), fault=fault)


@pytest.mark.parametrize(
    "agent_faults, status",
    [
        ((), EpisodeStatus.QUARANTINED),
        (("process limit reached",), EpisodeStatus.FAILURE),
        ((FaultKind.OOM_KILLED,), EpisodeStatus.QUARANTINED),
    ],
)
def test_the_loop_scores_a_step_fault_by_who_owns_it(renderer, agent_faults, status):
    loop = AgentLoop(
        DoneEngine(renderer.tokenizer, renderer.end_of_turn_id),
        make_segmenter("whole_trajectory", renderer),
        AgentConfig(max_turns=2, max_context_tokens=2048, agent_faults=agent_faults),
    )
    (rollout,) = asyncio.run(loop.run_group([FaultingStepEnv(FaultKind.PROCESS_LIMIT)], "task", seed=7))
    episode = rollout.episode
    assert episode.status is status and episode.reward == 0.0
    reason = episode.quarantine_reason if status is EpisodeStatus.QUARANTINED else episode.info["end_reason"]
    assert reason == "process limit reached: caused by the step"


def test_agent_faults_are_checked():
    with pytest.raises(ValueError, match="agent_faults \\['OOM'\\] are no fault kinds"):
        AgentConfig(agent_faults=("OOM",))


class WaitEngine(DoneEngine):
    """Replies `wait` to every request: the episode never ends on its own."""

    def __init__(self, tokenizer, end_of_turn_id):
        text = A.render_action(A.Wait(0.1))
        self.ids = np.asarray([*tokenizer.encode(text, add_special_tokens=False), end_of_turn_id], np.int32)


class JudgeableEnv(CountingEnv):
    """Steps never end the episode; judging the state it reached gives `verdict`."""

    def __init__(self, verdict: float | None):
        super().__init__()
        self.verdict = verdict

    async def _step(self, action):
        return EnvTransition(EnvObservation((self.screen,)))

    async def judge_current(self):
        self.calls.append("judge_current")
        return None if self.verdict is None else episode_outcome(verdict=self.verdict)


@pytest.mark.parametrize("judge_at_budget", [False, True])
def test_an_episode_out_of_turns_is_judged_where_the_config_and_environment_allow(renderer, judge_at_budget):
    """AgentConfig.judge_at_budget (OSWorld scores its step limit): the episode that ran out of
    turns takes the environment's verdict on the state it reached; an environment that cannot
    judge an unfinished episode (None), or the flag off, leaves it NO_VERDICT."""
    loop = AgentLoop(
        WaitEngine(renderer.tokenizer, renderer.end_of_turn_id),
        make_segmenter("whole_trajectory", renderer),
        AgentConfig(max_turns=2, max_context_tokens=2048, judge_at_budget=judge_at_budget),
    )
    envs = [JudgeableEnv(1.0), JudgeableEnv(0.0), JudgeableEnv(None)]
    rollouts = [asyncio.run(loop.run_group([env], "task", seed=7))[0] for env in envs]
    assert all(r.episode.num_turns == 2 and r.episode.info["budget"] == "turns" for r in rollouts)
    if judge_at_budget:
        assert [r.episode.status for r in rollouts] == [
            EpisodeStatus.SUCCESS,
            EpisodeStatus.FAILURE,
            EpisodeStatus.NO_VERDICT,
        ]
        assert [r.episode.info.get("judged_at_budget") for r in rollouts] == [True, True, None]
        assert all(env.calls == ["reset", "judge_current", "end_episode"] for env in envs)
    else:
        assert [r.episode.status for r in rollouts] == [EpisodeStatus.NO_VERDICT] * 3
        assert all(env.calls == ["reset", "end_episode"] for env in envs)
