"""FLOP counts for attention, in the FlashAttention papers' convention.

Forward: two matmuls (Q K^T and P V), each 2 * Sq * Sk * D FLOPs per (batch, query head), so
``4 * B * Hq * Sq * Sk * D``. Causal masking skips about half of the score matrix, so the count is
halved (the papers halve it for any Sq, Sk; we do the same so numbers compare with theirs).
Sliding windows instead count the exact visible (query, key) pairs, ``4 * B * Hq * pairs * D``: a
window can hide far more than half, and an approximation would misstate TFLOP/s. (So causal plus a
window counts exactly, while plain causal keeps the papers' Sq * Sk / 2.) Softcap and ALiBi add
elementwise work only and do not change the count.
Backward: five matmuls (recompute S, dV, dP, dQ, dK) = 2.5x the forward. Forward + backward = 3.5x.
Softmax/exp FLOPs are not counted, also as in the papers.
"""
from functools import lru_cache

MODES = ("fwd", "bwd", "fwd_bwd")
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


@lru_cache(maxsize=256)
def visible_pairs(seqlen_q, seqlen_k, left=-1, right=-1):
    """Number of (i, j) with i + Sk - Sq - left <= j <= i + Sk - Sq + right, 0 <= j < Sk (-1 = unbounded)."""
    total = 0
    for i in range(seqlen_q):
        p = i + seqlen_k - seqlen_q  # the query's position on the key axis
        lo = max(0, p - left) if left >= 0 else 0
        hi = min(seqlen_k - 1, p + right) if right >= 0 else seqlen_k - 1
        total += max(0, hi - lo + 1)
    return total


def attention_flops(batch, heads_q, seqlen_q, seqlen_k, head_dim, causal=False, mode="fwd",
                    window_size=(-1, -1)):
    """FLOPs of one attention call in ``mode`` ("fwd", "bwd" or "fwd_bwd").

    window_size=(left, right) as in flash_attn_func (causal sets right = 0); any bound other than the
    plain causal one counts the visible pairs exactly.
    """
    if mode not in MODE_FACTOR:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    left, right = window_size
    if causal:
        right = 0
    if left < 0 and (right < 0 or causal):
        pairs = seqlen_q * seqlen_k / (2 if causal else 1)
    else:
        pairs = visible_pairs(seqlen_q, seqlen_k, left, right)
    return 4.0 * batch * heads_q * pairs * head_dim * MODE_FACTOR[mode]


def tflops(flops, ms):
    """TFLOP/s for ``flops`` done in ``ms`` milliseconds (None when ms is missing or not positive)."""
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
