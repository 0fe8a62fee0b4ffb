"""The model_step benchmark's profiler summary reads JAX's trace of a jitted step."""

import jax
import jax.numpy as jnp

from experiments.benchmarks.model_step import profile_step


def test_profile_step_reports_op_kinds_and_top_ops(capsys):
    step = jax.jit(lambda a, b: jnp.tanh(a @ b).T.sum())
    a = jnp.ones((64, 32))
    profile_step(step, (a, jnp.ones((32, 48))), runs=2, top=3)
    out = capsys.readouterr().out
    assert "ms of ops per step" in out and "matmul" in out
    op_lines = [line for line in out.splitlines() if line.startswith("    ") and " ms  " in line]
    assert 1 <= len(op_lines) <= 3
