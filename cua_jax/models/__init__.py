"""cua_jax.models."""
