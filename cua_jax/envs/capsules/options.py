"""The options of a runtime's capsules, as an experiment config's `env.capsules` section sets them."""

from __future__ import annotations

import dataclasses
from typing import Any

from cua_jax.envs.capsules.backends import SharedBrowserBackend
from cua_jax.envs.capsules.runtime import FORK_METHODS, CapsuleRuntime


@dataclasses.dataclass(frozen=True)
class CapsuleOptions:
    """How a runtime's capsules share their browser: `renderers` cells sharing a renderer
    process each (0: a browser context, and renderers, per capsule), `warm_pages` loaded pages
    per task kept ready, fork and restore by captured state or by replay (`fork_by`), and
    `episodes_per_page` episodes of a task begun in one page before it is replaced (1: a new
    page every reset; see CapsuleRuntime)."""

    renderers: int = 2
    warm_pages: int = 2
    fork_by: str = "capture"
    episodes_per_page: int = 8

    def __post_init__(self) -> None:
        if self.renderers < 0 or self.warm_pages < 0:
            raise ValueError(
                f"capsule renderers and warm_pages must be 0 or more, got {self.renderers}, {self.warm_pages}"
            )
        if self.episodes_per_page < 1:
            raise ValueError(f"capsule episodes_per_page must be 1 or more, got {self.episodes_per_page}")
        if self.fork_by not in FORK_METHODS:
            raise ValueError(f"capsule fork_by must be one of {FORK_METHODS}, got {self.fork_by!r}")

    @classmethod
    def from_config(cls, section: Any) -> CapsuleOptions:
        """From an experiment config's `env.capsules` section."""
        return cls(
            int(section.renderers), int(section.warm_pages), str(section.fork_by), int(section.episodes_per_page)
        )

    def runtime(self, **kwargs: Any) -> CapsuleRuntime:
        """A CapsuleRuntime on a shared browser with these options (kwargs: its other arguments)."""
        backend = SharedBrowserBackend(renderers=self.renderers or None)
        return CapsuleRuntime(
            backend,
            warm_pages=self.warm_pages,
            fork_by=self.fork_by,
            episodes_per_page=self.episodes_per_page,
            **kwargs,
        )
