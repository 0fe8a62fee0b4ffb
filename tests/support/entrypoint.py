"""Running `python -m experiments.main` as a user would, for tests."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_main(*args, workdir):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "experiments.main", *args, f"--workdir={workdir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
