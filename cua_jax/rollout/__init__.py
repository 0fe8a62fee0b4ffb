"""cua_jax.rollout."""
