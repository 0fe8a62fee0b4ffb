"""The clipped policy-gradient loss with KL anchor and entropy bonus, over [B, T] token arrays.

Per token t of item b, with ratio rho = exp(logp - old_logp) and advantage A:

  pg   = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))     (asymmetric clip, DAPO)
  pg   = min(pg, -A c)  where A < 0                                (dual clip, cap c)
  loss = pg + kl_coef * KL_est(logp, ref_logp) - entropy_coef * entropy

ScaleCUA App. D eq. 3 / Table 10 uses eps 0.2 / 0.28, c = 3.0, k3 KL with 1e-4; CANOPY eq. 8
uses eps 0.2 / 0.2 and k3 KL, with token_mean aggregation.

Aggregation and micro-batches. `policy_loss` returns a numerator and a denominator instead of
their ratio. Both are sums over the items of the call, so splitting a batch into micro-batches
(whole rows) and adding the numerators and the denominators separately gives exactly the
full-batch numerator and denominator; the loss is `normalize(sum num, sum den)`. Since the
denominator never depends on the parameters, the gradient of the full-batch loss is
sum(grad num) / sum(den), so accumulated gradients are divided once, after accumulation, by
the full batch's denominator (which the caller may also compute up front with
`loss_denominator` on the full mask):

  token_mean           num = sum_b sum_t m l            den = sum_b sum_t m  (CANOPY eq. 8: one
                                                         pooled N over every action token)
  seq_mean_token_mean  num = sum_b (sum_t m l / n_b)    den = number of items with n_b > 0
  seq_mean_token_sum   num = sum_b sum_t m l            den = number of items with n_b > 0
  fixed_denominator    num = sum_b sum_t m l            den = (items with n_b > 0) * D, D a
                                                         constant per item, e.g. the maximum
                                                         response length (Dr. GRPO)

where m is the loss mask and n_b = sum_t m of item b. For the seq-mean modes, the denominator
of the whole accumulation is therefore the number of sequences of the full batch, not of one
micro-batch. Items with an empty mask (padding rows) count in no denominator. Each mode is a
function registered in AGGREGATION_MODES under its name (see `Aggregation`).

Truncated importance sampling (TIS; verl, AReaL). The inference engine that sampled the tokens
and the learner disagree on their log-probs (kernels, precision, batching), so the tokens are
samples of the engine's policy, not of the policy the learner takes as the behaviour policy
(`old_logp`). With `tis_cap` > 0, the policy-gradient term of each token is multiplied by

  w = min(exp(old_logp - rollout_logp), tis_cap)                  (a constant: stop_gradient)

which corrects the expectation from the engine's distribution to the learner's; the cap bounds
the variance. Only pg is weighted; the KL and entropy terms are the learner's own. When the old
log-probs are the engine's (the learner's "rollout" mode) w is exactly 1.

The decoupled objective (AReaL, `surrogate="decoupled"`) separates the two roles `old_logp`
plays in PPO for data from older policies: the ratio is clipped against the proximal policy
(`old_logp`: the learner's parameters before the update, old_logprobs="recompute"), and the
behaviour policy that sampled the tokens (the engine, `rollout_logp`, possibly several versions
stale) enters only through the importance weight

  w = exp(old_logp - rollout_logp)                                (a constant: stop_gradient)
  pg = w * pg   where w <= tis_cap;   0 where w > tis_cap          (tis_cap = 0: no cap)

Tokens past the cap are left out of the policy-gradient term, as AReaL's behaviour weight cap
does, rather than truncated; they still count in the denominator, which must not depend on
anything but the mask for micro-batch accumulation to stay exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cua_jax.registry import Registry
from cua_jax.rl.kl import KL_ESTIMATORS

# An aggregation mode: (per_token [B, T] float, mask [B, T] of 0/1 in per_token's dtype,
# config) -> (numerator: scalar in per_token's dtype, denominator: float32 scalar), both sums
# over the rows (module docstring). The denominator depends on the mask and config alone.
Aggregation = Callable[[jax.Array, jax.Array, "PolicyLossConfig"], tuple[jax.Array, jax.Array]]
AGGREGATION_MODES: Registry[Aggregation] = Registry("aggregation mode")
SURROGATES = ("ppo", "decoupled")
# The quantile of the rollout-vs-learner log-prob gap that the metrics report.
GAP_QUANTILE = 0.99


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of `policy_loss` (defaults: ScaleCUA Table 10).

    clip_eps_low / clip_eps_high: the ratio is clipped to [1 - low, 1 + high].
    dual_clip_c: cap c > 1 on the loss of negative-advantage tokens (None disables it).
    kl_coef / kl_estimator: weight and estimator ("k1", "k2", "k3") of KL(pi || pi_ref);
      with kl_coef > 0, `ref_logp` must be given.
    entropy_coef: weight of the entropy bonus; with entropy_coef > 0, `entropy` must be given.
    aggregation: a name registered in AGGREGATION_MODES.
    fixed_denominator: the per-item constant D of the "fixed_denominator" mode.
    tis_cap: truncated importance sampling of the engine-vs-learner mismatch (see the module
      docstring): 0 turns it off, else the cap (>= 1) on the per-token weight
      exp(old_logp - rollout_logp); `rollout_logp` must then be given. With old_logp equal to
      rollout_logp the weight is exactly 1.
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    dual_clip_c: float | None = 3.0
    kl_coef: float = 1e-4
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"
    fixed_denominator: float | None = None
    tis_cap: float = 0.0
    surrogate: str = "ppo"

    def __post_init__(self):
        if self.surrogate not in SURROGATES:
            raise ValueError(f"PolicyLossConfig.surrogate {self.surrogate!r} is unknown; choose one of {SURROGATES}")
        if not 0 <= self.clip_eps_low < 1:
            raise ValueError(f"PolicyLossConfig.clip_eps_low must lie in [0, 1), got {self.clip_eps_low}")
        if self.clip_eps_high < 0:
            raise ValueError(f"PolicyLossConfig.clip_eps_high must be >= 0, got {self.clip_eps_high}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ValueError(f"PolicyLossConfig.dual_clip_c must be > 1 (or None), got {self.dual_clip_c}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"PolicyLossConfig.kl_estimator {self.kl_estimator!r} is unknown; choose one of {sorted(KL_ESTIMATORS)}"
            )
        if self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"PolicyLossConfig.aggregation {self.aggregation!r} is unknown; choose one of {list(AGGREGATION_MODES)}"
            )
        if self.aggregation == "fixed_denominator" and not (
            self.fixed_denominator is not None and self.fixed_denominator > 0
        ):
            raise ValueError(
                "PolicyLossConfig.aggregation 'fixed_denominator' needs fixed_denominator > 0, "
                f"got {self.fixed_denominator}"
            )
        # A cap below 1 would down-weight even tokens the engine and the learner agree on.
        if not (self.tis_cap == 0 or self.tis_cap >= 1):
            raise ValueError(f"PolicyLossConfig.tis_cap must be 0 (off) or >= 1, got {self.tis_cap}")


# PolicyLossMetrics fields that combine across micro-batches by max / min (the rest add up).
_MERGED_BY_MAX = ("ratio_max", "logprob_gap_max", "logprob_gap_p99")
_MERGED_BY_MIN = ("ratio_min",)


class PolicyLossMetrics(NamedTuple):
    """Accumulable token statistics over the masked tokens of one or more micro-batches.

    Sums and counts add across micro-batches and extrema combine with min/max (`merge`);
    `summary()` turns them into the logged means. All fields are scalars.

    logprob_gap_p99 is a quantile, which does not combine exactly: merged, it is the largest
    of the micro-batches' own GAP_QUANTILE quantiles (exact for one micro-batch; at most
    logprob_gap_max always).
    """

    num_tokens: jax.Array
    clipped_low: jax.Array  # A < 0 and rho < 1 - eps_low: the lower clip is binding
    clipped_high: jax.Array  # A > 0 and rho > 1 + eps_high: the upper clip is binding
    clipped_dual: jax.Array  # A < 0 and rho > c: the dual-clip cap is binding
    ppo_kl_sum: jax.Array  # k1 of old -> current: sum(old_logp - logp)
    ratio_sum: jax.Array
    ratio_min: jax.Array
    ratio_max: jax.Array
    entropy_sum: jax.Array
    ref_kl_sum: jax.Array
    logprob_gap_sum: jax.Array  # sum |rollout_logp - logp|
    logprob_gap_max: jax.Array  # max |rollout_logp - logp| (0 without tokens: the gap is >= 0)
    logprob_gap_p99: jax.Array  # GAP_QUANTILE quantile of |rollout_logp - logp|, see above
    tis_capped: jax.Array  # tokens whose weight exp(old_logp - rollout_logp) exceeded tis_cap (TIS or decoupled)
    tis_weight_sum: jax.Array  # sum of the applied weights (1 per token when neither is on)

    @classmethod
    def empty(cls) -> PolicyLossMetrics:
        """The identity of `merge`: the statistics of no token at all."""
        fields = {name: jnp.zeros((), jnp.float32) for name in cls._fields}
        fields["ratio_min"] = jnp.full((), jnp.inf, jnp.float32)
        fields["ratio_max"] = jnp.full((), -jnp.inf, jnp.float32)
        return cls(**fields)

    def merge(self, other: PolicyLossMetrics) -> PolicyLossMetrics:
        """The statistics of both micro-batches together."""
        combined = {name: a + b for name, a, b in zip(self._fields, self, other)}
        for name in _MERGED_BY_MAX:
            combined[name] = jnp.maximum(getattr(self, name), getattr(other, name))
        for name in _MERGED_BY_MIN:
            combined[name] = jnp.minimum(getattr(self, name), getattr(other, name))
        return PolicyLossMetrics(**combined)

    def summary(self) -> dict[str, jax.Array]:
        """Logged scalars: fractions and means over masked tokens.

        With no masked token, fractions, means and gaps are 0 and the ratio and TIS weight
        statistics 1.
        """
        n = jnp.maximum(self.num_tokens, 1.0)
        some = self.num_tokens > 0
        return {
            "clipfrac_low": self.clipped_low / n,
            "clipfrac_high": self.clipped_high / n,
            "clipfrac_dual": self.clipped_dual / n,
            "clipfrac": (self.clipped_low + self.clipped_high + self.clipped_dual) / n,
            "ppo_kl": self.ppo_kl_sum / n,
            "ratio_mean": jnp.where(some, self.ratio_sum / n, 1.0),
            "ratio_min": jnp.where(some, self.ratio_min, 1.0),
            "ratio_max": jnp.where(some, self.ratio_max, 1.0),
            "entropy": self.entropy_sum / n,
            "ref_kl": self.ref_kl_sum / n,
            "rollout_logprob_gap": self.logprob_gap_sum / n,
            "rollout_logprob_gap_p99": self.logprob_gap_p99,
            "rollout_logprob_gap_max": self.logprob_gap_max,
            "tis_capped_frac": self.tis_capped / n,
            "tis_weight_mean": jnp.where(some, self.tis_weight_sum / n, 1.0),
            "num_tokens": self.num_tokens,
        }


class PolicyLossOutput(NamedTuple):
    """numerator / denominator: see the module docstring; metrics: PolicyLossMetrics."""

    numerator: jax.Array
    denominator: jax.Array
    metrics: PolicyLossMetrics


def normalize(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator, and 0 when the denominator is 0 (a batch with no trained token)."""
    return jnp.where(denominator > 0, numerator / jnp.maximum(denominator, 1e-30), 0.0)


def _check_token_array(name: str, x, shape) -> jax.Array:
    x = jnp.asarray(x)
    if x.shape != shape:
        raise ValueError(f"policy_loss: {name} has shape {x.shape}, expected {shape} like logp")
    return x


def loss_denominator(loss_mask: jax.Array, config: PolicyLossConfig) -> jax.Array:
    """The denominator `policy_loss` reports for these items under `config.aggregation`.

    Args:
      loss_mask: [B, T], nonzero on trained tokens.
      config: PolicyLossConfig (static).

    Returns:
      float32 scalar; additive over disjoint sets of rows.
    """
    mask = (jnp.asarray(loss_mask) != 0).astype(jnp.float32)
    if mask.ndim != 2:
        raise ValueError(f"loss_denominator: loss_mask must be [B, T], got shape {mask.shape}")
    # The numerator of a zero loss is discarded (and compiled away under jit).
    _, denominator = AGGREGATION_MODES[config.aggregation](jnp.zeros_like(mask), mask, config)
    return denominator


def masked_quantile(x: jax.Array, mask: jax.Array, q: float, empty: float = 0.0) -> jax.Array:
    """The q-quantile of the entries of `x` where `mask` is nonzero, as `np.quantile` (its
    default "linear" interpolation) of those entries; `empty` when no entry is selected.

    Args:
      x: float [...], finite on the selected entries (anything elsewhere).
      mask: [...], the same shape as x; nonzero selects.
      q: the quantile, in [0, 1].
      empty: the value for an empty selection.

    Returns:
      float32 (or wider) scalar, not differentiated (a statistic).
    """
    x = jax.lax.stop_gradient(jnp.asarray(x))
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mask = jnp.asarray(mask)
    if mask.shape != x.shape:
        raise ValueError(f"masked_quantile: mask has shape {mask.shape}, expected {x.shape} like x")
    if isinstance(q, (int, float)) and not 0 <= q <= 1:
        raise ValueError(f"masked_quantile: q must lie in [0, 1], got {q}")
    selected = (mask != 0).ravel()
    size = selected.shape[0]
    # Unselected entries sort first as -inf, so the n selected values are the last n.
    ordered = jnp.sort(jnp.where(selected, x.ravel(), -jnp.inf))
    n = jnp.sum(selected.astype(jnp.int32))
    position = q * jnp.maximum(n - 1, 0).astype(x.dtype)  # in the sorted selection
    below = jnp.floor(position)
    fraction = position - below
    lo = size - n + below.astype(jnp.int32)
    hi = jnp.minimum(lo + 1, size - 1)
    a, b = ordered[jnp.minimum(lo, size - 1)], ordered[hi]
    value = jnp.where(fraction > 0, a + fraction * (b - a), a)
    return jnp.where(n > 0, value, jnp.asarray(empty, x.dtype))


def truncated_importance_weight(
    old_logp: jax.Array, rollout_logp: jax.Array, cap: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token TIS weights min(exp(old_logp - rollout_logp), cap), under stop_gradient.

    Args:
      old_logp: float [...], the behaviour policy the learner assumes.
      rollout_logp: float [...], the engine's log-probs of the same tokens.
      cap: the truncation, >= 1.

    Returns:
      (weight float [...], capped bool [...]: where exp(old_logp - rollout_logp) > cap).
    """
    raw = jnp.exp(jax.lax.stop_gradient(old_logp - rollout_logp))  # may be inf: capped below
    return jnp.minimum(raw, cap), raw > cap


def behaviour_importance_weight(
    proximal_logp: jax.Array, behaviour_logp: jax.Array, cap: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token behaviour weights of the decoupled objective, under stop_gradient: exp(proximal
    - behaviour), and 0 where that exceeds `cap` (cap 0: no cap).

    Args:
      proximal_logp: float [...], the proximal policy's log-probs (the learner before the update).
      behaviour_logp: float [...], the log-probs of the policy that sampled the tokens.
      cap: 0 (none) or >= 1.

    Returns:
      (weight float [...], dropped bool [...]: where the weight exceeded the cap).
    """
    raw = jnp.exp(jax.lax.stop_gradient(proximal_logp - behaviour_logp))
    dropped = raw > cap if cap > 0 else jnp.zeros(raw.shape, bool)
    return jnp.where(dropped, 0.0, raw), dropped


def _token_count(mask: jax.Array) -> jax.Array:
    """float32: the number of masked tokens."""
    return jnp.sum(mask.astype(jnp.float32))


def _nonempty_items(mask: jax.Array) -> jax.Array:
    """float32: the number of rows with at least one masked token."""
    return jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32))


@AGGREGATION_MODES.register("token_mean")
def aggregate_token_mean(
    per_token: jax.Array, mask: jax.Array, config: PolicyLossConfig
) -> tuple[jax.Array, jax.Array]:
    """num = sum_b sum_t m l, den = sum_b sum_t m: one pooled N over every action token (CANOPY eq. 8)."""
    del config  # no mode-specific settings
    return jnp.sum(per_token * mask), _token_count(mask)


@AGGREGATION_MODES.register("seq_mean_token_mean")
def aggregate_seq_mean_token_mean(
    per_token: jax.Array, mask: jax.Array, config: PolicyLossConfig
) -> tuple[jax.Array, jax.Array]:
    """num = sum_b (sum_t m l / n_b), den = number of items with n_b > 0."""
    del config  # no mode-specific settings
    per_item = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    return jnp.sum(per_item), _nonempty_items(mask)


@AGGREGATION_MODES.register("seq_mean_token_sum")
def aggregate_seq_mean_token_sum(
    per_token: jax.Array, mask: jax.Array, config: PolicyLossConfig
) -> tuple[jax.Array, jax.Array]:
    """num = sum_b sum_t m l, den = number of items with n_b > 0."""
    del config  # no mode-specific settings
    return jnp.sum(per_token * mask), _nonempty_items(mask)


@AGGREGATION_MODES.register("fixed_denominator")
def aggregate_fixed_denominator(
    per_token: jax.Array, mask: jax.Array, config: PolicyLossConfig
) -> tuple[jax.Array, jax.Array]:
    """num = sum_b sum_t m l, den = (items with n_b > 0) * config.fixed_denominator (Dr. GRPO)."""
    return jnp.sum(per_token * mask), _nonempty_items(mask) * config.fixed_denominator


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: PolicyLossConfig = PolicyLossConfig(),
    *,
    ref_logp: jax.Array | None = None,
    rollout_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> PolicyLossOutput:
    """Clipped surrogate + KL + entropy over the masked tokens of a [B, T] batch.

    Args:
      logp: float [B, T], log pi_theta of the sampled tokens (differentiated).
      old_logp: float [B, T], log-probs of the policy that defines the ratio's denominator
        (the rollout policy; equal to `logp` on the first pass of a strictly on-policy step).
      advantages: float [B] (one per item) or [B, T] (per token).
      loss_mask: [B, T], nonzero on the action tokens to train.
      config: PolicyLossConfig (static under jit).
      ref_logp: optional float [B, T], log pi_ref; required when config.kl_coef > 0.
      rollout_logp: optional float [B, T], the inference engine's log-probs, for the
        rollout-vs-learner gap metrics (0 when absent) and the TIS weight; required when
        config.tis_cap > 0.
      entropy: optional float [B, T], the policy's per-token entropy (differentiated when
        entropy_coef > 0); required when config.entropy_coef > 0.

    Returns:
      PolicyLossOutput(numerator, denominator, metrics); the loss is
      `normalize(numerator, denominator)`; see the module docstring for accumulation.
    """
    # Low-precision log-probs (bf16) are promoted: ratios and token counts need float32.
    logp = jnp.asarray(logp)
    logp = logp.astype(jnp.promote_types(logp.dtype, jnp.float32))
    if logp.ndim != 2:
        raise ValueError(f"policy_loss: logp must be [B, T], got shape {logp.shape}")
    shape = logp.shape
    old_logp = _check_token_array("old_logp", old_logp, shape).astype(logp.dtype)
    mask = (_check_token_array("loss_mask", loss_mask, shape) != 0).astype(logp.dtype)
    advantages = jnp.asarray(advantages, dtype=logp.dtype)
    if advantages.shape == shape[:1]:
        advantages = jnp.broadcast_to(advantages[:, None], shape)
    elif advantages.shape != shape:
        raise ValueError(f"policy_loss: advantages has shape {advantages.shape}, expected {shape[:1]} or {shape}")
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError("policy_loss: entropy_coef > 0 needs entropy")
    if (config.tis_cap > 0 or config.surrogate == "decoupled") and rollout_logp is None:
        raise ValueError("policy_loss: tis_cap > 0 or the decoupled surrogate needs rollout_logp")

    # Masked-out positions may hold anything (padding, -inf log-probs). Replace them before any
    # arithmetic, not after: a NaN in an unselected `where` branch still poisons the gradient.
    on = mask > 0

    def clean(x):
        return jnp.where(on, x.astype(logp.dtype), 0.0)

    logp, old_logp, advantages = clean(logp), clean(old_logp), clean(advantages)
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, low, high)
    pg = jnp.maximum(unclipped, clipped)
    negative = advantages < 0
    if config.dual_clip_c is not None:
        pg = jnp.where(negative, jnp.minimum(pg, -advantages * config.dual_clip_c), pg)
        dual_binding = negative & (ratio > config.dual_clip_c)
    else:
        dual_binding = jnp.zeros(shape, dtype=bool)

    if rollout_logp is not None:
        rollout_logp = clean(_check_token_array("rollout_logp", rollout_logp, shape))
    if config.surrogate == "decoupled":
        tis_weight, tis_capped = behaviour_importance_weight(old_logp, rollout_logp, config.tis_cap)
        pg = pg * tis_weight
    elif config.tis_cap > 0:
        tis_weight, tis_capped = truncated_importance_weight(old_logp, rollout_logp, config.tis_cap)
        # After the clips (as verl): the weight reweights the whole clipped term's sample.
        pg = pg * tis_weight
    else:
        tis_weight, tis_capped = jnp.ones(shape, logp.dtype), jnp.zeros(shape, dtype=bool)

    per_token = pg
    if ref_logp is not None:
        ref_logp = clean(_check_token_array("ref_logp", ref_logp, shape))
        ref_kl = KL_ESTIMATORS[config.kl_estimator](logp, ref_logp)
        if config.kl_coef > 0:
            per_token = per_token + config.kl_coef * ref_kl
    else:
        ref_kl = jnp.zeros(shape, logp.dtype)
    if entropy is not None:
        entropy = clean(_check_token_array("entropy", entropy, shape))
        if config.entropy_coef > 0:
            per_token = per_token - config.entropy_coef * entropy
    else:
        entropy = jnp.zeros(shape, logp.dtype)

    numerator, denominator = AGGREGATION_MODES[config.aggregation](per_token, mask, config)
    denominator = denominator.astype(logp.dtype)

    def masked_sum(x):
        return jnp.sum(jnp.where(on, jax.lax.stop_gradient(x), 0.0))

    def count(flags):
        return jnp.sum((on & flags).astype(logp.dtype))

    ratio_seen = jax.lax.stop_gradient(ratio)
    if rollout_logp is not None:
        gap = jax.lax.stop_gradient(jnp.abs(rollout_logp - logp))
    else:
        gap = jnp.zeros(shape, logp.dtype)
    metrics = PolicyLossMetrics(
        num_tokens=jnp.sum(mask),
        clipped_low=count(negative & (ratio < low)),
        clipped_high=count((advantages > 0) & (ratio > high)),
        clipped_dual=count(dual_binding),
        ppo_kl_sum=masked_sum(-log_ratio),
        ratio_sum=masked_sum(ratio),
        ratio_min=jnp.min(jnp.where(on, ratio_seen, jnp.inf)),
        ratio_max=jnp.max(jnp.where(on, ratio_seen, -jnp.inf)),
        entropy_sum=masked_sum(entropy),
        ref_kl_sum=masked_sum(ref_kl),
        logprob_gap_sum=masked_sum(gap),
        logprob_gap_max=jnp.max(jnp.where(on, gap, 0.0)),
        logprob_gap_p99=masked_quantile(gap, on, GAP_QUANTILE),
        tis_capped=count(tis_capped),
        tis_weight_sum=masked_sum(tis_weight),
    )
    return PolicyLossOutput(numerator=numerator, denominator=denominator, metrics=metrics)
