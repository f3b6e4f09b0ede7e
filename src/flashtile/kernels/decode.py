"""Split-KV decoding ("flash-decoding") over a KV cache: few queries, long caches.

`_attn_fwd_splitkv` runs one program per (split, batch * KV head, packed row block). A tile packs the
group_size * Sq query rows that share one KV head, so each K/V byte is read once per row block instead of
once per query head: packed row r is query head hk * group_size + r // Sq at query position r % Sq. With
(B, Hq, Sq)-ordered rows this makes a tile's rows consecutive in lse's layout. Each split handles a
contiguous, BLOCK_N-aligned range of the key blocks its rows may see, and writes its partial output
(normalized by its own denominator) and lse; `_attn_combine` merges the splits with lse weights. With one
split the first kernel writes the final output directly.
"""
import triton
import triton.language as tl

from .common import _key_range_of_rows, _key_start, _load_tile, _segment, _store_tile
from .fwd import LN2, _attn_fwd_inner


# seqused_add is the cache length of a decode step with an int cache_seqlens: specialized (== 1, % 16) it would
# compile the kernel again as the cache grows.
@triton.jit(do_not_specialize=["seqused_add"])
def _attn_fwd_splitkv(Q, K, V, Out, Lse, Alibi, SequsedK, BlockTable, KeyStart,
                      stride_qb, stride_qm, stride_qh,
                      stride_kb, stride_kn, stride_kh,
                      stride_vb, stride_vn, stride_vh,
                      stride_os, stride_ob, stride_om, stride_oh,
                      stride_ls, stride_lb, stride_lh,
                      stride_alibi_b, stride_bt_b, page_size,
                      seqlen_q, heads_kv, group_size, num_splits, seqused_add,
                      qk_scale, softcap_log2, window_left, window_right,
                      HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, PAGED: tl.constexpr,
                      LEFTPAD: tl.constexpr, LEFT_BOUNDED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      HAS_SEQUSED_TENSOR: tl.constexpr, PAGE_SHIFT: tl.constexpr = -1,
                      PAGE_PREFETCH: tl.constexpr = False):
    """Writes split s's Out[s] (B, Sq, Hq, D) and Lse[s] (B, Hq, Sq) (natural log) at s * stride_os / stride_ls.

    Out/Lse are the fp32 workspace (num_splits > 1) or the final output and lse (one split, strides 0 along
    splits). Batch b sees its first seqused_add (+ SequsedK[b] when HAS_SEQUSED_TENSOR) keys, contiguous
    (K, V: (B, capacity, Hk, D)) or, when PAGED, in the pages BlockTable[b] lists (K, V: (num_pages, page_size,
    Hk, D)); with LEFTPAD only the cache tokens from KeyStart[b] on. A split that sees no key of a row writes
    output 0 and lse -inf for it.
    PAGED, PAGE_SHIFT: see common._kv_tile_ptrs; PAGE_PREFETCH: see fwd._attn_fwd_inner.
    Score arguments: see common._scores.
    """
    split = tl.program_id(0).to(tl.int64)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // heads_kv).to(tl.int64)
    off_hk = (pid_bh % heads_kv).to(tl.int64)
    n_rows = group_size * seqlen_q
    offs_r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows
    row_ok = offs_r < n_rows
    pos = offs_r % seqlen_q  # [BLOCK_M] query positions
    head = off_hk * group_size + (offs_r // seqlen_q).to(tl.int64)  # [BLOCK_M] query heads
    key_start = _key_start(KeyStart, off_b, LEFTPAD)
    seqlen_k = seqused_add - key_start
    if HAS_SEQUSED_TENSOR:
        seqlen_k += tl.load(SequsedK + off_b)

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    cols = offs_n[:, None].to(tl.int64)
    q_ptrs = (Q + off_b * stride_qb + pos[:, None].to(tl.int64) * stride_qm + head[:, None] * stride_qh
              + offs_d[None, :])
    k_head = K + off_hk * stride_kh
    v_head = V + off_hk * stride_vh
    k_ptrs = k_head + off_b * stride_kb + (cols + key_start) * stride_kn + offs_d[None, :]
    v_ptrs = v_head + off_b * stride_vb + (cols + key_start) * stride_vn + offs_d[None, :]
    alibi_slope = 0.0
    if HAS_ALIBI:  # one slope per packed row: [BLOCK_M, 1] broadcasts over the key axis in _scores
        alibi_slope = tl.load(Alibi + off_b * stride_alibi_b + head, mask=row_ok, other=0.0)[:, None]
    block_table = BlockTable + off_b * stride_bt_b

    q = _load_tile(q_ptrs, offs_r, n_rows, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # The tile's rows span query positions [first_q, last_q]; their key range, then this split's share of it.
    first_q = tl.min(tl.where(row_ok, pos, seqlen_q), 0)
    last_q = tl.max(tl.where(row_ok, pos, 0), 0)
    lo, full_lo, full_hi, hi = _key_range_of_rows(first_q, last_q, seqlen_q, seqlen_k, window_left, window_right,
                                                  BLOCK_N, LEFT_BOUNDED)
    per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), num_splits) * BLOCK_N
    split_lo = tl.minimum(lo + split * per_split, hi)
    split_hi = tl.minimum(split_lo + per_split, hi)
    for SEGMENT in tl.static_range(3):
        seg_lo, seg_hi = _segment(SEGMENT, lo, full_lo, full_hi, hi)
        seg_lo = tl.minimum(tl.maximum(seg_lo, split_lo), split_hi)
        seg_hi = tl.minimum(tl.maximum(seg_hi, split_lo), split_hi)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, pos, offs_n,
                                        offs_d, seg_lo, seg_hi, seqlen_q, seqlen_k, qk_scale, softcap_log2,
                                        alibi_slope, window_left, window_right, Q, 0, 0, k_head, v_head,
                                        stride_kb, stride_vb, block_table, page_size, key_start, 0, 0, 0, 0.0,
                                        HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, SEGMENT != 1, IS_LOCAL,
                                        SOFTCAP, HAS_ALIBI, False, PAGED, False, DOT_PRECISION,
                                        PAGE_SHIFT=PAGE_SHIFT, PAGE_PREFETCH=PAGE_PREFETCH)

    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)  # [BLOCK_M]
    o_ptrs = (Out + split * stride_os + off_b * stride_ob + pos[:, None].to(tl.int64) * stride_om
              + head[:, None] * stride_oh + offs_d[None, :])
    _store_tile(o_ptrs, acc.to(Out.dtype.element_ty), offs_r, n_rows, offs_d, HEAD_DIM, HEAD_DIM_PAD)
    tl.store(Lse + split * stride_ls + off_b * stride_lb + head * stride_lh + pos, lse, mask=row_ok)


@triton.jit
def _attn_combine(OutAccum, LseAccum, Out, Lse,
                  stride_as, stride_ab, stride_am, stride_ah,
                  stride_ls, stride_lb, stride_lh,
                  stride_ob, stride_om, stride_oh,
                  stride_lse_b, stride_lse_h,
                  seqlen_q, heads_q, num_splits,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program per (batch, query position, query head): Out = sum_s exp(lse_s - lse) * OutAccum[s],
    lse = log sum_s exp(lse_s), streaming the splits BLOCK_S at a time with a running maximum. Splits
    with lse_s = -inf (no visible key) weigh 0; a row no split saw gets output 0 and lse -inf."""
    pid = tl.program_id(0)
    off_b = (pid // (seqlen_q * heads_q)).to(tl.int64)
    pos = ((pid // heads_q) % seqlen_q).to(tl.int64)
    head = (pid % heads_q).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    lse_ptrs = LseAccum + off_b * stride_lb + head * stride_lh + pos + offs_s.to(tl.int64) * stride_ls
    o_ptrs = (OutAccum + off_b * stride_ab + pos * stride_am + head * stride_ah
              + offs_s[:, None].to(tl.int64) * stride_as + offs_d[None, :])
    m = tl.full([], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        in_range = s0 + offs_s < num_splits
        lse_s = tl.load(lse_ptrs, mask=in_range, other=float("-inf"))  # [BLOCK_S]
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # all splits so far empty: weights 0, not NaN
        weight = tl.exp(lse_s - m_sub)  # [BLOCK_S]
        alpha = tl.exp(m - m_sub)
        o = tl.load(o_ptrs, mask=in_range[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)  # [BLOCK_S, HEAD_DIM_PAD]
        lse_ptrs += BLOCK_S * stride_ls
        o_ptrs += BLOCK_S * stride_as
        acc = acc * alpha + tl.sum(o * weight[:, None], 0)
        denom = denom * alpha + tl.sum(weight, 0)
        m = m_new
    empty = denom == 0.0
    out = acc / tl.where(empty, 1.0, denom)
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, denom)))
    out_ptrs = Out + off_b * stride_ob + pos * stride_om + head * stride_oh + offs_d
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(Lse + off_b * stride_lse_b + head * stride_lse_h + pos, lse)
