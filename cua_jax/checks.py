"""Checks a config dataclass's `__post_init__` shares with the others: one message format for
every bound, so a config error reads the same whichever section it comes from."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def require_at_least(config: Any, names: Iterable[str], low: float, note: str = "") -> None:
    """ValueError "<Class>.<name> must be >= <low><note>, got <value>" for the first of `names`
    (fields of the dataclass `config`) below `low`."""
    for name in names:
        value = getattr(config, name)
        if value < low:
            raise ValueError(f"{type(config).__name__}.{name} must be >= {low}{note}, got {value}")
