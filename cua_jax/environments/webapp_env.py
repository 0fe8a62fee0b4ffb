"""Web application tasks (WebArena's format, judged on the application's database) in capsules of
a shared application server (`cua_jax.envs.webapp.WebappRuntime`), behind the environment
contract; and the `webapp` environment kind, a plugin kind registered when this module is
imported (a run names it in `env.kind_modules`; experiments/configs/webapp.py does).

    --config.env.kind_modules='("cua_jax.environments.webapp_env",)' --config.env.kind=webapp

The run config's `env.webapp` section is `WebappConfig` field for field. The run's tasks are
the suite folder's (`suite_dir`, all or those of `tasks`); MiniWoB tasks of `env.tasks` may
join them in one pool (each kind runs on its own runtime in every rollout worker).
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
from typing import Any

from cua_jax.environments.capsule_env import CapsuleEnvironment
from cua_jax.environments.kinds import EnvironmentKind, register_kind
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvReset, EnvTransition
from cua_jax.envs.faults import Fault, FaultKind, episode_outcome
from cua_jax.envs.prompts import INVALID_ACTION_PREFIX
from cua_jax.envs.webapp.branches import BRANCH_METHODS
from cua_jax.envs.webapp.runtime import WebappRuntime, WebappSnapshot
from cua_jax.envs.webapp.state import SCALES, ensure_base_state
from cua_jax.envs.webapp.tasks import WebappTask, load_tasks
from cua_jax.tasks.sources import SourceTask
from cua_jax.types import EpisodeStatus

KIND = "webapp"
SUITE_DIR = str(pathlib.Path(__file__).resolve().parents[1] / "tasks" / "suites" / "webapp" / "trac")


@dataclasses.dataclass(frozen=True)
class WebappConfig:
    """The `webapp` kind's settings (the run config's `env.webapp`).

    suite_dir: the folder of task files (WebArena's JSON); tasks: the ids to run (): all.
    scale: the seeded state's size ("test" or "bench", `state.ensure_base_state`).
    viewport: (width, height) of every page. branch_by: "auto" (the cheapest copy-on-write
    the workdir allows: an overlay mount, else file clones, else a full copy), "overlay",
    "reflink" or "copy". workdir: where branches live, a folder per rollout worker in it
    ("": a temporary folder per rollout worker).
    """

    suite_dir: str = SUITE_DIR
    tasks: tuple[str, ...] = ()
    scale: str = "test"
    viewport: tuple[int, int] = (1024, 768)
    branch_by: str = "auto"
    workdir: str = ""

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r}")
        if self.branch_by not in ("auto", *BRANCH_METHODS):
            raise ValueError(f"branch_by must be 'auto' or one of {BRANCH_METHODS}, got {self.branch_by!r}")
        if len(self.viewport) != 2 or min(self.viewport) < 64:
            raise ValueError(f"viewport must be (width, height) of at least 64 pixels each, got {self.viewport}")


class WebappEnvironment(CapsuleEnvironment):
    """A web application task in one capsule of a `WebappRuntime`.

    The instruction is the task's intent; each observation is the page's viewport and, with a
    runtime made with include_dom_text=True, the marked elements as text. The episode ends when
    the agent ends it (done, fail, answer): the judges score the capsule's database, the answer
    and the page's path. A quarantined capsule (the application server or the browser died)
    ends the episode QUARANTINED with the runtime's fault; the next reset builds a fresh
    generation. screenshots=False: text-only observations.
    """

    def __init__(self, runtime: Any, *, screenshots: bool = True):
        if not screenshots and not runtime.include_dom_text:
            raise ValueError("text-only web application observations need a runtime made with include_dom_text=True")
        super().__init__(runtime, screenshots=screenshots)

    def _fault_place(self, task: Any) -> str:
        return f"web application task {task.task_id}" if task is not None else f"capsule {self.env_id}"

    async def _start(self, task: WebappTask, build, rebuild) -> EnvReset:
        if not isinstance(task, WebappTask):
            raise ValueError(f"a web application environment runs WebappTask tasks, got {type(task).__name__}")
        if self.env_id is None:
            self.env_id = await self._call(build())
            observation = await self._call(self.runtime.aobserve(self.env_id))
        else:
            observation = await self._call(rebuild(self.env_id))
        return EnvReset(task.intent, self._observation(observation), screen_size=observation.screen_size)

    async def _reset(self, task: WebappTask, seed: int | None) -> EnvReset:
        # The seeded state is the task's: every episode of a task starts from the same state.
        return await self._start(
            task, lambda: self.runtime.acreate(task), lambda env_id: self.runtime.areset(env_id, task)
        )

    async def _shared_state(self) -> WebappSnapshot:
        if self.env_id is None:
            raise RuntimeError("shared_state() before reset()")
        return await self._call(self.runtime.asnapshot(self.env_id))

    async def _reset_to(self, task: WebappTask, seed: int | None, state: WebappSnapshot) -> EnvReset:
        if state.task.task_id != task.task_id:
            raise ValueError(f"the shared state is a {state.task.task_id!r} capsule, not {task.task_id!r}")
        return await self._start(
            task, lambda: self.runtime.afork(state), lambda env_id: self.runtime.arestore(env_id, state)
        )

    async def _step(self, action: A.Action | A.InvalidAction) -> EnvTransition:
        if self.env_id is None:
            raise RuntimeError("step() before reset()")
        result = await self._call(self.runtime.astep(self.env_id, action))
        if result.status is EpisodeStatus.QUARANTINED:
            fault = result.fault or Fault(FaultKind.SERVER_ERROR, result.quarantine_reason or "capsule quarantined")
            return EnvTransition(None, 0.0, episode_outcome(fault=fault), fault=fault)
        if result.done:
            info = {"judge_reasons": result.reason} if result.reason else {}
            return EnvTransition(None, result.reward, episode_outcome(verdict=result.reward), info)
        feedback = INVALID_ACTION_PREFIX + result.invalid_action if result.invalid_action else ""
        return EnvTransition(self._observation(result.observation, feedback), 0.0, None)


# ---- the kind ----------------------------------------------------------------------------------


def webapp_tasks(config: WebappConfig) -> list[SourceTask]:
    """The suite folder's tasks (all, or those of config.tasks in that order): domain "webapp"."""
    suite = {task.task_id: task for task in load_tasks(config.suite_dir)}
    missing = [task for task in config.tasks if task not in suite]
    if missing:
        raise ValueError(f"{missing} are not tasks of {config.suite_dir}")
    chosen = [suite[t] for t in dict.fromkeys(config.tasks)] if config.tasks else list(suite.values())
    return [SourceTask(task.task_id, KIND, KIND, 0, True, task, task.origin) for task in chosen]


def _open(worker_config: Any) -> WebappRuntime:
    config = worker_config.kind_config(KIND) or WebappConfig()
    if config.workdir:  # a folder of its own in it: every rollout worker's runtime clears its workdir
        pathlib.Path(config.workdir).mkdir(parents=True, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="worker-", dir=config.workdir)
    else:
        workdir = tempfile.mkdtemp(prefix="cua-webapp-")
    return WebappRuntime(
        ensure_base_state(config.scale),
        workdir,
        viewport=tuple(config.viewport),
        include_dom_text=worker_config.include_dom_text,
        action_space=worker_config.agent.action_space,
        branch_by=config.branch_by,
    )


def _make(runtime: WebappRuntime, worker_config: Any) -> AgentEnvironment:
    return WebappEnvironment(runtime, screenshots=worker_config.screenshots)


def _stats(runtime: WebappRuntime) -> dict[str, float]:
    return {f"webapp/{name}": float(value) for name, value in runtime.counters().items()}


def _suite_fields(config: WebappConfig, folder: str | None, group_size: int) -> dict[str, Any]:
    # The run is built as a webapp run (its runtime, its checks); the evaluation's tasks are the
    # suite's catalog, whatever folder it was read from.
    return {
        "env.kind_modules": (__name__,),
        "env.kind": KIND,
        "env.tasks": (),
        "rollout.group_size": group_size,
        "eval.group_size": group_size,
    }


register_kind(
    EnvironmentKind(
        KIND,
        _open,
        _make,
        close=lambda runtime: runtime.shutdown(),
        stats=_stats,
        config=WebappConfig,
        tasks=webapp_tasks,
        suite_fields=_suite_fields,
    )
)
