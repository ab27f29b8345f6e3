"""Causal block skipping gives the same attention as the full T x T computation."""

import jax
import numpy as np
import pytest

from orchestra_jax.models.qwen3_attention import (
    causal_blocked_attention,
    grouped_attention,
    segment_causal_mask,
)


@pytest.mark.parametrize("t,block", [(96, 32), (100, 32), (64, 64)])
def test_blocked_equals_full(t, block):
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    b, h, kv_heads, d = 2, 4, 2, 8
    q = jax.random.normal(kq, (b, t, h, d))
    k = jax.random.normal(kk, (b, kv_heads, t, d))
    v = jax.random.normal(kv, (b, kv_heads, t, d))
    # Row 0: two packed sequences then padding; row 1: one sequence, no padding.
    seg = np.zeros((b, t), np.int32)
    seg[0, : t // 3], seg[0, t // 3 : t - 7] = 1, 2
    seg[1] = 1
    mask = segment_causal_mask(seg)
    full = grouped_attention(q, k, v, mask)
    blocked = causal_blocked_attention(q, k, v, mask, block=block)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(full), atol=1e-6, rtol=1e-6)
