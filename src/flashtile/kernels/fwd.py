"""FlashAttention forward: one program per (query block, batch * query head)."""
import triton
import triton.language as tl

from .common import (LOG2E, _block_list, _dropout_keep, _exp2_minus, _key_range, _key_start, _kv_tile_ptrs, _load_tile,
                     _log2_units, _query_block, _scores, _segment, _seq_offset, _store_tile, _tile_pages,
                     _sparse_tile_start)

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, offs_d,
                    lo, hi, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                    bias_ptr, stride_bias_m, stride_bias_n,
                    k_head, v_head, stride_kpage, stride_vpage, block_table, page_size, key_start,
                    seed, rng_base, max_k, dropout_threshold,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                    MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr,
                    HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, PAGED: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
                    SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, idx_ptr=None,
                    BLOCK_SPARSE: tl.constexpr = False, SPARSE_N: tl.constexpr = 128,
                    PAGE_SHIFT: tl.constexpr = -1, PAGE_PREFETCH: tl.constexpr = False):
    """Online softmax over key blocks [lo, hi); MASKED blocks evaluate the masks, the others skip them.
    BLOCK_SPARSE: [lo, hi) are offsets into the key blocks listed at idx_ptr (see _sparse_tile_start).
    PAGED: see common._kv_tile_ptrs. PAGE_PREFETCH: the block-table entries of the next tile are read while this
    one is processed and carried through the loop. The K/V addresses then do not depend on a load of the same
    iteration, and the software pipeliner multi-buffers K and V as for a contiguous cache (with the lookup in
    the iteration it counts one level of indirection and gives each load (num_stages - 1) // 2 stages of
    latency: one K/V buffer at 3 stages, so each tile waited for its full memory latency).

    HAS_DROPOUT: dropped probabilities still count in the denominator l_i (the softmax is of the
    undropped scores) but not in acc; the caller scales by dropout_scale at the end.
    """
    tl.static_assert(not (BLOCK_SPARSE and PAGED and PAGE_PREFETCH), "the block-sparse loop reads no pages ahead")
    if PAGED and PAGE_PREFETCH:
        next_pages = _tile_pages(block_table, lo, offs_n, seqlen_k, key_start, page_size, PAGED, PAGE_SHIFT)
    if BLOCK_SPARSE:
        next_start = _sparse_tile_start(lo, hi, idx_ptr, SPARSE_N)
    for virt_n in range(lo, hi, BLOCK_N):
        if BLOCK_SPARSE:
            start_n = next_start
            next_start = _sparse_tile_start(virt_n + BLOCK_N, hi, idx_ptr, SPARSE_N)
        else:
            start_n = virt_n
        offs_kn = start_n + offs_n
        pages = 0
        if PAGED and PAGE_PREFETCH:
            pages = next_pages
            next_pages = _tile_pages(block_table, start_n + BLOCK_N, offs_n, seqlen_k, key_start, page_size, PAGED,
                                     PAGE_SHIFT)
        elif PAGED:
            pages = _tile_pages(block_table, start_n, offs_n, seqlen_k, key_start, page_size, PAGED, PAGE_SHIFT)
        k = _load_tile(_kv_tile_ptrs(k_ptrs, k_head, start_n, offs_kn, offs_d, stride_kn, stride_kpage, pages,
                                     page_size, key_start, PAGED, PAGE_SHIFT),
                       offs_kn, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD, MASKED)  # [BLOCK_N, HEAD_DIM_PAD]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s, _, _ = _scores(qk, offs_m[:, None], offs_kn[None, :], seqlen_q, seqlen_k, qk_scale, softcap_log2,
                          alibi_slope, window_left, window_right, bias_ptr, stride_bias_m, stride_bias_n,
                          MASKED, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, off_b, off_h, aux0, aux1, aux2, aux3,
                          SCORE_MOD, None, MASK_MOD)
        m_new = tl.maximum(m_i, _log2_units(tl.max(s, 1), SCORE_MOD))  # [BLOCK_M]
        if MASKED or HAS_BIAS or SCORE_MOD is not None:
            # A row with no visible key yet keeps m = -inf (masks, or a bias / score_mod of -inf on every key of the
            # block, also in blocks without masks); subtract 0 instead so exp2 gives 0, not NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        p = _exp2_minus(s, m_sub[:, None], SCORE_MOD)  # [BLOCK_M, BLOCK_N]
        alpha = tl.math.exp2(m_i - m_sub)  # [BLOCK_M]
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(seed, rng_base, offs_m[:, None], start_n, max_k, dropout_threshold, BLOCK_N,
                                       False), p, 0.0)
        v = _load_tile(_kv_tile_ptrs(v_ptrs, v_head, start_n, offs_kn, offs_d, stride_vn, stride_vpage, pages,
                                     page_size, key_start, PAGED, PAGE_SHIFT),
                       offs_kn, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD, MASKED)  # [BLOCK_N, HEAD_DIM_PAD]
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seqused_add"])  # the cache length of a decode / prefill step: one compile for all
def _attn_fwd(Q, K, V, Out, Lse, Alibi, Sink, CuSeqlensQ, CuSeqlensK, Bias, BlockTable, KeyStart, Rng,
              stride_qb, stride_qm, stride_qh,
              stride_kb, stride_kn, stride_kh,
              stride_vb, stride_vn, stride_vh,
              stride_ob, stride_om, stride_oh,
              stride_lse_b, stride_lse_h, stride_alibi_b,
              stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n, stride_bt_b, page_size,
              seqlen_q, seqlen_k, seqused_add, heads_q, group_size, qk_scale, softcap_log2, window_left,
              window_right, dropout_scale, dropout_threshold,
              Aux0, Aux1, Aux2, Aux3, KvNum, KvIdx, FullKvNum, FullKvIdx,
              stride_bm_b, stride_bm_h, stride_bm_m, stride_bi_b, stride_bi_h, stride_bi_m,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              IS_LOCAL: tl.constexpr, LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr,
              HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
              HAS_BIAS: tl.constexpr, IS_VARLEN: tl.constexpr, SEQUSED_K: tl.constexpr, PAGED: tl.constexpr,
              LEFTPAD: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
              SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, BLOCK_SPARSE: tl.constexpr = False,
              SPARSE_M: tl.constexpr = 128, SPARSE_N: tl.constexpr = 128, PAGE_SHIFT: tl.constexpr = -1,
              PAGE_PREFETCH: tl.constexpr = False, HAS_SEQUSED_TENSOR: tl.constexpr = False):
    """Writes Out (B, Sq, Hq, D) and Lse (B, Hq, Sq) fp32, natural log. Score arguments: see _scores.

    IS_VARLEN: sequences are packed along the token axis (total, H, D) at offsets CuSeqlensQ/K (int32,
    B + 1); seqlen_q/seqlen_k are then the maxima that sized the grid, and Lse is (Hq, total_q).
    SEQUSED_K (dense, KV cache): batch b attends to its first seqused_add keys only, plus CuSeqlensK[b] when
    HAS_SEQUSED_TENSOR (an int cache length needs no device tensor: no fill kernel per decode step).
    PAGED (KV cache, or varlen keys): K and V are (num_pages, page_size, Hk, D), stride_kb / stride_vb step
    pages, and batch b's keys are listed page by page in BlockTable[b] (int32 (B, max_pages)).
    LEFTPAD (KV cache): batch b's keys are the cache tokens KeyStart[b] <= t < its key count (int32 (B,)).
    PAGE_SHIFT (common._page_slot), PAGE_PREFETCH (_attn_fwd_inner): how page lookups are computed and scheduled.

    HAS_SINK: Sink (Hq,) holds one logit per head that joins every row's softmax denominator but
    carries no value (attention sinks); the online softmax simply starts from it.

    HAS_DROPOUT: Rng holds the int64 Philox seed; probabilities are dropped with probability dropout_p (where
    the element's 15-bit draw is below dropout_threshold = philox.dropout_threshold(dropout_p), see
    common._dropout_keep) and the kept ones scaled by dropout_scale = 1 / (1 - dropout_p), computed by the host in
    float64 (here in fp32, 1 - p would carry p's rounding: a factor 2 ulps too small at p = 0.9). Lse stays the
    undropped one.

    Programmable attention (flashtile.flex): SCORE_MOD / MASK_MOD read Aux0..Aux3 (see _scores). BLOCK_SPARSE:
    the key blocks come from a block mask of (SPARSE_M, SPARSE_N) blocks, multiples of the tiles: KvNum /
    FullKvNum (B, H, Sq / SPARSE_M) count the partial / full key blocks of each query block, KvIdx / FullKvIdx
    (B, H, Sq / SPARSE_M, Sk / SPARSE_N) list them (strides stride_bm_* and stride_bi_*, 0 along broadcast dims).
    Dropout applies in both loop structures (the same inner loop).
    """
    pid_m = tl.program_id(0)
    if IS_LOCAL or BLOCK_SPARSE:
        # Longest rows first: under a causal mask (or a causal block mask) the bottom blocks do the most work.
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    max_k = seqlen_k  # dropout counters are laid out as (B, Hq, max_q, max_k), positions within the sequence
    off_b, off_h, off_hk, start_m, seed, rng_base, q_start, seqlen_q, k_start, seqlen_k = _query_block(
        pid_m, pid_bh, heads_q, group_size, seqlen_q, seqlen_k, Rng, CuSeqlensQ, CuSeqlensK, BLOCK_M, HAS_DROPOUT,
        IS_VARLEN)
    if SEQUSED_K:
        seqlen_k = seqused_add
        if HAS_SEQUSED_TENSOR:
            seqlen_k += tl.load(CuSeqlensK + off_b)
    key_start = _key_start(KeyStart, off_b, LEFTPAD)
    seqlen_k -= key_start
    if IS_VARLEN:
        if start_m >= seqlen_q:  # the grid covers the longest sequence
            return

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = offs_m[:, None].to(tl.int64)
    cols = offs_n[:, None].to(tl.int64)
    q_ptrs = (Q + _seq_offset(off_b, q_start, stride_qb, stride_qm, IS_VARLEN) + off_h * stride_qh
              + rows * stride_qm + offs_d[None, :])
    k_ptrs = (K + _seq_offset(off_b, k_start, stride_kb, stride_kn, IS_VARLEN) + off_hk * stride_kh
              + (cols + key_start) * stride_kn + offs_d[None, :])
    v_ptrs = (V + _seq_offset(off_b, k_start, stride_vb, stride_vn, IS_VARLEN) + off_hk * stride_vh
              + (cols + key_start) * stride_vn + offs_d[None, :])
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + off_b * stride_alibi_b + off_h)
    bias_ptr = Bias + off_b * stride_bias_b + off_h * stride_bias_h
    block_table = BlockTable + off_b * stride_bt_b
    k_head = K + off_hk * stride_kh
    v_head = V + off_hk * stride_vh

    q = _load_tile(q_ptrs, offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    if HAS_SINK:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(Sink + off_h).to(tl.float32) * LOG2E
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    if BLOCK_SPARSE:
        # Partial key blocks (masks evaluated) then full ones (no masks); empty blocks are never visited.
        for FULL in tl.static_range(2):
            n_blocks, idx_ptr = _block_list(FULL, KvNum, KvIdx, FullKvNum, FullKvIdx, off_b, off_h,
                                            start_m // SPARSE_M, stride_bm_b, stride_bm_h, stride_bm_m,
                                            stride_bi_b, stride_bi_h, stride_bi_m)
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                            offs_d, 0, n_blocks * SPARSE_N, seqlen_q, seqlen_k, qk_scale,
                                            softcap_log2, alibi_slope, window_left, window_right, bias_ptr,
                                            stride_bias_m, stride_bias_n, k_head, v_head, stride_kb, stride_vb,
                                            block_table, page_size, key_start, seed, rng_base, max_k, dropout_threshold,
                                            HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, FULL == 0, IS_LOCAL, SOFTCAP,
                                            HAS_ALIBI, HAS_BIAS, PAGED, HAS_DROPOUT, DOT_PRECISION,
                                            off_b, off_h, Aux0, Aux1, Aux2, Aux3, SCORE_MOD, MASK_MOD, idx_ptr,
                                            True, SPARSE_N)
    else:
        lo, full_lo, full_hi, hi = _key_range(start_m, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M,
                                              BLOCK_N, LEFT_BOUNDED)
        for SEGMENT in tl.static_range(3):
            seg_lo, seg_hi = _segment(SEGMENT, lo, full_lo, full_hi, hi)
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                            offs_d, seg_lo, seg_hi, seqlen_q, seqlen_k, qk_scale, softcap_log2,
                                            alibi_slope, window_left, window_right, bias_ptr, stride_bias_m,
                                            stride_bias_n, k_head, v_head, stride_kb, stride_vb, block_table,
                                            page_size, key_start, seed, rng_base, max_k, dropout_threshold,
                                            HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, SEGMENT != 1, IS_LOCAL, SOFTCAP,
                                            HAS_ALIBI, HAS_BIAS, PAGED, HAS_DROPOUT, DOT_PRECISION,
                                            off_b, off_h, Aux0, Aux1, Aux2, Aux3, SCORE_MOD, MASK_MOD,
                                            PAGE_SHIFT=PAGE_SHIFT, PAGE_PREFETCH=PAGE_PREFETCH)

    # A row that saw no key (and no sink): output 0 and lse -inf.
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    if HAS_DROPOUT:
        acc = acc * dropout_scale
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)  # [BLOCK_M]
    o_ptrs = (Out + _seq_offset(off_b, q_start, stride_ob, stride_om, IS_VARLEN) + off_h * stride_oh
              + rows * stride_om + offs_d[None, :])
    _store_tile(o_ptrs, acc.to(Out.dtype.element_ty), offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD)
    lse_ptrs = Lse + off_b * stride_lse_b + off_h * stride_lse_h + q_start + offs_m
    tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)


@triton.jit
def _attn_probs(Q, K, Lse, Probs, Alibi, CuSeqlensQ, CuSeqlensK, Bias, Rng,
                stride_qb, stride_qm, stride_qh,
                stride_kb, stride_kn, stride_kh,
                stride_lse_b, stride_lse_h, stride_alibi_b,
                stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
                seqlen_q, seqlen_k, heads_q, group_size, qk_scale, softcap_log2, window_left, window_right,
                dropout_scale, dropout_threshold,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Writes Probs (B, Hq, max_q, max_k): P = exp(s - lse) of the undropped softmax, negated (sign bit set,
    -0.0 included) where dropout dropped it: the attention matrix return_attn_probs gives, for testing.

    One program per (query block, batch * query head); every key block is visited with all masks on.
    In varlen mode element (b, h, i, j) is query i and key j of sequence b; the rest stays untouched.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    max_k = seqlen_k
    probs_base = Probs + pid_bh.to(tl.int64) * seqlen_q * seqlen_k
    off_b, off_h, off_hk, start_m, seed, rng_base, q_start, seqlen_q, k_start, seqlen_k = _query_block(
        pid_m, pid_bh, heads_q, group_size, seqlen_q, seqlen_k, Rng, CuSeqlensQ, CuSeqlensK, BLOCK_M, HAS_DROPOUT,
        IS_VARLEN)
    if IS_VARLEN:
        if start_m >= seqlen_q:
            return

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q = _load_tile(Q + _seq_offset(off_b, q_start, stride_qb, stride_qm, IS_VARLEN) + off_h * stride_qh
                   + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                   offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    k_ptrs = (K + _seq_offset(off_b, k_start, stride_kb, stride_kn, IS_VARLEN) + off_hk * stride_kh
              + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :])
    lse = tl.load(Lse + off_b * stride_lse_b + off_h * stride_lse_h + q_start + offs_m, mask=offs_m < seqlen_q,
                  other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # [BLOCK_M]; rows that saw no key: P = 0
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + off_b * stride_alibi_b + off_h)
    bias_ptr = Bias + off_b * stride_bias_b + off_h * stride_bias_h
    probs_ptrs = probs_base + offs_m[:, None].to(tl.int64) * max_k + offs_n[None, :]
    for start_n in range(0, seqlen_k, BLOCK_N):
        offs_kn = start_n + offs_n
        k = _load_tile(k_ptrs + start_n * stride_kn, offs_kn, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD,
                       True)  # [BLOCK_N, HEAD_DIM_PAD]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s, _, _ = _scores(qk, offs_m[:, None], offs_kn[None, :], seqlen_q, seqlen_k, qk_scale, softcap_log2,
                          alibi_slope, window_left, window_right, bias_ptr, stride_bias_m, stride_bias_n,
                          True, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS)
        p = tl.math.exp2(s - lse2[:, None])  # [BLOCK_M, BLOCK_N]
        if HAS_DROPOUT:
            p = tl.where(_dropout_keep(seed, rng_base, offs_m[:, None], start_n, max_k, dropout_threshold, BLOCK_N,
                                       False), p, -p)
        tl.store(probs_ptrs + start_n, p.to(Probs.dtype.element_ty),
                 mask=(offs_m[:, None] < seqlen_q) & (offs_kn[None, :] < seqlen_k))
