"""cua_jax entrypoint: python -m experiments.main --config=experiments/configs/<recipe>.py

Any config field can be overridden on the command line: --config.x.y=value.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/default.py", "Experiment configuration file.", lock_config=True
)


def _run_segmentation_benchmark(config) -> None:
    from experiments.benchmarks import segmentation

    segmentation.main()


JOBS = {
    "segmentation_benchmark": _run_segmentation_benchmark,
}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    config = _CONFIG.value
    if config.job not in JOBS:
        raise app.UsageError(f"config.job={config.job!r} is not one of {sorted(JOBS)}")
    logging.info("running job %s", config.job)
    JOBS[config.job](config)


if __name__ == "__main__":
    app.run(main)
