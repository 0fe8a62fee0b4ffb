"""cua_jax entrypoint: python -m experiments.main --config=experiments/configs/<recipe>.py

Any config field can be overridden on the command line: --config.x.y=value. The config's
`job` picks what runs:

  train                    online RL (cua_jax.train.trainer): the warm start, evaluation
                           before, training with checkpoints, evaluation after, learning curve
  segmentation_benchmark   the Visual Context Segmentation benchmark

Flags: --workdir replaces config.workdir; --resume continues the run checkpointed in the
workdir (a killed run picks up at its last checkpoint). A workdir that holds checkpoints is
never trained over without --resume.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging
from ml_collections import config_flags

from cua_jax.observe.logs import quiet_library_logging

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/default.py", "Experiment configuration file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (replaces config.workdir).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run checkpointed in the workdir.")


def _run_segmentation_benchmark(config) -> None:
    from experiments.benchmarks import segmentation

    segmentation.main()


def _run_training(config) -> None:
    from cua_jax.train.settings import ConfigError, TrainSettings
    from cua_jax.train.trainer import build_trainer, prepare_run, warm_start

    try:
        TrainSettings.from_config(config)  # every field checked before anything starts
    except ConfigError as error:
        raise app.UsageError(str(error)) from error
    setup = prepare_run(config)
    latest = setup.checkpointer.latest_step()
    if latest is not None and not _RESUME.value:
        setup.checkpointer.close()
        raise app.UsageError(
            f"{config.workdir} holds checkpoints (latest step {latest}); pass --resume to continue "
            "that run, or choose another --workdir"
        )
    # The warm start: supervised fine-tuning on the oracle's demonstrations before anything copies
    # the policy; a resumed run's checkpoint holds its result, so it does not run again.
    warm_start(setup)
    with build_trainer(setup) as trainer:
        if _RESUME.value:
            if trainer.restore():
                logging.info("resumed %s at step %d", config.workdir, trainer.step)
            else:
                logging.info("--resume: no checkpoint in %s, starting fresh", config.workdir)
        summary = trainer.run()
    for line in report_lines(summary, config):
        print(line)
    print(
        json.dumps({"workdir": os.path.abspath(config.workdir), "steps": summary["steps"], "curve": summary["curve"]})
    )


def _gain_lines(gain, level: str, label: str = "") -> list[str]:
    lines = [
        f"held-out success after - before{label}: {gain['difference']:+.3f}, Newcombe {level} "
        f"[{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}] (independent samples)"
    ]
    if "paired_difference" in gain:
        lines.append(
            f"paired by seed{label} ({int(gain['paired_episodes'])} seeds, {int(gain['gained'])} gained, "
            f"{int(gain['lost'])} lost): {gain['paired_difference']:+.3f}, Newcombe {level} "
            f"[{gain['paired_ci_low']:+.3f}, {gain['paired_ci_high']:+.3f}]"
        )
    return lines


def report_lines(summary, config) -> list[str]:
    """What a training run prints at its end, headline first: held-out success before and
    after at eval.temperature with the gain (unpaired, then paired by seed); the same at
    eval.low_temperature when it ran; each task's before and after with its paired gain; the
    trend of training success per update with its interval."""
    from cua_jax.train.trainer import LOW_TEMPERATURE_AFTER, LOW_TEMPERATURE_BEFORE, LOW_TEMPERATURE_GAIN

    lines = []
    warm = summary["warm_start"]
    if "warm_start/held_out_click_nll" in warm:
        lines.append(
            f"warm start, held-out pages: {warm['warm_start/held_out_nll']:.3f} nats per reply token; "
            f"click-point digits {warm['warm_start/held_out_click_nll']:.3f} nats each, against "
            f"{warm['warm_start/click_prior_nll']:.3f} for a page-blind prior (0 if read off the page)"
        )
    evaluations = summary["evaluations"]
    level = f"{100 * config.eval.confidence:g}%"

    def rate_line(label, result, suffix=""):
        return (
            f"held-out success {label}{suffix}: {result['success_rate']:.3f} ({int(result['successes'])}/"
            f"{int(result['episodes'])} episodes), Wilson {level} [{result['ci_low']:.3f}, {result['ci_high']:.3f}]"
        )

    low_labels = (LOW_TEMPERATURE_BEFORE, LOW_TEMPERATURE_AFTER, LOW_TEMPERATURE_GAIN)
    headline = {k: v for k, v in evaluations.items() if k not in low_labels and not k.startswith("gain")}
    if "before" in evaluations:
        lines.append(
            f"held-out evaluation at temperature {config.eval.temperature:g} "
            f"(training samples at {config.rollout.temperature:g}):"
        )
    for label, result in headline.items():
        lines.append(rate_line(label, result))
    gain = evaluations.get("gain")
    if gain is not None:
        lines += _gain_lines(gain, level)
    if LOW_TEMPERATURE_GAIN in evaluations:
        at = f", temperature {config.eval.low_temperature:g}"
        lines.append(rate_line("before", evaluations[LOW_TEMPERATURE_BEFORE], at))
        lines.append(rate_line("after", evaluations[LOW_TEMPERATURE_AFTER], at))
        lines += _gain_lines(evaluations[LOW_TEMPERATURE_GAIN], level, at)
    per_task = (gain or {}).get("per_task", {})
    if per_task:
        lines.append(f"per task at temperature {config.eval.temperature:g}, successes before -> after:")
    for task, task_gain in per_task.items():
        line = (
            f"  {task}: {int(task_gain['successes_before'])}/{int(task_gain['episodes_before'])} -> "
            f"{int(task_gain['successes_after'])}/{int(task_gain['episodes_after'])}"
        )
        if "paired_difference" in task_gain:
            line += (
                f", paired {task_gain['paired_difference']:+.3f} "
                f"[{task_gain['paired_ci_low']:+.3f}, {task_gain['paired_ci_high']:+.3f}]"
            )
        lines.append(line)
    trend = summary.get("training_trend")
    if trend:
        lines.append(
            f"training success per update (fresh pages each update), least-squares slope over "
            f"{int(trend['updates'])} updates: {trend['slope']:+.4f}, {level} [{trend['ci_low']:+.4f}, "
            f"{trend['ci_high']:+.4f}]; fitted {trend['fitted_first']:.3f} at the first update, "
            f"{trend['fitted_last']:.3f} at the last"
        )
    return lines


JOBS = {
    "train": _run_training,
    "segmentation_benchmark": _run_segmentation_benchmark,
}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    quiet_library_logging()  # the run's own INFO lines; libraries' warnings and errors only
    config = _CONFIG.value
    if _WORKDIR.value:
        config.workdir = _WORKDIR.value
    if config.job not in JOBS:
        raise app.UsageError(f"config.job={config.job!r} is not one of {sorted(JOBS)}")
    logging.info("running job %s", config.job)
    JOBS[config.job](config)


if __name__ == "__main__":
    app.run(main)
