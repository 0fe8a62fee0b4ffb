"""Per-token estimators of KL(pi_theta || pi_ref) from sampled-token log-probabilities (Schulman 2020).

With r = ref_logp - logp on tokens sampled from pi_theta:
  k1 = -r                 unbiased, high variance, can be negative
  k2 = r^2 / 2            biased, low variance, >= 0
  k3 = exp(r) - r - 1     unbiased, low variance, >= 0 (CANOPY's anchor to the frozen base)

Each is registered in KL_ESTIMATORS under its name; `PolicyLossConfig.kl_estimator` picks one.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from cua_jax.registry import Registry

# A KL estimator: (logp, ref_logp), float arrays of one shape -> the per-token estimate, same shape.
KLEstimator = Callable[[jax.Array, jax.Array], jax.Array]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k1 = logp - ref_logp, elementwise over any matching shape (e.g. [B, T])."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k2 = (ref_logp - logp)^2 / 2, elementwise."""
    return 0.5 * jnp.square(ref_logp - logp)


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k3 = exp(r) - r - 1 with r = ref_logp - logp, elementwise; always >= 0.

    expm1 keeps it accurate (and non-negative after rounding) for small r.
    """
    r = ref_logp - logp
    return jnp.maximum(jnp.expm1(r) - r, 0.0)
