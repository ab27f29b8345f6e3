"""Tolerances derived from float32 round-off, for comparing two float32 evaluations
of one function that were compiled separately (fused differently, summed in another
order): on some CPUs (AVX2 without AVX-512, say) such results differ in their last
bits, so a test that means "these are the same function" compares within this bound
and proves bitwise sameness on what one compiled path computes (parameters, states).

Higham's bound for a float32 sum or dot product of n terms: |fl(s) − s| ≤ γ_n Σ|terms|,
γ_n = n·u / (1 − n·u), u = 2⁻²⁴ (float32's unit round-off). Two evaluations each within
that bound of the exact value are within twice it of each other.
"""

U32 = 2.0**-24  # float32 unit round-off


def gamma(n: int) -> float:
    """γ_n = n·u / (1 − n·u): the relative error bound of an n-term float32 sum."""
    return n * U32 / (1.0 - n * U32)


def two_evaluations_apart(n: int, magnitude: float) -> float:
    """How far apart two float32 evaluations of one quantity may be, each an n-term
    reduction whose terms' absolute values sum to at most `magnitude`."""
    return 2.0 * gamma(n) * magnitude


def qwen3_forward_terms(config, seq_len: int) -> int:
    """The reduction lengths one log-prob goes through in a Qwen3 forward, added up
    (to first order their relative errors add): per layer the two RMSNorms, the q/k/v
    and gate/up projections (hidden), the scores (head_dim), the softmax and the
    weighted sum (seq_len each), o_proj (heads × head_dim) and down_proj
    (intermediate); then the final norm, the LM head (hidden) and the log-sum-exp
    (vocab)."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    per_layer = (
        4 * hidden + config.head_dim + 2 * seq_len + heads * config.head_dim
    ) + config.intermediate_size
    return config.num_hidden_layers * per_layer + 2 * hidden + config.vocab_size
