"""Environment kinds as plugins (`cua_jax.environments.kinds`): the checker over every
registered kind, the contract's one fault rule, and a kind that lives in one module
(tests/support/http_page_kind.py) trained on by naming that module in the run config."""

from __future__ import annotations

import asyncio
import json
import math

import ml_collections
import pytest

import cua_jax.environments.webapp_env  # noqa: F401 - registers the webapp kind, which the checker covers
import tests.support.http_page_kind as http_page
from cua_jax.environments.check import EnvironmentCheckError, check_env, check_kind
from cua_jax.environments.kinds import kind_names
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvironmentFault, EnvReset, EnvTransition
from cua_jax.envs.faults import FaultKind
from cua_jax.rollout.rollout_worker import RemoteRolloutWorker, RolloutWorkerConfig
from cua_jax.types import EpisodeStatus
from tests.support.entrypoint import run_main
from tests.support.trainer import tiny_config


def _miniwob():
    return RolloutWorkerConfig(), "click-button"


def _desktop():
    from cua_jax.envs.docker_pool import PoolConfig
    from cua_jax.envs.images import ensure_image
    from cua_jax.tasks.schema import load_suite
    from cua_jax.tasks.suites.desktop.solutions import SUITE_DIR

    task = next(task for task in load_suite(SUITE_DIR) if task.id == "terminal-create-file")
    return RolloutWorkerConfig(kind_configs={"desktop": PoolConfig(image=ensure_image("desktop"), size=1)}), task


def _code():
    from cua_jax.environments.code_env import CodeEnvConfig
    from cua_jax.tasks.code_tasks import load_code_task
    from tests.support.code_env import SUITE

    return RolloutWorkerConfig(kind_configs={"code": CodeEnvConfig(default_timeout=20)}), load_code_task(
        SUITE / "code-inflection-000.json"
    )


def _http_page():
    return RolloutWorkerConfig(), "read-word"


def _webapp():
    from cua_jax.environments.webapp_env import WebappConfig, webapp_tasks

    config = WebappConfig(tasks=("trac-001",), viewport=(640, 480))
    return RolloutWorkerConfig(kind_configs={"webapp": config}), webapp_tasks(config)[0].spec


# Each registered kind's check: (what it needs, marks, its worker config and a task). A kind
# without a case fails test_every_registered_kind_is_checked; one whose infrastructure this
# machine lacks is deselected by its mark (docker, browser), never skipped unseen.
CASES = {
    "miniwob": ((pytest.mark.browser,), _miniwob),
    "desktop": ((pytest.mark.docker, pytest.mark.slow), _desktop),
    "code": ((pytest.mark.docker, pytest.mark.slow), _code),
    http_page.KIND: ((), _http_page),
    "webapp": ((pytest.mark.browser,), _webapp),
}


def test_every_registered_kind_is_checked():
    assert set(kind_names()) == set(CASES)


@pytest.mark.parametrize("kind", [pytest.param(name, marks=marks) for name, (marks, _) in CASES.items()])
def test_every_registered_kind_keeps_the_contract(kind):
    worker_config, task = CASES[kind][1]()
    check_kind(kind, worker_config, task)


def test_the_checker_names_a_broken_rule():
    class ForgetsTheMessage(http_page.HttpPageEnvironment):
        async def _step(self, action):
            return EnvTransition(http_page.render(self.word))  # no feedback

    server = http_page.PageServer(http_page.HttpPageConfig())
    try:
        with pytest.raises(EnvironmentCheckError, match="does not show its message"):
            asyncio.run(check_env(ForgetsTheMessage(server), "read-word"))
    finally:
        server.close()


def test_reset_and_step_are_final_and_apply_the_one_fault_rule():
    with pytest.raises(TypeError, match=r"overrides \['step'\].*\['_step'\]"):

        class OwnStep(AgentEnvironment):  # defining it is the test
            async def _reset(self, task, seed):
                raise NotImplementedError

            async def step(self, action):
                raise NotImplementedError

    class Raising(AgentEnvironment):
        def __init__(self, error):
            self.error = error

        async def _reset(self, task, seed):
            raise self.error

        async def _step(self, action):
            raise self.error

    # An infrastructure error quarantines: a step returns the fault, a reset raises it.
    step = asyncio.run(Raising(ConnectionResetError("peer gone")).step(A.Done()))
    assert step.outcome.status is EpisodeStatus.QUARANTINED and step.fault.kind is FaultKind.SERVER_UNRESPONSIVE
    with pytest.raises(EnvironmentFault) as fault:
        asyncio.run(Raising(ConnectionResetError("peer gone")).reset("task"))
    assert fault.value.fault.kind is FaultKind.SETUP_FAILED
    # A bug raises, unchanged.
    for call in (lambda env: env.step(A.Done()), lambda env: env.reset("task")):
        with pytest.raises(KeyError, match="a bug"):
            asyncio.run(call(Raising(KeyError("a bug"))))


def test_a_plugin_kind_whose_server_is_gone_quarantines_its_episodes():
    server = http_page.PageServer(http_page.HttpPageConfig())
    env = http_page.HttpPageEnvironment(server)
    start = asyncio.run(env.reset("read-word", 3))
    assert isinstance(start, EnvReset) and start.observation.images[0].shape == (120, 160, 3)
    with pytest.raises(ValueError, match="no page"):  # the caller's error, not a fault
        asyncio.run(env.reset("no-such-page", 0))
    server.close()
    with pytest.raises(EnvironmentFault) as fault:  # the server refuses: a real connection error
        asyncio.run(env.reset("read-word", 3))
    assert fault.value.fault.kind is FaultKind.SETUP_FAILED


@pytest.mark.slow
def test_a_plugin_kind_trains_from_its_module_alone(tmp_path):
    from cua_jax.train.settings import ConfigError, TrainSettings
    from tests.support.trainer import start_trainer

    config = tiny_config(
        tmp_path / "run",
        env__kind=http_page.KIND,
        env__kind_modules=("tests.support.http_page_kind",),
        env__tasks=(),
        train__num_steps=1,
    )
    bad = config.copy_and_resolve_references()
    bad.env.kind_modules = ("tests.support.no_such_kind",)
    with pytest.raises(ConfigError, match="config.env.kind_modules"):
        TrainSettings.from_config(bad)
    # The kind's config comes from a section env.<kind> when the config has one.
    sectioned = config.copy_and_resolve_references()
    sectioned.env.http_page = ml_collections.ConfigDict({"tasks": ("read-word", "read-it-again"), "timeout_s": 5.0})
    assert TrainSettings.from_config(sectioned).kind_configs[http_page.KIND] == http_page.HttpPageConfig(
        ("read-word", "read-it-again"), 5.0
    )
    sectioned.env.http_page.timeout_s = -1.0
    with pytest.raises(ConfigError, match=r"config.env.http_page.timeout_s: timeout_s must be > 0"):
        TrainSettings.from_config(sectioned)
    # The worker in a Ray actor (it imports env.kind_modules itself); the command-line run below
    # keeps it in the trainer's process, so both backends carry the kind.
    config.rollout.worker_backend = "ray"
    trainer = start_trainer(config)
    try:
        assert isinstance(trainer.workers[0], RemoteRolloutWorker)
        assert trainer.settings.catalog.kinds == {http_page.KIND}
        metrics = trainer.train_step()
        assert math.isfinite(metrics["learner/loss"]) and metrics["episodes/trained"] == 4
        assert metrics["quarantine/total"] == 0
        assert trainer.workers[0].environment_stats()[f"{http_page.KIND}/requests"] >= 4
    finally:
        trainer.close()
    # The same run from the command line: the module and the kind named by flags alone.
    workdir = tmp_path / "main"
    result = run_main(
        "--config=experiments/configs/tiny.py",
        "--config.env.kind_modules=('tests.support.http_page_kind',)",
        f"--config.env.kind={http_page.KIND}",
        "--config.env.tasks=()",
        "--config.train.num_steps=1",
        "--config.train.progress_bar=False",
        workdir=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 1
    episodes = [json.loads(line) for line in (workdir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["domain"] for e in episodes} == {http_page.KIND}
