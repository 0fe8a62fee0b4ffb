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

The three built-in kinds ("miniwob", "desktop", "code") register below; their configs come
from the run config's own sections (`env.capsules`, `env.desktop`, `env.code`, turned into the
worker config's fields by `cua_jax.train.settings`). A kind added by a module of its own (a
plugin) registers itself when imported: a run names the module in `env.kind_modules` and the
kind in `env.kind`; its config dataclass is built from `config.env.<kind>` when the run config
has that section (its defaults otherwise), and its `tasks(config)` gives the run's tasks.
docs/environments.md walks through one.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cua_jax.envs.contract import AgentEnvironment


def _unbounded(resources: Any) -> int | None:
    return None


def _nothing_to_close(resources: Any) -> None:
    return None


def _no_stats(resources: Any) -> dict[str, float]:
    return {}


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
    config: the kind's config dataclass (plugin kinds), built from the run config's
        `env.<name>` section when it has one, with its defaults otherwise; None: the kind's
        config lives in the run config's own sections (the built-in kinds).
    tasks(config) -> list[SourceTask]: the run's tasks of a plugin kind (`env.kind`); the
        config dataclass checks its own values (ValueError in `__post_init__`).
    """

    name: str
    open: Callable[[Any], Any]
    make: Callable[[Any, Any], AgentEnvironment]
    capacity: Callable[[Any], int | None] = _unbounded
    close: Callable[[Any], None] = _nothing_to_close
    stats: Callable[[Any], Mapping[str, float]] = _no_stats
    config: type | None = None
    tasks: Callable[[Any], Sequence[Any]] | None = None


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


def kind_config(kind: EnvironmentKind, section: Any) -> Any:
    """The kind's config dataclass from `section` (a mapping of its fields; None: the
    defaults). A field the dataclass lacks, or a bad value, raises ValueError / TypeError."""
    if kind.config is None:
        raise ValueError(f"environment kind {kind.name!r} takes no config of its own")
    if section is None:
        return kind.config()
    values = dict(section)
    fields = {field.name for field in dataclasses.fields(kind.config)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{unknown} are no fields of {kind.config.__name__} (it has {sorted(fields)})")
    return kind.config(**values)


# ---- the built-in kinds ------------------------------------------------------------------------


def _open_capsules(worker_config: Any) -> Any:
    # The capsules show element ids (marks, DOM text) as the agent's action space needs.
    return worker_config.capsules.runtime(
        include_dom_text=worker_config.include_dom_text,
        action_space=worker_config.agent.action_space,
        seed=worker_config.runtime_seed,
    )


def _make_miniwob(runtime: Any, worker_config: Any) -> AgentEnvironment:
    from cua_jax.environments.capsule_env import MiniWoBEnvironment

    return MiniWoBEnvironment(runtime, time_limit_s=worker_config.time_limit_s, screenshots=worker_config.screenshots)


def _capsule_stats(runtime: Any) -> dict[str, float]:
    return {f"capsules/{name}": float(count) for name, count in runtime.counters().items()}


def _open_desktop_pool(worker_config: Any) -> Any:
    if worker_config.desktop_pool is None:
        raise ValueError("the task catalog holds desktop tasks, but the worker has no desktop_pool config")
    from cua_jax.envs.docker_pool import DockerEnvPool

    return DockerEnvPool(worker_config.desktop_pool).start()


def _make_desktop(pool: Any, worker_config: Any) -> AgentEnvironment:
    from cua_jax.environments.desktop_env import DesktopEnvironment

    return DesktopEnvironment(pool, attribution=worker_config.agent.attribution)


def _open_code(worker_config: Any) -> Any:
    from cua_jax.environments.code_env import CodeEnvConfig
    from cua_jax.envs.images import ensure_image

    # The image is resolved (built when missing) once, not by every environment.
    config = worker_config.code_env or CodeEnvConfig()
    return dataclasses.replace(config, image=config.image or ensure_image("code"))


def _make_code(config: Any, worker_config: Any) -> AgentEnvironment:
    from cua_jax.environments.code_env import CodeEnvironment

    return CodeEnvironment(config, attribution=worker_config.agent.attribution)


register_kind(
    EnvironmentKind(
        "miniwob", _open_capsules, _make_miniwob, close=lambda runtime: runtime.shutdown(), stats=_capsule_stats
    )
)
register_kind(
    EnvironmentKind(
        "desktop",
        _open_desktop_pool,
        _make_desktop,
        capacity=lambda pool: pool.config.size,
        close=lambda pool: pool.close(),
    )
)
register_kind(EnvironmentKind("code", _open_code, _make_code))
