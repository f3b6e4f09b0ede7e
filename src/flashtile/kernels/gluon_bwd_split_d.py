"""The Hopper Gluon backward at head dim 256 (SPLIT_D; kernels/gluon_bwd.py describes the shape): both consumer
warpgroups work on the same 64 keys, warpgroup w owning head-dim columns 128 w + [0, 128) of dK, dV and dQ, and
exchange their halves of P^T and dS^T through shared memory.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .common import LOG2E
from .gluon_bwd_step import WG_N, _dq_tiled, _score_features_t, _sparse_head_lists, _tile_m, _tma_reduce_add, _visible_t
from .gluon_epilogue import _store_rows_via
from .gluon_sparse import _list_tile_key


@gluon.jit
def _bwd_step_split_d(it, m, dk, dv, k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs, q_ready,
                      q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0, seqlen_q, seqlen_k,
                      causal_offset, qk_scale, softcap_log2, alibi_log2, window_left, window_right, dq_desc, dq_done,
                      dq_b, dq_c, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                      STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, IS_LOCAL: gl.constexpr,
                      SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, DQ_CHUNKS: gl.constexpr,
                      DQ_TMA_REDUCE: gl.constexpr = 0, off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
                      MASK_MOD: gl.constexpr = None, BLOCK_SPARSE: gl.constexpr = False):
    """SPLIT_D (HEAD_DIM 256): both warpgroups own the same WG_N keys key0 + [0, WG_N); warpgroup WG computes
    S^T / dP^T for query columns WG * BLOCK_M / 2 + [0, BLOCK_M / 2) of the tile, writes its half of P^T and dS^T
    to x_bufs (slots 2 * buf: P^T, 2 * buf + 1: dS^T, each [WG_N, BLOCK_M]), and after both halves are in, adds
    into its head-dim half of dk, dv ([WG_N, HEAD_DIM / 2] fp32) and this tile's dQ columns WG * HEAD_DIM / 2 +
    [0, HEAD_DIM / 2) (unscaled) at dq_ptr + rows * stride_dqm. Same score features and masks as _bwd_step.
    DQ_TMA_REDUCE (DQ_CHUNKS 1): dQ through the tile's own ring slot instead, once both warpgroups' wgmmas on it
    retired (dq_done, count 2): warpgroup 0 in its Q buffer, 1 in its dO buffer (32 KB each: [64, 128] fp32), by
    four TMA reduce-adds into dq_desc at [dq_b, m, dq_c + 32 c], or with the tiled buffer (2-D dq_desc, the dense
    default) in the accumulator's order by one reduce-add of the [256, 32] box at the tile's row; the slot goes back
    to the loader during the next tile, once those have read it. BLOCK_SPARSE and MASKED: MASK_MOD on the half tile,
    as in _bwd_step."""
    dtype: gl.constexpr = q_bufs.dtype
    HALF_M: gl.constexpr = BLOCK_M // 2
    HALF_D: gl.constexpr = HEAD_DIM // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_M, 16])
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    DQ_N: gl.constexpr = HALF_D // DQ_CHUNKS
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_N, 16])
    stage = it % STAGES
    phase = (it // STAGES) & 1
    # K and V at a runtime index that is always 0 (it >= 0) but varies per tile for the compiler: with a constant
    # one their wgmma descriptors (16 k-steps of 64 bits each for K, as many for V) were hoisted out of the tile
    # loop into 64 registers per thread, and the default partition spilled inside it.
    kv = it >> 31
    k_view = k_smem.index(kv).reshape([WG_N, HEAD_DIM])
    v_view = v_smem.index(kv).reshape([WG_N, HEAD_DIM])
    q_view = q_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
    do_view = do_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
    s_zero = gl.zeros([WG_N, HALF_M], gl.float32, s_layout)
    mbarrier.wait(q_ready.index(stage), phase)
    s_tok = warpgroup_mma(k_view, q_view.slice(WG * HALF_M, HALF_M, dim=0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    mbarrier.wait(do_ready.index(stage), phase)
    dp_tok = warpgroup_mma(v_view, do_view.slice(WG * HALF_M, HALF_M, dim=0).permute((1, 0)), s_zero,
                           use_acc=False, is_async=True)
    cols = m + WG * HALF_M + gl.arange(0, HALF_M, layout=col_layout)  # [HALF_M] query rows
    in_seq = cols < seqlen_q
    if SOFTCAP:
        s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))  # [WG_N, HALF_M] = S^T, dP^T
    else:
        s = warpgroup_mma_wait(1, deps=(s_tok, ))  # [WG_N, HALF_M] = S^T
    lse2 = _row_half(lse2_bufs, stage, WG, in_seq, float("inf"), col_layout)
    if SOFTCAP or HAS_ALIBI:
        s, t = _score_features_t(s, key0, cols, causal_offset, qk_scale, softcap_log2, alibi_log2, SOFTCAP,
                                 HAS_ALIBI, s_layout)
        p = gl.exp2(s - lse2[None, :])  # [WG_N, HALF_M]
    else:
        p = gl.exp2(s * qk_scale - lse2[None, :])  # [WG_N, HALF_M]
    if MASKED:
        keys = key0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, s_layout))  # [WG_N]
        visible = _visible_t(keys, cols, seqlen_q, seqlen_k, causal_offset, window_left, window_right, off_b, off_h,
                             aux0, aux1, aux2, aux3, IS_CAUSAL, IS_LOCAL, BLOCK_SPARSE, MASK_MOD)
        p = gl.where(visible, p, 0.0)
    if not SOFTCAP:
        dp = warpgroup_mma_wait(0, deps=(dp_tok, ))  # [WG_N, HALF_M] = dP^T
    delta = _row_half(delta_bufs, stage, WG, in_seq, 0.0, col_layout)
    if SOFTCAP:
        ds_lp = (p * (dp - delta[None, :]) * (1.0 - t * t)).to(dtype)  # [WG_N, HALF_M] = dS^T
    else:
        ds_lp = (p * (dp - delta[None, :])).to(dtype)  # [WG_N, HALF_M] = dS^T
    # Both halves of P^T and dS^T through shared memory (the dV / dK / dQ wgmmas read them from there). Slot
    # pair `buf` is rewritten at it + 2, after this warpgroup has waited for the other one's arrival at it + 1,
    # which comes after the other's wgmmas of `it` retired.
    buf = it % 2
    pt_buf = x_bufs.index(2 * buf)
    ds_buf = x_bufs.index(2 * buf + 1)
    if DQ_TMA_REDUCE:
        # The previous tile's dQ reduce-adds have read its ring slot (issued a softmax ago): release the slot. The
        # bar.sync holds the arriving thread until the issuing one has waited.
        tma.store_wait(0)
        if it > 0:
            gl.thread_barrier()
            mbarrier.arrive(q_empty.index((it - 1) % STAGES))
            mbarrier.arrive(do_empty.index((it - 1) % STAGES))
    pt_buf.slice(WG * HALF_M, HALF_M, dim=1).store(p.to(dtype))
    ds_buf.slice(WG * HALF_M, HALF_M, dim=1).store(ds_lp)
    fence_async_shared()  # the generic-proxy stores before the async-proxy (wgmma) reads
    mbarrier.arrive(ds_ready.index(buf))
    mbarrier.wait(ds_ready.index(buf), (it // 2) & 1)
    dv_tok = warpgroup_mma(pt_buf, do_view.slice(WG * HALF_D, HALF_D, dim=1), dv, is_async=True)
    dk_tok = warpgroup_mma(ds_buf, q_view.slice(WG * HALF_D, HALF_D, dim=1), dk, is_async=True)
    dq_zero = gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout)
    rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dcols = gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
    # dQ's HALF_D columns in DQ_CHUNKS pieces, one at a time (variant dq-chunks2: 32 registers per thread for dq
    # instead of 64 beside dK and dV's 128, one more wgmma wait per tile; both compile without spills).
    for c in gl.static_range(DQ_CHUNKS):
        dq_tok = warpgroup_mma(ds_buf.permute((1, 0)), k_view.slice(WG * HALF_D + c * DQ_N, DQ_N, dim=1), dq_zero,
                               use_acc=False, is_async=True)
        if c == 0:
            dv, dk, dq = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok))  # dq: [BLOCK_M, DQ_N]
            if not DQ_TMA_REDUCE:
                mbarrier.arrive(q_empty.index(stage))
                mbarrier.arrive(do_empty.index(stage))
        else:
            dq = warpgroup_mma_wait(0, deps=(dq_tok, ))
        if DQ_TMA_REDUCE:
            # Both warpgroups' wgmmas on this slot's Q and dO retired: each may overwrite its buffer.
            mbarrier.arrive(dq_done.index(stage))
            mbarrier.wait(dq_done.index(stage), phase)
            own = q_bufs if WG == 0 else do_bufs
            if _dq_tiled(dq_desc):  # as _bwd_step's tiled store: one reduce-add of the whole [64, 128] tile
                dq_smem = own.index(stage)._reinterpret(gl.float32, [BLOCK_M * DQ_N // 32, 32], dq_desc.layout)
                dq_t = gl.permute(gl.reshape(dq, [BLOCK_M // 64, 4, 2, 8, DQ_N // 8, 4, 2]), (0, 4, 1, 3, 5, 2, 6))
                dq_smem.store(gl.reshape(dq_t, [BLOCK_M * DQ_N // 32, 32]))
            else:
                dq_smem = own.index(stage)._reinterpret(gl.float32, [1, BLOCK_M, DQ_N], dq_desc.layout)
                dq_smem.reshape([BLOCK_M, DQ_N]).store(dq)
            fence_async_shared()  # the generic-proxy stores before the async-proxy (TMA) read
            gl.thread_barrier()  # all 128 threads stored before the elected one issues
            if _dq_tiled(dq_desc):
                _tma_reduce_add(dq_desc, [((dq_b + m // BLOCK_M) * stride_dqm + dq_c) * (BLOCK_M // 32), 0],
                                dq_smem)
            else:
                BOX_N: gl.constexpr = dq_desc.block_type.shape[2]
                for b in gl.static_range(DQ_N // BOX_N):
                    _tma_reduce_add(dq_desc, [dq_b, m, dq_c + b * BOX_N], dq_smem.slice(b * BOX_N, BOX_N, dim=2))
        else:
            # No mask: the buffer has rows up to seqlen_q rounded up to BLOCK_M (padded rows get dS = 0, discarded).
            gl.atomic_add(dq_ptr + c * DQ_N + rows[:, None].to(gl.int64) * stride_dqm + dcols[None, :], dq,
                          sem="relaxed")
    return dk, dv


@gluon.jit
def _row_half(bufs, stage, WG: gl.constexpr, valid, other, layout: gl.constexpr):
    """_row_vector's slice for warpgroup WG's half of the query tile."""
    BLOCK_M: gl.constexpr = bufs.shape[2]
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    row = bufs.index(stage)._reinterpret(gl.float32, [BLOCK_M], flat)
    x = row.slice(WG * (BLOCK_M // 2), BLOCK_M // 2).load(layout)
    return gl.where(valid, x, other)


@gluon.jit
def _consumer_split_d_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs, kv_bar, q_ready,
                                q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                softcap_log2, window_left, window_right, dq_desc, dq_done, dq_b, dq_c0,
                                WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr,
                                SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, DQ_CHUNKS: gl.constexpr,
                                DQ_TMA_REDUCE: gl.constexpr, sp_num=None, sp_idx=None, sp_full_num=None,
                                sp_full_idx=None, sp_num_base=0, sp_idx_base=0, sp_num_h=0, sp_idx_h=0, off_b=0,
                                off_h0=0, aux0=None, aux1=None, aux2=None, aux3=None, MASK_MOD: gl.constexpr = None,
                                BLOCK_SPARSE: gl.constexpr = False, SPARSE_M: gl.constexpr = 128,
                                STORE_VIA_SMEM: gl.constexpr = False):
    """SPLIT_D: keys start_n + [0, WG_N), head-dim columns WG * HEAD_DIM / 2 + [0, HEAD_DIM / 2) of their dK and
    dV (and of dQ); otherwise as _consumer_partition (BLOCK_SPARSE: _consumer_sparse_walk's order).
    STORE_VIA_SMEM: dK / dV leave through V's shared buffer, seen as two [WG_N, HEAD_DIM / 2] tiles, one per
    warpgroup, in 16-byte row pieces. Both warpgroups read all of V (dP^T at full D), but each one's last read
    retired before it arrived at the last tile's ds_ready, which the other waited for: V is free once a warpgroup
    leaves its tile loop."""
    dtype: gl.constexpr = q_bufs.dtype
    HALF_D: gl.constexpr = HEAD_DIM // 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HALF_D, 16])
    key0 = start_n
    dk = gl.zeros([WG_N, HALF_D], gl.float32, acc_layout)
    dv = gl.zeros([WG_N, HALF_D], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    if BLOCK_SPARSE:
        TILES: gl.constexpr = SPARSE_M // BLOCK_M
        it0 = group_size * 0  # ring position of the head's first tile
        for g in range(group_size):
            h = off_h0 + g
            n_full, n_all, full_ptr, part_ptr = _sparse_head_lists(sp_num, sp_idx, sp_full_num, sp_full_idx,
                                                                   sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, h,
                                                                   TILES)
            dq_ptr = dq_base + g * HEAD_DIM + WG * HALF_D
            dq_c = dq_c0 + g * HEAD_DIM + WG * HALF_D
            for t in range(0, n_full):
                dk, dv = _bwd_step_split_d(it0 + t, _list_tile_key(full_ptr, t, True, BLOCK_M, SPARSE_M), dk, dv,
                                           k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs, q_ready,
                                           q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0,
                                           seqlen_q, seqlen_k, 0, qk_scale, 0.0, 0.0, 0, 0, dq_desc, dq_done, dq_b,
                                           dq_c, WG, HEAD_DIM, BLOCK_M, STAGES, False, False, False, False, False,
                                           DQ_CHUNKS, DQ_TMA_REDUCE)
            for t in range(n_full, n_all):
                dk, dv = _bwd_step_split_d(it0 + t, _list_tile_key(part_ptr, t - n_full, True, BLOCK_M, SPARSE_M),
                                           dk, dv, k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs,
                                           q_ready, q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0,
                                           seqlen_q, seqlen_k, 0, qk_scale, 0.0, 0.0, 0, 0, dq_desc, dq_done, dq_b,
                                           dq_c, WG, HEAD_DIM, BLOCK_M, STAGES, False, True, False, False, False,
                                           DQ_CHUNKS, DQ_TMA_REDUCE, off_b, h, aux0, aux1, aux2, aux3, MASK_MOD,
                                           True)
            it0 += n_all
    else:
        for g in range(group_size):
            dq_ptr = dq_base + g * HEAD_DIM + WG * HALF_D
            dq_c = dq_c0 + g * HEAD_DIM + WG * HALF_D
            it0 = g * n_tiles
            alibi_log2 = 0.0
            if HAS_ALIBI:
                alibi_log2 = gl.load(alibi_ptr + g) * LOG2E  # query head off_hk * group_size + g
            for t in range(0, n_masked):
                dk, dv = _bwd_step_split_d(it0 + t, _tile_m(t, m_lo, n_lead, n_masked, n_skip, BLOCK_M, IS_LOCAL, 0),
                                           dk, dv, k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs,
                                           q_ready, q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0,
                                           seqlen_q, seqlen_k, causal_offset, qk_scale, softcap_log2, alibi_log2,
                                           window_left, window_right, dq_desc, dq_done, dq_b, dq_c, WG, HEAD_DIM,
                                           BLOCK_M, STAGES, IS_CAUSAL, True, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS,
                                           DQ_TMA_REDUCE)
            for t in range(n_masked, n_tiles):
                dk, dv = _bwd_step_split_d(it0 + t, _tile_m(t, m_lo, n_lead, n_masked, n_skip, BLOCK_M, IS_LOCAL, 1),
                                           dk, dv, k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs,
                                           q_ready, q_empty, do_ready, do_empty, ds_ready, dq_ptr, stride_dqm, key0,
                                           seqlen_q, seqlen_k, causal_offset, qk_scale, softcap_log2, alibi_log2,
                                           window_left, window_right, dq_desc, dq_done, dq_b, dq_c, WG, HEAD_DIM,
                                           BLOCK_M, STAGES, IS_CAUSAL, False, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS,
                                           DQ_TMA_REDUCE)
    if DQ_TMA_REDUCE:
        tma.store_wait(0)  # the last reduce-adds have read their slot before the program exits
    if STORE_VIA_SMEM:
        halves = v_smem._reinterpret(dtype, [2, WG_N, HALF_D],
                                     gl.NVMMASharedLayout.get_default_for([WG_N, HALF_D], dtype))
        _store_rows_via(halves.index(WG), dv.to(dtype), dv_base + WG * HALF_D, stride_dvn, key0, seqlen_k)
        _store_rows_via(halves.index(WG), (dk * softmax_scale).to(dtype), dk_base + WG * HALF_D, stride_dkn, key0,
                        seqlen_k)
    else:
        rows = key0 + gl.arange(0, WG_N, layout=gl.SliceLayout(1, acc_layout))  # [WG_N]
        cols = WG * HALF_D + gl.arange(0, HALF_D, layout=gl.SliceLayout(0, acc_layout))  # [HALF_D]
        in_seq = (rows < seqlen_k)[:, None]
        rows64 = rows.to(gl.int64)[:, None]
        gl.store(dk_base + rows64 * stride_dkn + cols[None, :], (dk * softmax_scale).to(dtype), mask=in_seq)
        gl.store(dv_base + rows64 * stride_dvn + cols[None, :], dv.to(dtype), mask=in_seq)


@gluon.jit
def _consumer1_split_d_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs, kv_bar, q_ready,
                                 q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                 n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                 softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                 softcap_log2, window_left, window_right, dq_desc, dq_done, dq_b, dq_c0,
                                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                                 IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, SOFTCAP: gl.constexpr,
                                 HAS_ALIBI: gl.constexpr, DQ_CHUNKS: gl.constexpr, DQ_TMA_REDUCE: gl.constexpr,
                                 sp_num=None, sp_idx=None, sp_full_num=None, sp_full_idx=None, sp_num_base=0,
                                 sp_idx_base=0, sp_num_h=0, sp_idx_h=0, off_b=0, off_h0=0, aux0=None, aux1=None,
                                 aux2=None, aux3=None, MASK_MOD: gl.constexpr = None,
                                 BLOCK_SPARSE: gl.constexpr = False, SPARSE_M: gl.constexpr = 128,
                                 STORE_VIA_SMEM: gl.constexpr = False):
    _consumer_split_d_partition(k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, x_bufs, kv_bar, q_ready,
                                q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                softcap_log2, window_left, window_right, dq_desc, dq_done, dq_b, dq_c0, 1, HEAD_DIM,
                                BLOCK_M, STAGES, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS, DQ_TMA_REDUCE,
                                sp_num, sp_idx, sp_full_num, sp_full_idx, sp_num_base, sp_idx_base, sp_num_h, sp_idx_h,
                                off_b, off_h0, aux0, aux1, aux2, aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_M, STORE_VIA_SMEM)
