"""cua_jax.eval."""
