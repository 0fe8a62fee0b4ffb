# Single job: the learner's updates (policy-gradient and supervised) of a policy on a device mesh.
"""The learner: policy-gradient and supervised updates of an NNX policy on a device mesh.

Objectives. `LearnerConfig.objective` picks the loss: "policy_gradient" (`policy_loss` of
`cua_jax.rl.losses`) for RL, or "sft" (`supervised_loss`: the token-mean negative
log-likelihood of the loss-mask tokens) for the warm start and pretraining on
demonstrations. Both give a numerator and a parameter-free denominator, so everything below
(optimizer, precision, accumulation, sharding, train state) is the same for both.

State. The model is split once into its graph definition, the trainable parameters, and
the rest (`frozen`: a frozen vision tower, non-parameter variables). The optimizer (optax
AdamW behind global-norm clipping, with a warmup + constant/cosine schedule) holds state
for the trainable parameters only, so frozen parameters get no update and no moments and
stay bit-identical. The reference policy is a copy of the initial trainable parameters
(frozen ones are shared: they never change).

Precision. The model's config sets the parameter and compute dtypes (`Qwen3Config.dtype`,
`param_dtype`); log-probabilities, the loss, gradient accumulation and the optimizer are
float32 whatever they are. With bfloat16 compute and float32 parameters the forward casts
the parameters per use and nothing else changes. With bfloat16 parameters (half the bytes
for the reference copy, the rollout engines' weights and FSDP gathers) the optimizer keeps
float32 master weights (`with_float32_master_weights`): Adam's moments and the update
live on a float32 copy, and the bfloat16 parameters are that copy rounded after every step,
so updates far below bfloat16's resolution (lr 1e-6 on weights ~1e-2) still accumulate.
Memory per trainable parameter: float32 params 4 + Adam 8 bytes; bfloat16 params 2 + master
4 + Adam 8 bytes; gradient accumulators are float32 (4 bytes) in both.

One update (`update(microbatches)`) is one optimizer step over a mini-batch given as
micro-batches. Each micro-batch runs a jitted gradient pass that adds the gradient of the
loss numerator, the numerator and the denominator into donated accumulators; a jitted
apply pass then divides by the accumulated denominator and steps the optimizer. Since the
denominator never depends on the parameters (see `cua_jax.rl.losses`), the result is the
full-batch gradient for every aggregation mode, whatever the micro-batch split.

Both passes are `jax.jit` with explicit in/out shardings derived from the mesh and the
parameters' logical axes (pjit semantics); the parameters, optimizer state and
accumulators are donated, so an update holds one copy of the train state.

Log-probabilities the policy-gradient loss compares against are computed once per rollout
batch, before its first update (`prepare`): the frozen reference's (when kl_coef > 0) and,
with old_logprobs="recompute", the pre-update policy's. "rollout" uses the engine's logprobs;
"current" uses the learner's own logprobs under stop_gradient, which is exactly the
pre-update policy for strictly on-policy training with one update per rollout batch (the
ratio is then exactly 1 and no token is clipped, as CANOPY App. C checks).

With loss.tis_cap > 0, each token's policy-gradient term is weighted by
min(exp(old - rollout), tis_cap) (`cua_jax.rl.losses`), where "old" is the behaviour policy
of the mode above: the learner's current logprobs ("current"), its pre-update ones
("recompute"), or the engine's own ("rollout", where the weight is therefore exactly 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cua_jax.models.qwen3_vl import QWEN3_VL_RULES, image_features
from cua_jax.models.sampler import normalized_token_ids
from cua_jax.models.scoring import score_sequences
from cua_jax.models.sharding import DEFAULT_RULES, MeshConfig, logical_to_spec, make_mesh, shard_model, use_mesh
from cua_jax.observe import timeline
from cua_jax.rl.losses import PolicyLossConfig, PolicyLossMetrics, normalize, policy_loss
from cua_jax.train.batching import TrainBatch, batch_tokens

OBJECTIVES = ("policy_gradient", "sft")
OLD_LOGPROB_SOURCES = ("rollout", "recompute", "current")
SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with a learning-rate schedule and global-norm clipping.

    schedule: "constant" or "cosine"; both start with `warmup_steps` of linear warmup from
      learning_rate / (warmup_steps + 1). Cosine decays over the `decay_steps` after the
      warmup to min_lr_ratio * learning_rate.
    max_grad_norm: clip the global gradient norm to this (None: no clipping).
    weight_decay: decoupled decay on matrices (ndim >= 2); norms and biases are not decayed.
    """

    learning_rate: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    decay_steps: int = 1000
    min_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"OptimizerConfig.schedule {self.schedule!r} is unknown; choose one of {SCHEDULES}")
        if self.learning_rate < 0:
            raise ValueError(f"OptimizerConfig.learning_rate must be >= 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimizerConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule == "cosine" and self.decay_steps < 1:
            raise ValueError(f"OptimizerConfig.decay_steps must be >= 1 for cosine, got {self.decay_steps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"OptimizerConfig.max_grad_norm must be > 0 (or None), got {self.max_grad_norm}")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Settings of the Learner (filled by the trainer from the run's ml_collections config).

    objective: "policy_gradient" (`policy_loss` under `loss`) or "sft" (`supervised_loss`;
      `loss` and `old_logprobs` do not apply and no reference is kept).
    optimizer: OptimizerConfig. loss: PolicyLossConfig (clipping, KL to the reference,
    entropy bonus, aggregation).
    old_logprobs: where the ratio's denominator comes from: "rollout" (the engine's
      logprobs), "recompute" (the learner's pre-update params, once per rollout batch) or
      "current" (stop_gradient of the learner's logprobs: strictly on-policy only).
    freeze_vision: keep a Qwen3-VL vision tower frozen (no update, no optimizer state).
    temperature: the sampling temperature the logprobs are taken at.
    seq_chunk / vocab_chunk: chunking of the log-softmax (`cua_jax.models.scoring`).
    banned_token_ids: the token ids the rollout sampler never samples (its
      `SamplingParams.banned_token_ids`, e.g. `agent_loop.reserved_token_ids`); the learner's
      logprobs are then renormalised over the same allowed tokens, as the sampler's are.
      Empty (the default): the full vocabulary.
    """

    objective: str = "policy_gradient"
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: PolicyLossConfig = PolicyLossConfig()
    old_logprobs: str = "rollout"
    freeze_vision: bool = False
    temperature: float = 1.0
    seq_chunk: int = 256
    vocab_chunk: int = 32768
    banned_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        banned = normalized_token_ids(self.banned_token_ids, "LearnerConfig.banned_token_ids")
        object.__setattr__(self, "banned_token_ids", banned)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"LearnerConfig.objective {self.objective!r} is unknown; choose one of {OBJECTIVES}")
        if self.old_logprobs not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"LearnerConfig.old_logprobs {self.old_logprobs!r} is unknown; choose one of {OLD_LOGPROB_SOURCES}"
            )
        if self.temperature <= 0:
            raise ValueError(f"LearnerConfig.temperature must be > 0, got {self.temperature}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LearnerConfig:
        """From a nested mapping (e.g. `ml_collections.ConfigDict.to_dict()`); unknown keys are errors."""
        d = dict(d)
        nested = {"optimizer": OptimizerConfig, "loss": PolicyLossConfig}
        for key, kind in nested.items():
            if key in d and isinstance(d[key], Mapping):
                sub = dict(d[key])
                unknown = set(sub) - {f.name for f in dataclasses.fields(kind)}
                if unknown:
                    raise ValueError(f"unknown learner.{key} config keys {sorted(unknown)}")
                d[key] = kind(**sub)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown learner config keys {sorted(unknown)}")
        return cls(**d)


class SupervisedLossMetrics(NamedTuple):
    """Accumulable statistics of `supervised_loss` over the masked tokens of one or more
    micro-batches (the interface of `PolicyLossMetrics`: empty, merge, summary)."""

    num_tokens: jax.Array
    entropy_sum: jax.Array

    @classmethod
    def empty(cls) -> SupervisedLossMetrics:
        return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def merge(self, other: SupervisedLossMetrics) -> SupervisedLossMetrics:
        return SupervisedLossMetrics(*(a + b for a, b in zip(self, other)))

    def summary(self) -> dict[str, jax.Array]:
        """Logged scalars: the mean entropy over masked tokens (0 without any) and their number."""
        return {"entropy": self.entropy_sum / jnp.maximum(self.num_tokens, 1.0), "num_tokens": self.num_tokens}


class SupervisedLossOutput(NamedTuple):
    """numerator / denominator: see `supervised_loss`; metrics: SupervisedLossMetrics."""

    numerator: jax.Array
    denominator: jax.Array
    metrics: SupervisedLossMetrics


def supervised_loss(logp: jax.Array, loss_mask: jax.Array, entropy: jax.Array | None = None) -> SupervisedLossOutput:
    """Token-mean negative log-likelihood of the masked tokens, as a numerator and a denominator.

    Args:
      logp: float [B, T], log-probs of the tokens (aligned with the ids, as `score_sequences`
        gives them; differentiated). Masked-out entries may hold anything.
      loss_mask: [B, T], nonzero on the tokens to train.
      entropy: optional float [B, T], the per-token entropy, for the metrics only.

    Returns:
      SupervisedLossOutput: numerator -sum of logp over the masked tokens, denominator their
      number (float32 scalars, both sums over rows, so micro-batches add up exactly as
      `policy_loss`'s token_mean mode); the NLL is `normalize(numerator, denominator)`, 0
      when no token is masked.
    """
    logp = jnp.asarray(logp)
    logp = logp.astype(jnp.promote_types(logp.dtype, jnp.float32))
    if logp.ndim != 2:
        raise ValueError(f"supervised_loss: logp must be [B, T], got shape {logp.shape}")
    loss_mask = jnp.asarray(loss_mask)
    if loss_mask.shape != logp.shape:
        raise ValueError(f"supervised_loss: loss_mask has shape {loss_mask.shape}, expected {logp.shape} like logp")
    on = loss_mask != 0
    count = jnp.sum(on.astype(logp.dtype))
    entropy_sum = (
        jnp.zeros((), logp.dtype)
        if entropy is None
        else jnp.sum(jnp.where(on, jax.lax.stop_gradient(jnp.asarray(entropy, logp.dtype)), 0.0))
    )
    return SupervisedLossOutput(-jnp.sum(jnp.where(on, logp, 0.0)), count, SupervisedLossMetrics(count, entropy_sum))


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """step -> learning rate: linear warmup, then constant or cosine decay."""
    lr = config.learning_rate
    if config.schedule == "constant":
        main = optax.constant_schedule(lr)
    else:
        main = optax.cosine_decay_schedule(lr, decay_steps=config.decay_steps, alpha=config.min_lr_ratio)
    if config.warmup_steps == 0:
        return main
    warmup = optax.linear_schedule(lr / (config.warmup_steps + 1), lr, config.warmup_steps)
    return optax.join_schedules([warmup, main], [config.warmup_steps])


class MasterWeightsState(NamedTuple):
    """State of `with_float32_master_weights`: the float32 copy of the parameters and the
    wrapped optimizer's state over that copy."""

    master: Any
    inner: Any


def with_float32_master_weights(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Runs `inner` on a float32 copy of the parameters (master weights), for parameters
    stored in a lower precision.

    init(params) copies the parameters to float32 and initialises `inner` on the copy (so
    its moments are float32 too). update(grads, state, params) casts the gradients to
    float32, steps the copy, and returns updates for which `optax.apply_updates(params,
    updates)` is exactly the new copy rounded to each parameter's dtype: the updates are
    float32 differences of two such roundings, which float32 holds exactly, and
    apply_updates adds in float32 before casting back. `params` is required.
    """

    def init(params):
        master = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)
        return MasterWeightsState(master, inner.init(master))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("with_float32_master_weights: update() needs the current params")
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        steps, inner_state = inner.update(grads, state.inner, state.master)
        master = optax.apply_updates(state.master, steps)
        updates = jax.tree.map(
            lambda m, p: m.astype(p.dtype).astype(jnp.float32) - p.astype(jnp.float32), master, params
        )
        return updates, MasterWeightsState(master, inner_state)

    return optax.GradientTransformation(init, update)


def needs_master_weights(params) -> bool:
    """Whether any parameter is stored below float32 (then the optimizer needs master weights)."""
    return any(jnp.dtype(p.dtype) != jnp.float32 for p in jax.tree.leaves(params))


def make_optimizer(config: OptimizerConfig, master_weights: bool = False) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW under `learning_rate_schedule`; with master_weights,
    both on a float32 copy of the parameters (`with_float32_master_weights`), which
    bfloat16 parameters need (`needs_master_weights`)."""
    adamw = optax.adamw(
        learning_rate_schedule(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    )
    tx = adamw if config.max_grad_norm is None else optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
    return with_float32_master_weights(tx) if master_weights else tx


def _normalized_gradient(grad_sum, denominator: jax.Array):
    """sum of numerator gradients / the full batch's denominator (0 when nothing is trained),
    mirroring `cua_jax.rl.losses.normalize`."""
    scale = jnp.where(denominator > 0, 1.0 / jnp.maximum(denominator, 1e-30), 0.0)
    return jax.tree.map(lambda g: g * scale, grad_sum)


class ProcessRows(NamedTuple):
    """This process's block of a micro-batch's rows (`Learner.process_rows`): how many rows, the
    block's position among the processes' blocks (its first row / rows), and how many row
    shards its devices cut it into."""

    rows: int
    block: int
    shards: int


def _replicated_if_unnamed(mesh: Mesh):
    def fix(sharding):
        return sharding if isinstance(sharding, NamedSharding) else NamedSharding(mesh, PartitionSpec())

    return fix


class Learner:
    """Owns the policy's trainable parameters, optimizer state and reference copy (policy
    gradient with kl_coef > 0 only).

    Args:
      model: a Qwen3ForCausalLM or Qwen3VLForConditionalGeneration (anything with
        `hidden_states` and `output_projection`). It is moved onto `mesh` in place and its
        parameters are then owned by the learner: read the current policy from `.model`.
      config: LearnerConfig.
      mesh: the device mesh (default: a one-device mesh of this process's first device).
      rules: logical-axis rules (default: the model's, QWEN3_VL_RULES for Qwen3-VL, else
        DEFAULT_RULES).
    """

    def __init__(
        self, model: nnx.Module, config: LearnerConfig, mesh: Mesh | None = None, rules: Mapping[str, Any] | None = None
    ):
        self.config = config
        self.mesh = mesh if mesh is not None else make_mesh(MeshConfig(fsdp=1), devices=jax.local_devices()[:1])
        if rules is None:
            if hasattr(model, "visual"):
                rules = QWEN3_VL_RULES
            else:
                rules = DEFAULT_RULES
        self.rules = rules
        if config.freeze_vision:
            if not hasattr(model, "trainable_filter") or not hasattr(model, "freeze_vision"):
                raise ValueError(f"LearnerConfig.freeze_vision is set but {type(model).__name__} has no vision tower")
            model.freeze_vision = True  # stop_gradient at the tower's output: no backward through it
        trainable_filter = model.trainable_filter() if hasattr(model, "trainable_filter") else nnx.Param
        shard_model(model, self.mesh, rules)
        self._graphdef, self.params, self.frozen = nnx.split(model, trainable_filter, ...)
        self._tx = make_optimizer(config.optimizer, master_weights=needs_master_weights(self.params))
        self._schedule = learning_rate_schedule(config.optimizer)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        self._replicated = replicated
        fix = _replicated_if_unnamed(self.mesh)
        self._param_shardings = jax.tree.map(lambda a: fix(a.sharding), self.params)
        self._frozen_shardings = jax.tree.map(lambda a: fix(a.sharding), self.frozen)
        opt_state = jax.jit(self._tx.init)(self.params)
        self._opt_shardings = jax.tree.map(lambda a: fix(a.sharding), opt_state)
        self.opt_state = jax.device_put(opt_state, self._opt_shardings)
        self.step = jax.device_put(jnp.zeros((), jnp.int32), replicated)
        self._copy_params = jax.jit(lambda s: jax.tree.map(jnp.copy, s), out_shardings=self._param_shardings)
        self._copy_opt_state = jax.jit(lambda s: jax.tree.map(jnp.copy, s), out_shardings=self._opt_shardings)
        self._copy_frozen = jax.jit(lambda s: jax.tree.map(jnp.copy, s), out_shardings=self._frozen_shardings)
        self._policy_gradient = config.objective == "policy_gradient"
        self._metrics_type = PolicyLossMetrics if self._policy_gradient else SupervisedLossMetrics
        self.reference_params = (
            self._copy_params(self.params) if self._policy_gradient and config.loss.kl_coef > 0 else None
        )
        self.reference_scoring_passes = 0  # micro-batches scored by the reference, for accounting
        self._zero_totals = jax.jit(self._empty_totals, out_shardings=self._totals_shardings())
        self._zero_accumulator = jax.jit(
            lambda p: (jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), p), self._empty_totals()),
            out_shardings=self._accumulator_shardings(),
        )
        self._apply = jax.jit(
            self._apply_fn,
            in_shardings=(self._param_shardings, self._opt_shardings, replicated, self._accumulator_shardings()),
            out_shardings=(self._param_shardings, self._opt_shardings, replicated, replicated),
            donate_argnums=(0, 1, 2),  # the accumulator has no output to alias; it is freed on return
        )
        self._jit_cache: dict[Any, Any] = {}

    # -- views -------------------------------------------------------------------------------

    @property
    def model(self) -> nnx.Module:
        """The current policy as an NNX module (shares the learner's arrays: read, don't train)."""
        return nnx.merge(self._graphdef, self.params, self.frozen)

    # -- accumulation: loss totals are (numerator, denominator, metrics) summed over micro-batches;
    # the gradient accumulator is (float32 sum of the numerators' gradients, totals) ------------

    def _empty_totals(self):
        return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), self._metrics_type.empty()

    def _totals_shardings(self):
        return jax.tree.map(lambda _: self._replicated, jax.eval_shape(self._empty_totals))

    def _accumulator_shardings(self):
        return self._param_shardings, self._totals_shardings()

    def batch_shardings(self, batch: TrainBatch) -> TrainBatch:
        """A NamedSharding per array of `batch`: rows over the mesh's batch axes, images replicated."""

        def spec(names, x):
            return NamedSharding(self.mesh, logical_to_spec(names, self.rules, x.shape, self.mesh))

        row = ("activation_batch", None)
        fields = {}
        for name in (
            "ids",
            "segment_ids",
            "loss_mask",
            "rollout_logprobs",
            "advantages",
            "old_logprobs",
            "ref_logprobs",
        ):
            x = getattr(batch, name)
            fields[name] = None if x is None else spec(row, x)
        positions = batch.positions
        fields["positions"] = spec(row if positions.ndim == 2 else (None, *row), positions)
        fields["item_valid"] = spec(("activation_batch",), batch.item_valid)
        for name in ("pixel_values", "patch_offsets"):
            fields[name] = None if getattr(batch, name) is None else self._replicated
        features = lambda f: None if f is None else jax.tree.map(lambda x: spec((*row, None), x), f)
        fields["image_features"] = features(batch.image_features)
        prefix = batch.prefix
        if prefix is not None:
            fields["prefix"] = prefix.replace(
                ids=spec(row, prefix.ids),
                segment_ids=spec(row, prefix.segment_ids),
                positions=spec(row if prefix.positions.ndim == 2 else (None, *row), prefix.positions),
                index=spec(("activation_batch",), prefix.index),
                pixel_values=None if prefix.pixel_values is None else self._replicated,
                image_features=features(prefix.image_features),
            )
        return batch.replace(**fields)

    def process_rows(self, rows: int) -> ProcessRows:
        """Where this process's rows of a `rows`-row micro-batch sit (coordinated collection:
        `global_batch`): rows / process count of them, one contiguous block, cut into `shards`
        row shards by its devices. Raises when the mesh does not split the rows that way (the
        batch axes, data x fsdp, must divide `rows` and span the processes)."""
        names = ("activation_batch", None)
        sharding = NamedSharding(self.mesh, logical_to_spec(names, self.rules, (rows, 1), self.mesh))
        blocks = {index[0].indices(rows)[:2] for index in sharding.addressable_devices_indices_map((rows, 1)).values()}
        held = sorted({r for start, stop in blocks for r in range(start, stop)})
        count = jax.process_count()
        if len(held) * count != rows or held != list(range(held[0], held[0] + len(held))):
            raise ValueError(
                f"the mesh {dict(self.mesh.shape)} does not split micro-batches of {rows} rows (learner.rows) into "
                f"one block of {rows / count:g} rows per process ({count} processes): this process holds rows "
                f"{held[:8]}{'...' if len(held) > 8 else ''}; the mesh's data x fsdp must divide learner.rows and "
                "be a multiple of the process count"
            )
        return ProcessRows(len(held), held[0] // len(held), len(blocks))

    def global_batch(self, local: TrainBatch) -> TrainBatch:
        """The global micro-batch whose rows on this process are `local`'s (numpy, as `collate`
        makes them at `process_rows(...).rows` rows; with shared prefix rows, its prefix block
        too, the rows' prefix indices already global): every process passes its own rows and no
        process holds the others' (`jax.make_array_from_process_local_data`). Images are
        replicated over the mesh, so `local`'s images (pixel_values, patch_offsets, and its
        prefix's pixel_values) are already the whole micro-batch's, the same on every process
        (`cua_jax.train.coordinated.join_process_images`)."""
        prefix = local.prefix
        if local.image_features is not None or (prefix is not None and prefix.image_features is not None):
            raise ValueError("Learner.global_batch: takes patches (pixel_values), not encoded image_features")
        images = {"pixel_values": local.pixel_values, "patch_offsets": local.patch_offsets}
        prefix_pixels = None if prefix is None else prefix.pixel_values
        local = local.replace(pixel_values=None, patch_offsets=None)
        if prefix is not None:
            local = local.replace(prefix=prefix.replace(pixel_values=None))
        count = jax.process_count()

        def global_shape(x):
            shape = list(np.shape(x))
            shape[1 if len(shape) == 3 else 0] *= count  # rows: [3, B, L] positions, else the first axis
            return jax.ShapeDtypeStruct(tuple(shape), np.asarray(x).dtype)

        abstract = jax.tree.map(global_shape, local)
        batch = jax.tree.map(
            lambda sharding, x, shape: jax.make_array_from_process_local_data(sharding, np.asarray(x), shape.shape),
            self.batch_shardings(abstract),
            local,
            abstract,
        )

        def replicated(x):
            return None if x is None else jax.make_array_from_process_local_data(self._replicated, np.asarray(x))

        batch = batch.replace(**{name: replicated(x) for name, x in images.items()})
        if prefix is not None:
            batch = batch.replace(prefix=batch.prefix.replace(pixel_values=replicated(prefix_pixels)))
        return batch

    def _with_image_features(self, batch: TrainBatch) -> TrainBatch:
        """With a frozen vision tower, `batch` with its images (and its prefix's) encoded once
        here, as `image_features`, instead of by every pass that scores it: the reference, the
        recomputed old logprobs and the gradient all read the same features, and their compiled
        programs no longer depend on how many images a micro-batch holds."""
        if not self.config.freeze_vision:
            return batch
        if batch.pixel_values is not None:
            batch = batch.replace(
                image_features=self._encode(batch.ids, batch.pixel_values, batch.image_grid),
                pixel_values=None,
                patch_offsets=None,
                image_grid=None,
            )
        prefix = batch.prefix
        if prefix is not None and prefix.pixel_values is not None:
            batch = batch.replace(
                prefix=prefix.replace(
                    image_features=self._encode(prefix.ids, prefix.pixel_values, prefix.image_grid),
                    pixel_values=None,
                    image_grid=None,
                )
            )
        return batch

    def _encode(self, ids, pixel_values, grid):
        def encode(params, frozen, ids, pixel_values):
            model = nnx.merge(self._graphdef, params, frozen)
            tokens, deepstack = model.encode_images(pixel_values, grid)
            return image_features(ids, model.config.image_token_id, tokens, deepstack)

        with timeline.span("vision"), use_mesh(self.mesh, self.rules):
            key = ("encode", grid)
            fn = self._jit_cache.get(key)
            if fn is None:
                fn = self._jit_cache[key] = jax.jit(encode)
            return timeline.settle(fn(self.params, self.frozen, ids, pixel_values))

    # -- the jitted passes ---------------------------------------------------------------------

    def _logprobs(self, params, frozen, batch: TrainBatch):
        model = nnx.merge(self._graphdef, params, frozen)
        cfg = self.config
        return score_sequences(
            model,
            batch.ids,
            batch.segment_ids,
            batch.positions,
            temperature=cfg.temperature,
            seq_chunk=cfg.seq_chunk,
            vocab_chunk=cfg.vocab_chunk,
            banned_token_ids=cfg.banned_token_ids,
            prefix=batch.prefix,
            **batch.model_inputs(),
        )

    def _score_fn(self, params, frozen, batch: TrainBatch) -> jax.Array:
        return self._logprobs(params, frozen, batch)[0]

    def _objective(self, params, frozen, batch: TrainBatch):
        """(numerator, the objective's output) of one micro-batch: differentiated through the first."""
        cfg = self.config
        logp, entropy = self._logprobs(params, frozen, batch)
        if not self._policy_gradient:
            out = supervised_loss(logp, batch.loss_mask, entropy)
            return out.numerator, out
        if cfg.old_logprobs == "rollout":
            old = batch.rollout_logprobs
        elif cfg.old_logprobs == "recompute":
            old = batch.old_logprobs
        else:
            old = jax.lax.stop_gradient(logp)
        # The TIS weight (loss.tis_cap) is min(exp(old - rollout), cap) with this `old`.
        out = policy_loss(
            logp,
            old,
            batch.advantages,
            batch.loss_mask,
            cfg.loss,
            ref_logp=batch.ref_logprobs,
            rollout_logp=batch.rollout_logprobs,
            entropy=entropy,
        )
        return out.numerator, out

    @staticmethod
    def _add_to_totals(totals, out):
        num, den, metrics = totals
        return num + out.numerator, den + out.denominator, metrics.merge(out.metrics)

    @staticmethod
    def _summary(totals) -> dict[str, jax.Array]:
        num, den, metrics = totals
        return {"loss": normalize(num, den), "loss_denominator": den, **metrics.summary()}

    def _loss_fn(self, params, frozen, totals, batch: TrainBatch):
        _, out = self._objective(params, frozen, batch)
        return self._add_to_totals(totals, out)

    def _grad_fn(self, params, frozen, accumulator, batch: TrainBatch):
        grads, out = jax.grad(self._objective, has_aux=True)(params, frozen, batch)
        grad_sum, totals = accumulator
        return (
            jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads),  # float32 sums
            self._add_to_totals(totals, out),
        )

    def _apply_fn(self, params, opt_state, step, accumulator):
        grad_sum, totals = accumulator
        _, denominator, _ = totals
        grads = _normalized_gradient(grad_sum, denominator)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = self._tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        out = {"grad_norm": grad_norm, "learning_rate": self._schedule(step), **self._summary(totals)}
        return params, opt_state, step + 1, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}

    def _compiled(self, kind: str, batch_sharding: TrainBatch):
        key = (kind, jax.tree.structure(batch_sharding), tuple(jax.tree.leaves(batch_sharding)))
        fn = self._jit_cache.get(key)
        if fn is not None:
            return fn
        if kind == "score":
            row = batch_sharding.ids
            fn = jax.jit(
                self._score_fn,
                in_shardings=(self._param_shardings, self._frozen_shardings, batch_sharding),
                out_shardings=row,
            )
        elif kind == "loss":
            totals = self._totals_shardings()
            fn = jax.jit(
                self._loss_fn,
                in_shardings=(self._param_shardings, self._frozen_shardings, totals, batch_sharding),
                out_shardings=totals,
                donate_argnums=(2,),
            )
        else:
            acc = self._accumulator_shardings()
            fn = jax.jit(
                self._grad_fn,
                in_shardings=(self._param_shardings, self._frozen_shardings, acc, batch_sharding),
                out_shardings=acc,
                donate_argnums=(2,),
            )
        self._jit_cache[key] = fn
        return fn

    def _score(self, params, batch: TrainBatch, stage: str) -> jax.Array:
        with timeline.span(stage), use_mesh(self.mesh, self.rules):  # activations follow the logical rules
            out = timeline.settle(self._compiled("score", self.batch_shardings(batch))(params, self.frozen, batch))
            if timeline.active() is not None:
                timeline.count(f"learner/{stage}_tokens", batch_tokens(batch))
            return out

    # -- public API ------------------------------------------------------------------------------

    def score(self, batch: TrainBatch, params: nnx.State | None = None) -> np.ndarray:
        """float32 [B, L] logprobs of a micro-batch's tokens (aligned with its ids, as the loss
        sees them) under `params` (a copy of `train_state()["params"]`; default the current ones).
        A global micro-batch of several processes (`global_batch`): a collective, and every
        process gets the whole [B, L]."""
        batch = self._with_image_features(jax.device_put(batch, self.batch_shardings(batch)))
        scores = self._score(self.params if params is None else params, batch, "old_logprobs")
        if not scores.is_fully_addressable:
            from jax.experimental import multihost_utils

            scores = multihost_utils.process_allgather(scores, tiled=True)
        return np.asarray(scores)

    def prepare(self, microbatches: Sequence[TrainBatch]) -> list[TrainBatch]:
        """Places micro-batches on the mesh and fills what the loss compares against, once.

        Adds ref_logprobs (frozen reference, when kl_coef > 0) and, with old_logprobs =
        "recompute", old_logprobs under the current params, to every micro-batch that lacks
        them (policy gradient only: the supervised objective compares against nothing). Call
        it on all micro-batches of a rollout batch before its first update, so later
        mini-batches of the same rollout batch see the pre-update policy.
        """
        out = []
        for batch in microbatches:
            batch = jax.device_put(batch, self.batch_shardings(batch))
            batch = self._with_image_features(batch)
            if self.reference_params is not None and batch.ref_logprobs is None:
                batch = batch.replace(ref_logprobs=self._score(self.reference_params, batch, "reference"))
                self.reference_scoring_passes += 1
            if self._policy_gradient and self.config.old_logprobs == "recompute" and batch.old_logprobs is None:
                batch = batch.replace(old_logprobs=self._score(self.params, batch, "old_logprobs"))
            out.append(batch)
        return out

    def _accumulate(self, microbatches: Sequence[TrainBatch]):
        if not microbatches:
            raise ValueError("Learner.update needs at least one micro-batch")
        microbatches = self.prepare(microbatches)
        accumulator = self._zero_accumulator(self.params)
        with timeline.span("forward_backward"), use_mesh(self.mesh, self.rules):
            for batch in microbatches:
                grad_step = self._compiled("grad", self.batch_shardings(batch))
                accumulator = grad_step(self.params, self.frozen, accumulator, batch)
                if timeline.active() is not None:
                    timeline.count("learner/forward_backward_tokens", batch_tokens(batch))
            return timeline.settle(accumulator)  # the span is the device work's, not its dispatch

    def gradients(self, microbatches: Sequence[TrainBatch]) -> tuple[nnx.State, dict[str, float]]:
        """The mini-batch's loss gradient (before clipping) w.r.t. the trainable parameters, and
        the loss metrics, without updating anything."""
        grad_sum, totals = self._accumulate(microbatches)
        _, denominator, _ = totals
        grads = _normalized_gradient(grad_sum, denominator)
        return grads, {k: float(v) for k, v in jax.device_get(self._summary(totals)).items()}

    def evaluate(self, microbatches: Iterable[TrainBatch]) -> dict[str, float]:
        """The loss and loss metrics over all of `microbatches` under the current params, without
        updating anything (for "sft": the token-mean NLL pooled over all their loss-mask tokens).
        Micro-batches are placed and prepared one at a time, so an iterator of any length fits."""
        totals = self._zero_totals()
        for batch in microbatches:
            [batch] = self.prepare([batch])
            with use_mesh(self.mesh, self.rules):
                totals = self._compiled("loss", self.batch_shardings(batch))(self.params, self.frozen, totals, batch)
        return {k: float(v) for k, v in jax.device_get(self._summary(totals)).items()}

    def train_state(self) -> dict[str, Any]:
        """The state a resumed run needs: {"params", "frozen", "opt_state", "step"} (the learner's
        own arrays; params are donated to the next update, so copy or save them before it), plus
        "reference_params" when there is a KL reference. The frozen part (a frozen vision tower)
        and the reference are the policy the learner started from, e.g. a warm-started one,
        which a resumed run cannot rebuild."""
        state = {"params": self.params, "frozen": self.frozen, "opt_state": self.opt_state, "step": self.step}
        if self.reference_params is not None:
            state["reference_params"] = self.reference_params
        return state

    def load_train_state(self, state: Mapping[str, Any]) -> None:
        """Sets params, frozen parameters, optimizer state, step (and the reference, when
        `state` has one) from `state` (as `train_state` returns, or loaded from a checkpoint),
        copied onto the learner's shardings; `state` stays valid."""
        if "frozen" not in state:
            raise ValueError(
                "the train state has no 'frozen' parameters (written by an older version); "
                "a resumed run would keep freshly initialised frozen weights"
            )
        self.params = self._copy_params(state["params"])
        self.frozen = self._copy_frozen(state["frozen"])
        self.opt_state = self._copy_opt_state(state["opt_state"])
        self.step = jax.device_put(jnp.asarray(state["step"], jnp.int32).copy(), self._replicated)
        if self.reference_params is not None and "reference_params" in state:
            self.reference_params = self._copy_params(state["reference_params"])

    def update(self, microbatches: Sequence[TrainBatch]) -> dict[str, float]:
        """One optimizer step on the mini-batch made of `microbatches` (gradients accumulated
        exactly; see the module doc). Prepares any micro-batch not prepared yet.

        Returns float metrics: loss, grad_norm (before clipping), learning_rate,
        loss_denominator, and the loss statistics: for "sft", entropy and num_tokens; for
        policy gradient, clipfrac, clipfrac_low, clipfrac_high, clipfrac_dual, ppo_kl,
        ratio_mean, ratio_min, ratio_max, entropy, ref_kl, rollout_logprob_gap (mean
        |learner - rollout| logprob over action tokens),
        rollout_logprob_gap_p99 (the largest micro-batch's 99th percentile of it),
        rollout_logprob_gap_max, tis_capped_frac, tis_weight_mean, num_tokens.
        """
        accumulator = self._accumulate(microbatches)
        with timeline.span("optimizer"):
            self.params, self.opt_state, self.step, metrics = self._apply(
                self.params, self.opt_state, self.step, accumulator
            )
            return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def train_on_batch(self, minibatches: Sequence[Sequence[TrainBatch]]) -> list[dict[str, float]]:
        """All updates of one rollout batch: prepares every micro-batch first (reference and
        recomputed old logprobs under the pre-update params), then one update per mini-batch."""
        prepared = [self.prepare(mb) for mb in minibatches]
        return [self.update(mb) for mb in prepared]
