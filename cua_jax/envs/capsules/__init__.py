"""State capsules: many MiniWoB environments on one shared, initialised browser runtime.

CUA-Sandbox (§3) observes that a trajectory needs its own mutable state, not its own
runtime. Here the runtime is one Chromium process (launched once, through Playwright);
each environment is a *capsule*: a page on a site of its own (so its own cookies, storage,
IndexedDB and cache), in one of a few *cells* that share a renderer process each
(SharedBrowserBackend; or a browser context per capsule), the task and its seed, reached
through a *route* keyed by the environment id. A route publishes one *generation* of the
capsule at a time; every generation gets a new page on a new site, except that with
`episodes_per_page` above 1 a reset or restore of the same task may begin the next episode
in the page its predecessor held (storage emptied, focus and pointer home, painted anew;
only for the tasks `restarts.restart_exact_tasks` lists, where that is measured to show
exactly what a new page shows, and whose page has not asked to navigate since it loaded).
A restart that fails in the page falls back to a new page; as the old page is then gone, a
build that fails after that quarantines the capsule rather than leave its previous generation.

Lifecycle operations are transactions (CUA-Sandbox §3.4):

    freeze the route  -> requests arriving now are refused with CapsuleFrozenError
    drain             -> wait until requests already admitted have finished
    build successor   -> a new page (a warm one when the pool has it), prepared off the route
    publish           -> one assignment on the event loop swaps the route to the successor
    retire            -> the old generation's page is closed once the caller has its observation

If building fails, the route keeps its previous generation (LifecycleError says so) and the
half-built successor is closed. All route bookkeeping runs on one asyncio event loop, so
admission (check frozen, count in-flight) and publication are atomic with respect to each
other; `publications` records, for every publish, how many requests were in flight (0 by
construction, checked by the tests).

How fork reproduces state: from captured page state where that is exact, else by *replay*.
`snapshot` asks `miniwob_state.capture_state` for the page's state (form fields, focus,
selection, scroll, element ids, MiniWoB's globals), which it gives only when none of the
task's own code has run since the episode began; a fork then begins the same seed on a
fresh page and writes that state, and a fingerprint check sends a mismatch back to replay.
Otherwise (and with fork_by="replay") the fork replays. A generation records its task, its
seed and the prefix of actions it performed. MiniWoB generates every problem from `Math.seedrandom`
(core.js), and its handlers are deterministic functions of the DOM and the input events,
so loading the task, seeding, starting the episode and replaying the prefix rebuilds the
same DOM, pixels and reward state (the tests check observation equality and equal rewards
under the same next actions). The one quantity replay cannot reproduce is wall-clock time:
after replay the fork's MiniWoB clock is moved to the parent's elapsed time at the snapshot
and its time limit re-armed, so the fork keeps the time the parent had left then. Replay is
exact for tasks whose state is a function of the seed and the input events (the scripted
tasks and most of MiniWoB); tasks that move on their own clock (chase-circle, moving
targets) come back at the same seed and inputs but not the same animation phase (and capture
refuses them). `snapshot` captures (task, seed, prefix, elapsed time, page state) without
building anything; `fork` builds a new capsule
from an environment or a snapshot; `restore` replaces an environment's generation by one.

Faults: when the shared browser disconnects (crash, killed process), every capsule on it is
quarantined as "browser crashed: ..." (steps return EpisodeStatus.QUARANTINED with that
`fault`) and the backend relaunches the runtime; `reset` (or `restore`) of a quarantined
environment builds a fresh generation on the new runtime. When one renderer process dies,
each page it hosted reports the crash and exactly those capsules (one cell's) are
quarantined as "renderer crashed: ..."; the browser and the other cells serve on. The runtime remembers which
runtimes died, and asks the backend whether a runtime's browser still lives, so a request
that fails because its browser died (even before the disconnect is reported), and a build
that fails until the browser is back, also carry the browser crash (CapsuleFaultError,
BrowserCrashedError) rather than a setup or page failure. A Playwright error or timeout
inside one capsule whose browser lives quarantines only that capsule. An exception that
`faults.classify_environment_error` does not call an infrastructure fault is a bug in this
library and raises. Malformed action text becomes an invalid-action step; an action after
the episode ended raises EpisodeEndedError; unknown tasks raise UnknownTaskError; unknown
environment ids raise UnknownEnvironmentError.

The runtime is generic over a `RuntimeBackend` that hands out browser pages: the shared
browser here, and one browser or one container per environment in
`cua_jax.envs.browser_baselines`, so baselines run the same code path.

The package, one module per job: `errors` (what the runtime raises), `records` (snapshots,
step results, publications), `backends` (`RuntimeBackend` and the shared browser), `procfs`
(processes and memory from /proc), `runtime` (`CapsuleRuntime`: routes, generations,
transactions, the warm pool, the blocking API) and `options` (`CapsuleOptions`, from a config).
"""

from cua_jax.envs.capsules.backends import (
    CAPSULE_SITE_DOMAIN,
    CrashCallback,
    RuntimeBackend,
    SharedBrowserBackend,
    Slot,
    find_browser_pid,
    launch_browser,
    launch_marker,
    renderer_sharing_args,
)
from cua_jax.envs.capsules.errors import (
    BrowserCrashedError,
    BuildTimeoutError,
    CapsuleError,
    CapsuleFaultError,
    CapsuleFrozenError,
    LifecycleError,
    RuntimeShutDownError,
    RuntimeStartError,
    UnknownEnvironmentError,
)
from cua_jax.envs.capsules.options import CapsuleOptions
from cua_jax.envs.capsules.procfs import PssReading, command_line, process_alive, process_tree, read_pss
from cua_jax.envs.capsules.records import CapsuleSnapshot, PublicationRecord, StepResult
from cua_jax.envs.capsules.runtime import FORK_METHODS, CapsuleRuntime

__all__ = [
    "CAPSULE_SITE_DOMAIN",
    "FORK_METHODS",
    "BrowserCrashedError",
    "BuildTimeoutError",
    "CapsuleError",
    "CapsuleFaultError",
    "CapsuleFrozenError",
    "CapsuleOptions",
    "CapsuleRuntime",
    "CapsuleSnapshot",
    "CrashCallback",
    "LifecycleError",
    "PssReading",
    "PublicationRecord",
    "RuntimeBackend",
    "RuntimeShutDownError",
    "RuntimeStartError",
    "SharedBrowserBackend",
    "Slot",
    "StepResult",
    "UnknownEnvironmentError",
    "command_line",
    "find_browser_pid",
    "launch_browser",
    "launch_marker",
    "process_alive",
    "process_tree",
    "read_pss",
    "renderer_sharing_args",
]
