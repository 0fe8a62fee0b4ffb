"""The trainer on code tasks (env.kind = "code"): two strictly on-policy updates of the
canopy_code recipe (the first one checked in detail), shrunk to two tasks of the code suite,
groups of 2 and 2 turns, on real code containers.

The engine plays one episode of each group with the task's oracle fix (a str_replace, then
submit: the repository's tests judge it inside its container). In the first update the other
episode of one task submits at once, without a patch (CANOPY's terminal constant, -0.2 in the
recipe); the other task's fills its work tree (a resource fault the agent owns under
advantage.agent_faults: a failure that stays in its group and is counted, not a quarantine).
In the second update both are left to the tiny random policy, whose replies are no tool calls
(the turn budget runs out: no verdict). So each group holds a success and a non-success and
every update has a signal. The agent loop asked the code environment for its system prompt and
its parser.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import docker
import numpy as np
import pytest

from cua_jax.environments.code_env import CodeEnvironment
from cua_jax.envs import actions as A
from cua_jax.envs.code_actions import SYSTEM_PROMPT, Bash, Edit, Submit, render_code_action
from cua_jax.envs.contract import AgentEnvironment, EnvironmentWrapper
from cua_jax.rollout.engine import FinishReason, Generation, GenerationRequest, RolloutEngine, SamplingConfig
from cua_jax.tasks.code_suite import oracle_actions
from cua_jax.train.settings import ConfigError, TrainSettings
from cua_jax.types import EpisodeStatus
from experiments.configs import base, canopy_code
from tests.support.configs import flatten
from tests.support.trainer import start_trainer

TASKS = ("code-six-012", "code-inflection-006")
NO_PATCH_TASKS = frozenset({"code-six-012"})  # its non-oracle episode submits at once
FILL_TASKS = frozenset({"code-inflection-006"})  # its non-oracle episode fills the work tree
FILL_COMMAND = "dd if=/dev/zero of=big bs=1M count=200"  # past the 64 MB tmpfs cap


class OracleForOneEpisode(RolloutEngine):
    """Replies with a task's oracle script (its tool calls) to the first request of each task
    at each turn whose earlier replies followed the script; every other request goes to
    `policy`. Tasks are told apart by their instruction in the prompt."""

    def __init__(
        self,
        policy: RolloutEngine,
        tokenizer,
        end_of_turn_id: int,
        scripts: dict[str, tuple[str, list[str]]],
        submit_at_once: frozenset[str] = frozenset(),
        fill_at_once: frozenset[str] = frozenset(),
    ):
        self.policy, self.tokenizer, self.end_of_turn_id = policy, tokenizer, int(end_of_turn_id)
        self.scripts = scripts  # task id -> (instruction, replies)
        self.submit_at_once = submit_at_once  # tasks whose other episode submits without a patch
        self.fill_at_once = fill_at_once  # tasks whose other episode fills its work tree

    def _script_reply(self, text: str, taken: set) -> str | None:
        task_id = next((t for t, (instruction, _) in self.scripts.items() if instruction in text), None)
        if task_id is None:
            return None
        script = self.scripts[task_id][1]
        replies = [chunk.split("<|im_end|>")[0].strip() for chunk in text.split("<|im_start|>assistant")[1:-1]]
        if len(replies) >= len(script) or any(r != s.strip() for r, s in zip(replies, script)):
            return None
        if (task_id, len(replies)) in taken:  # the group's other episode
            if task_id in self.fill_at_once and not replies:
                return render_code_action(Bash(FILL_COMMAND, timeout=60))
            return render_code_action(Submit()) if task_id in self.submit_at_once and not replies else None
        taken.add((task_id, len(replies)))
        return script[len(replies)]

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        taken: set = set()
        out: list[Any] = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
            reply = self._script_reply(text, taken)
            if reply is None:
                out.append(self.policy.generate([request], sampling)[0])
            else:
                ids = np.asarray(
                    [*self.tokenizer.encode(reply, add_special_tokens=False), self.end_of_turn_id], np.int32
                )
                out.append(Generation(ids, np.zeros(len(ids), np.float32), FinishReason.STOP, 0))
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.policy.update_weights(params, version)

    def health(self):
        return self.policy.health()


def code_config(workdir, **overrides):
    """canopy_code shrunk: TASKS, groups of 2, 2 turns, replies long enough for the oracle's."""
    c = canopy_code.get_config()
    c.workdir = str(workdir)
    c.env.code.tasks = TASKS
    c.rollout.group_size = 2
    c.rollout.batch_tasks = 2
    c.rollout.max_turns = 2
    c.rollout.max_context_tokens = 2048
    c.learner.rows = 4
    c.train.num_steps = 1
    c.train.progress_bar = False
    for key, value in overrides.items():
        section, name = key.split("__")
        c[section][name] = value
    return c


def _by_task(batch) -> dict[str, list]:
    by_task: dict[str, list] = {}
    for episode in batch.episodes.values():
        by_task.setdefault(episode.task_id, []).append(episode)
    return by_task


@pytest.fixture(scope="module")
def code_step(tmp_path_factory):
    settings = TrainSettings.from_config(code_config(tmp_path_factory.mktemp("check")))
    tasks = {task_id: settings.catalog[task_id].spec for task_id in TASKS}
    scripts = {
        task_id: (task.instruction, [render_code_action(a) for a in oracle_actions(task)])
        for task_id, task in tasks.items()
    }
    from cua_jax.context.tokenizer import load_processor

    tokenizer, _ = load_processor(None)
    longest = max(
        len(tokenizer.encode(reply, add_special_tokens=False)) for _, replies in scripts.values() for reply in replies
    )
    config = code_config(
        tmp_path_factory.mktemp("code"),
        rollout__max_new_tokens=longest + 1,
        eval__num_seeds=1,
        eval__max_turns=2,
        train__trace_every=1,
    )
    with start_trainer(config) as trainer:
        worker = trainer.workers[0]
        policy = worker.train_loop.engine
        worker.train_loop.engine = OracleForOneEpisode(
            policy, trainer.tokenizer, trainer.renderer.end_of_turn_id, scripts, NO_PATCH_TASKS, FILL_TASKS
        )
        metrics = trainer.train_step()
        first_batch = trainer.last_batch
        # The recipe runs on: a second update on fresh episodes, the non-oracle ones the policy's.
        worker.train_loop.engine = OracleForOneEpisode(
            policy, trainer.tokenizer, trainer.renderer.end_of_turn_id, scripts
        )
        second = trainer.train_step()
        assert math.isfinite(second["learner/loss"]) and second["policy/version"] == 2
        for episodes in _by_task(trainer.last_batch).values():
            oracle, other = sorted(episodes, key=lambda e: e.status is not EpisodeStatus.SUCCESS)
            assert oracle.status is EpisodeStatus.SUCCESS
            # The random policy's replies are no tool calls: invalid actions fed back, no verdict.
            assert other.status is EpisodeStatus.NO_VERDICT and other.info["budget"] == "turns"
            assert other.reward == trainer.settings.advantage.no_verdict_reward
            assert len(other.turns) == 2 and other.turns[1].observation_text.startswith("Invalid action:")
        trainer.last_batch = first_batch
        trainer.evaluate("after")  # the held-out evaluation (the harness) on code containers
        containers = [env.container.id for env in worker.envs["code"] if env.container is not None]
        yield trainer, metrics, containers
    client = docker.from_env()
    for container_id in containers:  # close() removed every container the run started
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(container_id)


@pytest.mark.docker
@pytest.mark.slow
def test_the_canopy_code_recipe_steps_on_code_containers(code_step):
    trainer, metrics, containers = code_step
    assert math.isfinite(metrics["learner/loss"]) and metrics["learner/updates"] == 1.0
    assert metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == 1.0  # strictly on-policy
    assert metrics["learner/grad_norm"] > 0 and metrics["quarantine/total"] == 0
    assert metrics["episodes/trained"] == 4 and metrics["policy/version"] == 1
    # The filled work tree: the agent's fault, counted, its episode kept in its group.
    assert metrics["agent_fault/work_tree_full"] == metrics["agent_fault/total"] == 1.0
    # Only the judged episodes (the oracle's) count; the fix touched nothing but a source file.
    assert metrics["episode/changes_outside_sources"] == metrics["episode/changed_outside_sources_fraction"] == 0.0
    assert len(containers) == 4  # one pooled container per environment of the two groups (reused by step 2)
    for domain in ("six", "inflection"):
        assert metrics[f"domain/{domain}/episodes"] == 2 and metrics[f"domain/{domain}/success_rate"] == 0.5
    by_task = _by_task(trainer.last_batch)
    assert all(episode.system_prompt == SYSTEM_PROMPT for episodes in by_task.values() for episode in episodes)
    assert sorted(by_task) == sorted(TASKS)
    for task_id, episodes in by_task.items():
        oracle, policy = sorted(episodes, key=lambda e: e.status is not EpisodeStatus.SUCCESS)
        # The oracle's fix, parsed as the code environment's actions and judged by the tests.
        assert oracle.status is EpisodeStatus.SUCCESS and oracle.reward == 1.0, (task_id, oracle.info)
        assert [type(turn.action) for turn in oracle.turns] == [Edit, Submit]
        edit = oracle.turns[0].action
        assert oracle.turns[1].observation_text.startswith(f"edited {edit.path}:")  # the editor's answer
        info = oracle.turns[-1].info
        assert info["fail_to_pass_passed"] == info["fail_to_pass_total"] >= 1 and info["broken"] == []
        assert info["changes_outside_sources"] == [] and info["changes_outside_sources_count"] == 0
        if task_id in NO_PATCH_TASKS:  # submitted with the sources untouched: the recipe's -0.2
            assert (
                policy.status is EpisodeStatus.FAILURE
                and policy.reward == -0.2 == trainer.settings.advantage.no_patch_reward
            )
            assert policy.info["end_reason"].startswith("no patch") and len(policy.turns) == 1
            continue
        # The work tree filled by the agent's own command: a failure scored 0 that stays in its group.
        assert task_id in FILL_TASKS and policy.status is EpisodeStatus.FAILURE and policy.reward == 0.0
        assert policy.info["end_reason"].startswith("work tree full") and len(policy.turns) == 1
        assert policy.turns[0].action == Bash(FILL_COMMAND, timeout=60)
    # The held-out evaluation ran both tasks through the harness; traces record code tool calls.
    after = trainer.evaluations["after"]
    assert after["episodes"] + after["given_up"] == 2 and 0.0 <= after["success_rate"] <= 1.0
    import json
    import os

    traces = os.path.join(trainer.workdir, "traces", "train_000000")
    records = [json.load(open(os.path.join(traces, k, "trace.json"))) for k in sorted(os.listdir(traces))]
    turns = [turn for record in records for turn in record["turns"]]
    assert turns and all(turn["action_arguments"] is None and turn["tokens"] for turn in turns)
    assert any(turn["action"].startswith("Edit(") for turn in turns)  # the oracle's traced edit


def test_the_environment_supplies_its_tools_through_wrappers():
    env = EnvironmentWrapper(CodeEnvironment())
    assert env.system_prompt == SYSTEM_PROMPT and "str_replace_editor" in SYSTEM_PROMPT
    assert env.parse_action(render_code_action(Submit()), "coordinates") == Submit()
    # The computer-use default stays the grammar of `actions`.
    click = A.render_action(A.Click("left_click", 10, 20))
    assert EnvironmentWrapper(_Plain()).parse_action(click, "coordinates") == A.Click("left_click", 10, 20)
    assert EnvironmentWrapper(_Plain()).system_prompt is None


class _Plain(AgentEnvironment):
    """The contract's defaults: the computer-use tool."""

    async def _reset(self, task, seed):
        raise NotImplementedError

    async def _step(self, action):
        raise NotImplementedError


def test_the_recipe_passes_the_checks_and_adds_no_field():
    config = canopy_code.get_config()
    settings = TrainSettings.from_config(config)
    assert settings.catalog.kinds == {"code"} and settings.training_tasks == canopy_code.CODE_TASKS
    assert {settings.catalog[t].domain for t in settings.training_tasks} == {t.spec.package for t in settings.catalog}
    assert settings.learner.old_logprobs == "current" and settings.kind_configs["code"].reset_mode == "pooled"
    assert set(flatten(config.to_dict())) == set(flatten(base.base_config().to_dict()))


def test_the_dense_reward_gives_code_verdicts_partial_credit():
    config = canopy_code.get_config()
    for reward, partial_credit in (("sparse", False), ("pass_fraction", True)):
        config.advantage.reward = reward
        assert TrainSettings.from_config(config).kind_configs["code"].partial_credit is partial_credit


@pytest.mark.parametrize(
    "field, value, named, says",
    [
        ("env.code.memory", "lots", "config.env.code.memory", "is not a size"),
        ("env.code.reset_mode", "snapshot", "config.env.code.reset_mode", "not one of ('pooled', 'fresh')"),
        ("env.code.tasks", ("code-six-012", "code-no-such-task"), "config.env.code.tasks", "code-no-such-task"),
        ("env.code.suite_dir", "/nonexistent/code-suite", "config.env.code.suite_dir", "holds no task files"),
        ("env.code.default_timeout", 0.0, "config.env.code.default_timeout", "must be > 0"),
        ("env.code.max_timeout", 10.0, "config.env.code.max_timeout", "is below default_timeout (30.0)"),
        (
            "env.tasks",
            (("click-button", 0),),
            "config.env.tasks",
            "env.kind 'code' takes its tasks from env.code.suite_dir",
        ),
    ],
)
def test_a_bad_code_setting_is_named(tmp_path, field, value, named, says):
    config = code_config(tmp_path)
    *sections, name = field.split(".")
    node = config
    for section in sections:
        node = node[section]
    node[name] = value
    with pytest.raises(ConfigError) as error:
        TrainSettings.from_config(config)
    assert str(error.value).startswith(named) and says in str(error.value), str(error.value)


@pytest.mark.docker
@pytest.mark.slow
def test_a_warm_start_on_code_oracle_demonstrations(tmp_path):
    """warm_start.steps > 0 on a code run: each task's oracle fix, played through the agent loop
    on a code container and judged by the package's tests, becomes the supervised data."""
    config = code_config(
        tmp_path, warm_start__steps=2, warm_start__demos_per_task=1, eval__enabled=False, rollout__max_new_tokens=512
    )
    config.env.code.tasks = TASKS[:1]
    config.rollout.batch_tasks = 1
    with start_trainer(config) as trainer:
        metrics = trainer.warm_start_metrics
    assert metrics["warm_start/demonstrations"] == 1 and metrics["warm_start/rejected"] == 0
    assert math.isfinite(metrics["warm_start/loss_first"]) and metrics["warm_start/items"] >= 1
