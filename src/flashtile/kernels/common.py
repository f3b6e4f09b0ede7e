"""Small @triton.jit helpers shared by the forward and backward kernels."""
import triton
import triton.language as tl


@triton.jit
def _mask_scores(s, q_idx, k_idx, seqlen_q, seqlen_k, IS_CAUSAL: tl.constexpr):
    """The one place where scores are changed: -inf where a query may not see a key.

    s: scores in log2 units; q_idx / k_idx: query and key positions broadcastable to s's shape
    ([M, 1] and [1, N] in the forward and dQ kernels, [1, M] and [N, 1] in the dK/dV kernel,
    which works on the transposed tile). Called only on blocks that need masking: full blocks
    are decided by the loop bounds, so they skip this entirely.
    """
    visible = k_idx < seqlen_k
    if IS_CAUSAL:
        # Bottom-right aligned: query i sees key j iff j <= i + Sk - Sq.
        visible = visible & (k_idx <= q_idx + (seqlen_k - seqlen_q))
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _load_tile(ptrs, offs_rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Load a [rows, HEAD_DIM_PAD] tile, zero outside the sequence and the real head dim."""
    if MASK_ROWS:
        if HEAD_DIM == HEAD_DIM_PAD:
            return tl.load(ptrs, mask=offs_rows[:, None] < n_rows, other=0.0)
        return tl.load(ptrs, mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if HEAD_DIM == HEAD_DIM_PAD:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _store_tile(ptrs, value, offs_rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Store a [rows, HEAD_DIM_PAD] tile, only the rows inside the sequence and the real head dim."""
    if HEAD_DIM == HEAD_DIM_PAD:
        tl.store(ptrs, value, mask=offs_rows[:, None] < n_rows)
    else:
        tl.store(ptrs, value, mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _causal_key_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       IS_CAUSAL: tl.constexpr):
    """Key range of a query block: [0, full_hi) needs no mask, [full_hi, hi) does.

    Causal query i sees keys j <= i + Sk - Sq, so the block's last row bounds hi and its first
    row bounds the keys every row sees. full_hi is a multiple of BLOCK_N.
    """
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        hi = tl.minimum(seqlen_k, start_m + BLOCK_M + diag)
        hi = tl.maximum(hi, 0)
        all_see = tl.minimum(start_m + diag + 1, seqlen_k)
        full_hi = tl.maximum(all_see, 0) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen_k
        full_hi = seqlen_k // BLOCK_N * BLOCK_N
    full_hi = tl.minimum(full_hi, hi)
    return full_hi, hi


@triton.jit
def _causal_query_bounds(start_n, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         IS_CAUSAL: tl.constexpr):
    """Query range of a key block (the dK/dV kernel's loop), all multiples of BLOCK_M.

    Returns (lo, full_lo, full_hi, hi): [lo, full_lo) and [full_hi, hi) need masks, [full_lo, full_hi)
    does not. Causal key j is seen by queries i >= j - (Sk - Sq).
    """
    hi = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        lo = tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M
        lo = tl.minimum(lo, hi)
        full_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M
        full_lo = tl.minimum(full_lo, hi)
    else:
        lo = 0
        full_lo = 0
    if start_n + BLOCK_N <= seqlen_k:
        full_hi = tl.maximum(seqlen_q // BLOCK_M * BLOCK_M, full_lo)
    else:
        full_hi = full_lo  # a key block past the sequence end is masked on every query block
    return lo, full_lo, full_hi, hi
