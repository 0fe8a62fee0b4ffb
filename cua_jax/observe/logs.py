"""A run's console: its own progress lines, and only the warnings and errors of its libraries.

Orbax alone logs some 190 INFO lines per run (every checkpoint save and restore, through
absl), and JAX, Ray and others add theirs; they bury what the run says about itself.
`quiet_library_logging` filters every handler of the root logger (absl's included, which
prints both absl and Python `logging` records) so that a record below WARNING passes only
when it was logged from one of `own_roots` (by default this checkout's cua_jax and
experiments packages). Warnings and errors of every library still pass. Loggers with
handlers of their own (Ray's, when the Ray worker backend is used) are not touched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OWN_ROOTS = (os.path.join(_CHECKOUT, "cua_jax"), os.path.join(_CHECKOUT, "experiments"))


class OwnInfoFilter(logging.Filter):
    """Passes WARNING and above from anywhere, lower levels only from files under `roots`."""

    def __init__(self, roots: Sequence[str] = OWN_ROOTS):
        super().__init__()
        self.roots = tuple(os.path.join(os.path.abspath(root), "") for root in roots)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return os.path.abspath(record.pathname).startswith(self.roots)


def quiet_library_logging(roots: Sequence[str] = OWN_ROOTS) -> OwnInfoFilter:
    """Installs an `OwnInfoFilter` on every handler of the root logger and absl's handler
    (idempotent: a handler keeps one such filter), and keeps XLA's C++ INFO lines out unless
    TF_CPP_MIN_LOG_LEVEL says otherwise (read when JAX loads: call this before importing it).
    Returns the filter."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    handlers = list(logging.getLogger().handlers)
    try:
        from absl import logging as absl_logging

        handlers.append(absl_logging.get_absl_handler())
    except ImportError:
        pass
    own = OwnInfoFilter(roots)
    for handler in handlers:
        for old in [f for f in handler.filters if isinstance(f, OwnInfoFilter)]:
            handler.removeFilter(old)
        handler.addFilter(own)
    return own
