"""The web application capsules benchmark runs end to end (--quick) and prints its ratios."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from cua_jax.envs.webapp.server import PYTHON_VARIABLE
from cua_jax.envs.webapp.state import BUILDER

RATIO = re.compile(
    r"^(create|fork|reset|throughput|memory|storage) (processes|containers)/capsules \(c=2\): ([0-9.]+)x", re.M
)


@pytest.mark.skipif(not os.environ.get(PYTHON_VARIABLE), reason=f"${PYTHON_VARIABLE} names no Trac virtualenv")
def test_quick_run_prints_positive_ratios(tmp_path, capsys):
    from experiments.benchmarks import webapp_capsules

    base = tmp_path / "base"  # the test scale's seeded state, which the trac image (--quick's containers) holds
    subprocess.run(
        [os.environ[PYTHON_VARIABLE], str(BUILDER), "build", "--out", str(base), "--scale", "test"], check=True
    )
    report = tmp_path / "report.json"
    webapp_capsules.main(["--base", str(base), "--quick", "--json", str(report)])  # short socket paths
    out = capsys.readouterr().out
    found = {(metric, baseline): float(value) for metric, baseline, value in RATIO.findall(out)}
    metrics = {"create", "fork", "reset", "throughput", "memory", "storage"}
    assert set(found) == {(m, b) for m in metrics for b in ("processes", "containers")}, out
    assert all(value > 0 for value in found.values()), found
    assert re.search(r"with the transaction \d+, with direct publication \d+", out), out
    assert report.is_file()
    # Every container and committed image of the run is gone.
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={webapp_capsules.BENCHMARK_LABEL}"], capture_output=True, text=True
    )
    assert left.returncode == 0 and not left.stdout.strip(), left.stdout
    forks = subprocess.run(["docker", "images", "-q", webapp_capsules.FORK_REPOSITORY], capture_output=True, text=True)
    assert forks.returncode == 0 and not forks.stdout.strip(), forks.stdout
