"""cua_jax.envs."""
