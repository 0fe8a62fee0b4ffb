"""A real infrastructure fault to inject into a running episode: its capsule closed under it."""

from __future__ import annotations

import threading

from cua_jax.envs.contract import EnvironmentWrapper


class FaultSwitch:
    """Faults to inject: each of the next `count` steps after `arm(count)` takes one, whichever
    environment makes it. Shared by every environment of a fixture, so a test need not know
    which environments exist yet (they are built lazily) or which test ran first."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = 0

    def arm(self, count: int = 1) -> None:
        with self._lock:
            self._pending += count

    def take(self) -> bool:
        with self._lock:
            if not self._pending:
                return False
            self._pending -= 1
            return True


class CapsuleClosingEnvironment(EnvironmentWrapper):
    """A MiniWoB environment whose capsule is closed under the running episode when it takes
    a fault from its switch: the runtime no longer knows the environment, so the episode is
    quarantined as the server's fault."""

    def __init__(self, env, switch: FaultSwitch):
        super().__init__(env)
        self.switch = switch

    async def _step(self, action):
        if not self.switch.take():
            return await self.env.step(action)
        await self.env._call(self.env.runtime.aclose(self.env.env_id))
        transition = await self.env.step(action)
        self.env.env_id = None  # the next reset builds a fresh capsule
        return transition
