"""cua_jax.tasks."""
