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
micro-batch. Items with an empty mask (padding rows) count in no denominator.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cua_jax.rl.kl import KL_ESTIMATORS

AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "fixed_denominator")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of `policy_loss` (defaults: ScaleCUA Table 10).

    clip_eps_low / clip_eps_high: the ratio is clipped to [1 - low, 1 + high].
    dual_clip_c: cap c > 1 on the loss of negative-advantage tokens (None disables it).
    kl_coef / kl_estimator: weight and estimator ("k1", "k2", "k3") of KL(pi || pi_ref);
      with kl_coef > 0, `ref_logp` must be given.
    entropy_coef: weight of the entropy bonus; with entropy_coef > 0, `entropy` must be given.
    aggregation: one of AGGREGATION_MODES.
    fixed_denominator: the per-item constant D of the "fixed_denominator" mode.
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    dual_clip_c: float | None = 3.0
    kl_coef: float = 1e-4
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"
    fixed_denominator: float | None = None

    def __post_init__(self):
        if not 0 <= self.clip_eps_low < 1:
            raise ValueError(f"PolicyLossConfig.clip_eps_low must lie in [0, 1), got {self.clip_eps_low}")
        if self.clip_eps_high < 0:
            raise ValueError(f"PolicyLossConfig.clip_eps_high must be >= 0, got {self.clip_eps_high}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ValueError(f"PolicyLossConfig.dual_clip_c must be > 1 (or None), got {self.dual_clip_c}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"PolicyLossConfig.kl_estimator {self.kl_estimator!r} is unknown; "
                f"choose one of {sorted(KL_ESTIMATORS)}"
            )
        if self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"PolicyLossConfig.aggregation {self.aggregation!r} is unknown; "
                f"choose one of {list(AGGREGATION_MODES)}"
            )
        if self.aggregation == "fixed_denominator" and not (
            self.fixed_denominator is not None and self.fixed_denominator > 0
        ):
            raise ValueError(
                "PolicyLossConfig.aggregation 'fixed_denominator' needs fixed_denominator > 0, "
                f"got {self.fixed_denominator}"
            )


class PolicyLossMetrics(NamedTuple):
    """Accumulable token statistics over the masked tokens of one or more micro-batches.

    Sums and counts add across micro-batches and extrema combine with min/max (`merge`);
    `summary()` turns them into the logged means. All fields are scalars.
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

    def merge(self, other: "PolicyLossMetrics") -> "PolicyLossMetrics":
        """The statistics of both micro-batches together."""
        combined = {
            name: a + b for name, a, b in zip(self._fields, self, other)
        }
        combined["ratio_min"] = jnp.minimum(self.ratio_min, other.ratio_min)
        combined["ratio_max"] = jnp.maximum(self.ratio_max, other.ratio_max)
        return PolicyLossMetrics(**combined)

    def summary(self) -> dict[str, jax.Array]:
        """Logged scalars: fractions and means over masked tokens.

        With no masked token, fractions and means are 0 and the ratio statistics 1.
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
      float scalar; additive over disjoint sets of rows.
    """
    mask = (jnp.asarray(loss_mask) != 0).astype(jnp.float32)
    if mask.ndim != 2:
        raise ValueError(f"loss_denominator: loss_mask must be [B, T], got shape {mask.shape}")
    if config.aggregation == "token_mean":
        return jnp.sum(mask)
    nonempty_items = jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32))
    if config.aggregation == "fixed_denominator":
        return nonempty_items * config.fixed_denominator
    return nonempty_items


def _aggregate_numerator(per_token: jax.Array, mask: jax.Array, aggregation: str) -> jax.Array:
    masked = per_token * mask
    if aggregation == "seq_mean_token_mean":
        per_item = jnp.sum(masked, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        return jnp.sum(per_item)
    return jnp.sum(masked)


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
        rollout-vs-learner gap metric (0 when absent).
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
        raise ValueError(
            f"policy_loss: advantages has shape {advantages.shape}, expected {shape[:1]} or {shape}"
        )
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError("policy_loss: entropy_coef > 0 needs entropy")

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

    numerator = _aggregate_numerator(per_token, mask, config.aggregation)
    denominator = loss_denominator(mask, config).astype(logp.dtype)

    def masked_sum(x):
        return jnp.sum(jnp.where(on, jax.lax.stop_gradient(x), 0.0))

    def count(flags):
        return jnp.sum((on & flags).astype(logp.dtype))

    ratio_seen = jax.lax.stop_gradient(ratio)
    if rollout_logp is not None:
        rollout_logp = _check_token_array("rollout_logp", rollout_logp, shape)
        gap = jnp.abs(clean(rollout_logp) - logp)
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
    )
    return PolicyLossOutput(numerator=numerator, denominator=denominator, metrics=metrics)
