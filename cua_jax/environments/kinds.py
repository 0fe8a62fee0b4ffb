"""Environment kinds: one registry entry per kind of task a rollout worker runs.

An entry says how a worker opens the kind's shared resources (a capsule runtime over a shared
browser, a pool of desktop containers, a resolved container image), how it makes one
environment over them, how many episodes they carry at once, and how they close. The worker,
the run's settings and the task catalog loop over the registered kinds instead of naming them.

    register_kind(EnvironmentKind("my_kind", open=..., make=..., config=MyKindConfig, tasks=...))
    kind = environment_kind("my_kind")
    resources = kind.open(worker_config)              # once per rollout worker
    env = kind.make(resources, worker_config)         # an AgentEnvironment, reused across groups
    kind.capacity(resources)                          # episodes at once; None: unbounded
    kind.close(resources)

Every kind's config dataclass is built from the run config's `env.<kind>` section, field for
field (its defaults where the section lacks a field or the run config the section), by
`cua_jax.train.settings`; the worker config carries them all (`kind_configs`). The three
built-in kinds ("miniwob", "desktop", "code") register below, with `env.capsules`,
`env.desktop` and `env.code` as their sections. A kind added by a module of its own (a plugin)
registers itself when imported: a run names the module in `env.kind_modules` and the kind in
`env.kind`, and its `tasks(config)` gives the run's tasks. docs/environments.md walks through
one.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.environments.code_env import CodeEnvConfig, CodeEnvironment
from cua_jax.environments.desktop_env import DesktopEnvironment
from cua_jax.envs.capsules import CapsuleOptions
from cua_jax.envs.contract import AgentEnvironment
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import covering_image, ensure_image, image_names, lineage
from cua_jax.tasks.runnable import task_image
from cua_jax.tasks.sources import scan_task_folder


def _unbounded(resources: Any) -> int | None:
    return None


def _nothing_to_close(resources: Any) -> None:
    return None


def _no_stats(resources: Any) -> dict[str, float]:
    return {}


def _as_is(config: Any) -> Any:
    return config


@dataclasses.dataclass(frozen=True)
class RunView:
    """What a kind's `derived_fields` and `check_settings` see of the rest of the run: the checked
    settings (`cua_jax.train.settings` fills it from its sections), each field the value of the
    run config field its comment names."""

    observation: str  # env.observation
    action_space: str  # env.action_space
    group_size: int  # rollout.group_size
    eval_group_size: int | None  # eval.group_size; None without held-out evaluation (eval.enabled)
    reward: str  # advantage.reward


def _no_derived_fields(run: RunView) -> dict[str, tuple[Any, str]]:
    return {}


def _nothing_to_check(config: Any, run: RunView, catalog: Any) -> None:
    return None


def require(ok: bool, field: str, message: str) -> None:
    """A `check_settings` hook's check: ValueError naming the run config's field."""
    if not ok:
        raise ValueError(f"config.{field}: {message}")


@dataclasses.dataclass(frozen=True)
class EnvironmentKind:
    """One kind of environment.

    name: what a task's `SourceTask.kind` and the run config's `env.kind` call it.
    open(worker_config) -> resources: what every environment of the kind on one worker
        shares (the worker config is `cua_jax.rollout.rollout_worker.RolloutWorkerConfig`;
        a plugin kind reads its own config with `worker_config.kind_config(name)`). Raises
        ValueError for a worker config that cannot run the kind.
    make(resources, worker_config) -> AgentEnvironment: one environment; the worker keeps
        and reuses it across groups.
    capacity(resources) -> int | None: episodes the resources carry at once (a desktop
        pool's containers); None: unbounded. A group larger than the capacity is an error;
        groups beyond it wait for one to end before they start.
    close(resources): releases them (once, when the worker shuts down).
    stats(resources) -> {name: count}: the worker's environment counters of the kind.
    config: the kind's config dataclass, built from the run config's `env.<name>` section
        (field for field; its defaults for fields the section lacks); it checks its own values
        (ValueError in `__post_init__`). The worker config carries it (`kind_config(name)`).
    section: the run config's section of the config, `env.<section>` ("": the kind's name).
    task_fields: fields of that section that choose the run's tasks, not the config's.
    derived_fields(run) -> {field: (value, the run config field it comes from)}: config
        fields set by other sections of the run config (`run` a `RunView`).
    check_settings(config, run, catalog): the kind's checks against the rest of the run (its
        observation, group sizes: the `RunView`; the tasks: the run's TaskCatalog), called for
        every kind the run's tasks hold; raises ValueError("config.<field>: ...", see `require`).
    prepare(config) -> config: run once before the workers start, for every kind the run's
        tasks hold (the desktop pool's image resolved to its exact tag).
    tasks(config) -> list[SourceTask]: the run's tasks of a plugin kind (`env.kind`).
    suite_fields(config, folder, group_size) -> {run config field: value}: how an evaluation
        suite holding the kind's tasks (read from `folder`, None for a suite that is a list)
        sets up a policy's run config for groups of `group_size` episodes, so that its settings
        are built and checked as a training run's would be (`config`: the kind's config of the
        policy's run config). None: the suite's tasks need nothing of the run config.

    A kind whose tasks the warm start's oracle demonstrates has a `Demonstrator` too
    (`cua_jax.train.warm_start.register_demonstrator`, a layer above this one).
    """

    name: str
    open: Callable[[Any], Any]
    make: Callable[[Any, Any], AgentEnvironment]
    capacity: Callable[[Any], int | None] = _unbounded
    close: Callable[[Any], None] = _nothing_to_close
    stats: Callable[[Any], Mapping[str, float]] = _no_stats
    config: type | None = None
    section: str = ""
    task_fields: tuple[str, ...] = ()
    derived_fields: Callable[[RunView], Mapping[str, tuple[Any, str]]] = _no_derived_fields
    check_settings: Callable[[Any, RunView, Any], None] = _nothing_to_check
    prepare: Callable[[Any], Any] = _as_is
    tasks: Callable[[Any], Sequence[Any]] | None = None
    suite_fields: Callable[[Any, str | None, int], Mapping[str, Any]] | None = None

    @property
    def config_section(self) -> str:
        """The run config's section of the kind's config, e.g. "env.desktop"."""
        return f"env.{self.section or self.name}"


_KINDS: dict[str, EnvironmentKind] = {}


def register_kind(kind: EnvironmentKind) -> EnvironmentKind:
    """Adds `kind` to the registry. A name taken by another module's kind raises; the same
    module registering it again (a reload) replaces its entry."""
    known = _KINDS.get(kind.name)
    if known is not None and known.make.__module__ != kind.make.__module__:
        raise ValueError(f"environment kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def environment_kind(name: str) -> EnvironmentKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"no environment kind {name!r}; the registered kinds are {kind_names()}") from None


def kind_names() -> tuple[str, ...]:
    """The registered kinds, in registration order (the built-in ones first)."""
    return tuple(_KINDS)


def import_kind_modules(modules: Sequence[str]) -> None:
    """Imports each module (its import registers its kinds)."""
    for module in modules:
        importlib.import_module(module)


# ---- the built-in kinds ------------------------------------------------------------------------


def _open_capsules(worker_config: Any) -> Any:
    # The capsules show element ids (marks, DOM text) as the agent's action space needs.
    return (worker_config.kind_config("miniwob") or CapsuleOptions()).runtime(
        include_dom_text=worker_config.include_dom_text,
        action_space=worker_config.agent.action_space,
        seed=worker_config.runtime_seed,
    )


def _make_miniwob(runtime: Any, worker_config: Any) -> AgentEnvironment:
    return MiniWoBEnvironment(runtime, time_limit_s=worker_config.time_limit_s, screenshots=worker_config.screenshots)


def _capsule_stats(runtime: Any) -> dict[str, float]:
    return {f"capsules/{name}": float(count) for name, count in runtime.counters().items()}


def _open_desktop_pool(worker_config: Any) -> Any:
    config = worker_config.kind_config("desktop")
    if config is None:
        raise ValueError("the task catalog holds desktop tasks, but the worker has no desktop config (a PoolConfig)")

    return DockerEnvPool(config).start()


def _resolve_desktop_image(config: PoolConfig) -> PoolConfig:
    """env.desktop.image (an image of launch/images/) as the exact tag of the current sources,
    built when missing: once for the run, not by every worker."""

    return dataclasses.replace(config, image=ensure_image(config.image))


def _check_desktop_settings(config: PoolConfig, run: RunView, catalog: Any) -> None:
    require(
        run.observation == "screenshot", "env.observation", "desktop tasks are seen as screenshots; set 'screenshot'"
    )
    require(
        run.action_space == "coordinates",
        "env.action_space",
        "a desktop shows no element ids: desktop tasks point by coordinates; set 'coordinates'",
    )
    # A group's episodes run at once, each on a container of its own.
    groups = {"rollout.group_size": run.group_size}
    if run.eval_group_size is not None:
        groups["eval.group_size"] = run.eval_group_size
    for field, size in groups.items():
        require(
            config.size >= size,
            "env.desktop.size",
            f"{config.size} containers cannot run a group of {size} desktop episodes at once ({field})",
        )
    # A task runs on its snapshot's image or on any image built FROM it (osworld_apps holds
    # osworld's applications too).
    runs_on = lineage(config.image)
    images = sorted({task_image(catalog[t].spec) for t in catalog.task_ids if catalog[t].kind == "desktop"})
    others = [image for image in images if image not in runs_on]
    require(
        not others,
        "env.desktop.image",
        f"tasks need the environment images {others}; the pool runs env.desktop.image {config.image!r}, built "
        f"from {runs_on}: set it to an image built from all of them",
    )


def _desktop_suite_fields(config: PoolConfig, folder: str | None, group_size: int) -> dict[str, Any]:
    # The suite's folder is the run's task source, beside the policy's own MiniWoB tasks, and
    # the pool runs a group's episodes at once (the desktop checks above then hold). The pool
    # runs the image its tasks start on: the configured one when it is built from all of
    # them, else the one of theirs built from the others (os tasks on osworld, Chrome's on
    # osworld_apps); where none is, the check above names the images. An episode out of
    # turns is judged on the state it reached, as OSWorld scores its step limit.
    fields: dict[str, Any] = {
        "env.kind": "mixed",
        "env.task_dirs": (folder,),
        "eval.judge_at_budget": True,
        "rollout.group_size": group_size,
        "eval.group_size": group_size,
        "env.desktop.size": max(config.size, group_size),
    }
    if folder is not None:
        known = set(image_names())
        wanted = {task_image(file.task) for file in scan_task_folder(folder) if file.task is not None} & known
        if not wanted <= set(lineage(config.image)):
            chosen = covering_image(wanted)
            if chosen is not None:
                fields["env.desktop.image"] = chosen
    return fields


def _make_desktop(pool: Any, worker_config: Any) -> AgentEnvironment:
    return DesktopEnvironment(pool, attribution=worker_config.agent.attribution)


def _open_code(worker_config: Any) -> Any:
    # The image is resolved (built when missing) once, not by every environment.
    config = worker_config.kind_config("code") or CodeEnvConfig()
    return dataclasses.replace(config, image=config.image or ensure_image("code"))


def _make_code(config: Any, worker_config: Any) -> AgentEnvironment:
    return CodeEnvironment(config, attribution=worker_config.agent.attribution)


def _code_derived_fields(run: RunView) -> dict[str, tuple[Any, str]]:
    # The dense reward scores a code fix by the share of its tests that pass.
    return {"partial_credit": (run.reward == "pass_fraction", "advantage.reward")}


register_kind(
    EnvironmentKind(
        "miniwob",
        _open_capsules,
        _make_miniwob,
        close=lambda runtime: runtime.shutdown(),
        stats=_capsule_stats,
        config=CapsuleOptions,
        section="capsules",
    )
)
register_kind(
    EnvironmentKind(
        "desktop",
        _open_desktop_pool,
        _make_desktop,
        capacity=lambda pool: pool.config.size,
        close=lambda pool: pool.close(),
        config=PoolConfig,
        check_settings=_check_desktop_settings,
        prepare=_resolve_desktop_image,
        suite_fields=_desktop_suite_fields,
    )
)
register_kind(
    EnvironmentKind(
        "code",
        _open_code,
        _make_code,
        config=CodeEnvConfig,
        task_fields=("suite_dir", "tasks"),
        derived_fields=_code_derived_fields,
    )
)
