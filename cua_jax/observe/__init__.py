"""cua_jax.observe."""
