"""How an episode ended, and who is to blame (CANOPY App. G).

Every episode ends with one `EpisodeStatus`:
    SUCCESS / FAILURE   the verifier gave a verdict (reward > 0 is a success), or the
                        policy caused the end and it is scored as a failure: invalid
                        action text, a declared FAIL, its own actions timing out.
    NO_VERDICT          the turn or token budget ran out before the policy finished.
    QUARANTINED         the serving layer attributes the end to itself: the container
                        exited, was OOM-killed, the server stopped answering or failed,
                        task setup failed, or the judge itself broke. The episode leaves
                        its group before advantages are computed.

The attribution is a serving-layer heuristic, as CANOPY stresses: a fault the policy
provoked but the infrastructure reports (say, an application the agent opened that
exhausted the container's memory) is quarantined. CANOPY scores an episode whose own
allocation exhausts its budget as a failure; `Attribution.agent_faults` names the kinds
scored so (experiment configs: `advantage.agent_faults`, by default AGENT_OWNED_FAULTS).

Environment faults quarantine; library bugs raise. `classify_environment_error` is the one
rule that tells them apart for an exception caught around an environment call.
"""

from __future__ import annotations

import dataclasses

# FaultKind and Fault are records of cua_jax.types, beside the episode records.
from cua_jax.types import EpisodeStatus, Fault, FaultKind

# Faults an agent's own actions bring about in an environment capped for it alone: a command
# that exhausts the container's memory, its pids limit or its work tree. Scored as the agent's
# failure by default (`Attribution.agent_faults`): a quarantine leaves the group, which for a
# policy behind its group's mean scores better than failing, and an agent could learn to ask
# for one on purpose. So are a judge's output with a verdict the judge did not write and a server
# stopped from inside its container (the work of processes the agent ran there), and a MiniWoB
# page that left its task's document (no task page navigates by itself; only what the agent did
# on it can). Crashes of shared browsers, servers and engines stay quarantined.
AGENT_OWNED_FAULTS = (
    FaultKind.OOM_KILLED,
    FaultKind.PROCESS_LIMIT,
    FaultKind.WORK_TREE_FULL,
    FaultKind.JUDGE_TAMPERED,
    FaultKind.SERVER_STOPPED,
    FaultKind.PAGE_LEFT_TASK,
)
# Exit statuses of a main process that ended by itself or on SIGHUP / SIGINT / SIGTERM.
STOPPED_FROM_INSIDE = (0, 128 + 1, 128 + 2, 128 + 15)
FAULT_KINDS = tuple(kind.value for kind in FaultKind)  # what configs may name


def fault_kind_of(reason: str | None) -> FaultKind | None:
    """The FaultKind a recorded reason names (`Fault.reason`: the kind's value before ':'), or None:
    for reasons read back from episode logs (a running episode carries its `Fault`)."""
    head = (reason or "").split(":", 1)[0].strip()
    return next((kind for kind in FaultKind if kind.value == head), None)


class FaultError(Exception):
    """An error that names the infrastructure fault behind it (a crashed browser, a quarantined
    capsule, a runtime that is shut down); `classify_environment_error` takes that fault as is.
    Subclasses set `fault_kind`; the message is the fault's detail."""

    fault_kind: FaultKind = FaultKind.SERVER_ERROR

    @property
    def fault(self) -> Fault:
        return Fault(self.fault_kind, str(self))


class AttributedFaultError(FaultError):
    """A FaultError raised with its fault already attributed (a quarantined capsule, a container's
    limit): `fault` is that fault as is, the message its reason."""

    def __init__(self, fault: Fault):
        super().__init__(fault.reason)
        self._fault = fault

    @property
    def fault(self) -> Fault:
        return self._fault


# OSErrors about a path on this host: the library named a wrong path, not an environment fault.
LOCAL_PATH_ERRORS = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError)


def _playwright_errors() -> tuple[type[BaseException], ...]:
    try:
        from playwright.async_api import Error  # TimeoutError and TargetClosedError derive from it
    except ImportError:  # an installation without browsers raises no Playwright errors
        return ()
    return (Error,)


def _is_timeout(error: BaseException) -> bool:
    if isinstance(error, TimeoutError):  # asyncio.TimeoutError is TimeoutError since Python 3.11
        return True
    try:
        from playwright.async_api import TimeoutError as PlaywrightTimeoutError
    except ImportError:
        return False
    return isinstance(error, PlaywrightTimeoutError)


def classify_environment_error(error: BaseException, *, setup: bool = False) -> Fault | None:
    """The infrastructure fault behind `error`, or None when it is a bug that must raise.

    The error and then its chain of causes (`raise ... from`) are read in turn, so a wrapper
    such as a failed lifecycle transaction is judged by what failed it; the first link that
    is an infrastructure error decides:

        FaultError (crashed browser, quarantined capsule, shut-down runtime)   its own fault
        timeouts (TimeoutError, asyncio's and Playwright's)      SERVER_UNRESPONSIVE
        ConnectionError (refused, reset, BrokenPipeError)       SERVER_UNRESPONSIVE
        other Playwright errors (closed target, crashed page)   SERVER_ERROR
        other OSError (sockets, ENOSPC, EIO, ...)               SERVER_ERROR
        LOCAL_PATH_ERRORS (FileNotFoundError, PermissionError,  none: a wrong local path
            NotADirectoryError, IsADirectoryError, FileExistsError)   is this library's bug

    With setup=True (the error came while setting a task up) every kind but a FaultError's
    is SETUP_FAILED. A chain with no infrastructure error (TypeError, AttributeError,
    KeyError, AssertionError, ValueError, a local path error, ...) is a library bug: None.
    """
    detail = f"{type(error).__name__}: {error}"  # the outermost error says where it failed
    link: BaseException | None = error
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, FaultError):
            return link.fault
        if _is_timeout(link) or isinstance(link, ConnectionError):
            return Fault(FaultKind.SETUP_FAILED if setup else FaultKind.SERVER_UNRESPONSIVE, detail)
        if isinstance(link, (*_playwright_errors(), OSError)) and not isinstance(link, LOCAL_PATH_ERRORS):
            return Fault(FaultKind.SETUP_FAILED if setup else FaultKind.SERVER_ERROR, detail)
        link = link.__cause__
    return None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The end of an episode: status, reward, (for quarantine or agent failure) why, and the
    infrastructure fault behind it (quarantined, or scored as the agent's failure)."""

    status: EpisodeStatus
    reward: float
    reason: str | None = None
    fault: Fault | None = None


@dataclasses.dataclass(frozen=True)
class Attribution:
    """The knobs of the attribution rule.

    no_verdict_reward: the terminal reward of a budget-exhausted episode (ScaleCUA uses
        -0.2 via configuration; 0 keeps it neutral).
    no_patch_reward / crash_reward: CANOPY's SWE terminal constants (App. H, -0.2 each there)
        for a code episode that left nothing to test: no change to the sources or a change
        that cannot be applied, and a test run that could not finish (hang, crash). 0: a
        plain failure.
    agent_faults: the fault kinds scored as the agent's failure (reward 0, the episode stays
        in its group) instead of quarantined; CANOPY scores an OOM kill of an episode's own
        allocation so. Experiment configs set `advantage.agent_faults` (default
        AGENT_OWNED_FAULTS); this class's default owns none.
    """

    no_verdict_reward: float = 0.0
    agent_faults: frozenset[FaultKind] = frozenset()
    no_patch_reward: float = 0.0
    crash_reward: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "agent_faults", frozenset(FaultKind(kind) for kind in self.agent_faults))


def episode_outcome(
    *,
    fault: Fault | None = None,
    verdict: float | None = None,
    budget_exhausted: bool = False,
    agent_failure: str | None = None,
    no_patch: str | None = None,
    crash: str | None = None,
    rule: Attribution = Attribution(),
) -> Outcome:
    """Decide how an episode ended. Precedence: infrastructure fault, then agent failure
    (no patch, a crashed test run, any other), then the verifier's verdict, then budget
    exhaustion.

    Args:
        fault: an infrastructure fault seen during setup, the episode or judging.
        verdict: the judge's reward in [0, 1] when it ran to completion.
        budget_exhausted: the turn or token budget ran out before the agent finished.
        agent_failure: why the policy itself ended the episode (declared FAIL on a feasible
            task, an action that timed out); scored 0.
        no_patch / crash: a code episode left nothing to test (why); scored
            `rule.no_patch_reward` / `rule.crash_reward`.
    """
    if fault is not None:
        if fault.kind in rule.agent_faults:
            return Outcome(EpisodeStatus.FAILURE, 0.0, fault.reason, fault)
        return Outcome(EpisodeStatus.QUARANTINED, 0.0, fault.reason, fault)
    if no_patch is not None:
        return Outcome(EpisodeStatus.FAILURE, float(rule.no_patch_reward), no_patch)
    if crash is not None:
        return Outcome(EpisodeStatus.FAILURE, float(rule.crash_reward), crash)
    if agent_failure is not None:
        return Outcome(EpisodeStatus.FAILURE, 0.0, agent_failure)
    if verdict is not None:
        if not 0.0 <= verdict <= 1.0:
            raise ValueError(f"a verdict is a reward in [0, 1], got {verdict}")
        return Outcome(EpisodeStatus.SUCCESS if verdict > 0 else EpisodeStatus.FAILURE, float(verdict))
    if budget_exhausted:
        return Outcome(EpisodeStatus.NO_VERDICT, rule.no_verdict_reward, "turn or token budget exhausted")
    raise ValueError("an episode needs a fault, an agent failure, a verdict or an exhausted budget")


def container_fault(state: dict | None) -> Fault | None:
    """The fault a Docker container's `State` (from `docker inspect`) shows, if any.

    A missing container (None) counts as exited: something removed it under the episode.
    """
    if state is None:
        return Fault(FaultKind.CONTAINER_EXITED, "container is gone")
    if state.get("OOMKilled"):
        return Fault(FaultKind.OOM_KILLED, f"exit status {state.get('ExitCode')}")
    if not state.get("Running", False) or state.get("Status") in ("exited", "dead"):
        detail = f"status {state.get('ExitCode')}"
        if state.get("Error"):
            detail += f", {state['Error']}"
        elif state.get("Status") == "exited" and state.get("ExitCode") in STOPPED_FROM_INSIDE:
            return Fault(FaultKind.SERVER_STOPPED, f"the container's main process ended with {detail}")
        return Fault(FaultKind.CONTAINER_EXITED, detail)
    return None
