"""FLOP counts for attention, in the FlashAttention papers' convention.

Forward: two matmuls (Q K^T and P V), each 2 * Sq * Sk * D FLOPs per (batch, query head), so
``4 * B * Hq * Sq * Sk * D``. Causal masking skips about half of the score matrix, so the count is
halved (the papers halve it for any Sq, Sk; we do the same so numbers compare with theirs).
Backward: five matmuls (recompute S, dV, dP, dQ, dK) = 2.5x the forward. Forward + backward = 3.5x.
Softmax/exp FLOPs are not counted, also as in the papers.
"""

MODES = ("fwd", "bwd", "fwd_bwd")
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(batch, heads_q, seqlen_q, seqlen_k, head_dim, causal=False, mode="fwd"):
    """FLOPs of one attention call in ``mode`` ("fwd", "bwd" or "fwd_bwd")."""
    if mode not in MODE_FACTOR:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fwd = 4.0 * batch * heads_q * seqlen_q * seqlen_k * head_dim
    if causal:
        fwd /= 2
    return fwd * MODE_FACTOR[mode]


def tflops(flops, ms):
    """TFLOP/s for ``flops`` done in ``ms`` milliseconds (None when ms is missing or not positive)."""
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
