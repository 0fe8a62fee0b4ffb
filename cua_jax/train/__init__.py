"""cua_jax.train."""
