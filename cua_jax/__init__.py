"""cua_jax: online reinforcement learning of computer-use agents in JAX."""

__version__ = "0.1.0"
