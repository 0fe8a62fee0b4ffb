"""The seeded base state, built once per scale and builder version and cached.

    base = ensure_base_state("test")     # a Trac environment directory, ready to branch

`trac_state.py` builds it, run by the application's Python; the result is cached under
`$CUA_JAX_CACHE/webapp/` (launch/setup.sh exports the cache; ~/.cache/cua_jax without it),
keyed by the scale and a hash of the builder's source, and published by one rename, so a
half-built state is never used and concurrent callers build it once (a file lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess

from cua_jax.envs.webapp.server import app_python

BUILDER = pathlib.Path(__file__).with_name("trac_state.py")
SCALES = ("test", "bench")


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CUA_JAX_CACHE") or pathlib.Path.home() / ".cache" / "cua_jax") / "webapp"


def ensure_base_state(scale: str = "test", *, python: str | None = None) -> pathlib.Path:
    """The directory of the seeded state at `scale` ("test": small, for CI and training runs;
    "bench": the benchmark's, a database over 100 MB), built when missing."""
    if scale not in SCALES:
        raise ValueError(f"unknown seeded-state scale {scale!r}; known: {SCALES}")
    digest = hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"trac-{scale}-{digest}"
    if (target / "VERSION").is_file():
        return target
    with open(root / f".build-{scale}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "VERSION").is_file():  # another process built it meanwhile
            return target
        staging = root / f".staging-{scale}-{digest}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        done = subprocess.run(
            [python or app_python(), str(BUILDER), "build", "--out", str(staging), "--scale", scale],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"building the {scale} seeded state failed:\n{done.stderr[-2000:]}")
        staging.rename(target)
    return target
