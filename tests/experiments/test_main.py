"""The entrypoint's command line: a bad config field or job is refused before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.entrypoint import ROOT, run_main


def test_a_malformed_field_stops_the_run_naming_it(tmp_path):
    result = run_main(
        "--config=experiments/configs/canopy.py", "--config.loss.clip_eps_low=1.5", workdir=tmp_path / "run"
    )
    assert result.returncode != 0
    assert "config.loss.clip_eps_low" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the trainer started


def test_an_unknown_job_is_named(tmp_path):
    result = run_main("--config=experiments/configs/default.py", "--config.job=nope", workdir=tmp_path)
    assert result.returncode != 0 and "config.job='nope' is not one of" in result.stderr


@pytest.mark.browser
@pytest.mark.slow
def test_the_default_run_end_to_end_at_tiny_scale(tmp_path):
    """The README's main job, shrunk by overrides only (one of its tasks): the shipped base
    loaded, evaluation before (at the training temperature and greedy), three RL steps with an
    evaluation between them, evaluation after with the gains' intervals (overall, greedy, per
    task), the training trend's slope, and every artefact in the workdir."""
    workdir = tmp_path / "run"
    overrides = [
        "--config.env.tasks=(('click-tab',0),)",
        "--config.rollout.group_size=2",
        "--config.rollout.batch_tasks=1",
        "--config.rollout.max_turns=1",
        "--config.eval.num_seeds=2",
        "--config.eval.max_turns=1",
        "--config.train.num_steps=3",
        "--config.eval.every_steps=2",
        "--config.train.progress_bar=False",
    ]
    result = run_main("--config=experiments/configs/default.py", *overrides, workdir=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "held-out success before:" in out and "held-out success after:" in out
    assert "held-out success after - before:" in out and "Newcombe 95%" in out
    # The headline at the training temperature, then greedy decoding on the same seeds, then
    # per task, then the training trend.
    assert "held-out evaluation at temperature 1 (training samples at 1):" in out
    assert "held-out success before, temperature 0:" in out and "held-out success after, temperature 0:" in out
    assert out.index("paired by seed (2 seeds,") < out.index("paired by seed, temperature 0 (2 seeds,")
    assert out.index("paired by seed, temperature 0") < out.index("  click-tab: ")
    assert "training success per update (fresh pages each update), least-squares slope over 3 updates:" in out
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 3 and not summary["warm_start"]  # the base needs none
    assert summary["evaluations"]["step_2"]["episodes"] + summary["evaluations"]["step_2"]["given_up"] == 2
    greedy = summary["evaluations"]["gain_low_temperature"]
    assert greedy["paired_episodes"] + summary["evaluations"]["after_low_temperature"]["given_up"] == 2
    task_gain = summary["evaluations"]["gain"]["per_task"]["click-tab"]
    assert task_gain["paired_difference"] == pytest.approx(summary["evaluations"]["gain"]["paired_difference"])
    for when in ("before", "after"):  # one task: its counts are the evaluation's
        assert task_gain[f"episodes_{when}"] == summary["evaluations"][when]["episodes"]
        assert task_gain[f"successes_{when}"] == summary["evaluations"][when]["successes"]
    trend = summary["training_trend"]
    assert trend["updates"] == 3 and trend["ci_low"] <= trend["slope"] <= trend["ci_high"]
    gain = summary["evaluations"]["gain"]
    assert gain["ci_low"] <= gain["difference"] <= gain["ci_high"]
    # One episode per held-out seed: the gain is also paired by seed, over the same episodes.
    assert "paired by seed (2 seeds," in result.stdout
    assert gain["paired_episodes"] == 2 and gain["paired_difference"] == pytest.approx(gain["difference"])
    assert gain["paired_ci_low"] <= gain["paired_difference"] <= gain["paired_ci_high"]
    outcomes = summary["evaluations"]["before"]["outcomes"]
    assert sorted(outcomes) == ["click-tab/1000000/0", "click-tab/1000001/0"]
    assert set(outcomes.values()) <= {0, 1}
    # The evaluations ran through the evaluation harness: its results file and tables.
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any("groups/tier_0/informative_fraction" in r for r in records)  # live coverage per tier
    for path in (
        "evals/before_000000/results.jsonl",
        "evals/step_2_000002/results.md",
        "evals/after_000003/results.md",
        "evals/before_low_temperature_000000/results.md",
        "evals/after_low_temperature_000003/results.md",
        "metrics.jsonl",
        "learning_curve.png",
        "traces/before/00/trace.json",
        "traces/after/00/trace.json",
        "checkpoints",
    ):
        assert (workdir / path).exists(), path
    assert any((workdir / "tensorboard").iterdir())
    # A workdir that holds checkpoints is not trained over without --resume.
    again = run_main("--config=experiments/configs/default.py", *overrides, workdir=workdir)
    assert again.returncode != 0 and "pass --resume" in again.stderr


@pytest.mark.browser
@pytest.mark.vllm
@pytest.mark.slow
def test_text_policy_on_vllm_through_the_entrypoint_then_exported(tmp_path):
    """experiments/configs/text_vllm.py shrunk by overrides: a text-only Qwen3 whose rollouts
    come from a vLLM engine in a Ray actor, trained one step, evaluated, then exported by
    `python -m experiments.export` into a directory transformers loads. It runs in coordinated
    mode (train.coordinated, one process), as each process of a multi-host run does: the engine
    serves this process's own export of a host copy of the policy, synced from host copies, and
    the evaluations run with the process group (one process: every seed its own)."""
    workdir = tmp_path / "run"
    overrides = [
        "--config.train.coordinated=true",
        "--config.rollout.seed_per_turn=true",
        "--config.env.tasks=(('click-button',0),)",
        "--config.rollout.group_size=2",
        "--config.rollout.batch_tasks=1",
        "--config.rollout.max_turns=1",
        "--config.rollout.max_new_tokens=16",
        "--config.eval.num_seeds=1",
        "--config.eval.max_turns=1",
        "--config.train.num_steps=1",
        "--config.train.progress_bar=False",
    ]
    result = run_main("--config=experiments/configs/text_vllm.py", *overrides, workdir=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out success after:" in result.stdout
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "learner/rollout_logprob_gap" in r)
    assert step["learner/rollout_logprob_gap"] < 1e-3 and "learner/rollout_logprob_gap_max" in step
    assert step["policy/version"] == 1.0
    assert (workdir / "engine_model" / "process_0" / "config.json").is_file()  # this process's own export
    out = tmp_path / "export"
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    exported = subprocess.run(
        [sys.executable, "-m", "experiments.export", f"--workdir={workdir}", f"--out={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(str(out))).__name__ == "Qwen3ForCausalLM"
