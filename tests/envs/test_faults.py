"""Fault attribution (CANOPY App. G): who ended the episode decides its status."""

import pytest

from cua_jax.envs.faults import Attribution, Fault, FaultKind, container_fault, episode_outcome
from cua_jax.types import EpisodeStatus


def test_infrastructure_faults_quarantine_whatever_the_verdict():
    fault = Fault(FaultKind.SERVER_UNRESPONSIVE, "no answer in 20s")
    outcome = episode_outcome(fault=fault, verdict=1.0)
    assert outcome.status is EpisodeStatus.QUARANTINED
    assert outcome.reason == "server unresponsive: no answer in 20s"


def test_oom_kill_quarantines_unless_configured_as_the_agents_fault():
    fault = Fault(FaultKind.OOM_KILLED, "exit status 137")
    assert episode_outcome(fault=fault).status is EpisodeStatus.QUARANTINED
    agent_rule = Attribution(oom_is_agent_fault=True)
    assert episode_outcome(fault=fault, rule=agent_rule).status is EpisodeStatus.FAILURE


def test_verdicts_budget_and_agent_failures():
    assert episode_outcome(verdict=1.0).status is EpisodeStatus.SUCCESS
    assert episode_outcome(verdict=0.5).reward == 0.5
    assert episode_outcome(verdict=0.0).status is EpisodeStatus.FAILURE
    assert episode_outcome(agent_failure="declared FAIL", verdict=1.0).status is EpisodeStatus.FAILURE
    no_verdict = episode_outcome(budget_exhausted=True, rule=Attribution(no_verdict_reward=-0.2))
    assert (no_verdict.status, no_verdict.reward) == (EpisodeStatus.NO_VERDICT, -0.2)
    with pytest.raises(ValueError, match="needs a fault"):
        episode_outcome()
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        episode_outcome(verdict=2.0)


@pytest.mark.parametrize(
    "state, kind",
    [
        (None, FaultKind.CONTAINER_EXITED),
        ({"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True}, FaultKind.OOM_KILLED),
        ({"Running": False, "Status": "exited", "ExitCode": 1, "OOMKilled": False}, FaultKind.CONTAINER_EXITED),
        ({"Running": True, "Status": "running", "ExitCode": 0, "OOMKilled": False}, None),
    ],
)
def test_container_state_faults(state, kind):
    fault = container_fault(state)
    assert (fault.kind if fault else None) is kind
