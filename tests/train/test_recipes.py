"""The papers' recipes run through the entrypoint (`python -m experiments.main`), shrunk by sizes
only, with the mechanism each recipe is about asserted from the run's own metrics.

Every recipe keeps its estimator, loss, sampler and segmenter. What is overridden is the size of
the run (group counts, turns, steps, evaluation seeds) and, where a recipe names a random-init
tiny policy, the policy: the shipped base (experiments/configs/default.py's BASE, which reads
the page by element ids), so that updates have a signal to act on.
"""

from __future__ import annotations

import json

import pytest

from cua_jax.eval.pilot import pilot_report, write_pilot_file
from experiments.configs import canopy
from experiments.configs.default import BASE
from tests.experiments.test_main import run_main

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The shipped base as the policy (its action space, observation and prompt are part of it).
BASE_POLICY = ("--config.model.name=qwen3_vl", f"--config.model.init_from={BASE}", "--config.env.action_space=elements",
               "--config.env.include_dom_text=True", "--config.rollout.prompt_style=compact",
               "--config.rollout.max_new_tokens=128")


def _metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_the_canopy_recipe_through_the_entrypoint(tmp_path):
    """CANOPY (experiments/configs/canopy.py): the group size comes from a pilot file's floor,
    every update is strictly on-policy (ratio exactly 1, no clipping), the k3 KL to the frozen
    base is part of the loss, and the loss is a token mean over the action tokens alone."""
    config = canopy.get_config()
    tiers = dict(zip(config.env.tasks, config.env.task_tiers))
    # A pilot of 8 samples per task at pass rate 0.5: coverage 0.9 needs a handful, not the recipe's 32.
    records = [{"task": task, "status": "success" if k % 2 else "failure", "success": bool(k % 2)}
               for task in tiers for k in range(8)]
    report = pilot_report(records, tiers, group_size=config.rollout.group_size, target=config.sampler.pilot_target,
                          samples=8)
    floor = report["group_size_floor"]
    assert 2 <= floor < config.rollout.group_size
    pilot = write_pilot_file(tmp_path / "pilot", report)
    workdir = tmp_path / "run"
    result = run_main("--config=experiments/configs/canopy.py", *BASE_POLICY, f"--config.sampler.pilot_file={pilot}",
                      "--config.rollout.max_turns=2", "--config.eval.max_turns=3", "--config.eval.num_seeds=1",
                      "--config.eval.group_size=1", "--config.train.num_steps=2", "--config.train.checkpoint_every=2",
                      "--config.train.progress_bar=False", workdir=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in _metrics(workdir) if "learner/loss" in r]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["episodes/total"] == config.rollout.batch_tasks * floor  # the pilot's group size
        assert metrics["learner/updates"] == 1.0
        assert metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == 1.0 and metrics["learner/clipfrac"] == 0.0
        # Token mean over action tokens: the loss's tokens are exactly the replies' tokens
        # (whole_trajectory: one item per episode, each reply trained once).
        assert metrics["learner/num_tokens"] == pytest.approx(metrics["episode/response_tokens"] * metrics["episodes/trained"])
    assert steps[0]["learner/ref_kl"] == pytest.approx(0.0, abs=1e-7)  # the policy is the reference at first
    assert steps[1]["learner/ref_kl"] > 0  # after an update the k3 estimate measures the drift it anchors

