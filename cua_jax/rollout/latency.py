"""Injected environment latency: a long-tailed delay before each environment step.

Computer-use environments answer with heavy-tailed latency: most steps of a desktop or a
browser return in a typical time, a few take many times longer (a page load, an
application start, a busy host). Synchronous training waits for the slowest episode of
every rollout batch; asynchronous training overlaps that wait with learning. To measure
the difference on fast local MiniWoB++ capsules, `LatencyEnvironment` wraps any
`AgentEnvironment` and sleeps a drawn delay before each `step` (and, optionally, `reset`).

The delay is log-normal, capped: `median_s * exp(sigma * Z)`, Z ~ N(0, 1), clipped at
`max_s`. Log-normal because it is parametrized by what one observes of an environment (the
typical step time is the median; sigma sets how far the tail reaches: p99 / median =
exp(2.326 sigma), about 10x at sigma = 1) and, unlike Pareto, has every moment finite, so
a benchmark's mean over a few hundred steps is stable; the cap keeps a single draw from
stalling a run. The sleep is `asyncio.sleep`: it takes wall time but no CPU, as a remote
environment's latency does, and the other episodes on the event loop keep running.

Draws are seeded: the k-th delay of a `DelaySampler(distribution, seed)` is fixed.
`LatencyWrapper` is the trainer's `env_wrapper`: a module-level class with plain-data
constructor arguments, so it pickles (to a rollout actor in another process) and wraps
each environment with its own seeded stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvironmentWrapper, EnvReset, EnvTransition

# The key of a step's injected delay (seconds) in `EnvTransition.info`, hence in `Turn.info`.
DELAY_INFO_KEY = "injected_delay_s"


def lognormal_quantile(q: jnp.ndarray, median_s: float, sigma: float, max_s: float = math.inf) -> jnp.ndarray:
    """The quantile function of the capped log-normal delay.

    Args:
      q: probabilities in (0, 1), any shape [...].
      median_s: the median delay in seconds (> 0); sigma: the standard deviation of the
        log-delay (>= 0); max_s: the cap (inf: none).
    Returns:
      [...] delays in seconds: min(median_s * exp(sigma * Phi^-1(q)), max_s).
    """
    q = jnp.asarray(q, jnp.float32)
    return jnp.minimum(median_s * jnp.exp(sigma * ndtri(q)), max_s)


@dataclasses.dataclass(frozen=True)
class LogNormalDelay:
    """A capped log-normal delay distribution (see the module doc for why log-normal).

    median_s: the median delay in seconds (> 0).
    sigma: the standard deviation of log(delay) (>= 0; 0 gives a constant median_s).
    max_s: the cap in seconds (None: uncapped); at least median_s.
    """

    median_s: float
    sigma: float
    max_s: float | None = None

    def __post_init__(self):
        if not (math.isfinite(self.median_s) and self.median_s > 0):
            raise ValueError(f"LogNormalDelay: median_s must be a positive number of seconds, got {self.median_s}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"LogNormalDelay: sigma must be >= 0, got {self.sigma}")
        if self.max_s is not None and not self.max_s >= self.median_s:
            raise ValueError(f"LogNormalDelay: max_s ({self.max_s}) must be >= median_s ({self.median_s})")

    @property
    def cap_s(self) -> float:
        return math.inf if self.max_s is None else float(self.max_s)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Delays in seconds, float64 of shape `size` (a 0-d array when None)."""
        draws = rng.lognormal(mean=math.log(self.median_s), sigma=self.sigma, size=size)
        return np.minimum(draws, self.cap_s)

    def quantile(self, q: Any) -> np.ndarray:
        """The delay at probabilities q (any shape, in (0, 1)); see `lognormal_quantile`."""
        return np.asarray(lognormal_quantile(q, self.median_s, self.sigma, self.cap_s))


class DelaySampler:
    """A seeded stream of delays from `distribution`: draw k of a given seed is always the same.

    seed: an int or a tuple of ints (numpy SeedSequence entropy), e.g. (run seed, env index).
    """

    def __init__(self, distribution: LogNormalDelay, seed: int | tuple[int, ...] = 0):
        self.distribution = distribution
        self.seed = seed
        self._rng = np.random.default_rng(np.random.SeedSequence(seed))

    def draw(self) -> float:
        """The next delay in seconds."""
        return float(self.distribution.sample(self._rng))


class LatencyEnvironment(EnvironmentWrapper):
    """`env` with a drawn delay slept before every step (and every reset when `delay_reset`).

    The step's delay is recorded in its transition's info under DELAY_INFO_KEY; counters
    `resets`, `steps` and `delay_s` (total seconds slept) say what the wrapper did.
    Faults pass through unchanged: a reset's EnvironmentFault is raised after the delay,
    a quarantining step transition is returned after it.
    """

    def __init__(self, env: AgentEnvironment, sampler: DelaySampler, *, delay_reset: bool = False):
        super().__init__(env)
        self.sampler = sampler
        self.delay_reset = delay_reset
        self.resets = 0
        self.steps = 0
        self.delay_s = 0.0

    async def _sleep(self) -> float:
        delay = self.sampler.draw()
        self.delay_s += delay
        await asyncio.sleep(delay)
        return delay

    async def _reset(self, task: Any, seed: int | None) -> EnvReset:
        self.resets += 1
        if self.delay_reset:
            await self._sleep()
        return await self.env.reset(task, seed)

    async def _reset_to(self, task: Any, seed: int | None, state: Any) -> EnvReset:
        self.resets += 1
        if self.delay_reset:
            await self._sleep()
        return await self.env.reset_to(task, seed, state)

    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        self.steps += 1
        delay = await self._sleep()
        transition = await self.env.step(action)
        return dataclasses.replace(transition, info={**transition.info, DELAY_INFO_KEY: delay})


class LatencyWrapper:
    """An env_wrapper adding log-normal latency: env -> LatencyEnvironment(env, ...).

    Plain-data arguments only, so it pickles. The k-th environment one instance wraps draws
    from the stream seeded (seed, k); a copy made by pickling continues from the count it
    was pickled at, so give each process its own seed when several copies wrap at once.
    """

    def __init__(
        self, median_s: float, sigma: float, *, max_s: float | None = None, seed: int = 0, delay_reset: bool = False
    ):
        self.distribution = LogNormalDelay(median_s, sigma, max_s)
        self.seed = int(seed)
        self.delay_reset = bool(delay_reset)
        self._wrapped = 0
        self._lock = threading.Lock()  # workers' threads may wrap environments at once

    def __call__(self, env: AgentEnvironment) -> LatencyEnvironment:
        with self._lock:
            index = self._wrapped
            self._wrapped += 1
        return LatencyEnvironment(
            env, DelaySampler(self.distribution, (self.seed, index)), delay_reset=self.delay_reset
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        d = self.distribution
        return (
            f"LatencyWrapper(median_s={d.median_s}, sigma={d.sigma}, max_s={d.max_s}, seed={self.seed}, "
            f"delay_reset={self.delay_reset})"
        )
