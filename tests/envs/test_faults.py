"""Fault attribution (CANOPY App. G): who ended the episode decides its status."""

import pytest

from cua_jax.envs.faults import Attribution, Fault, FaultKind, container_fault, episode_outcome
from cua_jax.types import EpisodeStatus


def test_infrastructure_faults_quarantine_whatever_the_verdict():
    fault = Fault(FaultKind.SERVER_UNRESPONSIVE, "no answer in 20s")
    outcome = episode_outcome(fault=fault, verdict=1.0)
    assert outcome.status is EpisodeStatus.QUARANTINED
    assert outcome.reason == "server unresponsive: no answer in 20s"


@pytest.mark.parametrize("kind", list(FaultKind))
def test_a_fault_quarantines_unless_the_rule_makes_it_the_agents(kind):
    fault = Fault(kind, "detail")
    assert episode_outcome(fault=fault).status is EpisodeStatus.QUARANTINED
    owned = episode_outcome(fault=fault, rule=Attribution(agent_faults=frozenset({kind.value})))
    assert (owned.status, owned.reward, owned.reason) == (EpisodeStatus.FAILURE, 0.0, fault.reason)
    others = Attribution(agent_faults=frozenset(set(FaultKind) - {kind}))
    assert episode_outcome(fault=fault, rule=others).status is EpisodeStatus.QUARANTINED
    with pytest.raises(ValueError):
        Attribution(agent_faults=frozenset({"a typo"}))


def test_verdicts_budget_and_agent_failures():
    assert episode_outcome(verdict=1.0).status is EpisodeStatus.SUCCESS
    assert episode_outcome(verdict=0.5).reward == 0.5
    assert episode_outcome(verdict=0.0).status is EpisodeStatus.FAILURE
    assert episode_outcome(agent_failure="declared FAIL", verdict=1.0).status is EpisodeStatus.FAILURE
    no_verdict = episode_outcome(budget_exhausted=True, rule=Attribution(no_verdict_reward=-0.2))
    assert (no_verdict.status, no_verdict.reward) == (EpisodeStatus.NO_VERDICT, -0.2)
    with pytest.raises(ValueError, match="needs a fault"):
        episode_outcome()
    # CANOPY's SWE terminal constants: nothing to test scores the rule's constant, below a wrong patch's 0.
    swe = Attribution(no_patch_reward=-0.2, crash_reward=-0.3)
    no_patch = episode_outcome(no_patch="no patch: nothing changed", rule=swe)
    assert (no_patch.status, no_patch.reward, no_patch.reason) == (
        EpisodeStatus.FAILURE,
        -0.2,
        "no patch: nothing changed",
    )
    assert episode_outcome(crash="the tests ran past 60s", verdict=1.0, rule=swe).reward == -0.3
    assert episode_outcome(no_patch="no patch").reward == 0.0  # the default rule: a plain failure
    assert (
        episode_outcome(fault=Fault(FaultKind.OOM_KILLED, "x"), no_patch="no patch", rule=swe).status
        is EpisodeStatus.QUARANTINED
    )
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        episode_outcome(verdict=2.0)


@pytest.mark.parametrize(
    "state, kind",
    [
        (None, FaultKind.CONTAINER_EXITED),
        ({"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True}, FaultKind.OOM_KILLED),
        ({"Running": False, "Status": "exited", "ExitCode": 1, "OOMKilled": False}, FaultKind.CONTAINER_EXITED),
        ({"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": False}, FaultKind.CONTAINER_EXITED),
        # stopped from inside: the main process exited cleanly or on SIGTERM / SIGINT / SIGHUP
        ({"Running": False, "Status": "exited", "ExitCode": 0, "OOMKilled": False}, FaultKind.SERVER_STOPPED),
        ({"Running": False, "Status": "exited", "ExitCode": 143, "OOMKilled": False}, FaultKind.SERVER_STOPPED),
        ({"Running": True, "Status": "running", "ExitCode": 0, "OOMKilled": False}, None),
    ],
)
def test_container_state_faults(state, kind):
    fault = container_fault(state)
    assert (fault.kind if fault else None) is kind
