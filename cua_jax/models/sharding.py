"""Meshes, logical-to-mesh axis rules, and sharding placement for NNX models.

Every parameter carries logical axis names (metadata `out_sharding`, e.g. ("embed", "mlp"));
large activations are constrained with logical names too (`constrain`). Rules map a
logical name to a mesh axis (or a tuple of axes, or None = replicated), so the same
module runs on one CPU device and on a GPU mesh; only the mesh and rules change.

The active mesh and rules are set together by `use_mesh(mesh, rules)`; outside it
`constrain` is the identity, so models run unsharded with no setup.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from cua_jax.models.liveness import jax_heartbeat_timeout_s, start_watchdog

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes. Parameters: "embed" is FSDP-sharded, the wide dimensions
# (heads, mlp, vocab) tensor-sharded. Activations: batch over data x fsdp, the wide
# dimensions over tensor, the residual stream's embed dimension replicated.
DEFAULT_RULES: Mapping[str, Any] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
    "activation_batch": ("data", "fsdp"),
    "activation_length": None,
    "activation_embed": None,
    "activation_heads": "tensor",
    "activation_kv_heads": "tensor",
    "activation_mlp": "tensor",
    "activation_vocab": "tensor",
    "cache_batch": ("data", "fsdp"),
    "cache_length": None,
    "cache_kv_heads": "tensor",
    # Qwen3.5's Gated DeltaNet: conv channels (the q/k/v projection) and linear-attention heads.
    "linear_conv": "tensor",
    "linear_heads": "tensor",
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape over (data, fsdp, tensor). -1 in one axis takes the remaining devices.

    distributed: call `jax.distributed.initialize` (multi-host) before building the mesh;
    coordinator_address / num_processes / process_id are passed through (None lets JAX
    detect them from the cluster environment). heartbeat_timeout_s: seconds after which a
    process that stopped sending heartbeats counts as lost, and every other process stops with
    an error naming it (`cua_jax.models.liveness`; JAX's own heartbeat timeout is twice it).
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: float = 100.0

    def __post_init__(self):
        if (
            isinstance(self.heartbeat_timeout_s, bool)
            or not isinstance(self.heartbeat_timeout_s, (int, float))
            or not self.heartbeat_timeout_s >= 1
        ):
            raise ValueError(f"heartbeat_timeout_s must be a number of seconds >= 1, got {self.heartbeat_timeout_s!r}")
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None and (
            self.process_id < 0 or (self.num_processes is not None and self.process_id >= self.num_processes)
        ):
            raise ValueError(f"process_id {self.process_id} is not in [0, num_processes={self.num_processes})")
        if self.coordinator_address is not None:
            host, _, port = self.coordinator_address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"coordinator_address must be host:port, got {self.coordinator_address!r}")
        if not self.distributed and (self.coordinator_address or self.num_processes or self.process_id is not None):
            raise ValueError("distributed is False, yet coordinator_address / num_processes / process_id are set")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeshConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown mesh config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))


def initialize_distributed(config: MeshConfig) -> None:
    """Joins the multi-host JAX runtime when the config asks for it (idempotent), and with more
    than one process starts this process's watchdog (`cua_jax.models.liveness`): a process
    silent for config.heartbeat_timeout_s stops every other one with an error naming it."""
    if not config.distributed:
        return
    if jax.distributed.is_initialized():
        return
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        heartbeat_timeout_seconds=jax_heartbeat_timeout_s(config.heartbeat_timeout_s),
    )
    # The coordination service's client (jax.distributed offers no public handle on it); its
    # key-value store carries the watchdogs' beats. No JAX computation runs here.
    from jax._src import distributed as jax_distributed

    state = jax_distributed.global_state
    start_watchdog(
        state.client, state.process_id, state.num_processes, config.heartbeat_timeout_s, state.coordinator_address
    )


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices, all hosts)."""
    initialize_distributed(config)
    devices = list(jax.devices() if devices is None else devices)
    shape = [config.data, config.fsdp, config.tensor]
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, shape))}")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into mesh {dict(zip(MESH_AXES, shape))}")
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices, have {len(devices)}")
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


_ACTIVE_RULES: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("rules", default=None)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> Iterator[Mesh]:
    """Makes `mesh` the current mesh and `rules` the logical rules for `constrain`."""
    token = _ACTIVE_RULES.set(rules)
    try:
        with jax.set_mesh(mesh):
            yield mesh
    finally:
        _ACTIVE_RULES.reset(token)


def logical_to_spec(
    names: Sequence[str | None], rules: Mapping[str, Any], shape: Sequence[int] | None = None, mesh: Mesh | None = None
) -> PartitionSpec:
    """PartitionSpec for logical axis `names` under `rules`.

    With `shape` and `mesh` given, a dimension that does not divide by its mesh axes'
    size stays replicated (e.g. 2 KV heads on a tensor axis of 4): placement changes,
    values do not. A name missing from the rules is an error.
    """
    spec = []
    used: set[str] = set()
    for i, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule; rules cover {sorted(rules)}")
        axes = rules[name]
        axes_tuple = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        axes_tuple = tuple(a for a in axes_tuple if a not in used)  # a mesh axis shards one dim at most
        if mesh is not None:
            axes_tuple = tuple(a for a in axes_tuple if mesh.shape[a] > 1)
            if shape is not None and shape[i] % int(np.prod([mesh.shape[a] for a in axes_tuple] or [1])):
                axes_tuple = ()
        used.update(axes_tuple)
        spec.append(None if not axes_tuple else axes_tuple[0] if len(axes_tuple) == 1 else axes_tuple)
    return PartitionSpec(*spec)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical names under the active mesh; identity without one."""
    rules = _ACTIVE_RULES.get()
    mesh = jax.sharding.get_abstract_mesh()
    if rules is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(names, rules, x.shape, mesh))


def state_shardings(state: nnx.State, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> nnx.State:
    """A NamedSharding per variable of `state` (concrete or abstract), from its logical names."""

    def one(v: nnx.Variable):
        names = v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
        return NamedSharding(mesh, logical_to_spec(names, rules, v.shape, mesh))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_state(state: nnx.State, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> nnx.State:
    """A copy of `state` with every array placed on its sharding on `mesh`."""
    return jax.device_put(state, state_shardings(state, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> nnx.Module:
    """Moves every variable of `model` (in place) onto its sharding on `mesh`."""
    nnx.update(model, shard_state(nnx.state(model), mesh, rules))
    return model


def init_sharded(model_fn, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> nnx.Module:
    """Builds `model_fn()` with each parameter created directly on its shard (jit with
    out_shardings), so no device ever holds the whole unsharded model."""
    abstract = nnx.eval_shape(model_fn)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh, rules)

    make_state = jax.jit(lambda: nnx.state(model_fn()), out_shardings=shardings)
    return nnx.merge(graphdef, make_state())


def bytes_per_device(state: nnx.State) -> dict[jax.Device, int]:
    """Bytes of `state`'s arrays resident on each device (addressable shards)."""
    totals: dict[jax.Device, int] = {}
    for leaf in jax.tree.leaves(state):
        for shard in leaf.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return totals
