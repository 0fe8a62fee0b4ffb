"""CANOPY's pilot pass: per-tier coverage against numpy, the report's floor, the pilot file's
errors, and the whole path: `python -m experiments.evaluate --pilot` writes a file a
training run reads (rollout.group_size and the pool's pass rates)."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys

import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.eval.pilot import pilot_report, read_pilot_file, report_lines, write_pilot_file
from cua_jax.rl.coverage import min_group_size, tier_signal_coverage
from cua_jax.train.settings import ConfigError, apply_pilot_file
from tests.support.trainer import start_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_TASKS, NUM_TIERS = 9, 3
tier_coverage_jit = jax.jit(functools.partial(tier_signal_coverage, num_tiers=NUM_TIERS))


@settings(max_examples=40, deadline=None)
@given(
    p=hnp.arrays(np.float64, (NUM_TASKS,), elements=st.floats(0, 1)),
    tiers=hnp.arrays(np.int32, (NUM_TASKS,), elements=st.integers(0, NUM_TIERS - 1)),
    n=st.integers(1, 64),
)
def test_tier_coverage_is_the_mean_binomial_coverage_of_the_tier(p, tiers, n):
    got = np.asarray(tier_coverage_jit(p, tiers, n=n))
    for tier in range(NUM_TIERS):
        members = p[tiers == tier]
        # P(at least one success and one failure in n) = 1 - P(all succeed) - P(all fail).
        want = np.mean([1 - q**n - (1 - q) ** n for q in members]) if len(members) else 0.0
        np.testing.assert_allclose(got[tier], want, atol=1e-5)


def records(outcomes):
    """Harness records from {task: [success, ...]}, one quarantined record each besides."""
    out = []
    for task, results in outcomes.items():
        out += [{"task": task, "status": "success" if s else "failure", "success": bool(s)} for s in results]
        out.append({"task": task, "status": "quarantined", "success": False})
    return out


def test_report_floor_covers_the_hardest_reached_tier():
    outcomes = {"easy": [1] * 7 + [0], "mid": [1, 1, 0, 0, 0, 0, 0, 0], "hard": [1] + [0] * 7, "wall": [0] * 8}
    tiers = {"easy": 0, "mid": 1, "hard": 2, "wall": 3}
    report = pilot_report(records(outcomes), tiers, group_size=4, target=0.9, samples=8)
    assert report["tasks"]["hard"] == {"tier": 2, "successes": 1, "attempts": 8, "pass_rate": 0.125}
    assert report["hardest_reached_tier"] == 2 and report["p_min"] == 0.125 and report["unreached_tiers"] == [3]
    floor = report["group_size_floor"]
    assert floor == int(min_group_size(0.125, 0.9)) == 18
    assert report["tiers"]["2"]["coverage_at_floor"] >= 0.9 - 0.02 > report["tiers"]["2"]["coverage_at_configured"]
    assert report["tiers"]["3"]["coverage_at_configured"] == 0.0
    lines = report_lines(report)
    assert "n >= 18" in lines[-2] and "tier 3: no success" in lines[-1]
    with pytest.raises(ValueError, match="scored no episode"):
        pilot_report(records(outcomes), {**tiers, "missing": 0}, 4, 0.9, 8)
    with pytest.raises(ValueError, match="target"):
        pilot_report(records(outcomes), tiers, 4, 1.0, 8)


def test_pilot_file_errors_name_the_field(tmp_path):
    from experiments.configs import tiny

    c = tiny.get_config()
    c.sampler.pilot.file = str(tmp_path / "none.json")
    with pytest.raises(ConfigError, match="config.sampler.pilot.file: no pilot file"):
        apply_pilot_file(c)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a pilot file"):
        read_pilot_file(tmp_path / "bad.json")
    unreached = pilot_report(records({"a": [0, 0]}), {"a": 0}, 4, 0.9, 2)
    c.sampler.pilot.file = write_pilot_file(tmp_path, unreached)
    with pytest.raises(ConfigError, match="no tier succeeded"):
        apply_pilot_file(c)


def test_a_pilot_files_group_size_is_logged_and_kept_in_the_config(tmp_path, caplog):
    from experiments.configs import tiny

    c = tiny.get_config()
    report = pilot_report(records({"a": [1, 0, 0, 0]}), {"a": 0}, 4, 0.9, 4)
    c.sampler.pilot.file = write_pilot_file(tmp_path, report)
    with caplog.at_level(logging.INFO):
        applied, read = apply_pilot_file(c)
    floor = report["group_size_floor"]
    assert applied.rollout.group_size == floor != c.rollout.group_size and read == report
    assert f"rollout.group_size = {floor} from the pilot file" in caplog.text
    assert f"replacing {c.rollout.group_size}" in caplog.text


@pytest.mark.browser
@pytest.mark.slow
def test_pilot_command_writes_the_file_a_run_reads(tmp_path):
    """The pilot on real capsules (the random policy, 2 tasks in 2 tiers), then a trainer given
    the file: its group size is the floor and its pool starts from the pilot's rates."""
    overrides = [
        "--config.env.tasks=(('click-test',0),('click-button',1))",
        "--config.sampler.pilot.group_size=4",
        "--config.rollout.group_size=2",
        "--config.rollout.max_turns=2",
        "--config.rollout.batch_tasks=2",
        "--config.eval.concurrent_groups=2",
    ]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.evaluate",
            "--pilot",
            "--policy=random",
            "--seeds=3",
            f"--out={tmp_path / 'pilot'}",
            *overrides,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tier 0: 1 tasks" in result.stdout and "P_sig at n=2" in result.stdout
    report = read_pilot_file(tmp_path / "pilot" / "pilot.json")
    assert report["samples"] == 4 and all(row["attempts"] == 12 for row in report["tasks"].values())
    assert json.loads(result.stdout.strip().splitlines()[-1])["group_size_floor"] == report["group_size_floor"]
    assert report["group_size_floor"] is not None, "the random policy reached no tier; pick easier tasks"

    from experiments.configs import tiny

    c = tiny.get_config()
    c.workdir = str(tmp_path / "run")
    c.env.tasks = (("click-test", 0), ("click-button", 1))
    c.rollout.batch_tasks = 2
    c.sampler.pilot.file = str(tmp_path / "pilot" / "pilot.json")
    c.eval.enabled = False
    with start_trainer(c) as trainer:
        assert trainer.settings.rollout.group_size == report["group_size_floor"]
        assert trainer.settings.config_dict["rollout"]["group_size"] == report["group_size_floor"]
        rates = dict(zip(trainer.pool.task_ids, trainer.pool.pass_rate))
        assert rates == pytest.approx({t: row["pass_rate"] for t, row in report["tasks"].items()})
