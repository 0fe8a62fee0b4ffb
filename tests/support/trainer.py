"""Trainer configs for tests."""

from __future__ import annotations

from cua_jax.observe.metrics import TIMING_PREFIX
from experiments.configs import tiny


def tiny_config(workdir, **train):
    """experiments/configs/tiny.py in `workdir`, with section__field=value overrides."""
    c = tiny.get_config()
    c.workdir = str(workdir)
    for key, value in train.items():
        section, name = key.split("__")
        c[section][name] = value
    return c


# What a restored run need not repeat: timings, and the capsule runtime's counters (pages
# loaded or restarted, crashes), which count the worker's live pages, not the checkpoint.
NOT_REPLAYED = (TIMING_PREFIX, "capsules/")


def replayed_metrics(metrics):
    """The metrics a resumed run reproduces exactly (all but NOT_REPLAYED's)."""
    return {k: v for k, v in metrics.items() if not k.startswith(NOT_REPLAYED)}


def start_trainer(config, *, env_wrapper=None):
    """The run's trainer as experiments.main builds it: the setup, its warm start (nothing
    without warm_start.steps or when resuming), the trainer."""
    from cua_jax.train.trainer import build_trainer, prepare_run, warm_start

    setup = prepare_run(config)
    warm_start(setup)
    return build_trainer(setup, env_wrapper=env_wrapper)
