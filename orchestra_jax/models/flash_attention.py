"""Blocked attention whose memory grows linearly with sequence length (FlashAttention's scheme).

    out = flash_attention(q, k, v, mask, block_q=256, block_k=256)

q [B, T, H, D]; k, v [B, K, S, D] with K key/value heads, G = H / K query heads
each; `mask` an `AttentionMask` (coordinates and segment ids, never a dense
[T, S] array): query t sees key s iff

    kv_coord[s] <= q_coord[t]  and  kv_segment[s] == q_segment[t] != 0,

or, where the mask names a shared prefix's segment for query t (`q_prefix[t]`
!= 0, `rl/prefix_packing.py`), kv_segment[s] == q_prefix[t] as well.

Forward: for each block of `block_q` queries, an online softmax runs over the
blocks of `block_k` keys, keeping per row the running maximum m, the running
sum l of exp(scores − m) and the running weighted sum of values; the output is
that sum / l, and the pass keeps only the output and lse = m + log l per row.
Key blocks whose smallest coordinate exceeds every coordinate of the query
block are skipped (a causal mask's upper triangle), and so are key blocks whose
segments the query block does not hold (earlier sequences of a packed row): each
query block reads one range of key blocks, the union over the batch's rows. With
shared prefixes, it reads a second range before that one, the blocks of the
prefixes it sees, and skips the other continuations of its prefix between them.

Backward (FlashAttention-2, Dao 2023): each block's probabilities are
recomputed as P = exp(S − lse), then with dO the output's cotangent and
Δ = rowsum(dO ∘ O):

    dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − Δ),   dQ += dS K · scale,   dK += dSᵀ Q · scale

so no [T, S] array is ever stored: memory is O(T · D) plus one block's scores.
Scores, softmax statistics and every accumulator are float32; matmul operands
are q/k/v's dtype (probabilities and dS are cast to it, as in FlashAttention).
A row with no visible key gets output 0 and no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from orchestra_jax.models.attention_mask import AttentionMask

_F32 = jnp.float32


def _pad_to(x: jax.Array, axis: int, size: int, value) -> jax.Array:
    if x.shape[axis] == size:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


class _Blocks:
    """Static block geometry and the padded, blocked inputs shared by both passes."""

    def __init__(self, q, k, mask: AttentionMask, block_q: int, block_k: int):
        b, t, h, d = q.shape
        kv_heads, s = k.shape[1], k.shape[2]
        self.g = h // kv_heads
        self.bq, self.bk = min(block_q, t), min(block_k, s)
        self.nq, self.nk = -(-t // self.bq), -(-s // self.bk)
        self.t, self.s, self.h = t, s, h
        self.scale = d**-0.5
        tp, sp = self.nq * self.bq, self.nk * self.bk
        # Padded queries have segment 0 (see nothing); padded keys segment -1 (seen by none).
        self.q_coord = _pad_to(mask.q_coord, 1, tp, -1).reshape(b, self.nq, self.bq)
        self.q_seg = _pad_to(mask.q_segment, 1, tp, 0).reshape(b, self.nq, self.bq)
        self.q_prefix = (
            None
            if mask.q_prefix is None
            else _pad_to(mask.q_prefix, 1, tp, 0).reshape(b, self.nq, self.bq)
        )
        self.kv_coord = _pad_to(mask.kv_coord, 1, sp, 0)
        self.kv_seg = _pad_to(mask.kv_segment, 1, sp, -1)
        self.first_kv, self.num_kv, self.first_prefix, self.end_prefix = self._key_block_ranges(b)

    def _key_block_ranges(self, b: int):
        """int32 [nq] each: the first key block a query block reads and one past the
        last; then the same for the blocks of the shared prefixes it sees (None
        without prefixes), a range that ends before the first. Key block j can
        matter to query block i in a row only if its smallest coordinate is <= the
        query block's largest (causal) and its segment ids (those > 0) overlap the
        query block's (those != 0), or its prefix segments: packed sequences never
        read each other's blocks. Blocks outside the ranges in every row are
        skipped; the blocks inside are read and masked as usual."""
        big = jnp.iinfo(jnp.int32).max
        q_live = self.q_seg != 0  # [B, nq, bq]
        q_max = jnp.where(q_live, self.q_coord, -1).max(axis=2)  # [B, nq]
        q_seg_min = jnp.where(q_live, self.q_seg, big).min(axis=2)
        q_seg_max = jnp.where(q_live, self.q_seg, -1).max(axis=2)
        kv_coord = self.kv_coord.reshape(b, self.nk, self.bk)
        kv_seg = self.kv_seg.reshape(b, self.nk, self.bk)
        k_live = kv_seg > 0
        k_min = jnp.where(k_live, kv_coord, big).min(axis=2)  # [B, nk]
        k_seg_min = jnp.where(k_live, kv_seg, big).min(axis=2)
        k_seg_max = jnp.where(k_live, kv_seg, -1).max(axis=2)
        causal = k_min[:, None, :] <= q_max[:, :, None]

        def block_range(seg_min, seg_max):
            needed = (
                causal
                & (k_seg_min[:, None, :] <= seg_max[:, :, None])
                & (seg_min[:, :, None] <= k_seg_max[:, None, :])
            ).any(axis=0)  # [nq, nk]
            j = jnp.arange(self.nk)[None, :]
            first = jnp.min(jnp.where(needed, j, self.nk), axis=1)
            last = jnp.max(jnp.where(needed, j, -1), axis=1)
            first = jnp.minimum(first, last + 1)  # a block that needs nothing reads nothing
            return first.astype(jnp.int32), (last + 1).astype(jnp.int32)

        first, end = block_range(q_seg_min, q_seg_max)
        if self.q_prefix is None:
            return first, end, None, None
        reads = q_live & (self.q_prefix != 0)
        prefix_min = jnp.where(reads, self.q_prefix, big).min(axis=2)
        prefix_max = jnp.where(reads, self.q_prefix, -1).max(axis=2)
        first_prefix, end_prefix = block_range(prefix_min, prefix_max)
        end_prefix = jnp.minimum(end_prefix, first)  # blocks of the first range are read there
        return first, end, jnp.minimum(first_prefix, end_prefix), end_prefix

    def read_key_blocks(self, body, init, first_kv, num_kv, first_prefix, end_prefix):
        """`body(j, carry)` over the key blocks a query block reads: its prefixes'
        range (when the mask has prefixes), then its own."""
        if first_prefix is not None:
            init = jax.lax.fori_loop(first_prefix, end_prefix, body, init)
        return jax.lax.fori_loop(first_kv, num_kv, body, init)

    def prefix_blocks(self) -> jax.Array | None:
        """The query blocks' prefix segments [nq, B, bq] (scanned with them), or None."""
        return None if self.q_prefix is None else self.q_prefix.transpose(1, 0, 2)

    def query_blocks(self, x: jax.Array) -> jax.Array:
        """[B, T, H, D] -> [nq, B, K, G, bq, D] (padded with zeros)."""
        b, _, h, d = x.shape
        x = _pad_to(x, 1, self.nq * self.bq, 0)
        x = x.reshape(b, self.nq, self.bq, h // self.g, self.g, d)
        return x.transpose(1, 0, 3, 4, 2, 5)

    def unblock_queries(self, x: jax.Array) -> jax.Array:
        """[nq, B, K, G, bq, D] -> [B, T, H, D]."""
        nq, b, kv, g, bq, d = x.shape
        return x.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * bq, kv * g, d)[:, : self.t]

    def key_block(self, x: jax.Array, j) -> jax.Array:
        """Key block j of padded [B, K, S', D] keys or values."""
        return jax.lax.dynamic_slice_in_dim(x, j * self.bk, self.bk, axis=2)

    def visible(self, j, q_coord, q_seg, q_prefix=None) -> jax.Array:
        """bool [B, 1, 1, bq, bk]: the mask of a query block (its coordinates, segments
        and prefix segments or None, [B, bq]) against key block j."""
        kc = jax.lax.dynamic_slice_in_dim(self.kv_coord, j * self.bk, self.bk, axis=1)
        ks = jax.lax.dynamic_slice_in_dim(self.kv_seg, j * self.bk, self.bk, axis=1)
        same = ks[:, None, :] == q_seg[:, :, None]
        if q_prefix is not None:
            same = same | ((ks[:, None, :] == q_prefix[:, :, None]) & (q_prefix[:, :, None] != 0))
        vis = (kc[:, None, :] <= q_coord[:, :, None]) & same
        vis = vis & (q_seg[:, :, None] != 0)
        return vis[:, None, None]


def _scores(blocks: _Blocks, qi, kj) -> jax.Array:
    return jnp.einsum("bkgqd,bksd->bkgqs", qi, kj, preferred_element_type=_F32) * blocks.scale


def _forward(q, k, v, mask, block_q, block_k):
    blocks = _Blocks(q, k, mask, block_q, block_k)
    sp = blocks.nk * blocks.bk
    kp, vp = _pad_to(k, 2, sp, 0), _pad_to(v, 2, sp, 0)
    qb = blocks.query_blocks(q)

    def query_block(_, xs):
        qi, q_coord, q_seg, q_prefix, first_kv, num_kv, first_prefix, end_prefix = xs
        shape = qi.shape[:-1]  # [B, K, G, bq]

        def key_block(j, carry):
            m, total, acc = carry
            s = _scores(blocks, qi, blocks.key_block(kp, j))
            s = jnp.where(blocks.visible(j, q_coord, q_seg, q_prefix), s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - m_safe[..., None])
            alpha = jnp.exp(m - m_safe)
            pv = jnp.einsum(
                "bkgqs,bksd->bkgqd",
                p.astype(v.dtype),
                blocks.key_block(vp, j),
                preferred_element_type=_F32,
            )
            return m_new, alpha * total + p.sum(axis=-1), alpha[..., None] * acc + pv

        init = (
            jnp.full(shape, -jnp.inf, _F32),
            jnp.zeros(shape, _F32),
            jnp.zeros(qi.shape, _F32),
        )
        m, total, acc = blocks.read_key_blocks(
            key_block, init, first_kv, num_kv, first_prefix, end_prefix
        )
        seen = total > 0
        total = jnp.where(seen, total, 1.0)
        out = jnp.where(seen[..., None], acc / total[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(total), jnp.inf)
        return None, (out.astype(q.dtype), lse)

    xs = (
        qb,
        blocks.q_coord.transpose(1, 0, 2),
        blocks.q_seg.transpose(1, 0, 2),
        blocks.prefix_blocks(),
        blocks.first_kv,
        blocks.num_kv,
        blocks.first_prefix,
        blocks.end_prefix,
    )
    _, (out_b, lse) = jax.lax.scan(query_block, None, xs)
    return blocks.unblock_queries(out_b), (out_b, lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, mask, block_q, block_k):
    return _forward(q, k, v, mask, block_q, block_k)[0]


def _flash_fwd(q, k, v, mask, block_q, block_k):
    out, (out_b, lse) = _forward(q, k, v, mask, block_q, block_k)
    return out, (q, k, v, mask, out_b, lse)


def _flash_bwd(block_q, block_k, residuals, d_out):
    q, k, v, mask, out_b, lse = residuals
    blocks = _Blocks(q, k, mask, block_q, block_k)
    sp = blocks.nk * blocks.bk
    kp, vp = _pad_to(k, 2, sp, 0), _pad_to(v, 2, sp, 0)
    qb = blocks.query_blocks(q)
    dob = blocks.query_blocks(d_out.astype(q.dtype))
    # Δ = rowsum(dO ∘ O), from the float32 cotangent and the stored output, as a matmul
    # with a ones vector: XLA's CPU backend runs this sum as a slow windowed reduction.
    prod = blocks.query_blocks(d_out).astype(_F32) * out_b.astype(_F32)
    ones = jnp.ones((prod.shape[-1], 1), _F32)
    delta = jnp.dot(prod.reshape(-1, prod.shape[-1]), ones).reshape(prod.shape[:-1])

    def query_block(carry, xs):
        dk, dv = carry
        qi, doi, lse_i, delta_i, q_coord, q_seg, q_prefix = xs[:7]
        first_kv, num_kv, first_prefix, end_prefix = xs[7:]

        def key_block(j, inner):
            dq, dk, dv = inner
            kj, vj = blocks.key_block(kp, j), blocks.key_block(vp, j)
            s = _scores(blocks, qi, kj)
            vis = blocks.visible(j, q_coord, q_seg, q_prefix)
            p = jnp.where(vis, jnp.exp(s - lse_i[..., None]), 0.0)
            dv_j = jnp.einsum(
                "bkgqs,bkgqd->bksd", p.astype(q.dtype), doi, preferred_element_type=_F32
            )
            dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vj, preferred_element_type=_F32)
            ds = (p * (dp - delta_i[..., None])).astype(q.dtype)
            dq = dq + jnp.einsum("bkgqs,bksd->bkgqd", ds, kj, preferred_element_type=_F32)
            dk_j = jnp.einsum("bkgqs,bkgqd->bksd", ds, qi, preferred_element_type=_F32)
            start = j * blocks.bk
            dk = jax.lax.dynamic_update_slice_in_dim(
                dk, blocks.key_block(dk, j) + dk_j * blocks.scale, start, axis=2
            )
            dv = jax.lax.dynamic_update_slice_in_dim(
                dv, blocks.key_block(dv, j) + dv_j, start, axis=2
            )
            return dq, dk, dv

        dq = jnp.zeros(qi.shape, _F32)
        dq, dk, dv = blocks.read_key_blocks(
            key_block, (dq, dk, dv), first_kv, num_kv, first_prefix, end_prefix
        )
        return (dk, dv), dq * blocks.scale

    xs = (
        qb,
        dob,
        lse,
        delta,
        blocks.q_coord.transpose(1, 0, 2),
        blocks.q_seg.transpose(1, 0, 2),
        blocks.prefix_blocks(),
        blocks.first_kv,
        blocks.num_kv,
        blocks.first_prefix,
        blocks.end_prefix,
    )
    zeros = jnp.zeros(kp.shape, _F32)
    (dk, dv), dq_b = jax.lax.scan(query_block, (zeros, zeros), xs)
    dq = blocks.unblock_queries(dq_b)
    s = blocks.s
    mask_ct = jax.tree.map(lambda _: None, mask)
    return (
        dq.astype(q.dtype),
        dk[:, :, :s].astype(k.dtype),
        dv[:, :, :s].astype(v.dtype),
        mask_ct,
    )


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: AttentionMask,
    *,
    block_q: int = 256,
    block_k: int = 256,
) -> jax.Array:
    """softmax(q kᵀ / √D, masked) v in blocks, [B, T, H, D] in q's dtype; see the module
    docstring (k, v [B, K, S, D]; `mask` coordinates and segment ids)."""
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got {block_q}, {block_k}")
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    return _flash(q, k, v, mask, block_q, block_k)
