"""The Hopper Gluon backward's per-tile work at head dims 64 / 128 (kernels/gluon_bwd.py has the schedule): a consumer
warpgroup's step over one query tile (_bwd_step: S^T, dP^T, P^T, dS^T, dV, dK and its dQ share), the helpers it
shares with the D256 path (gluon_bwd_split_d.py), and the consumer partitions that walk a key block's query tiles
(dense, windowed or block-sparse) and store dK / dV.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .common import LOG2E, _tanh, _to_f32_16bit
from .gluon_dropout import (dropout_draws_t, dropout_keep_pairs, dropout_kept_grad, dropout_kept_p, dropout_masked,
                            dropout_masked_p, dropout_rescale, dropout_signed)
from .gluon_epilogue import _store_rows_via
from .gluon_sparse import _list_tile_key

try:  # triton >= 3.7 names the TMA reduce-add (cp.reduce.async.bulk.tensor ... .add)
    from triton.experimental.gluon.language.nvidia.hopper.tma import async_atomic_add as _tma_reduce_add
except ImportError:  # triton 3.6: the op and its builder method exist, Gluon's Python does not expose them
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """src (shared memory, tensor_desc's layout) added into tensor_desc's box at coord by one bulk TMA op."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

WG_N = gl.constexpr(64)  # keys per consumer warpgroup (the wgmma M of one warpgroup)
# Dropout up to this head dim applies 1 / (1 - p) once per program (dK, dV here; dQ in the launcher's conversion)
# instead of twice per score (_bwd_step). Session 23 (H200, 8K): D64's backward with dropout 1.69 -> 1.45x the
# one without; at D128 it measured level plain and 2.5 % slower causal, and again 1.8 % slower plain once the round
# keys were fresh per tile (6 % fewer instructions even so), so D128 keeps the per-score scale.
DROPOUT_ONCE_MAX_HEAD_DIM = gl.constexpr(64)


@gluon.constexpr_function
def _dq_tiled(dq_desc):
    """Whether dq_desc is the tiled dQ buffer's 2-D descriptor (gluon_bwd_launch's dq_tiled; the row-major one is
    3-D, and 0 without TMA reduce-adds)."""
    return hasattr(dq_desc, "block_type") and len(dq_desc.block_type.shape) == 2


@gluon.jit
def _tile_row(t, n_lead, n_masked, n_skip, SEGMENT: gl.constexpr):
    """IS_LOCAL: the query tile (from m_lo) of ring position t. The n_masked masked tiles come first (the n_lead
    before the full ones, then the trailing ones, n_skip full tiles further on), then the full ones: two consumer
    loops as for causal (a third loop for the trailing tiles spilled inside the D128 tile loops with softcap).
    SEGMENT: 0 the consumers' masked loop (t < n_masked), 1 their full loop (t >= n_masked), 2 any t (loader)."""
    if SEGMENT == 1:
        return t - n_masked + n_lead
    row = gl.where(t >= n_lead, t + n_skip, t)
    if SEGMENT == 2:
        row = gl.where(t >= n_masked, t - n_masked + n_lead, row)
    return row


@gluon.jit
def _tile_m(t, m_lo, n_lead, n_masked, n_skip, BLOCK_M: gl.constexpr, IS_LOCAL: gl.constexpr,
            SEGMENT: gl.constexpr):
    """First query row of ring position t: m_lo + t * BLOCK_M, or under IS_LOCAL that of _tile_row(t)."""
    if IS_LOCAL:
        return m_lo + _tile_row(t, n_lead, n_masked, n_skip, SEGMENT) * BLOCK_M
    return m_lo + t * BLOCK_M


@gluon.jit
def _row_vector(bufs, stage, valid, other, layout: gl.constexpr):
    """The [BLOCK_M] lse2 / delta slice of ring slot `stage` in `layout`, `other` where not `valid` (the padded
    buffer's rows past seqlen_q are never written)."""
    BLOCK_M: gl.constexpr = bufs.shape[2]
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    x = bufs.index(stage)._reinterpret(gl.float32, [BLOCK_M], flat).load(layout)
    return gl.where(valid, x, other)


@gluon.jit
def _bias_tile(bias_bufs, stage, WG: gl.constexpr, layout: gl.constexpr):
    """Warpgroup WG's key columns of ring slot `stage`'s [BLOCK_M, 2 * WG_N] bias tile, transposed, as fp32
    [WG_N, BLOCK_M] in `layout`. Rows past seqlen_q and keys past seqlen_k were zero-filled by the 4-D TMA box
    (bias 0 there; lse2 = +inf and the key mask make P = 0, as in the portable kernels, which load 0 there)."""
    BLOCK_M: gl.constexpr = bias_bufs.shape[3]
    tile = bias_bufs.index(stage).reshape([BLOCK_M, 2 * WG_N]).slice(WG * WG_N, WG_N, dim=1)
    return _to_f32_16bit(tile.permute((1, 0)).load(layout))


@gluon.jit
def _score_features_t(s, key0, cols, causal_offset, qk_scale, softcap_log2, alibi_log2, SOFTCAP: gl.constexpr,
                      HAS_ALIBI: gl.constexpr, s_layout: gl.constexpr):
    """(scores in log2 units, t) of a transposed tile s = K Q^T [WG_N keys, len(cols) query rows]: scaled, or under
    SOFTCAP t = tanh(s * qk_scale) (qk_scale = softmax_scale / softcap here) and t * softcap_log2, minus ALiBi's
    alibi_log2 * |i + Sk - Sq - j| under HAS_ALIBI. t (softcap's derivative needs it) is s itself without SOFTCAP."""
    t = s
    if SOFTCAP:
        t = _tanh(s * qk_scale, True)
        s = t * softcap_log2
    else:
        s = s * qk_scale
    if HAS_ALIBI:
        keys_f = (key0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, s_layout))).to(gl.float32)  # [WG_N]
        rows_f = (cols + causal_offset).to(gl.float32)  # query positions + Sk - Sq
        s = s - alibi_log2 * gl.abs(rows_f[None, :] - keys_f[:, None])
    return s, t


@gluon.jit
def _visible_t(keys, cols, seqlen_q, seqlen_k, causal_offset, window_left, window_right, off_b, off_h, aux0, aux1,
               aux2, aux3, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, BLOCK_SPARSE: gl.constexpr,
               MASK_MOD: gl.constexpr, causal_cols=None):
    """Which scores of a transposed tile a masked step keeps: [len(keys), len(cols)], keys on rows and query rows on
    columns. Keys past Sk drop; IS_CAUSAL: key <= query + Sk - Sq; IS_LOCAL: query i sees keys i + Sk - Sq - left
    <= j <= i + Sk - Sq + right; BLOCK_SPARSE with a MASK_MOD: MASK_MOD(b, h, q_idx, kv_idx) as in the forward (with
    aux tensors, positions clamped to the last one). causal_cols: a causal test the caller made another way (the
    rows_in_acc variants), anded in where IS_CAUSAL's would be."""
    visible = (keys < seqlen_k)[:, None]
    if causal_cols is not None:
        visible = visible & causal_cols
    if IS_CAUSAL:
        visible = visible & (keys[:, None] <= cols[None, :] + causal_offset)
    if IS_LOCAL:
        shifted = cols + causal_offset
        visible = visible & (keys[:, None] <= shifted[None, :] + window_right) & (
            keys[:, None] >= shifted[None, :] - window_left)
    if BLOCK_SPARSE and MASK_MOD is not None:
        if aux0 is None:
            q_idx = cols[None, :]
            kv_idx = keys[:, None]
        else:
            q_idx = gl.minimum(cols, seqlen_q - 1)[None, :]
            kv_idx = gl.minimum(keys, seqlen_k - 1)[:, None]
        visible = visible & MASK_MOD(off_b, off_h, q_idx, kv_idx, aux0, aux1, aux2, aux3)
    return visible


@gluon.jit
def _issue_t(it, a_view, bufs, ready, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """A B^T ([WG_N, BLOCK_M] fp32) for B the [BLOCK_M, HEAD_DIM] tile of ring slot it in bufs, as an async wgmma
    group once the slot's ready barrier has flipped: S^T from K and Q, dP^T from V and dO."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    stage = it % STAGES
    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
    return warpgroup_mma(a_view, bufs.index(stage).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)),
                         gl.zeros([WG_N, BLOCK_M], gl.float32, s_layout), use_acc=False, is_async=True)


@gluon.jit
def _issue_rows_t(it, a_view, bufs, ready, row_bufs, valid, other, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  STAGES: gl.constexpr, ROWS_ZERO_FILL: gl.constexpr):
    """ROWS_IN_ACC: _issue_t's A B^T plus r broadcast over the rows, r ring slot it's [BLOCK_M] row slice of row_bufs
    (-lse2 / qk_scale or -delta, folded on the host; loaded with B on the same barrier): the wgmma starts from that
    tile instead of zeros. ROWS_ZERO_FILL: the slice is read as it is (the launcher filled the rows past seqlen_q);
    else `other` where not `valid`. Folding the scale and sign on the host instead of here: 573 instead of 619 SASS
    instructions per full-loop iteration (the loaded values go to the accumulator with copies only)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    stage = it % STAGES
    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
    if ROWS_ZERO_FILL:
        flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        r = row_bufs.index(stage)._reinterpret(gl.float32, [BLOCK_M], flat).load(col_layout)
    else:
        r = _row_vector(row_bufs, stage, valid, other, col_layout)
    init, _ = gl.broadcast(r[None, :], gl.zeros([WG_N, BLOCK_M], gl.float32, s_layout))
    return warpgroup_mma(a_view, bufs.index(stage).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)), init,
                         use_acc=True, is_async=True)


@gluon.jit
def _bwd_step(it, m, dk, dv, k_view, v_view, k_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready,
              q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k, causal_offset,
              qk_scale, softcap_log2, alibi_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c,
              bias_bufs, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
              IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, DQ_SPLIT_D: gl.constexpr, IS_LOCAL: gl.constexpr,
              SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, DQ_TMA_REDUCE: gl.constexpr = 0,
              HAS_BIAS: gl.constexpr = False, off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
              MASK_MOD: gl.constexpr = None, BLOCK_SPARSE: gl.constexpr = False, ROWS_IN_ACC: gl.constexpr = False,
              ROWS_ZERO_FILL: gl.constexpr = False, drop_seed=0, drop_base=0, drop_row_groups=0, drop_thr=0,
              dropout_scale=1.0, HAS_DROPOUT: gl.constexpr = False, keep_prob=1.0):
    """Query rows m + [0, BLOCK_M) of ring slot `it` against this warpgroup's keys key0 + [0, WG_N): updates
    dk, dv ([WG_N, HEAD_DIM] fp32) and adds this tile's dQ (unscaled) at dq_ptr + rows * stride_dqm, or under
    DQ_TMA_REDUCE (1 or 2: buffers per warpgroup) through one of this warpgroup's [1, BLOCK_M, DQ_N] fp32 dq_bufs
    and TMA reduce-adds into dq_desc at [dq_b, m, dq_c], or with the tiled buffer (_dq_tiled: dq_bufs
    [BLOCK_M * DQ_N / 32, 32], dq_b the batch's first query tile) one reduce-add at the tile's row of the flat
    buffer (dq_desc, dq_bufs, dq_b, dq_c are constexpr 0 otherwise).
    causal_offset is Sk - Sq under IS_CAUSAL, IS_LOCAL or HAS_ALIBI (else 0); the feature scalars are the
    forward's (gluon_fwd_common._feature_scores), None when their feature is off. HAS_BIAS: bias_bufs is the
    loader's [STAGES, 1, 1, BLOCK_M, 2 * WG_N] ring of bias tiles (this warpgroup reads its WG_N key columns),
    else 0. BLOCK_SPARSE and MASKED (a block mask's partial query block): MASK_MOD(off_b, off_h, q_idx, kv_idx,
    aux0..aux3) on the transposed tile (kv_idx [WG_N, 1] on rows, q_idx [1, BLOCK_M] on columns; clamped to the
    last position with aux tensors, as gluon_sparse._mask_mod_scores) beside the key-end mask.
    ROWS_IN_ACC (plain / causal only; variants d64-bm128*): lse2_bufs / delta_bufs hold -lse2 / qk_scale and -delta
    (folded by the launcher); the S^T wgmma starts from the first and the dP^T one from the second (_issue_rows_t),
    so P^T = exp2(acc * qk_scale) and dS^T = P^T * acc: no [BLOCK_M] row vector is live beside the accumulators
    (at BLOCK_M 128 each is 32 registers per thread). ROWS_ZERO_FILL: the launcher filled the rows past seqlen_q
    with -inf / 0 (P = 0, dS = 0 there), so the slices need no mask.
    HAS_DROPOUT (not ROWS_IN_ACC): the forward's dropout mask of this tile (gluon_dropout.dropout_draws_t: seed
    drop_seed, the query head's first counter drop_base, drop_row_groups = ceil(max_k / 8) per row; threshold
    drop_thr), drawn while S^T runs: dV takes P^T's kept entries times dropout_scale = 1 / (1 - dropout_p), and
    dP^T (the gradient of the dropped, scaled P^T) becomes the undropped P^T's the same way before dS^T. The draws
    are compared two at a time as fp16: at D64 when drawn (dropout_keep_pairs: a 16-bit mask per score, two per
    register), at D128 (LATE_DP) when P^T is made, the mask riding in P^T's sign from there (dropout_signed).
    DROPOUT_ONCE (head dims
    up to DROPOUT_ONCE_MAX_HEAD_DIM): the tile adds dV / s, dK / s and dQ / s instead, s = dropout_scale
    (dS^T = s P^T (Z dP^T - delta / s) with Z the mask and delta times keep_prob = 1 / s), two multiplies per score
    fewer; _consumer_partition multiplies dK and dV by s, gluon_bwd_launch's dQ conversion dQ."""
    dtype: gl.constexpr = q_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2)
    DQ_N: gl.constexpr = HEAD_DIM // 2 if DQ_SPLIT_D else HEAD_DIM
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_N, 16])
    stage = it % STAGES
    q_view = q_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
    do_view = do_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
    # HAS_BIAS at D128: dP^T's wgmma is issued once P^T is made, so that the bias tile (16 to 32 registers per
    # thread) is never live beside dP^T's accumulator: with dP^T in flight meanwhile, 49 spill loads / stores came
    # inside the D128 tile loops; under SOFTCAP its 1 - t^2 is folded into P^T before dP^T (bias + softcap: 0). This
    # warpgroup's softmax no longer overlaps its own dP^T wgmma (the other warpgroup's GEMMs still run meanwhile),
    # as under SOFTCAP. D64 (half the dK / dV registers) keeps the plain order without spills.
    # BLOCK_SPARSE's partial tiles at D128 likewise: a mask_mod evaluated beside dP^T's accumulator spilled 22-54
    # loads / stores per tile (sparse-window, sparse-aux); full tiles keep the plain order.
    LATE_DP: gl.constexpr = (HAS_BIAS or (BLOCK_SPARSE and MASKED) or HAS_DROPOUT) and HEAD_DIM > 64
    DROPOUT_ONCE: gl.constexpr = HAS_DROPOUT and HEAD_DIM <= DROPOUT_ONCE_MAX_HEAD_DIM
    score_scale = dropout_scale  # the per-score factor of dropout's kept entries
    if DROPOUT_ONCE:
        score_scale = 1.0  # a constant: dropout_kept_p's multiplies fold away
    # Dropout below D128 takes the mask without a scale (dropout_masked): DROPOUT_ONCE must cover it.
    gl.static_assert(not HAS_DROPOUT or LATE_DP or DROPOUT_ONCE)
    keep = 0  # the dropout mask, at D128 (LATE_DP) its draws (HAS_DROPOUT; a placeholder otherwise)
    if ROWS_IN_ACC:
        cols = m + gl.arange(0, BLOCK_M, layout=col_layout)  # [BLOCK_M] query rows
        in_seq = cols < seqlen_q
        # S^T - lse2 / qk_scale and dP^T - delta straight out of the wgmmas (past seqlen_q: -inf and 0).
        s_tok = _issue_rows_t(it, k_view, q_bufs, q_ready, lse2_bufs, in_seq, float("-inf"), HEAD_DIM, BLOCK_M,
                              STAGES, ROWS_ZERO_FILL)
        dp_tok = _issue_rows_t(it, v_view, do_bufs, do_ready, delta_bufs, in_seq, 0.0, HEAD_DIM, BLOCK_M, STAGES,
                               ROWS_ZERO_FILL)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))  # [WG_N, BLOCK_M] = S^T - lse2 / qk_scale
        p = gl.exp2(s * qk_scale)  # [WG_N, BLOCK_M]
    else:
        s_tok = _issue_t(it, k_view, q_bufs, q_ready, HEAD_DIM, BLOCK_M, STAGES)
        if not LATE_DP:
            dp_tok = _issue_t(it, v_view, do_bufs, do_ready, HEAD_DIM, BLOCK_M, STAGES)
        cols = m + gl.arange(0, BLOCK_M, layout=col_layout)  # [BLOCK_M] query rows
        in_seq = cols < seqlen_q
        if HAS_DROPOUT and LATE_DP:  # integer work beside the S^T wgmma; the compare comes in dropout_signed
            keep = dropout_draws_t(drop_seed, drop_base, drop_row_groups, key0, m, WG_N, BLOCK_M, s_layout)
        elif HAS_DROPOUT:
            keep = dropout_keep_pairs(dropout_draws_t(drop_seed, drop_base, drop_row_groups, key0, m, WG_N, BLOCK_M,
                                                      s_layout), drop_thr)
        if LATE_DP:
            s = warpgroup_mma_wait(0, deps=(s_tok, ))  # [WG_N, BLOCK_M] = S^T
        elif SOFTCAP:
            # Both first: softcap's 1 - t^2 waits for dP^T in no register of its own (dS^T is made element by element
            # from S^T and dP^T). Keeping it from S^T's wait to dP^T's, 32 more fp32 (16 packed fp16) registers per
            # thread spilled inside the D128 tile loop; this warpgroup's tanh and exp2 no longer overlap its dP^T
            # wgmma (the other warpgroup's GEMMs still run meanwhile).
            s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))  # [WG_N, BLOCK_M] = S^T, dP^T
        else:
            # wgmma groups retire in order: one outstanding means S^T is done and dP^T may still run.
            s = warpgroup_mma_wait(1, deps=(s_tok, ))  # [WG_N, BLOCK_M] = S^T
        # Past seqlen_q: lse2 = +inf makes P = 0 (Q and dO are zero-filled there, so dP = 0 and dS = 0).
        lse2 = _row_vector(lse2_bufs, stage, in_seq, float("inf"), col_layout)
        if HAS_BIAS and not (SOFTCAP or HAS_ALIBI):
            # Two FFMAs per score: s * qk_scale + (bias * log2(e) - lse2), where the sum in _score_features_t's order
            # took three (FMUL, FFMA, FADD).
            p = gl.exp2(s * qk_scale + (_bias_tile(bias_bufs, stage, WG, s_layout) * LOG2E - lse2[None, :]))
        elif SOFTCAP or HAS_ALIBI:
            s, t = _score_features_t(s, key0, cols, causal_offset, qk_scale, softcap_log2, alibi_log2, SOFTCAP,
                                     HAS_ALIBI, s_layout)
            if HAS_BIAS:
                s = s + _bias_tile(bias_bufs, stage, WG, s_layout) * LOG2E  # after softcap and ALiBi, as common._scores
            p = gl.exp2(s - lse2[None, :])  # [WG_N, BLOCK_M]
        else:
            p = gl.exp2(s * qk_scale - lse2[None, :])  # [WG_N, BLOCK_M]
    if MASKED:
        keys = key0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, s_layout))  # [WG_N]
        if IS_CAUSAL and ROWS_IN_ACC:
            # The causal test against the tile's column index: one [WG_N] threshold per tile, no [BLOCK_M] vector
            # offset by m (causal masked loops 874-890 instead of 1063-1105 SASS instructions at BLOCK_M 128).
            first = keys - causal_offset - m  # [WG_N]: the first column of the tile that sees each key
            visible = _visible_t(keys, cols, seqlen_q, seqlen_k, causal_offset, window_left, window_right, off_b, off_h,
                                 aux0, aux1, aux2, aux3, False, IS_LOCAL, BLOCK_SPARSE, MASK_MOD,
                                 gl.arange(0, BLOCK_M, layout=col_layout)[None, :] >= first[:, None])
        else:
            visible = _visible_t(keys, cols, seqlen_q, seqlen_k, causal_offset, window_left, window_right, off_b, off_h,
                                 aux0, aux1, aux2, aux3, IS_CAUSAL, IS_LOCAL, BLOCK_SPARSE, MASK_MOD)
        p = gl.where(visible, p, 0.0)
    # Dropout at D128 (LATE_DP): the mask rides in P^T's sign from here, so it no longer lives beside dP^T's
    # accumulator and dK / dV (spill loads / stores per tile loop 298 -> 176); |p| is the probability. Comparing the
    # draws here, two per fp16 compare, rather than as integers when drawn: tile loops 930 -> 896 SASS instructions
    # (LDL + STL 47 -> 35; session 41, offline). D64 keeps the booleans: it had no spills there, and the signed form
    # compiled to more instructions.
    SIGNED_MASK: gl.constexpr = HAS_DROPOUT and LATE_DP
    p = dropout_signed(p, keep, drop_thr, SIGNED_MASK)
    if LATE_DP:
        if SOFTCAP:
            p_dt = p * (1.0 - t * t)  # [WG_N, BLOCK_M]: P^T times softcap's derivative, so t dies before dP^T
        dp_tok = _issue_t(it, v_view, do_bufs, do_ready, HEAD_DIM, BLOCK_M, STAGES)
        # dV^T += P^T dO right behind it: it runs while dS^T is made (groups retire in order: one outstanding
        # means dP^T is done).
        p_v = dropout_kept_p(p, score_scale, dtype, SIGNED_MASK)  # [WG_N, BLOCK_M]: the forward's dropped, scaled
        p_op = gl.convert_layout(p_v, op_layout, assert_trivial=True)  # P^T, 16-bit
        dv_tok = warpgroup_mma(p_op, do_view, dv, is_async=True)
        dp = warpgroup_mma_wait(1, deps=(dp_tok, ))  # [WG_N, BLOCK_M] = dP^T
    elif not SOFTCAP:
        dp = warpgroup_mma_wait(0, deps=(dp_tok, ))  # [WG_N, BLOCK_M] = dP^T
    # dP^T becomes the undropped P^T's gradient (delta: rowsum(dO * O))
    if SIGNED_MASK:
        dp = dropout_kept_grad(dp, p, score_scale, True)
        p = gl.abs(p)  # the probabilities again (an operand modifier of the multiplies below)
        if SOFTCAP:
            p_dt = gl.abs(p_dt)
    else:
        dp = dropout_masked(dp, keep, HAS_DROPOUT)  # score_scale is 1.0 here (DROPOUT_ONCE)
    if ROWS_IN_ACC:
        ds_lp = (p * dp).to(dtype)  # [WG_N, BLOCK_M] = dS^T (dp is dP^T - delta)
    else:
        delta = _row_vector(delta_bufs, stage, in_seq, 0.0, col_layout)
        if DROPOUT_ONCE:
            delta = delta * keep_prob  # delta / s (docstring)
        if LATE_DP and SOFTCAP:
            ds_lp = (p_dt * (dp - delta[None, :])).to(dtype)  # [WG_N, BLOCK_M] = dS^T
        elif SOFTCAP:
            # d(softcap * tanh(x / softcap)) / dx = 1 - t^2 (softmax_scale is applied to dK / dQ at the end).
            ds_lp = (p * (dp - delta[None, :]) * (1.0 - t * t)).to(dtype)  # [WG_N, BLOCK_M] = dS^T
        else:
            ds_lp = (p * (dp - delta[None, :])).to(dtype)  # [WG_N, BLOCK_M] = dS^T
    if not LATE_DP:
        p_v = dropout_masked_p(p, keep, dtype, HAS_DROPOUT)  # [WG_N, BLOCK_M]: the forward's dropped P^T, 16-bit
        p_op = gl.convert_layout(p_v, op_layout, assert_trivial=True)
        dv_tok = warpgroup_mma(p_op, do_view, dv, is_async=True)
    ds_op = gl.convert_layout(ds_lp, op_layout, assert_trivial=True)
    dk_tok = warpgroup_mma(ds_op, q_view, dk, is_async=True)
    # dS^T to shared memory (written while the dV / dK wgmmas run), for dQ = dS K.
    buf = it % 2
    if DQ_SPLIT_D:
        ds_buf = ds_bufs.index(buf)
        ds_buf.slice(WG * WG_N, WG_N, dim=0).store(ds_lp)
    else:
        ds_buf = ds_bufs.index(WG)
        ds_buf.store(ds_lp)
    fence_async_shared()  # the generic-proxy stores before the async-proxy (wgmma) reads
    if DQ_TMA_REDUCE:
        BOX_N: gl.constexpr = DQ_N if _dq_tiled(dq_desc) else dq_desc.block_type.shape[2]
        # The reduce-adds of tile it - DQ_TMA_REDUCE have read this tile's buffer (one bulk group per box: those of
        # the tiles in between may stay in flight). Their issuing thread waits; the bar.sync below, which comes
        # before this tile's stores into the buffer, holds the other threads until it has.
        tma.store_wait((DQ_TMA_REDUCE - 1) * (DQ_N // BOX_N))
    if DQ_SPLIT_D:
        mbarrier.arrive(ds_ready.index(buf))  # after a warpgroup-wide bar.sync: all 128 threads stored
    dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))
    mbarrier.arrive(q_empty.index(stage))
    mbarrier.arrive(do_empty.index(stage))
    dq_zero = gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout)
    if DQ_SPLIT_D:
        # Both halves of dS^T written. Buffer `buf` is rewritten at it + 2, after this warpgroup has waited for
        # the other one's arrival at it + 1, which comes after the other's dQ wgmma of `it` retired.
        mbarrier.wait(ds_ready.index(buf), (it // 2) & 1)
        dq_tok = warpgroup_mma(ds_buf.permute((1, 0)), k_smem.slice(WG * DQ_N, DQ_N, dim=1), dq_zero,
                               use_acc=False, is_async=True)
    else:
        gl.thread_barrier()  # this warpgroup's dS^T stores, before its own wgmma reads them
        dq_tok = warpgroup_mma(ds_buf.permute((1, 0)), k_view, dq_zero, use_acc=False, is_async=True)
    dq = warpgroup_mma_wait(0, deps=(dq_tok, ))  # [BLOCK_M, DQ_N]
    if DQ_TMA_REDUCE:
        # The tile by bulk reduce-adds from one thread, in flight while this warpgroup goes on: in place of the
        # DQ_N / 4 red.global.add.v2.f32 of each of 128 threads. Row-major, DQ_N / 32 of them (a box is one
        # 128-byte swizzle block of 32 fp32 columns, at a plain 8 KB offset in dq_smem); tiled, one.
        if DQ_TMA_REDUCE == 1:
            dq_smem = dq_bufs.index(WG)  # [1, BLOCK_M, DQ_N] fp32 ([BLOCK_M * DQ_N / 32, 32] tiled)
        else:
            dq_smem = dq_bufs.index(WG * DQ_TMA_REDUCE + it % DQ_TMA_REDUCE)
        if _dq_tiled(dq_desc):
            # The tile in the accumulator's register order (bwd_launch.dq_tiled_offsets): each thread's four
            # values of an 8-column group (rows r, r + 8) are one 16-byte piece, 32 lanes fill 512 bytes, so the
            # stores are v4 and conflict-free (row-major, a warp's v2 stores hit each bank twice), and the tile
            # is one reduce-add of BLOCK_M * DQ_N / 32 rows of the flat buffer.
            dq_t = gl.permute(gl.reshape(dq, [BLOCK_M // 64, 4, 2, 8, DQ_N // 8, 4, 2]), (0, 4, 1, 3, 5, 2, 6))
            dq_smem.store(gl.reshape(dq_t, [BLOCK_M * DQ_N // 32, 32]))
        else:
            dq_smem.reshape([BLOCK_M, DQ_N]).store(dq)
        fence_async_shared()  # the generic-proxy stores before the async-proxy (TMA) read
        gl.thread_barrier()  # all 128 threads stored before the elected one issues
        if _dq_tiled(dq_desc):
            _tma_reduce_add(dq_desc, [((dq_b + m // BLOCK_M) * stride_dqm + dq_c) * (BLOCK_M // 32), 0], dq_smem)
        else:
            for c in gl.static_range(DQ_N // BOX_N):
                _tma_reduce_add(dq_desc, [dq_b, m, dq_c + c * BOX_N], dq_smem.slice(c * BOX_N, BOX_N, dim=2))
    else:
        rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        dcols = gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
        # No mask: the buffer has rows up to seqlen_q rounded up to BLOCK_M (padded rows get dS = 0, discarded).
        gl.atomic_add(dq_ptr + rows[:, None].to(gl.int64) * stride_dqm + dcols[None, :], dq, sem="relaxed")
    return dk, dv


@gluon.jit
def _consumer_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty,
                        do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked,
                        n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale, softmax_scale,
                        stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr, softcap_log2,
                        window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs, WG: gl.constexpr,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                        DQ_SPLIT_D: gl.constexpr, IS_LOCAL: gl.constexpr, SOFTCAP: gl.constexpr,
                        HAS_ALIBI: gl.constexpr, DQ_TMA_REDUCE: gl.constexpr, HAS_BIAS: gl.constexpr,
                        ROWS_IN_ACC: gl.constexpr, ROWS_ZERO_FILL: gl.constexpr, sp_num=None, sp_idx=None,
                        sp_full_num=None, sp_full_idx=None, sp_num_base=0, sp_idx_base=0, sp_num_h=0, sp_idx_h=0,
                        off_b=0, off_h0=0, aux0=None, aux1=None, aux2=None, aux3=None, MASK_MOD: gl.constexpr = None,
                        BLOCK_SPARSE: gl.constexpr = False, SPARSE_M: gl.constexpr = 128, drop_seed=0, drop_base0=0,
                        drop_head=0, drop_row_groups=0, drop_thr=0, dropout_scale=1.0,
                        HAS_DROPOUT: gl.constexpr = False, STORE_VIA_SMEM: gl.constexpr = False):
    """Keys start_n + WG * 64 + [0, 64): dK, dV over the n_tiles query tiles from row m_lo of every query head of
    the group (the first n_masked of each need the causal / window / key-end mask; under IS_LOCAL in the order of
    _tile_row); writes those rows of dK and dV. dk_base / dv_base: this (batch, kv head)'s rows of
    DK / DV; dq_base: the group's first head in DQAccum; alibi_ptr: the group's first head's slope.
    DQ_TMA_REDUCE: dQ by dq_desc (batch dq_b, the group's first head at column dq_c0) from this warpgroup's
    DQ_TMA_REDUCE buffers of dq_bufs. BLOCK_SPARSE: the query tiles of the key block's transposed lists instead
    (_consumer_sparse_walk; m_lo, n_masked, n_tiles, n_lead, n_skip unused). HAS_DROPOUT: the group's first query
    head's first dropout counter drop_base0, drop_head counters per head (_bwd_step); up to
    DROPOUT_ONCE_MAX_HEAD_DIM, dK and dV take dropout_scale = 1 / (1 - dropout_p) here, once. STORE_VIA_SMEM: dK / dV
    leave through shared memory in 16-byte row pieces (_store_rows_via), else from the accumulators' layout."""
    dtype: gl.constexpr = q_bufs.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    key0 = start_n + WG * WG_N
    k_all = k_smem.reshape([2 * WG_N, HEAD_DIM])
    k_view = k_all.slice(WG * WG_N, WG_N, dim=0)
    v_view = v_smem.reshape([2 * WG_N, HEAD_DIM]).slice(WG * WG_N, WG_N, dim=0)
    dk = gl.zeros([WG_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([WG_N, HEAD_DIM], gl.float32, acc_layout)
    DQ_N: gl.constexpr = HEAD_DIM // 2 if DQ_SPLIT_D else HEAD_DIM
    dq_col = WG * DQ_N if DQ_SPLIT_D else 0
    DROPOUT_ONCE: gl.constexpr = HAS_DROPOUT and HEAD_DIM <= DROPOUT_ONCE_MAX_HEAD_DIM
    keep_prob = 1.0
    if DROPOUT_ONCE:
        keep_prob = 1.0 / dropout_scale  # 1 - dropout_p, _bwd_step's factor of delta
    mbarrier.wait(kv_bar, 0)
    if BLOCK_SPARSE:
        dk, dv = _consumer_sparse_walk(
            dk, dv, k_view, v_view, k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready, q_empty,
            do_ready, do_empty, ds_ready, dq_base, dq_col, stride_dqm, key0, seqlen_q, seqlen_k, qk_scale, dq_desc,
            dq_bufs, dq_b, dq_c0, group_size, sp_num, sp_idx, sp_full_num, sp_full_idx, sp_num_base, sp_idx_base,
            sp_num_h, sp_idx_h, off_b, off_h0, aux0, aux1, aux2, aux3, WG, HEAD_DIM, BLOCK_M, STAGES, DQ_SPLIT_D,
            DQ_TMA_REDUCE, MASK_MOD, SPARSE_M)
    else:
        for g in range(group_size):
            dq_ptr = dq_base + g * HEAD_DIM + dq_col
            dq_c = dq_c0 + g * HEAD_DIM + dq_col
            it0 = g * n_tiles
            alibi_log2 = 0.0
            if HAS_ALIBI:
                alibi_log2 = gl.load(alibi_ptr + g) * LOG2E  # query head off_hk * group_size + g
            drop_base = drop_base0 + g * drop_head  # that head's first dropout counter
            for t in range(0, n_masked):
                dk, dv = _bwd_step(
                    it0 + t, _tile_m(t, m_lo, n_lead, n_masked, n_skip, BLOCK_M, IS_LOCAL, 0), dk, dv, k_view, v_view,
                    k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready, q_empty, do_ready, do_empty,
                    ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k, causal_offset, qk_scale, softcap_log2,
                    alibi_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c, bias_bufs, WG, HEAD_DIM,
                    BLOCK_M, STAGES, IS_CAUSAL, True, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_TMA_REDUCE,
                    HAS_BIAS, ROWS_IN_ACC=ROWS_IN_ACC, ROWS_ZERO_FILL=ROWS_ZERO_FILL, drop_seed=drop_seed,
                    drop_base=drop_base, drop_row_groups=drop_row_groups, drop_thr=drop_thr,
                    dropout_scale=dropout_scale, HAS_DROPOUT=HAS_DROPOUT, keep_prob=keep_prob)
            for t in range(n_masked, n_tiles):
                dk, dv = _bwd_step(
                    it0 + t, _tile_m(t, m_lo, n_lead, n_masked, n_skip, BLOCK_M, IS_LOCAL, 1), dk, dv, k_view, v_view,
                    k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready, q_empty, do_ready, do_empty,
                    ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k, causal_offset, qk_scale, softcap_log2,
                    alibi_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c, bias_bufs, WG, HEAD_DIM,
                    BLOCK_M, STAGES, IS_CAUSAL, False, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_TMA_REDUCE,
                    HAS_BIAS, ROWS_IN_ACC=ROWS_IN_ACC, ROWS_ZERO_FILL=ROWS_ZERO_FILL, drop_seed=drop_seed,
                    drop_base=drop_base, drop_row_groups=drop_row_groups, drop_thr=drop_thr,
                    dropout_scale=dropout_scale, HAS_DROPOUT=HAS_DROPOUT, keep_prob=keep_prob)
    if DQ_TMA_REDUCE:
        tma.store_wait(0)  # the last reduce-add has read dq_smem before the program exits
    dv = dropout_rescale(dv, dropout_scale, DROPOUT_ONCE)
    dk = dropout_rescale(dk, dropout_scale, DROPOUT_ONCE)
    if STORE_VIA_SMEM:
        # This warpgroup's half of V's buffer is free now (no one else reads it): dV, then dK, go out through it.
        _store_rows_via(v_view, dv.to(dtype), dv_base, stride_dvn, key0, seqlen_k)
        _store_rows_via(v_view, (dk * softmax_scale).to(dtype), dk_base, stride_dkn, key0, seqlen_k)
    else:
        rows = key0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, acc_layout))  # [WG_N]
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))  # [HEAD_DIM]
        in_seq = (rows < seqlen_k)[:, None]
        rows64 = rows.to(gl.int64)[:, None]
        gl.store(dk_base + rows64 * stride_dkn + cols[None, :], (dk * softmax_scale).to(dtype), mask=in_seq)
        gl.store(dv_base + rows64 * stride_dvn + cols[None, :], dv.to(dtype), mask=in_seq)


@gluon.jit
def _consumer1_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready,
                         q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                         n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale, softmax_scale,
                         stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr, softcap_log2,
                         window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                         DQ_SPLIT_D: gl.constexpr, IS_LOCAL: gl.constexpr, SOFTCAP: gl.constexpr,
                         HAS_ALIBI: gl.constexpr, DQ_TMA_REDUCE: gl.constexpr, HAS_BIAS: gl.constexpr,
                         ROWS_IN_ACC: gl.constexpr, ROWS_ZERO_FILL: gl.constexpr, sp_num=None, sp_idx=None,
                         sp_full_num=None, sp_full_idx=None, sp_num_base=0, sp_idx_base=0, sp_num_h=0, sp_idx_h=0,
                         off_b=0, off_h0=0, aux0=None, aux1=None, aux2=None, aux3=None,
                         MASK_MOD: gl.constexpr = None, BLOCK_SPARSE: gl.constexpr = False,
                         SPARSE_M: gl.constexpr = 128, drop_seed=0, drop_base0=0, drop_head=0, drop_row_groups=0,
                         drop_thr=0, dropout_scale=1.0, HAS_DROPOUT: gl.constexpr = False,
                         STORE_VIA_SMEM: gl.constexpr = False):
    _consumer_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty,
                        do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked, n_tiles,
                        group_size, seqlen_q, seqlen_k, causal_offset, qk_scale, softmax_scale, stride_dkn,
                        stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr, softcap_log2, window_left, window_right,
                        dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs, 1, HEAD_DIM, BLOCK_M, STAGES, IS_CAUSAL,
                        DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_TMA_REDUCE, HAS_BIAS, ROWS_IN_ACC,
                        ROWS_ZERO_FILL, sp_num, sp_idx,
                        sp_full_num, sp_full_idx, sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, off_b, off_h0, aux0,
                        aux1, aux2, aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_M, drop_seed, drop_base0, drop_head,
                        drop_row_groups, drop_thr, dropout_scale, HAS_DROPOUT, STORE_VIA_SMEM)


@gluon.jit
def _sparse_head_lists(sp_num, sp_idx, sp_full_num, sp_full_idx, sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, h,
                       TILES: gl.constexpr):
    """BLOCK_SPARSE, query head h: (n_full, n_all, full_ptr, part_ptr): this key block's full query blocks (n_full
    tiles of BLOCK_M rows, TILES per block) listed at full_ptr, then its partial ones up to n_all at part_ptr (the
    block mask's transposed lists full_q_* / q_*; a broadcast head has stride 0)."""
    num_off = sp_num_base + h * sp_num_h
    idx_off = sp_idx_base + h * sp_idx_h
    n_full = gl.load(sp_full_num + num_off) * TILES
    n_all = n_full + gl.load(sp_num + num_off) * TILES
    return n_full, n_all, sp_full_idx + idx_off, sp_idx + idx_off


@gluon.jit
def _consumer_sparse_walk(dk, dv, k_view, v_view, k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready,
                          q_empty, do_ready, do_empty, ds_ready, dq_base, dq_col, stride_dqm, key0, seqlen_q,
                          seqlen_k, qk_scale, dq_desc, dq_bufs, dq_b, dq_c0, group_size, sp_num, sp_idx, sp_full_num,
                          sp_full_idx, sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, off_b, off_h0, aux0, aux1, aux2,
                          aux3, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                          STAGES: gl.constexpr, DQ_SPLIT_D: gl.constexpr, DQ_TMA_REDUCE: gl.constexpr,
                          MASK_MOD: gl.constexpr, SPARSE_M: gl.constexpr):
    """BLOCK_SPARSE: for each query head off_h0 + g of the group, the full query blocks of this key block
    (plain steps, no mask: a full block never reaches past Sq or Sk) then its partial ones (MASK_MOD and the
    key-end mask), in the ring order of _sparse_load_partition; empty blocks are never visited (a key block with
    none keeps dK = dV = 0, and dQ's rows receive nothing)."""
    TILES: gl.constexpr = SPARSE_M // BLOCK_M
    it0 = group_size * 0  # ring position of the head's first tile (heads list different counts)
    for g in range(group_size):
        h = off_h0 + g
        n_full, n_all, full_ptr, part_ptr = _sparse_head_lists(sp_num, sp_idx, sp_full_num, sp_full_idx,
                                                               sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, h,
                                                               TILES)
        dq_ptr = dq_base + g * HEAD_DIM + dq_col
        dq_c = dq_c0 + g * HEAD_DIM + dq_col
        for t in range(0, n_full):
            m = _list_tile_key(full_ptr, t, True, BLOCK_M, SPARSE_M)
            dk, dv = _bwd_step(
                it0 + t, m, dk, dv, k_view, v_view, k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready,
                q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k, 0, qk_scale,
                0.0, 0.0, 0, 0, dq_desc, dq_bufs, dq_b, dq_c, 0, WG, HEAD_DIM, BLOCK_M, STAGES, False, False,
                DQ_SPLIT_D, False, False, False, DQ_TMA_REDUCE, False)
        for t in range(n_full, n_all):
            m = _list_tile_key(part_ptr, t - n_full, True, BLOCK_M, SPARSE_M)
            dk, dv = _bwd_step(
                it0 + t, m, dk, dv, k_view, v_view, k_all, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, q_ready,
                q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k, 0, qk_scale,
                0.0, 0.0, 0, 0, dq_desc, dq_bufs, dq_b, dq_c, 0, WG, HEAD_DIM, BLOCK_M, STAGES, False, True,
                DQ_SPLIT_D, False, False, False, DQ_TMA_REDUCE, False, off_b, h, aux0, aux1, aux2, aux3, MASK_MOD,
                True)
        it0 += n_all
    return dk, dv
