"""Pretrain a base policy: python -m experiments.pretrain --config=experiments/configs/pretrain.py

Supervised learning on the MiniWoB oracle's demonstrations across tasks, resumable (rerun
the same command with the same --workdir to continue), exported as a Hugging Face directory
with a manifest (cua_jax.train.pretrain). --config.x.y=value overrides any field.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from cua_jax.observe.logs import quiet_library_logging

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/pretrain.py", "Pretraining configuration file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (replaces config.workdir); rerun to resume.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    quiet_library_logging()  # the run's own lines; libraries' warnings and errors (before JAX loads)
    from cua_jax.train.pretrain import Pretrainer
    from cua_jax.train.settings import ConfigError, TrainSettings, pretrain_settings

    config = _CONFIG.value
    if _WORKDIR.value:
        config.workdir = _WORKDIR.value
    try:
        pretrainer = Pretrainer(TrainSettings.from_config(config), pretrain_settings(config))
    except ConfigError as error:
        raise app.UsageError(str(error)) from error
    try:
        manifest = pretrainer.run()
    finally:
        pretrainer.close()
    held_out, success = manifest["held_out"], manifest["held_out_success"]
    print(f"pretrained {manifest['steps']} steps in {manifest['wall_seconds']:.0f} s -> {pretrainer.export_dir()}")
    print(
        f"held-out pages: {held_out['held_out_nll']:.3f} nats per reply token"
        + (
            f"; click-target digits {held_out['held_out_click_nll']:.3f} nats each, against "
            f"{held_out['click_prior_nll']:.3f} for a page-blind prior"
            if "held_out_click_nll" in held_out
            else ""
        )
    )
    print(
        f"greedy held-out success {success['success_rate']:.3f} over {success['episodes']} episodes: "
        + json.dumps(success["per_task"])
    )


if __name__ == "__main__":
    app.run(main)
