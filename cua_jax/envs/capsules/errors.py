"""The errors the capsule runtime raises about environments (the package docstring,
`cua_jax.envs.capsules`, says which comes when)."""

from __future__ import annotations

from cua_jax.envs.faults import AttributedFaultError, FaultError, FaultKind


class CapsuleError(RuntimeError):
    """Base of the errors the capsule runtime raises about environments."""


class UnknownEnvironmentError(CapsuleError, LookupError, FaultError):
    """An environment id that no route holds (never created, or closed). To an episode that
    holds the id, its capsule was closed under it: the runtime no longer serves it."""

    fault_kind = FaultKind.SERVER_UNRESPONSIVE


class BrowserCrashedError(CapsuleError, FaultError):
    """The browser runtime a capsule needs died (crash, killed process) and is not back yet."""

    fault_kind = FaultKind.BROWSER_CRASHED


class RuntimeStartError(CapsuleError, FaultError):
    """A runtime a capsule needs (a browser, a container) could not be started."""

    fault_kind = FaultKind.SETUP_FAILED


class RuntimeShutDownError(CapsuleError, FaultError):
    """A request reached a runtime that has been shut down."""

    fault_kind = FaultKind.SERVER_UNRESPONSIVE


# AttributedFaultError first: its __init__ (which keeps the fault) must come before RuntimeError's.
class CapsuleFaultError(AttributedFaultError, CapsuleError):
    """A request failed on a fault the runtime attributes: its capsule is quarantined, or the
    runtime serving it died or is shutting down."""


class BuildTimeoutError(CapsuleError, TimeoutError):
    """Building a capsule generation took longer than the runtime's build_timeout_s."""


class CapsuleFrozenError(CapsuleError):
    """A request reached a route frozen by a lifecycle transaction; retry after it publishes."""


class LifecycleError(CapsuleError):
    """A lifecycle transaction failed; the previous generation stays published."""
