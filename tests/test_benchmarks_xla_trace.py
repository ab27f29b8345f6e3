"""experiments/benchmarks/xla_trace.py: HLO ops mapped to their Python functions, and thunk times."""

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.xla_trace import hlo_ops, trace_thunk_seconds


def project(x, w):
    return jnp.tanh(x @ w)


def test_hlo_ops_name_the_functions_and_the_trace_times_them():
    x = jnp.asarray(np.ones((8, 64), np.float32))
    w = jnp.asarray(np.ones((64, 32), np.float32))
    jitted = jax.jit(project)
    ops = hlo_ops(jitted.lower(x, w).compile().as_text())
    dots = [op for op in ops.values() if op.is_dot]
    assert dots and all("project" in op.functions for op in dots)
    seconds = trace_thunk_seconds(lambda: jitted(x, w).block_until_ready(), 2)
    assert any(name in seconds for name in ops)
