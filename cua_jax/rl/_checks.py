"""Input checks that run when values are concrete (eager calls) and vanish under jit tracing."""

from __future__ import annotations

import jax
import numpy as np


def is_concrete(*values) -> bool:
    """True when none of `values` is a tracer, so their contents can be inspected."""
    return not any(isinstance(v, jax.core.Tracer) for v in values)


def check_ids_in_range(caller: str, name: str, ids, size: int) -> None:
    """Raise ValueError naming `caller` and `name` if concrete `ids` leave [0, size).

    Out-of-range ids would be dropped silently by `jax.ops.segment_sum` and clamped by
    gathers; traced ids cannot be inspected and are the caller's responsibility.
    """
    if not is_concrete(ids):
        return
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= size):
        raise ValueError(f"{caller}: {name} must lie in [0, {size}), got values in [{ids.min()}, {ids.max()}]")
