"""The papers' recipes run through the entrypoint (`python -m experiments.main`), shrunk by sizes
only, with the mechanism each recipe is about asserted from the run's own metrics.

Every recipe keeps its estimator, loss, sampler and segmenter. What is overridden is the size of
the run (group counts, turns, steps; held-out evaluation is off, as the default run's test
covers it) and, where a recipe names a random-init tiny policy, the policy: the shipped base
(experiments/configs/default.py's BASE, which reads the page by element ids), so that updates
have a signal to act on.
"""

from __future__ import annotations

import json

import pytest

from cua_jax.eval.pilot import pilot_report, write_pilot_file
from experiments.configs import canopy, evocua, scalecua
from experiments.configs.default import BASE
from tests.support.entrypoint import run_main

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The shipped base as the policy (its action space, observation and prompt are part of it).
BASE_POLICY = (
    "--config.model.name=qwen3_vl",
    f"--config.model.init_from={BASE}",
    "--config.env.action_space=elements",
    "--config.env.include_dom_text=True",
    "--config.rollout.prompt_style=compact",
    "--config.rollout.max_new_tokens=128",
)


def _metrics(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_the_canopy_recipe_through_the_entrypoint(tmp_path):
    """CANOPY (experiments/configs/canopy.py): the group size comes from a pilot file's floor,
    every update is strictly on-policy (ratio exactly 1, no clipping), the k3 KL to the frozen
    base is part of the loss, and the loss is a token mean over the action tokens alone."""
    config = canopy.get_config()
    tiers = dict(config.env.tasks)
    # A pilot of 8 samples per task at pass rate 0.5: coverage 0.9 needs a handful, not the recipe's 32.
    records = [
        {"task": task, "status": "success" if k % 2 else "failure", "success": bool(k % 2)}
        for task in tiers
        for k in range(8)
    ]
    report = pilot_report(
        records, tiers, group_size=config.rollout.group_size, target=config.sampler.pilot.target, samples=8
    )
    floor = report["group_size_floor"]
    assert 2 <= floor < config.rollout.group_size
    pilot = write_pilot_file(tmp_path / "pilot", report)
    workdir = tmp_path / "run"
    result = run_main(
        "--config=experiments/configs/canopy.py",
        *BASE_POLICY,
        f"--config.sampler.pilot.file={pilot}",
        "--config.rollout.max_turns=2",
        "--config.eval.enabled=False",
        "--config.train.num_steps=2",
        "--config.train.checkpoint_every=2",
        "--config.train.progress_bar=False",
        workdir=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in _metrics(workdir) if "learner/loss" in r]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["episodes/total"] == config.rollout.batch_tasks * floor  # the pilot's group size
        assert metrics["learner/updates"] == 1.0
        assert (
            metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == 1.0 and metrics["learner/clipfrac"] == 0.0
        )
        # Token mean over action tokens: the loss's tokens are exactly the replies' tokens
        # (whole_trajectory: one item per episode, each reply trained once).
        assert metrics["learner/num_tokens"] == pytest.approx(
            metrics["episode/response_tokens"] * metrics["episodes/trained"]
        )
    assert steps[0]["learner/ref_kl"] == pytest.approx(0.0, abs=1e-7)  # the policy is the reference at first
    assert steps[1]["learner/ref_kl"] > 0  # after an update the k3 estimate measures the drift it anchors


def test_the_scalecua_recipe_through_the_entrypoint(tmp_path):
    """ScaleCUA (experiments/configs/scalecua.py): Frontier Sampling draws each batch from the
    32-task pool by eq. 2's weights over the pass rates it tracks, the ratio is against the
    rollout policy's own logprobs under asymmetric and dual clipping, and the sliding window
    splits an episode whose screenshots outgrow it into segments (items)."""
    config = scalecua.get_config()
    workdir = tmp_path / "run"
    result = run_main(
        "--config=experiments/configs/scalecua.py",
        *BASE_POLICY,
        "--config.rollout.batch_tasks=2",
        "--config.rollout.group_size=4",
        "--config.rollout.max_turns=3",
        # The recipe's window (K = Delta = 5) never drops in 3 turns; the smallest one does.
        "--config.context.sliding_window.keep=1",
        "--config.context.sliding_window.min_removal=1",
        "--config.eval.enabled=False",
        "--config.train.num_steps=2",
        "--config.train.checkpoint_every=2",
        "--config.train.progress_bar=False",
        workdir=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in _metrics(workdir) if "learner/loss" in r]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["groups/total"] == 2 and metrics["episodes/total"] == 8
        assert metrics["sampler/active_tasks"] == len(config.env.tasks)
        assert 0 < metrics["sampler/frontier_weight_mean"] <= metrics["sampler/frontier_weight_max"] <= 1
        # rho = pi_theta / pi_rollout: 1 up to the engine-learner gap before the update.
        assert metrics["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["learner/rollout_logprob_gap"] < 1e-3
    # Segments: some episode ran past the window of one screenshot.
    assert max(m["episode/items"] for m in steps) > 1
    # Pass rates were estimated from the first batch's groups, so eq. 2's weights moved.
    assert steps[1]["sampler/estimated_tasks"] >= 2


def test_the_evocua_recipe_through_the_entrypoint(tmp_path):
    """EvoCUA-1.5 (experiments/configs/evocua.py): a pilot of the current policy filters the
    pool to the learnable band and re-estimates it every `calibration.every_k_steps` steps, DTAC draws
    from what is left, STEPO spreads each trajectory's advantage over its step items, and
    training is asynchronous within the staleness window, with whole-group mini-batches."""
    config = evocua.get_config()
    workdir = tmp_path / "run"
    result = run_main(
        "--config=experiments/configs/evocua.py",
        *BASE_POLICY,
        "--config.env.tasks=(('click-button',0),('click-tab',0),('click-widget',1),('focus-text',1))",
        "--config.rollout.batch_tasks=2",
        "--config.rollout.group_size=4",
        "--config.rollout.max_turns=2",
        "--config.train.buffer_groups=2",
        "--config.sampler.pilot.group_size=4",
        "--config.sampler.calibration.every_k_steps=1",
        "--config.sampler.calibration.sample_size=2",
        "--config.sampler.calibration.group_size=2",
        "--config.eval.enabled=False",
        "--config.train.num_steps=2",
        "--config.train.checkpoint_every=2",
        "--config.train.progress_bar=False",
        workdir=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in _metrics(workdir) if "learner/loss" in r]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["learner/updates"] == config.learner.num_minibatches  # whole groups per mini-batch
        assert metrics["policy/lag_max"] <= config.train.staleness_window
        assert "sampler/replay_band_tasks" in metrics and "sampler/replay_cache" in metrics
        assert "sampler/tier_0/pass_rate" in metrics and "sampler/tier_1/pass_rate" in metrics
        # STEPO: one item per step under compact_context, so items outnumber episodes.
        assert metrics["episode/items"] >= 1
    # The pilot filtered the pool before the first draw, and calibration ran again after it.
    assert steps[-1]["sampler/calibrations"] >= 2
    assert steps[0]["sampler/active_tasks"] < 4  # focus-text (the base solves it) left the band
