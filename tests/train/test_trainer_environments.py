"""The trainer on every environment: a mixed run of MiniWoB++ capsules and real Docker desktops.

One strictly on-policy update over a mixed task catalog (env.kind = "mixed"): MiniWoB's
click-button and three tasks of the desktop suite (a terminal, a settings file, an
infeasible request), copied into a task folder. The engine plays scripts through the
engine interface: on each desktop task one episode of the group replies with the suite's
solution and the other with its wrong solution, so the judges run inside the containers and
return both verdicts; on click-button the MiniWoB oracle plays one episode and the tiny
random policy the other. One container is SIGKILLed under its first step: that episode,
and only it, is quarantined as `container exited`. Groups start from one state
(rollout.group_start = "shared"): the capsule group's second episode is a fork of the first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.contract import EnvironmentWrapper
from cua_jax.rollout.engine import FinishReason, Generation, GenerationRequest, RolloutEngine, SamplingConfig
from cua_jax.rollout.oracle_engine import OracleDemonstrator
from cua_jax.tasks.schema import load_suite
from cua_jax.tasks.suites.desktop.solutions import SOLUTIONS, SUITE_DIR, WRONG_SOLUTIONS
from cua_jax.types import EpisodeStatus
from tests.support.trainer import start_trainer, tiny_config

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.slow]

DESKTOP_TASKS = ("terminal-create-file", "write-settings-json", "infeasible-photo-editor")
KILLED_TASK = "write-settings-json"
MINIWOB_TASK = "click-button"


def desktop_folder(root) -> str:
    """A task folder holding three tasks of the desktop suite (and the files they read)."""
    folder = os.path.join(root, "desktop")
    os.makedirs(folder)
    for path in SUITE_DIR.glob("*.json"):
        if json.loads(path.read_text())["id"] in DESKTOP_TASKS:
            shutil.copy(path, folder)
    shutil.copytree(SUITE_DIR / "files", os.path.join(folder, "files"))
    return folder


class ScriptedEngine(RolloutEngine):
    """Desktop prompts: the first episode of each task's group in a batch follows its solution
    script, the second its wrong one (told apart by the replies in the prompt); scripts are
    task id -> (solution, wrong solution), reply texts. Other prompts: the oracle (when given)
    answers the first request of each distinct first-turn prompt, the policy the rest."""

    def __init__(
        self, policy: RolloutEngine, oracle: OracleDemonstrator | None, tokenizer, end_of_turn_id: int, tasks, scripts
    ):
        self.policy, self.oracle = policy, oracle
        self.tokenizer, self.end_of_turn_id = tokenizer, int(end_of_turn_id)
        self.instructions = {task.id: task.instruction for task in tasks}
        self.scripts = scripts

    def _script(self, text: str, taken: dict) -> str | None:
        task_id = next((t for t, instruction in self.instructions.items() if instruction in text), None)
        if task_id is None:
            return None
        replies = [chunk.split("<|im_end|>")[0].strip() for chunk in text.split("<|im_start|>assistant")[1:-1]]
        scripts = [
            script
            for script in self.scripts[task_id]
            if all(reply == done.strip() for reply, done in zip(replies, script))
        ]
        if len(scripts) > 1:  # both scripts agree so far: the first request takes the solution
            scripts = scripts[taken.setdefault((task_id, len(replies)), 0) :]
            taken[(task_id, len(replies))] += 1
        return scripts[0][len(replies)]

    def _reply(self, text: str) -> Generation:
        ids = np.asarray([*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn_id], np.int32)
        return Generation(ids, np.zeros(len(ids), np.float32), FinishReason.STOP, 0)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        taken: dict = {}
        seen: set[bytes] = set()
        out: list[Any] = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
            script = self._script(text, taken)
            if script is not None:
                out.append(self._reply(script))
            elif (
                self.oracle is not None
                and "<|im_start|>assistant" not in text.rsplit("<|im_start|>assistant", 1)[0]
                and request.prompt_ids.tobytes() not in seen
            ):  # a first turn, the first of its prompt
                seen.add(request.prompt_ids.tobytes())
                out.append(self.oracle.generate([request], sampling)[0])
            else:
                out.append(self.policy.generate([request], sampling)[0])
        return out

    def update_weights(self, params: Any, version: int) -> None:
        self.policy.update_weights(params, version)

    def health(self):
        return self.policy.health()


class KillFirstStepOf(EnvironmentWrapper):
    """SIGKILLs the container under the first step of the first desktop episode of `task_id`
    (as an OOM kill or a crash would), then steps as usual."""

    armed = {"left": 1}

    async def _step(self, action):
        episode = getattr(self.env, "episode", None)
        if episode is not None and episode.task.id == KILLED_TASK and self.armed["left"] and not episode.history:
            self.armed["left"] -= 1
            self.env.pool.docker.api.kill(episode.env.container_id)
        return await self.env.step(action)


@pytest.fixture(scope="module")
def mixed_step(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    config = tiny_config(
        root / "run",
        env__include_dom_text=True,
        rollout__group_size=2,
        rollout__batch_tasks=4,
        rollout__max_turns=5,
        rollout__max_new_tokens=96,
        rollout__max_context_tokens=2048,
        rollout__prompt_style="compact",
        rollout__group_start="shared",
    )
    config.env.kind = "mixed"
    config.env.tasks = ((MINIWOB_TASK, 0),)
    config.env.task_dirs = (desktop_folder(root),)
    config.env.domain_weights = ("desktop=3", "miniwob=1")
    config.env.desktop.size = 4  # two desktop groups at a time
    config.env.desktop.screen = "800x500"
    config.env.capsules.renderers = 3  # reaches the worker's capsule runtime
    config.env.capsules.warm_pages = 1
    with start_trainer(config, env_wrapper=KillFirstStepOf) as trainer:
        worker = trainer.workers[0]
        oracle = OracleDemonstrator(trainer.tokenizer, trainer.renderer.end_of_turn_id, MINIWOB_TASK, reasoning=False)
        worker.train_loop.engine = ScriptedEngine(
            worker.train_loop.engine,
            oracle,
            trainer.tokenizer,
            trainer.renderer.end_of_turn_id,
            load_suite(config.env.task_dirs[0]),
            {t: (SOLUTIONS[t], WRONG_SOLUTIONS[t]) for t in DESKTOP_TASKS},
        )
        metrics = trainer.train_step()
        publications = list(worker.runtime.publications)
        capsules = (worker.runtime.backend.renderers, worker.runtime.warm_pages, dict(worker.runtime.fork_methods))
        with open(os.path.join(config.workdir, "episodes.jsonl")) as f:
            logged = [json.loads(line) for line in f]
        engine_stats = worker.engine_stats()
        yield trainer, metrics, (publications, capsules), logged, oracle, engine_stats


def test_desktop_judges_verdicts_and_a_killed_container_quarantined_in_an_on_policy_update(mixed_step):
    trainer, metrics, _, logged, _, _ = mixed_step
    assert metrics["learner/updates"] == 1
    assert metrics["quarantine/total"] == 1
    assert metrics["quarantine/container_exited"] == 1
    assert metrics["domain/desktop/quarantine/container_exited"] == 1
    (killed,) = [r for r in logged if r["status"] == EpisodeStatus.QUARANTINED.value]
    assert killed["task_id"] == KILLED_TASK and "137" in killed["quarantine_reason"]
    by_task: dict[str, list[str]] = {}
    for episode in trainer.last_batch.episodes.values():
        by_task.setdefault(episode.task_id, []).append(episode.status.value)
    # The judges ran in the containers: the solution scored 1, the wrong solution 0.
    for task in ("terminal-create-file", "infeasible-photo-editor"):
        assert sorted(by_task[task]) == ["failure", "success"], (task, by_task[task])
    assert len(by_task[KILLED_TASK]) == 1  # its other episode finished and trained


def test_mixed_run_logs_per_domain_metrics_and_episodes(mixed_step):
    _, metrics, _, logged, _, _ = mixed_step
    assert metrics["domain/desktop/episodes"] == 6
    assert metrics["domain/miniwob/episodes"] == 2
    assert 0 < metrics["domain/desktop/success_rate"] < 1
    assert metrics["domain/miniwob/success_rate"] == 0.5  # the oracle's episode
    assert sorted({(r["task_id"], r["domain"]) for r in logged}) == sorted(
        [(task, "desktop") for task in DESKTOP_TASKS] + [(MINIWOB_TASK, "miniwob")]
    )


def test_groups_prompts_run_once_and_later_turns_continue_cached_keys_and_values(mixed_step):
    """The run's defaults share work (rollout.share_prompts, rollout.prefix_cache_tokens,
    learner.share_prefix): the learner ran each group's prompt once for the desktop and MiniWoB
    groups alike, and the policy engine prefilled the MiniWoB episode's later turns from its cache."""
    trainer, metrics, _, _, _, engine_stats = mixed_step
    items = trainer.last_batch.items
    groups = {item.group_id for item in items}
    assert len(groups) >= 3 and {
        trainer.settings.catalog[e.task_id].kind for e in trainer.last_batch.episodes.values()
    } == {"desktop", "miniwob"}
    assert 0 < metrics["learner/forward_tokens"] < sum(len(item) for item in items)
    assert engine_stats["cached_tokens"] > 0 and engine_stats["prefill_tokens"] < engine_stats["prompt_tokens"]


def test_a_group_starts_from_one_state_and_diverges(mixed_step):
    trainer, _, (publications, capsules), _, oracle, _ = mixed_step
    assert not oracle.errors, oracle.errors
    # The capsules ran as env.capsules says: 3 shared renderers, 1 warm page, the group's
    # second start rebuilt from the first's captured state.
    assert capsules == (3, 1, {"capture": 1}), capsules
    episodes = [e for e in trainer.last_batch.episodes.values() if e.task_id == MINIWOB_TASK]
    assert len(episodes) == 2
    first = [e.turns[0].images[0] for e in episodes]
    np.testing.assert_array_equal(first[0], first[1])  # one state, seen by both
    assert any(p.operation in ("fork", "restore") for p in publications)  # the second episode's start
    assert sorted(e.status.value for e in episodes) != ["success", "success"]  # the oracle's run diverged
    assert {e.status for e in episodes} & {EpisodeStatus.SUCCESS}


@pytest.fixture(scope="module")
def verigen_folder(tmp_path_factory):
    """Two tasks VeriGen's programmatic loop accepted (re-run from scratch), as it writes them."""
    from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
    from cua_jax.envs.images import ensure_image
    from cua_jax.tasks.verigen import pipeline, templates
    from cua_jax.tasks.verigen.probe import InteractionProbe
    from cua_jax.tasks.verigen.roles import ProgrammaticJudger, ScriptedChecker, TemplateFixer

    out = tmp_path_factory.mktemp("synthesized")
    with (
        DockerEnvPool(PoolConfig(image=ensure_image("desktop"), size=2, health_interval=None)) as pool,
        InteractionProbe(pool) as probe,
    ):
        proposer = templates.TemplateProposer(seed=5, defect_rate=0.0, families=("file_create", "file_append"))
        verigen = pipeline.VeriGen(
            proposer,
            ProgrammaticJudger(),
            ScriptedChecker(probe, judge_timeout_cap=5.0),
            TemplateFixer(),
            pipeline.LoopConfig(),
        )
        report = verigen.run(target=2, max_candidates=6, workers=2)
    accepted = report.accepted[:2]  # a proposal call may bring more
    assert len(accepted) == 2, report.summary()
    pipeline.write_tasks(accepted, out)
    return out, {c.id: c for c in accepted}


def test_training_on_a_folder_verigen_synthesized(verigen_folder, tmp_path):
    folder, accepted = verigen_folder
    config = tiny_config(
        tmp_path,
        rollout__group_size=2,
        rollout__batch_tasks=2,
        rollout__max_turns=4,
        rollout__max_new_tokens=160,
        rollout__max_context_tokens=2048,
        rollout__prompt_style="compact",
    )
    config.env.kind = "desktop"
    config.env.tasks = ()
    config.env.task_dirs = (str(folder),)
    config.env.desktop.size = 2
    config.env.desktop.screen = "800x500"
    with start_trainer(config) as trainer:
        worker = trainer.workers[0]
        # The wrong script never ends: its episodes run out of turns (no verdict), and must give
        # their containers back for the next group (the pool holds one group at a time).
        idle = [A.render_action(A.Wait(0.1))] * config.rollout.max_turns
        scripts = {task_id: (c.solution, idle) for task_id, c in accepted.items()}
        worker.train_loop.engine = ScriptedEngine(
            worker.train_loop.engine,
            None,
            trainer.tokenizer,
            trainer.renderer.end_of_turn_id,
            [trainer.settings.catalog[t].spec for t in accepted],
            scripts,
        )
        metrics = trainer.train_step()
    assert metrics["quarantine/total"] == 0
    assert metrics["learner/updates"] == 1
    domain = os.path.basename(str(folder))
    assert metrics[f"domain/{domain}/episodes"] == 4
    statuses = {}
    for episode in trainer.last_batch.episodes.values():
        statuses.setdefault(episode.task_id, []).append(episode.status.value)
    # Each synthesized task's in-container judge scored its reference solution 1; idling ran out of turns.
    assert {t: sorted(v) for t, v in statuses.items()} == {t: ["no_verdict", "success"] for t in accepted}
