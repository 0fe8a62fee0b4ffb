"""Pure JAX reinforcement-learning math: advantages, policy losses, KL estimators, coverage.

No I/O and no global state: every function takes arrays and returns arrays, and jit-compiles.
"""
