"""Pure JAX reinforcement-learning math: advantages, policy losses, KL estimators, coverage.

No I/O, and no global state beyond the registries filled at import: every function takes
arrays and returns arrays, and jit-compiles.

  advantages  rewards + status -> scored rewards -> group-relative advantages (GRPO, Dr. GRPO,
              RLOO; quarantined episodes leave their group first) -> items (ScaleCUA broadcast
              or STEPO) -> [B, T] token advantages
  losses      clipped surrogate (asymmetric + dual clip) + KL anchor + entropy over [B, T],
              returned as numerator and denominator so micro-batches accumulate exactly
  kl          k1 / k2 / k3 estimators of KL(pi || pi_ref)
  coverage    signal coverage P_sig(p, n), the group-size floor, informative-group statistics

Estimators and aggregation modes are functions registered by name in a `cua_jax.registry.Registry`
(ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, AGGREGATION_MODES; `@REGISTRY.register(name)` adds one),
picked by name in frozen dataclasses (AdvantageConfig, PolicyLossConfig), which jit treats as
static.
"""
