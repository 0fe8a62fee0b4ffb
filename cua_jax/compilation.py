"""XLA's compiled programs kept on disk between processes (JAX's persistent compilation cache).

On a CPU, compiling a program for a new shape takes seconds (the learner's gradient pass of the
shipped base: about 8 s), as long as several updates; a run, its resumption and the next run
with the same shapes compile them once. JAX keys every entry by the program and the compiler,
so a changed program never reads a stale one. Tracing still happens in each process.
"""

from __future__ import annotations

import os

# Programs that compiled faster than this are not kept (the many small eager ones: writing
# them costs what compiling them does).
MIN_COMPILE_SECONDS = 0.5


def use_compilation_cache(directory: str) -> str | None:
    """Keeps compiled programs under `directory` (a leading ~ expanded; created when missing)
    for this process and later ones; "" leaves the cache off. Returns the directory used.

    JAX's own size bound is left off: it reads every entry's access record on each write, which
    made a test suite several times slower; `launch/setup.sh` empties the directory once it
    passes 4 GiB."""
    if not directory:
        return None
    import jax

    path = os.path.abspath(os.path.expanduser(directory))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path
