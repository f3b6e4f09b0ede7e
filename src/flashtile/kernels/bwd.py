"""FlashAttention backward: preprocess (delta, lse in log2 units), dK/dV per key block, dQ per query block.

Two kernels instead of atomics: each dK/dV program owns one key block of one key/value head and
loops over every query head of its group, so GQA sums need no atomics and results are deterministic.
"""
import triton
import triton.language as tl

from .common import (LOG2E, _block_list, _dropout_base, _dropout_keep, _exp2_minus, _key_range, _load_tile,
                     _query_block, _query_range, _row_base, _scores, _segment, _seq_offset, _seq_range, _store_tile,
                     _sparse_tile_start)


@triton.jit
def _dq_tiled_rows(start_m, col0, stride_m, HEAD_DIM: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr):
    """Offsets, within one batch, of query rows start_m + [0, 64) (start_m a multiple of 64) of the head whose first
    column is col0 in the Gluon backward's tiled fp32 dQ buffer: a [HEAD_DIM / TILE_N, 64 * TILE_N] tensor, each
    row contiguous, in the order _dq_tiled_order undoes. The tiled buffer has the row-major (B, Sq_pad, Hq, D)
    one's size (stride_m = Hq * D); each [TILE_M, TILE_N] tile (one warpgroup's dQ reduce-add, TILE_N dividing D)
    is TILE_M * TILE_N contiguous floats, in the row-major buffer's order of tiles, and within a tile in the wgmma
    accumulator's register order: row r = 64 rep + 16 w + 8 h + i, column c = 8 j + 2 t + e at
    ((((rep * TILE_N / 8 + j) * 4 + w) * 8 + i) * 4 + t) * 4 + 2 h + e (kernels/gluon_bwd_step._bwd_step;
    bwd_launch.dq_tiled_offsets is the same map in PyTorch)."""
    r = start_m % TILE_M
    base = (start_m - r) * stride_m + TILE_M * col0 + (r // 64) * (64 * TILE_N)
    tiles = tl.arange(0, HEAD_DIM // TILE_N) * (TILE_M * TILE_N)
    return base + tiles[:, None] + tl.arange(0, 64 * TILE_N)[None, :]


@triton.jit
def _dq_tiled_order(x, HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr):
    """The [64, HEAD_DIM] rows of a [HEAD_DIM / TILE_N, 64 * TILE_N] tensor in _dq_tiled_rows' order."""
    x = tl.reshape(x, [HEAD_DIM // TILE_N, TILE_N // 8, 4, 8, 4, 2, 2])  # [tile, j, w, i, t, h, e]
    return tl.reshape(tl.permute(x, (2, 5, 3, 0, 1, 4, 6)), [64, HEAD_DIM])  # [w, h, i, tile, j, t, e]


@triton.jit
def _attn_bwd_preprocess(Out, DOut, Lse, DLse, Delta, Lse2, CuSeqlensQ, Sink, SinkPart, DQAccum,
                         stride_ob, stride_om, stride_oh,
                         stride_dob, stride_dom, stride_doh,
                         stride_lse_b, stride_lse_h, stride_row_b, stride_row_h,
                         stride_dqa_b, stride_dqa_m, stride_dqa_h,
                         seqlen_q, heads_q, rows_pad, fold_scale,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                         IS_VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr, HAS_SINK: tl.constexpr,
                         ZERO_DQ: tl.constexpr = False, ROWS_IN_ACC: tl.constexpr = False,
                         DQ_TILE_M: tl.constexpr = 0, DQ_TILE_N: tl.constexpr = 0):
    """Delta = rowsum(dO * O) - dLse; Lse2 = lse * log2(e), with +inf for rows that saw no key (so P = 0 there).

    Lse and DLse (the gradient flowing into lse, HAS_DLSE) have lse's layout: (B, Hq, Sq), or (Hq, total_q) in
    varlen mode. Delta and Lse2 are laid out for the dK/dV and dQ kernels (common._row_base, strides
    stride_row_*). Since d lse_i / d s_ij = P_ij, dLse folds into delta: dS = P * (dP - (delta - dlse)).
    HAS_SINK: SinkPart[b * Hq + h, m] = sum over the rows of block m of exp(sink_h - lse) * delta, the sink
    logit's gradient (negated) in per-program pieces that the host sums in a fixed order (deterministic).
    ZERO_DQ: also zero rows < seqlen_q of DQAccum, the Gluon backward's fp32 dQ buffer ((B, Sq_pad, Hq, D), or
    (total_q + pad, Hq, D) in varlen mode), in place of a separate memset launch (FA3's preprocess does the same);
    DQ_TILE_M > 0 (dense, BLOCK_M 64): the buffer holds [DQ_TILE_M, DQ_TILE_N] tiles (_dq_tiled_rows); a program
    zeroes all 64 of its rows there, the ones past seqlen_q too (rows of the buffer that only receive adds of zeros).
    ROWS_IN_ACC (dense; the Gluon backward's rows_in_acc variants start their S^T / dP^T accumulators from these
    rows): Lse2 * fold_scale (-1 / (scale * log2 e)) and -Delta, written for every row below rows_pad (the padded
    row count the kernel reads unmasked), with Lse2 = +inf and Delta = 0 past seqlen_q so P and dS are 0 there.
    """
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // heads_q).to(tl.int64)
    off_h = (pid_bh % heads_q).to(tl.int64)
    start_m = tl.program_id(0) * BLOCK_M
    # SinkPart's row blocks per (batch, head): bwd_launch.sink_parts' width. ROWS_IN_ACC's grid covers rows_pad rows,
    # more blocks than that when seqlen_q % 128 is in [1, 64]; those programs' rows are all past seqlen_q (part 0).
    sink_blocks = tl.cdiv(seqlen_q, BLOCK_M)
    q_start, seqlen_q = _seq_range(CuSeqlensQ, off_b, seqlen_q, IS_VARLEN)
    if IS_VARLEN:
        if start_m >= seqlen_q:
            return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = offs_m[:, None].to(tl.int64)
    o = _load_tile(Out + _seq_offset(off_b, q_start, stride_ob, stride_om, IS_VARLEN) + off_h * stride_oh
                   + rows * stride_om + offs_d[None, :],
                   offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    do = _load_tile(DOut + _seq_offset(off_b, q_start, stride_dob, stride_dom, IS_VARLEN) + off_h * stride_doh
                    + rows * stride_dom + offs_d[None, :],
                    offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # [BLOCK_M]
    lse_ptrs = off_b * stride_lse_b + off_h * stride_lse_h + q_start + offs_m
    lse = tl.load(Lse + lse_ptrs, mask=offs_m < seqlen_q, other=0.0)
    if HAS_DLSE:
        delta -= tl.load(DLse + lse_ptrs, mask=offs_m < seqlen_q, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    row_ptrs = _row_base(off_b, off_h, q_start, stride_row_b, stride_row_h, IS_VARLEN) + offs_m
    if ROWS_IN_ACC:
        lse2 = tl.where(offs_m < seqlen_q, lse2, float("inf")) * fold_scale
        tl.store(Delta + row_ptrs, -delta, mask=offs_m < rows_pad)  # delta is 0 past seqlen_q (masked loads)
        tl.store(Lse2 + row_ptrs, lse2, mask=offs_m < rows_pad)
    else:
        tl.store(Delta + row_ptrs, delta, mask=offs_m < seqlen_q)
        tl.store(Lse2 + row_ptrs, lse2, mask=offs_m < seqlen_q)
    if ZERO_DQ:
        if DQ_TILE_M:
            dqa_ptrs = DQAccum + off_b * stride_dqa_b + _dq_tiled_rows(
                start_m.to(tl.int64), off_h * stride_dqa_h, stride_dqa_m, HEAD_DIM, DQ_TILE_M, DQ_TILE_N)
            tl.store(dqa_ptrs, tl.zeros([HEAD_DIM // DQ_TILE_N, 64 * DQ_TILE_N], tl.float32))
        else:
            dqa_ptrs = (DQAccum + _seq_offset(off_b, q_start, stride_dqa_b, stride_dqa_m, IS_VARLEN)
                        + off_h * stride_dqa_h + rows * stride_dqa_m + offs_d[None, :])
            tl.store(dqa_ptrs, tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32),
                     mask=(offs_m < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :])
    if HAS_SINK:  # lse >= sink on every row, so the exponent is <= 0; lse = -inf (a -inf sink, no key): P_sink = 0
        p_sink = tl.where(lse == float("-inf"), 0.0, tl.exp(tl.load(Sink + off_h).to(tl.float32) - lse))
        part = tl.sum(tl.where(offs_m < seqlen_q, p_sink * delta, 0.0), axis=0)
        tl.store(SinkPart + pid_bh * sink_blocks + tl.program_id(0), part, mask=tl.program_id(0) < sink_blocks)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, lse2_ptr, delta_ptr,
                         offs_m, offs_n, start_n, offs_d, lo, hi, seqlen_q, seqlen_k,
                         qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                         bias_ptr, stride_bias_m, stride_bias_n, seed, rng_base, max_k, dropout_scale,
                         dropout_threshold, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                         BLOCK_M: tl.constexpr,
                         MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr,
                         HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, ROWS_PADDED: tl.constexpr,
                         off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None, SCORE_MOD: tl.constexpr = None,
                         SCORE_MOD_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, idx_ptr=None,
                         BLOCK_SPARSE: tl.constexpr = False, SPARSE_M: tl.constexpr = 128,
                         q_desc=None, do_desc=None, desc_row=0, desc_col=0, Q_DESC: tl.constexpr = False,
                         PART: tl.constexpr = 0, DROPOUT_FACTOR: tl.constexpr = False):
    """Accumulate dK, dV of one key block over query blocks [lo, hi), working on transposed tiles.
    BLOCK_SPARSE: [lo, hi) are offsets into the query blocks listed at idx_ptr (see _sparse_tile_start).

    dK is accumulated with respect to the raw products q.k (softcap's chain rule applied here); the
    caller multiplies by softmax_scale once at the end. HAS_DROPOUT: with Z the forward's keep mask
    and r = dropout_scale = 1 / (1 - dropout_p), dV = (P Z r)^T dO and dP = (dO V^T) Z r; delta = rowsum(dO O) is
    still rowsum(P dP), so dS = P (dP - delta) keeps its form.
    ROWS_PADDED: the rows past seqlen_q up to a tile's end can be read (varlen: the next sequence's rows or
    the buffer's tail padding; see Geometry.row_buffer_shape), so the masked tiles read them unpredicated
    and discard them. Per-element predicates there cost the varlen kernel its registers (it spilled at D128).
    Q_DESC: q and dO tiles come through the 2-D tensor descriptors q_desc / do_desc (rows x heads * head dim,
    block [BLOCK_M, HEAD_DIM_PAD], tile at [desc_row + start_m, desc_col]): TMA copies straight into shared
    memory, so no [BLOCK_M, HEAD_DIM_PAD] pointer tensors occupy registers. Rows past the sequence are the next
    sequence's (or zero past the buffer) and are discarded as in ROWS_PADDED: lse2 = +inf there, so P = 0.
    PART: 0 accumulates both; 1 only dV (no dP: 2 matmuls per tile; v unused); 2 only dK (3 matmuls). The
    other accumulator is returned untouched.
    DROPOUT_FACTOR: the keep mask enters as a factor (dropout_scale or 0) multiplied into P^T and dP^T instead of
    selecting them: the same values (both are finite, so x * 0 is the select's 0; dP^T's -0 changes no sum) up to
    the compiler's FMA contraction of the product (a few ulp on the H200), and a float, not boolean, tensor on its
    way to the dot operand's layout (ROCm triton 3.9 could not lay the booleans out in shared memory:
    bwd_launch._dropout_as_factor). NVIDIA keeps the select: on the H200 the factor was 4 % faster in five of six
    feature-table shapes but 7 % slower at D128 non-causal (docs/perf-log.md, session 49).
    """
    if BLOCK_SPARSE:
        next_start = _sparse_tile_start(lo, hi, idx_ptr, SPARSE_M)
    for virt_m in range(lo, hi, BLOCK_M):
        if BLOCK_SPARSE:
            start_m = next_start
            next_start = _sparse_tile_start(virt_m + BLOCK_M, hi, idx_ptr, SPARSE_M)
        else:
            start_m = virt_m
        offs_qm = start_m + offs_m
        if Q_DESC:
            q = q_desc.load([desc_row + start_m, desc_col])  # [BLOCK_M, HEAD_DIM_PAD]
            do = do_desc.load([desc_row + start_m, desc_col])  # [BLOCK_M, HEAD_DIM_PAD]
        else:
            q = _load_tile(q_ptrs + start_m * stride_qm, offs_qm, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD,
                           MASKED)  # [BLOCK_M, HEAD_DIM_PAD]
            do = _load_tile(do_ptrs + start_m * stride_dom, offs_qm, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD,
                            MASKED)  # [BLOCK_M, HEAD_DIM_PAD]
        if MASKED and ROWS_PADDED:
            # Rows past the sequence end get lse2 = +inf, hence P = 0.
            lse2 = tl.where(offs_qm < seqlen_q, tl.load(lse2_ptr + offs_qm), float("inf"))
            delta = tl.where(offs_qm < seqlen_q, tl.load(delta_ptr + offs_qm), 0.0)
        elif MASKED:
            lse2 = tl.load(lse2_ptr + offs_qm, mask=offs_qm < seqlen_q, other=float("inf"))
            delta = tl.load(delta_ptr + offs_qm, mask=offs_qm < seqlen_q, other=0.0)
        else:
            lse2 = tl.load(lse2_ptr + offs_qm)
            delta = tl.load(delta_ptr + offs_qm)
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        sT, tT, gT = _scores(qkT, offs_qm[None, :], offs_n[:, None], seqlen_q, seqlen_k, qk_scale, softcap_log2,
                             alibi_slope, window_left, window_right, bias_ptr, stride_bias_m, stride_bias_n,
                             MASKED, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, off_b, off_h, aux0, aux1, aux2, aux3,
                             SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
        pT = _exp2_minus(sT, lse2[None, :], SCORE_MOD)  # [BLOCK_N, BLOCK_M]
        if HAS_DROPOUT:
            keepT = _dropout_keep(seed, rng_base, offs_qm[None, :], start_n, max_k, dropout_threshold,
                                  offs_n.shape[0], True)
            if DROPOUT_FACTOR:
                factorT = tl.where(keepT, dropout_scale, 0.0)
        if PART != 2:
            if HAS_DROPOUT and DROPOUT_FACTOR:
                dv = tl.dot((pT * factorT).to(do.dtype), do, dv, input_precision=DOT_PRECISION)
            elif HAS_DROPOUT:
                dv = tl.dot(tl.where(keepT, pT * dropout_scale, 0.0).to(do.dtype), do, dv,
                            input_precision=DOT_PRECISION)
            else:
                dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        if PART != 1:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
            if HAS_DROPOUT and DROPOUT_FACTOR:
                dpT = dpT * factorT
            elif HAS_DROPOUT:
                dpT = tl.where(keepT, dpT * dropout_scale, 0.0)
            dsT = pT * (dpT - delta[None, :])  # [BLOCK_N, BLOCK_M]
            if SCORE_MOD is not None:
                dsT = tl.where(pT > 0.0, dsT * gT, 0.0)  # the user's derivative, never read where P = 0
            if SOFTCAP:
                dsT = dsT * (1.0 - tT * tT)
            dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DOut, Lse2, Delta, DK, DV, Alibi, CuSeqlensQ, CuSeqlensK, Bias, Rng, QDesc, DODesc,
                   stride_qb, stride_qm, stride_qh,
                   stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh,
                   stride_dob, stride_dom, stride_doh,
                   stride_dkb, stride_dkn, stride_dkh,
                   stride_dvb, stride_dvn, stride_dvh,
                   stride_row_b, stride_row_h, stride_alibi_b,
                   stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
                   seqlen_q, seqlen_k, heads_kv, group_size, softmax_scale,
                   qk_scale, softcap_log2, window_left, window_right, dropout_scale, dropout_threshold,
                   Aux0, Aux1, Aux2, Aux3, QNum, QIdx, FullQNum, FullQIdx,
                   stride_bm_b, stride_bm_h, stride_bm_m, stride_bi_b, stride_bi_h, stride_bi_m,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   SPLIT_GROUP_SUM: tl.constexpr,
                   SCORE_MOD: tl.constexpr = None, SCORE_MOD_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
                   BLOCK_SPARSE: tl.constexpr = False, SPARSE_M: tl.constexpr = 128, SPARSE_N: tl.constexpr = 128,
                   Q_DESC: tl.constexpr = False, PART: tl.constexpr = 0, DROPOUT_FACTOR: tl.constexpr = False):
    """One program per (key block, batch * key/value head); sums over the group's query heads.

    BLOCK_SPARSE: the query blocks come from the block mask's transposed lists QNum / FullQNum
    (B, H, Sk / SPARSE_N) and QIdx / FullQIdx (B, H, Sk / SPARSE_N, Sq / SPARSE_M); see _attn_fwd.
    HAS_DROPOUT: the forward's keep mask is regenerated in both loop structures.
    Q_DESC: QDesc / DODesc are tensor descriptors over q and dO viewed as (rows, heads_q * HEAD_DIM) (see
    _attn_bwd_dkdv_inner); else they are unused.
    PART: 0 computes and stores dK and dV; 1 only dV (DK unused, v never read); 2 only dK (DV unused): the
    D256 "dv-dk" split (configs.BwdConfig.dkdv_split), two launches whose programs each hold one [BLOCK_N, D]
    fp32 accumulator instead of two.
    DROPOUT_FACTOR: see _attn_bwd_dkdv_inner.
    """
    start_n = tl.program_id(0) * BLOCK_N
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // heads_kv).to(tl.int64)
    off_hk = (pid_bh % heads_kv).to(tl.int64)
    max_q = seqlen_q  # the (B, Hq, max_q, max_k) layout of dropout counters (common._dropout_keep)
    max_k = seqlen_k
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Rng)
    q_start, seqlen_q = _seq_range(CuSeqlensQ, off_b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = _seq_range(CuSeqlensK, off_b, seqlen_k, IS_VARLEN)
    if IS_VARLEN:
        if start_n >= seqlen_k:
            return

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    cols = offs_n[:, None].to(tl.int64)
    k = _load_tile(K + _seq_offset(off_b, k_start, stride_kb, stride_kn, IS_VARLEN) + off_hk * stride_kh
                   + cols * stride_kn + offs_d[None, :],
                   offs_n, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_N, HEAD_DIM_PAD]
    v = k  # never read when PART == 1
    if PART != 1:
        v = _load_tile(V + _seq_offset(off_b, k_start, stride_vb, stride_vn, IS_VARLEN) + off_hk * stride_vh
                       + cols * stride_vn + offs_d[None, :],
                       offs_n, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_N, HEAD_DIM_PAD]
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _query_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                            BLOCK_M, BLOCK_N, IS_LOCAL)
    rows = offs_m[:, None].to(tl.int64)
    q_base = _seq_offset(off_b, q_start, stride_qb, stride_qm, IS_VARLEN)
    do_base = _seq_offset(off_b, q_start, stride_dob, stride_dom, IS_VARLEN)
    desc_row = (off_b * max_q).to(tl.int32)  # the descriptors' first row of this sequence
    if IS_VARLEN:
        desc_row = q_start.to(tl.int32)
    for g in range(0, group_size):
        off_h = off_hk * group_size + g
        desc_col = (off_h * HEAD_DIM).to(tl.int32)
        q_ptrs = Q + q_base + off_h * stride_qh + rows * stride_qm + offs_d[None, :]
        do_ptrs = DOut + do_base + off_h * stride_doh + rows * stride_dom + offs_d[None, :]
        row_base = _row_base(off_b, off_h, q_start, stride_row_b, stride_row_h, IS_VARLEN)
        alibi_slope = 0.0
        if HAS_ALIBI:
            alibi_slope = tl.load(Alibi + off_b * stride_alibi_b + off_h)
        bias_ptr = Bias + off_b * stride_bias_b + off_h * stride_bias_h
        rng_base = _dropout_base(off_b * heads_kv * group_size + off_h, max_q, max_k)
        if SPLIT_GROUP_SUM:
            # fp32: a sum over group_size * Sq rows in one running fp32 accumulator drifts like
            # sqrt(n) ulps; summing each head apart first keeps fp32 GQA as exact as PyTorch.
            dk_all, dv_all = dk, dv
            dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
        if BLOCK_SPARSE:
            for FULL in tl.static_range(2):
                n_blocks, idx_ptr = _block_list(FULL, QNum, QIdx, FullQNum, FullQIdx, off_b, off_h,
                                                start_n // SPARSE_N, stride_bm_b, stride_bm_h, stride_bm_m,
                                                stride_bi_b, stride_bi_h, stride_bi_m)
                dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom,
                                              Lse2 + row_base, Delta + row_base, offs_m, offs_n, start_n, offs_d,
                                              0, n_blocks * SPARSE_M, seqlen_q, seqlen_k,
                                              qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                                              bias_ptr, stride_bias_m, stride_bias_n, seed, rng_base, max_k,
                                              dropout_scale, dropout_threshold, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M,
                                              FULL == 0, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT,
                                              DOT_PRECISION, IS_VARLEN, off_b, off_h, Aux0, Aux1, Aux2, Aux3,
                                              SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, idx_ptr, True, SPARSE_M,
                                              q_desc=QDesc, do_desc=DODesc, desc_row=desc_row, desc_col=desc_col,
                                              Q_DESC=Q_DESC, PART=PART, DROPOUT_FACTOR=DROPOUT_FACTOR)
        else:
            for SEGMENT in tl.static_range(3):
                seg_lo, seg_hi = _segment(SEGMENT, lo, full_lo, full_hi, hi)
                dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom,
                                              Lse2 + row_base, Delta + row_base, offs_m, offs_n, start_n, offs_d,
                                              seg_lo, seg_hi, seqlen_q, seqlen_k,
                                              qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                                              bias_ptr, stride_bias_m, stride_bias_n, seed, rng_base, max_k,
                                              dropout_scale, dropout_threshold, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M,
                                              SEGMENT != 1, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT,
                                              DOT_PRECISION, IS_VARLEN, off_b, off_h, Aux0, Aux1, Aux2, Aux3,
                                              SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, q_desc=QDesc, do_desc=DODesc,
                                              desc_row=desc_row, desc_col=desc_col, Q_DESC=Q_DESC, PART=PART,
                                              DROPOUT_FACTOR=DROPOUT_FACTOR)
        if SPLIT_GROUP_SUM:
            dk = dk_all + dk
            dv = dv_all + dv

    if PART != 1:
        dk = dk * softmax_scale
        dk_ptrs = (DK + _seq_offset(off_b, k_start, stride_dkb, stride_dkn, IS_VARLEN) + off_hk * stride_dkh
                   + cols * stride_dkn + offs_d[None, :])
        _store_tile(dk_ptrs, dk.to(DK.dtype.element_ty), offs_n, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD)
    if PART != 2:
        dv_ptrs = (DV + _seq_offset(off_b, k_start, stride_dvb, stride_dvn, IS_VARLEN) + off_hk * stride_dvh
                   + cols * stride_dvn + offs_d[None, :])
        _store_tile(dv_ptrs, dv.to(DV.dtype.element_ty), offs_n, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                       offs_m, offs_n, offs_d, lo, hi, seqlen_q, seqlen_k,
                       qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                       bias_ptr, stride_bias_m, stride_bias_n, dbias_ptr, max_k, seed, rng_base, dropout_scale,
                       dropout_threshold, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                       MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr,
                       HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_DBIAS: tl.constexpr,
                       HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
                       SCORE_MOD: tl.constexpr = None, SCORE_MOD_GRAD: tl.constexpr = None,
                       MASK_MOD: tl.constexpr = None, idx_ptr=None, BLOCK_SPARSE: tl.constexpr = False,
                       SPARSE_N: tl.constexpr = 128):
    """Accumulate dQ of one query block over key blocks [lo, hi); dropout as in _attn_bwd_dkdv_inner.

    STORE_DBIAS: dS (the gradient of the score after softcap and ALiBi, i.e. of the additive bias) is
    also written to this (batch, head)'s slice of a full (max_q, max_k) fp32 buffer; each element once.
    BLOCK_SPARSE: [lo, hi) are offsets into the key blocks listed at idx_ptr (see _sparse_tile_start).
    """
    if BLOCK_SPARSE:
        next_start = _sparse_tile_start(lo, hi, idx_ptr, SPARSE_N)
    for virt_n in range(lo, hi, BLOCK_N):
        if BLOCK_SPARSE:
            start_n = next_start
            next_start = _sparse_tile_start(virt_n + BLOCK_N, hi, idx_ptr, SPARSE_N)
        else:
            start_n = virt_n
        offs_kn = start_n + offs_n
        k = _load_tile(k_ptrs + start_n * stride_kn, offs_kn, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD,
                       MASKED)  # [BLOCK_N, HEAD_DIM_PAD]
        v = _load_tile(v_ptrs + start_n * stride_vn, offs_kn, seqlen_k, offs_d, HEAD_DIM, HEAD_DIM_PAD,
                       MASKED)  # [BLOCK_N, HEAD_DIM_PAD]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s, t, g = _scores(qk, offs_m[:, None], offs_kn[None, :], seqlen_q, seqlen_k, qk_scale, softcap_log2,
                          alibi_slope, window_left, window_right, bias_ptr, stride_bias_m, stride_bias_n,
                          MASKED, IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, off_b, off_h, aux0, aux1, aux2, aux3,
                          SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
        p = _exp2_minus(s, lse2[:, None], SCORE_MOD)  # [BLOCK_M, BLOCK_N]
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if HAS_DROPOUT:
            keep = _dropout_keep(seed, rng_base, offs_m[:, None], start_n, max_k, dropout_threshold, BLOCK_N, False)
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])  # [BLOCK_M, BLOCK_N]
        if STORE_DBIAS:
            tl.store(dbias_ptr + offs_m[:, None].to(tl.int64) * max_k + offs_kn[None, :], ds,
                     mask=(offs_m[:, None] < seqlen_q) & (offs_kn[None, :] < seqlen_k))
        if SCORE_MOD is not None:
            ds = tl.where(p > 0.0, ds * g, 0.0)  # the user's derivative, never read where P = 0
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DOut, Lse2, Delta, DQ, Alibi, CuSeqlensQ, CuSeqlensK, Bias, DBias, Rng,
                 stride_qb, stride_qm, stride_qh,
                 stride_kb, stride_kn, stride_kh,
                 stride_vb, stride_vn, stride_vh,
                 stride_dob, stride_dom, stride_doh,
                 stride_dqb, stride_dqm, stride_dqh,
                 stride_row_b, stride_row_h, stride_alibi_b,
                 stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
                 seqlen_q, seqlen_k, heads_q, group_size, softmax_scale,
                 qk_scale, softcap_log2, window_left, window_right, dropout_scale, dropout_threshold,
                 Aux0, Aux1, Aux2, Aux3, KvNum, KvIdx, FullKvNum, FullKvIdx,
                 stride_bm_b, stride_bm_h, stride_bm_m, stride_bi_b, stride_bi_h, stride_bi_m,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 IS_LOCAL: tl.constexpr, LEFT_BOUNDED: tl.constexpr, SOFTCAP: tl.constexpr,
                 HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_DBIAS: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 SCORE_MOD: tl.constexpr = None, SCORE_MOD_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
                 BLOCK_SPARSE: tl.constexpr = False, SPARSE_M: tl.constexpr = 128, SPARSE_N: tl.constexpr = 128):
    """One program per (query block, batch * query head). DBias: (B, Hq, max_q, max_k) fp32, zero-filled,
    element (b, h, i, j) for query i and key j of sequence b (positions within the sequence in varlen mode).
    BLOCK_SPARSE: key blocks from the block mask's lists, as in _attn_fwd."""
    pid_m = tl.program_id(0)
    if IS_LOCAL or BLOCK_SPARSE:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    max_k = seqlen_k  # dbias and the dropout counters are laid out as (B, Hq, max_q, max_k)
    dbias_ptr = DBias + pid_bh.to(tl.int64) * seqlen_q * seqlen_k
    off_b, off_h, off_hk, start_m, seed, rng_base, q_start, seqlen_q, k_start, seqlen_k = _query_block(
        pid_m, pid_bh, heads_q, group_size, seqlen_q, seqlen_k, Rng, CuSeqlensQ, CuSeqlensK, BLOCK_M, HAS_DROPOUT,
        IS_VARLEN)
    if IS_VARLEN:
        if start_m >= seqlen_q:
            return

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = offs_m[:, None].to(tl.int64)
    q = _load_tile(Q + _seq_offset(off_b, q_start, stride_qb, stride_qm, IS_VARLEN) + off_h * stride_qh
                   + rows * stride_qm + offs_d[None, :],
                   offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    do = _load_tile(DOut + _seq_offset(off_b, q_start, stride_dob, stride_dom, IS_VARLEN) + off_h * stride_doh
                    + rows * stride_dom + offs_d[None, :],
                    offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD, True)  # [BLOCK_M, HEAD_DIM_PAD]
    row_ptrs = _row_base(off_b, off_h, q_start, stride_row_b, stride_row_h, IS_VARLEN) + offs_m
    lse2 = tl.load(Lse2 + row_ptrs, mask=offs_m < seqlen_q, other=float("inf"))  # [BLOCK_M]
    delta = tl.load(Delta + row_ptrs, mask=offs_m < seqlen_q, other=0.0)  # [BLOCK_M]
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + off_b * stride_alibi_b + off_h)
    bias_ptr = Bias + off_b * stride_bias_b + off_h * stride_bias_h

    cols = offs_n[:, None].to(tl.int64)
    k_ptrs = (K + _seq_offset(off_b, k_start, stride_kb, stride_kn, IS_VARLEN) + off_hk * stride_kh
              + cols * stride_kn + offs_d[None, :])
    v_ptrs = (V + _seq_offset(off_b, k_start, stride_vb, stride_vn, IS_VARLEN) + off_hk * stride_vh
              + cols * stride_vn + offs_d[None, :])
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if BLOCK_SPARSE:
        for FULL in tl.static_range(2):
            n_blocks, idx_ptr = _block_list(FULL, KvNum, KvIdx, FullKvNum, FullKvIdx, off_b, off_h,
                                            start_m // SPARSE_M, stride_bm_b, stride_bm_h, stride_bm_m,
                                            stride_bi_b, stride_bi_h, stride_bi_m)
            dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                    offs_m, offs_n, offs_d, 0, n_blocks * SPARSE_N, seqlen_q, seqlen_k,
                                    qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                                    bias_ptr, stride_bias_m, stride_bias_n, dbias_ptr, max_k, seed, rng_base,
                                    dropout_scale, dropout_threshold, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, FULL == 0,
                                    IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, STORE_DBIAS, HAS_DROPOUT, DOT_PRECISION,
                                    off_b, off_h, Aux0, Aux1, Aux2, Aux3,
                                    SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD, idx_ptr, True, SPARSE_N)
    else:
        lo, full_lo, full_hi, hi = _key_range(start_m, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M,
                                              BLOCK_N, LEFT_BOUNDED)
        for SEGMENT in tl.static_range(3):
            seg_lo, seg_hi = _segment(SEGMENT, lo, full_lo, full_hi, hi)
            dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                    offs_m, offs_n, offs_d, seg_lo, seg_hi, seqlen_q, seqlen_k,
                                    qk_scale, softcap_log2, alibi_slope, window_left, window_right,
                                    bias_ptr, stride_bias_m, stride_bias_n, dbias_ptr, max_k, seed, rng_base,
                                    dropout_scale, dropout_threshold, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, SEGMENT != 1,
                                    IS_LOCAL, SOFTCAP, HAS_ALIBI, HAS_BIAS, STORE_DBIAS, HAS_DROPOUT, DOT_PRECISION,
                                    off_b, off_h, Aux0, Aux1, Aux2, Aux3,
                                    SCORE_MOD, SCORE_MOD_GRAD, MASK_MOD)
    dq = dq * softmax_scale
    dq_ptrs = (DQ + _seq_offset(off_b, q_start, stride_dqb, stride_dqm, IS_VARLEN) + off_h * stride_dqh
               + rows * stride_dqm + offs_d[None, :])
    _store_tile(dq_ptrs, dq.to(DQ.dtype.element_ty), offs_m, seqlen_q, offs_d, HEAD_DIM, HEAD_DIM_PAD)


@triton.jit
def _attn_bwd_dq_convert(DQAccum, DQ, stride_ab, stride_am, stride_qb, stride_qm, stride_qh, seqlen_q, heads_q,
                         scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_M: tl.constexpr = 0,
                         TILE_N: tl.constexpr = 0):
    """DQ = DQAccum * scale in DQ's dtype, for the Gluon backward's fp32 dQ buffer (B, Sq_pad, Hq, HEAD_DIM) with
    a unit head stride of HEAD_DIM (a power of two), or with TILE_M > 0 (BLOCK_M 64) its tiled order
    (_dq_tiled_rows: contiguous loads, reordered in registers). One program per (BLOCK_M rows, batch * head)."""
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // heads_q).to(tl.int64)
    off_h = (pid_bh % heads_q).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None].to(tl.int64)
    mask = offs_m[:, None] < seqlen_q
    if TILE_M:  # the program's 64 rows are in the buffer (rows up to Sq_pad, a multiple of TILE_M)
        acc = tl.load(DQAccum + off_b * stride_ab + _dq_tiled_rows(
            (tl.program_id(0) * BLOCK_M).to(tl.int64), off_h * HEAD_DIM, stride_am, HEAD_DIM, TILE_M, TILE_N))
        acc = _dq_tiled_order(acc, HEAD_DIM, TILE_N)
    else:
        acc = tl.load(DQAccum + off_b * stride_ab + rows * stride_am + off_h * HEAD_DIM + offs_d[None, :], mask=mask)
    tl.store(DQ + off_b * stride_qb + off_h * stride_qh + rows * stride_qm + offs_d[None, :],
             (acc * scale).to(DQ.dtype.element_ty), mask=mask)
