"""Config fields renamed since runs were saved: a saved config (a run's checkpoint for --resume,
`experiments.evaluate --policy=<workdir>`, a base's manifest recipe) is read through this table
by `base.config_from_dict`, each rename logged, so older runs still load with every value kept.

RENAMED maps a field's old full name to its new one; a field renamed twice maps its oldest name
straight to today's. An entry is kept for as long as saved runs may hold the old name. Beside
the table, env.task_tiers (a tier per task of env.tasks) merges into env.tasks' (task, tier)
records."""

from __future__ import annotations

import copy
import logging
from typing import Any

RENAMED = {
    # The sampler's fields, nested by the dataclass each fills (was one flat section).
    "sampler.mu": "sampler.frontier.mu",
    "sampler.sigma": "sampler.frontier.sigma",
    "sampler.gamma": "sampler.frontier.gamma",
    "sampler.pool_factor": "sampler.frontier.pool_factor",
    "sampler.p_low": "sampler.dtac.p_low",
    "sampler.p_high": "sampler.dtac.p_high",
    "sampler.max_replays_per_trajectory": "sampler.dtac.max_replays_per_trajectory",
    "sampler.replay_cache_size": "sampler.dtac.replay_cache_size",
    "sampler.rho_inf": "sampler.dtac.rho_inf",
    "sampler.curriculum_difficulty": "sampler.curriculum.difficulty",
    "sampler.curriculum_start": "sampler.curriculum.start",
    "sampler.curriculum_steps": "sampler.curriculum.steps",
    "sampler.curriculum_schedule": "sampler.curriculum.schedule",
    "sampler.calibration": "sampler.calibration.enabled",  # was a switch, now its section's
    "sampler.p_min": "sampler.calibration.p_min",
    "sampler.p_max": "sampler.calibration.p_max",
    "sampler.calibrate_every": "sampler.calibration.every_k_steps",
    "sampler.calibration_sample_size": "sampler.calibration.sample_size",
    "sampler.calibration_group_size": "sampler.calibration.group_size",
    "sampler.pilot": "sampler.pilot.enabled",  # was a switch, now its section's
    "sampler.pilot_group_size": "sampler.pilot.group_size",
    "sampler.pilot_target": "sampler.pilot.target",
    "sampler.pilot_file": "sampler.pilot.file",
    # The environment kinds' sections, named as their config dataclasses' fields.
    "env.desktop.pool_size": "env.desktop.size",
    "env.desktop.ready_timeout_s": "env.desktop.ready_timeout",
    "env.desktop.call_timeout_s": "env.desktop.call_timeout",
    "env.desktop.health_interval_s": "env.desktop.health_interval",
    "env.code.bash_timeout_s": "env.code.default_timeout",
    "env.code.max_bash_timeout_s": "env.code.max_timeout",
    # The segmenters' options, a section per segmenter (was one flat section).
    "context.keep": "context.sliding_window.keep",
    "context.min_removal": "context.sliding_window.min_removal",
    "context.keep_images": "context.step_wise.keep_images",
    "context.window": "context.compact_context.window",
}


def renamed(saved: dict[str, Any]) -> dict[str, Any]:
    """A copy of the saved config (nested dicts) with every field of RENAMED under its new name.
    An old name is moved only where it holds a value, not a section: a section of today's
    config may carry the name a value had before (sampler.calibration)."""
    saved = copy.deepcopy(saved)
    moved = {}
    for old, new in RENAMED.items():
        *parents, name = old.split(".")
        section = _section(saved, parents)
        if section is not None and name in section and not isinstance(section[name], dict):
            moved[new] = section.pop(name)
            logging.info("saved config: config.%s is now config.%s", old, new)
    for new, value in moved.items():
        *parents, name = new.split(".")
        section = saved
        for parent in parents:
            section = section.setdefault(parent, {})
        section[name] = value
    env = saved.get("env")
    if isinstance(env, dict) and "task_tiers" in env:
        tiers, tasks = env.pop("task_tiers"), env.get("tasks", [])
        if len(tiers) != len(tasks):
            raise ValueError(f"config.env.task_tiers: {len(tiers)} tiers for the {len(tasks)} tasks of env.tasks")
        env["tasks"] = [[task, tier] for task, tier in zip(tasks, tiers)]
        logging.info(
            "saved config: config.env.task_tiers is now the tier of each (task, tier) record of config.env.tasks"
        )
    return saved


def _section(config: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    for name in path:
        config = config.get(name)
        if not isinstance(config, dict):
            return None
    return config
