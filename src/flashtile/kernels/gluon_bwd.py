"""Hopper (sm90) backward in Gluon: dK/dV per key block with dQ added into fp32 by TMA reduce-adds (FA3's schedule).

One program per (key block of BLOCK_N = 128 keys (64 at D256), batch * key/value head), three partitions:
  - load (1 warp): K and V of the block once, then the Q and dO tiles of BLOCK_M = 64 query rows of every
    query head of the group through a STAGES-deep ring (TMA, one mbarrier pair per stage and tensor);
  - two consumer warpgroups (the default partition and a 4-warp worker), warpgroup w owning keys
    start_n + 64 w + [0, 64) and their dK / dV rows in registers.
Per query tile a consumer computes, on transposed tiles so that P^T and dS^T feed the dV / dK wgmmas from
registers: S^T = K_w Q^T, dP^T = V_w dO^T (both from shared memory), P^T = exp2(S^T * scale * log2e - lse2),
dS^T = P^T (dP^T - delta), dV += P^T dO, dK += dS^T Q; then dS^T goes to shared memory for dQ = dS K.

dQ: reductions into an fp32 (B, Sq_pad, Hq, D) buffer instead of a second kernel. Per 64 x 128 tile pair at D128
the five GEMMs are 5 * 2 * 64 * 128 * 128 = 10.5 MFLOP; a separate dQ kernel would recompute S and dP
(7 GEMMs instead of 5: +40 % FLOPs), the atomics cost 64 * 128 * 4 B = 32 KB of L2 reductions per tile pair
(3 KB per MFLOP; at 600 TFLOP/s about 2 TB/s over the GPU, within L2's reach). DQ_SPLIT_D (default): the two
warpgroups exchange their dS^T halves through shared memory (an mbarrier per buffer) and each computes half of
dQ's columns over all 128 keys, so each element is added once per key block; otherwise (variant dq-keys) each
warpgroup adds dS_w K_w over its own 64 keys: no exchange, twice the atomics. DQ_TMA_REDUCE (the default since
session 8; dq-reduce2 has two buffers; "atomics" is the path above): a warpgroup stores its [64, 64] fp32 dQ tile
into shared memory instead and one thread adds it with two TMA reduce-adds (32-column boxes) while the warpgroup
goes on: FA3's way, 4x fewer L2 requests, measured 1.12-1.45x the atomics' speed at 1K-16K. Dense launches keep the
fp32 buffer in tiles (D64 / D128 since session 25, D256 since 26; gluon_bwd_launch.dq_tile): a warpgroup's tile is
stored in the accumulator's register order (16-byte stores without bank conflicts) and added by one reduce-add.

HEAD_DIM 256 (SPLIT_D; FA3's hdim-256 shape): dK and dV of 64 keys per warpgroup would be 256 fp32 registers per
thread, so a program takes BLOCK_N = 64 keys and both warpgroups work on all of them, warpgroup w owning head-dim
columns 128 w + [0, 128) of dK, dV (64 + 64 registers) and dQ. Each computes S^T and dP^T for its half of the
query tile ([64 keys, 32 queries], wgmma N = 32, from shared memory at full D), writes its half of P^T and dS^T
to shared memory (double-buffered, one mbarrier per slot, as DQ_SPLIT_D), and once both halves are in, dV_w +=
P^T dO_w, dK_w += dS^T Q_w, dQ_w = dS K_w (all from shared memory). Shared memory: K + V 64 KB, Q + dO 64 KB per
stage (2 stages), P^T + dS^T 2 x 16 KB: 225 KB of the 227. DQ_TMA_REDUCE there stages dQ in the tile's own ring
slot (_bwd_step_split_d) and hands the slot back to the loader a softmax later.

Dense (B, S, H, D) tensors as 3-D (B, S, H * D) TMA tensors: a tile past a sequence's end is zero-filled (not
the next batch's rows), so padded query rows have Q = dO = 0 and lse2 = +inf (P = 0, dS = 0), and padded keys
K = V = 0 (masked to P = 0 as well; their dK / dV rows are not stored). Causal aligned bottom-right.
Score features, each a constexpr (off, the plain / causal kernel compiles as it did without them; their runtime
arguments are None then, so the launch signature is unchanged too), in the order of kernels/common._scores and
kernels/gluon_fwd_common._feature_scores, so P is the one the forward's lse belongs to: SOFTCAP (softcap * tanh(score /
softcap) with tanh.approx.f32, the Gluon forward's; dS gets the chain rule's 1 - t^2), HAS_ALIBI (-slope *
|i + Sk - Sq - j|, no gradient to the slopes), IS_LOCAL (a window, bottom-right aligned, causal + left window
included): each key block visits only the query tiles of common._query_range (masked, full, masked segments),
HAS_BIAS (D64 / D128: an additive bias without gradient, a [BLOCK_M, BLOCK_N] tile per query tile in the Q ring
from a 4-D TMA tensor, bias * log2(e) added after softcap and ALiBi; at D128 dP^T's wgmma then waits for P^T, which
keeps the tile's registers clear of dP^T's accumulator, and dV's follows it at once).
BLOCK_SPARSE (flashtile.attention with a block mask, plain scores, D64 / D128 / D256): a key block visits, per query
head, the query blocks of the block mask's transposed lists (full_q_*, then q_*), full ones with the plain step and
partial ones evaluating the user's mask_mod on S^T (_sparse_load_partition, _consumer_sparse_walk; D256 the same walk
in _consumer_split_d_partition); empty blocks are never loaded. At D128 a partial tile issues dP^T after P^T (as
HAS_BIAS: the mask_mod's registers beside dP^T's accumulator spilled). Off, the dense kernels compile to the PTX
they did (the sparse arguments are None).
ROWS_IN_ACC / ROWS_ZERO_FILL (variants d64-bm128, d64-bm128-split: BLOCK_M = 128 at D64, plain / causal dense calls
only): the S^T / dP^T wgmmas start from -lse2 / qk_scale and -delta (the launcher folds the row buffers), so no
[BLOCK_M] row vector stays live beside the [64, 128] accumulators, and the launcher fills the rows past seqlen_q
(-inf / 0) so they are read unmasked.
LPT_HEADS (> 0: dense causal launches, GluonBwdConfig.lpt_heads): programs start by groups of that many heads, every
head's first key blocks (the most query tiles) first (gluon_grid._heavy_first); 0 walks the grid head by head.
BATCH_FAST (HAS_BIAS, a bias the batch shares): the grid's second index counts the batch fastest (KV head hk, batch
b at hk * B + b), and without LPT_HEADS the programs start batch by batch at each (head, key block), so the B
programs that read one bias tile run side by side and it comes from DRAM once (gluon_grid._batch_fast).

This file holds the kernel and its load partitions; gluon_bwd_step.py the consumers' per-tile step (_bwd_step) and
partitions at D64 / D128, gluon_bwd_split_d.py those of D256.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_bwd_split_d import _consumer1_split_d_partition, _consumer_split_d_partition
from .gluon_bwd_step import WG_N, _consumer1_partition, _consumer_partition, _dq_tiled, _sparse_head_lists, _tile_row
from .gluon_dropout import dropout_rng
from .gluon_grid import _batch_and_head, _batch_fast, _heavy_first
from .gluon_sparse import _sparse_tile_key


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_bufs, do_bufs,
                    lse2_bufs, delta_bufs, kv_bar, q_ready, q_empty, do_ready, do_empty, desc_b, q_r0, kv_r0, row_b,
                    row_c0, start_n, kv_col, off_h0, m_lo, n_tiles, group_size, n_lead, n_masked, n_skip, bias_desc,
                    bias_bufs, bias_b, bias_h0, bias_h_step, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    STAGES: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_BIAS: gl.constexpr = False):
    # Q with its lse2 row slice on one barrier, dO with its delta slice on another. IS_LOCAL: the consumers take
    # the masked tiles first (_tile_row), and so does this ring. Boxes at [desc_b, q_r0 + row, col] (Q, dO) and
    # [desc_b, kv_r0 + start_n, col] (K, V); lse2 / delta at [row_b + query head, row_c0 + row] (dense: batch
    # desc_b = off_b, row offsets 0, row_b = off_b * Hq; varlen: one packed batch and each sequence's offsets).
    # HAS_BIAS (dense only): the [BLOCK_M, BLOCK_N] bias tile at (bias_b, bias_h0 + g * bias_h_step, row, start_n)
    # with Q, on Q's barrier.
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [desc_b, kv_r0 + start_n, kv_col], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [desc_b, kv_r0 + start_n, kv_col], kv_bar, v_smem)
    for it in range(group_size * n_tiles):
        g = it // n_tiles
        if IS_LOCAL:
            row = m_lo + _tile_row(it - g * n_tiles, n_lead, n_masked, n_skip, 2) * BLOCK_M
        else:
            row = m_lo + (it - g * n_tiles) * BLOCK_M
        col = (off_h0 + g) * HEAD_DIM
        row_bh = row_b + off_h0 + g  # the row of lse2 / delta
        stage = it % STAGES
        # Fresh barriers count as having completed phase 1, so the first lap through the ring does not wait.
        empty_phase = ((it // STAGES) & 1) ^ 1
        mbarrier.wait(q_empty.index(stage), empty_phase)
        if HAS_BIAS:
            mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes + lse2_desc.block_type.nbytes
                            + bias_desc.block_type.nbytes)
        else:
            mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes + lse2_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [desc_b, q_r0 + row, col], q_ready.index(stage), q_bufs.index(stage))
        tma.async_copy_global_to_shared(lse2_desc, [row_bh, row_c0 + row], q_ready.index(stage),
                                        lse2_bufs.index(stage))
        if HAS_BIAS:
            tma.async_copy_global_to_shared(bias_desc, [bias_b, bias_h0 + g * bias_h_step, row, start_n],
                                            q_ready.index(stage), bias_bufs.index(stage))
        mbarrier.wait(do_empty.index(stage), empty_phase)
        mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [desc_b, q_r0 + row, col], do_ready.index(stage),
                                        do_bufs.index(stage))
        tma.async_copy_global_to_shared(delta_desc, [row_bh, row_c0 + row], do_ready.index(stage),
                                        delta_bufs.index(stage))


@gluon.jit
def _sparse_load_partition(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_bufs, do_bufs,
                           lse2_bufs, delta_bufs, kv_bar, q_ready, q_empty, do_ready, do_empty, desc_b, row_b,
                           start_n, kv_col, off_h0, group_size, sp_num, sp_idx, sp_full_num, sp_full_idx,
                           sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, HEAD_DIM: gl.constexpr,
                           BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SPARSE_M: gl.constexpr):
    """BLOCK_SPARSE (dense tensors): _load_partition's ring over the query tiles of the key block's lists, per
    query head the full blocks then the partial ones (_consumer_sparse_walk's order)."""
    TILES: gl.constexpr = SPARSE_M // BLOCK_M
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [desc_b, start_n, kv_col], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [desc_b, start_n, kv_col], kv_bar, v_smem)
    it = group_size * 0
    for g in range(group_size):
        h = off_h0 + g
        n_full, n_all, full_ptr, part_ptr = _sparse_head_lists(sp_num, sp_idx, sp_full_num, sp_full_idx,
                                                               sp_num_base, sp_idx_base, sp_num_h, sp_idx_h, h,
                                                               TILES)
        col = h * HEAD_DIM
        row_bh = row_b + h  # the row of lse2 / delta
        for t in range(n_all):
            row = _sparse_tile_key(t, n_full, n_all, full_ptr, part_ptr, BLOCK_M, SPARSE_M)
            stage = it % STAGES
            empty_phase = ((it // STAGES) & 1) ^ 1  # fresh barriers count as having completed phase 1
            mbarrier.wait(q_empty.index(stage), empty_phase)
            mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes + lse2_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [desc_b, row, col], q_ready.index(stage), q_bufs.index(stage))
            tma.async_copy_global_to_shared(lse2_desc, [row_bh, row], q_ready.index(stage), lse2_bufs.index(stage))
            mbarrier.wait(do_empty.index(stage), empty_phase)
            mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [desc_b, row, col], do_ready.index(stage), do_bufs.index(stage))
            tma.async_copy_global_to_shared(delta_desc, [row_bh, row], do_ready.index(stage),
                                            delta_bufs.index(stage))
            it += 1


# Shape-like ints are not specialized (one compiled kernel per config, head dim, causal and dtype).
@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k", "seqlen_q_pad", "heads_q", "heads_kv", "group_size",
                               "stride_alibi_b", "window_left", "window_right", "bias_batch", "bias_heads",
                               "dropout_threshold"])
def _attn_bwd_dkdv_hopper(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, DK, DV, DQAccum, dq_desc,
                          stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, stride_dqm,
                          seqlen_q, seqlen_k, seqlen_q_pad, heads_q, heads_kv, group_size, qk_scale, softmax_scale,
                          Alibi, stride_alibi_b, softcap_log2, window_left, window_right, CuSeqlensQ, CuSeqlensK,
                          bias_desc, bias_batch, bias_heads, QNum, QIdx, FullQNum, FullQIdx, stride_bm_b,
                          stride_bm_h, stride_bm_n, stride_bi_b, stride_bi_h, stride_bi_n, Aux0, Aux1, Aux2, Aux3,
                          Rng, dropout_scale, dropout_threshold, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                          STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, DQ_SPLIT_D: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, IS_LOCAL: gl.constexpr = False,
                          SOFTCAP: gl.constexpr = False, HAS_ALIBI: gl.constexpr = False,
                          DQ_CHUNKS: gl.constexpr = 1, DQ_TMA_REDUCE: gl.constexpr = 0, VARLEN: gl.constexpr = False,
                          HAS_BIAS: gl.constexpr = False, MASK_MOD: gl.constexpr = None,
                          BLOCK_SPARSE: gl.constexpr = False, SPARSE_M: gl.constexpr = 128,
                          SPARSE_N: gl.constexpr = 128, ROWS_IN_ACC: gl.constexpr = False,
                          ROWS_ZERO_FILL: gl.constexpr = False, LPT_HEADS: gl.constexpr = 0,
                          HAS_DROPOUT: gl.constexpr = False, STORE_VIA_SMEM: gl.constexpr = False,
                          BATCH_FAST: gl.constexpr = False):
    """q_desc / do_desc: (B, Sq, Hq * D) boxes [1, BLOCK_M, D]; k_desc / v_desc: (B, Sk, Hk * D) boxes
    [1, 128, D]. lse2_desc / delta_desc: (B * Hq, seqlen_q_pad) fp32 boxes [1, BLOCK_M] over _attn_bwd_preprocess's
    lse * log2(e) (+inf for empty rows) and rowsum(dO * O), written for rows < seqlen_q only.
    DQAccum: zeroed fp32 (B, seqlen_q_pad, Hq, D), row stride stride_dqm, seqlen_q_pad a multiple of BLOCK_M;
    receives dS K (unscaled). qk_scale = softmax_scale * log2(e) (softmax_scale / softcap under SOFTCAP,
    softcap_log2 = softcap * log2(e)). Alibi: fp32 slopes read at off_b * stride_alibi_b + query head. IS_LOCAL:
    window_left / window_right, Sq + Sk for an unbounded side (gluon_launch.mask_mode: causal with a left window
    is IS_LOCAL with right 0, causal alone IS_CAUSAL). Feature arguments are None when their feature is off.
    DQ_CHUNKS (D256 only): dQ's 128 columns per warpgroup in this many wgmma + atomic pieces.
    DQ_TMA_REDUCE (1 or 2 shared buffers per warpgroup at D64 / D128; 1 at D256: the ring slot): dQ tiles by TMA
    reduce-add through dq_desc, DQAccum as (B, seqlen_q_pad, Hq * D) with boxes [1, BLOCK_M, 32] (one 128-byte
    swizzle block; triton 3.6 issues one message per reduce), or, when dq_desc is 2-D (gluon_bwd_launch.dq_tile:
    dense launches), DQAccum in tiles (bwd_launch.dq_tiled_offsets) as (numel / 32, 32) with one tile per box; else
    None.
    VARLEN: packed q / k / v / dO (total, H, D) at int32 CuSeqlensQ / CuSeqlensK (B + 1,), seen as one batch
    (descriptors (1, total, H * D)); seqlen_q / seqlen_k the maxima (the grid); lse2 / delta in the varlen row layout
    (Hq, R), sequence b's rows from 16 * (b + q_start // 16) (common._row_base); DK / DV packed (stride_dkb unused);
    DQAccum (total_q + BLOCK_M, Hq, D) and dq_desc over it with two aliased row dimensions (shape (rows, max_q_pad,
    Hq * D), strides (row, row, 1)), addressed [q_start, m, col]. Tiles reading past a sequence's end read the
    next sequence's rows: their lse2 / delta are masked (P = 0, dS = 0: nothing flows into dK / dV, and dQ adds
    zeros to those rows), and keys past seqlen_k are masked in the block that has them.
    HAS_BIAS (D64 / D128, dense): bias_desc a 4-D (bias_batch, bias_heads, Sq, Sk) TMA tensor
    over the additive bias (bias_batch 1 or B, bias_heads 1 or Hq: a broadcast dim is read at coordinate 0), boxes
    [1, 1, BLOCK_M, BLOCK_N]; no bias gradient. Else bias_desc, bias_batch, bias_heads are None.
    BLOCK_SPARSE (flashtile.attention with a block mask; dense, plain scores: no causal / window /
    softcap / ALiBi / bias): the query tiles come from the block mask's transposed lists of (SPARSE_M, SPARSE_N)
    blocks, SPARSE_M a multiple of BLOCK_M and SPARSE_N of BLOCK_N (gluon_bwd_launch.sparse_ok):
    QNum / FullQNum (B, H, Sk / SPARSE_N) count the partial / full query blocks of each key block, QIdx /
    FullQIdx (B, H, Sk / SPARSE_N, Sq / SPARSE_M) list them (strides stride_bm_* and stride_bi_*, 0 along
    broadcast dims; H is 1 or Hq), as kernels/bwd.py's dK/dV kernel reads them. Full blocks run the plain step,
    partial ones evaluate MASK_MOD (flex's adapter, or None: the key-end mask only) with Aux0..Aux3 (or None).
    All of these are None in dense launches (the same compiled kernel as before).
    ROWS_IN_ACC (dense, plain or causal): lse2_desc / delta_desc hold -lse2 / qk_scale and -delta (gluon_backward
    folds them), onto which S^T and dP^T accumulate (_issue_rows_t); ROWS_ZERO_FILL: their rows past seqlen_q hold
    -inf / 0, read without a mask.
    HAS_DROPOUT (D64 / D128, not BLOCK_SPARSE or ROWS_IN_ACC): Rng holds the forward's int64 Philox seed; the tiles
    regenerate its mask (kernels/common._dropout_keep's draws; threshold dropout_threshold) and dropout_scale =
    1 / (1 - dropout_p) (_bwd_step); up to DROPOUT_ONCE_MAX_HEAD_DIM, DQAccum receives dQ without that factor (the
    launcher's conversion applies it). lse2 / delta as without dropout (delta = rowsum(dO * O) of the dropped O).
    Else Rng is unread, dropout_scale 1 and dropout_threshold 0.
    STORE_VIA_SMEM: dK and dV leave through V's shared buffer as 16-byte row pieces, each warpgroup through its half
    (D64 / D128: of the rows; D256, not block-sparse: of the bytes, as [WG_N, HEAD_DIM / 2]); gluon_bwd_launch's
    dkdv_launch_args sets it for short programs (configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS; D256:
    GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256, all rows).
    Launch with num_warps=4 and a grid of (cdiv(Sk, BLOCK_N), B * Hk), BLOCK_N 128 (64 at D256: K / V boxes too)."""
    SPLIT_D: gl.constexpr = HEAD_DIM > 128  # D256: one WG_N key block, the head dim split over the warpgroups
    # D256 has no shared memory for a bias ring (gluon_bwd_launch refuses it)
    gl.static_assert(not (SPLIT_D and HAS_BIAS), "HAS_BIAS: D64 / D128 only")
    gl.static_assert(not (VARLEN and HAS_BIAS), "HAS_BIAS: dense only")
    gl.static_assert(not BLOCK_SPARSE or not (VARLEN or HAS_BIAS or IS_CAUSAL or IS_LOCAL or SOFTCAP or HAS_ALIBI),
                     "BLOCK_SPARSE: dense, plain scores")
    gl.static_assert(not (SPLIT_D and DQ_TMA_REDUCE) or (DQ_TMA_REDUCE == 1 and DQ_CHUNKS == 1),
                     "DQ_TMA_REDUCE at D256: 1 (the ring slot), with DQ_CHUNKS 1")
    gl.static_assert(not (ROWS_IN_ACC or ROWS_ZERO_FILL) or not (
        SPLIT_D or VARLEN or HAS_BIAS or BLOCK_SPARSE or IS_LOCAL or SOFTCAP or HAS_ALIBI),
        "ROWS_IN_ACC / ROWS_ZERO_FILL: dense plain or causal scores, D64 / D128")
    gl.static_assert(LPT_HEADS == 0 or (IS_CAUSAL and not (IS_LOCAL or VARLEN or BLOCK_SPARSE)),
                     "LPT_HEADS: dense causal launches")
    gl.static_assert(not HAS_DROPOUT or not (SPLIT_D or BLOCK_SPARSE or ROWS_IN_ACC),
                     "HAS_DROPOUT: D64 / D128, without a block mask or ROWS_IN_ACC")
    gl.static_assert(not (STORE_VIA_SMEM and SPLIT_D and BLOCK_SPARSE), "STORE_VIA_SMEM at D256: not block-sparse")
    BLOCK_N: gl.constexpr = WG_N if SPLIT_D else 2 * WG_N
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    if BATCH_FAST and LPT_HEADS == 0:
        pid_n, pid_bh = _batch_fast(pid_n, pid_bh, gl.num_programs(0), gl.num_programs(1) // heads_kv)
    if LPT_HEADS > 0:  # causal: the first key blocks (the most query tiles) of LPT_HEADS heads at a time
        pid_n, pid_bh = _heavy_first(pid_n, pid_bh, gl.num_programs(0), gl.num_programs(1), LPT_HEADS)
    start_n = pid_n * BLOCK_N
    off_b, off_hk = _batch_and_head(pid_bh, heads_kv, BATCH_FAST)
    # Dropout's counters from the maxima (seqlen_q / seqlen_k are still those here under VARLEN), from the group's
    # first query head off_hk * group_size.
    drop_seed, drop_base0, drop_head, drop_row_groups = dropout_rng(Rng, off_b * heads_q + off_hk * group_size,
                                                                    seqlen_q, seqlen_k, HAS_DROPOUT)
    q_start = 0
    k_start = 0
    if VARLEN:
        q_start = gl.load(CuSeqlensQ + off_b)
        seqlen_q = gl.load(CuSeqlensQ + off_b + 1) - q_start
        k_start = gl.load(CuSeqlensK + off_b)
        seqlen_k = gl.load(CuSeqlensK + off_b + 1) - k_start

    # Query tiles [m_lo, m_lo + n_tiles * BLOCK_M) see some key of the block; the first n_masked need a mask
    # (the causal diagonal, or every tile when the block runs past seqlen_k).
    n_q = gl.cdiv(seqlen_q, BLOCK_M)
    # constexpr placeholders (as are the feature arguments below when off): the plain kernel captures nothing new
    n_lead = 0
    n_skip = 0
    if IS_LOCAL:
        # common._query_range: key j is seen by rows j - diag - right <= i <= j - diag + left. Tiles [m_lo,
        # m_lo + n_lead * BLOCK_M) and [full_hi, hi) need the mask, those between do not; the
        # n_masked masked ones go first (_tile_row).
        causal_offset = seqlen_k - seqlen_q
        first_key = start_n - causal_offset
        last_key = gl.minimum(start_n + BLOCK_N, seqlen_k) - 1 - causal_offset
        rows_end = n_q * BLOCK_M
        lo = gl.minimum(gl.maximum(first_key - window_right, 0) // BLOCK_M * BLOCK_M, rows_end)
        hi = gl.cdiv(gl.maximum(gl.minimum(last_key + window_left + 1, seqlen_q), 0), BLOCK_M) * BLOCK_M
        hi = gl.maximum(hi, lo)
        full_lo = gl.cdiv(gl.maximum(last_key - window_right, 0), BLOCK_M) * BLOCK_M
        full_lo = gl.minimum(gl.maximum(full_lo, lo), hi)
        full_hi = gl.maximum(gl.minimum(first_key + window_left + 1, seqlen_q), 0) // BLOCK_M * BLOCK_M
        full_hi = gl.minimum(gl.maximum(full_hi, full_lo), hi)
        m_lo = lo
        n_tiles = (hi - lo) // BLOCK_M
        n_lead = (full_lo - lo) // BLOCK_M
        n_skip = (full_hi - full_lo) // BLOCK_M  # the full tiles
        if start_n + BLOCK_N > seqlen_k:
            n_lead = n_tiles
            n_skip = 0
        n_masked = n_tiles - n_skip
    elif IS_CAUSAL:
        causal_offset = seqlen_k - seqlen_q  # row r sees keys <= r + causal_offset
        m_lo = gl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        m_full = gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        n_tiles = n_q - m_lo // BLOCK_M
        n_masked = gl.minimum(gl.maximum(m_full - m_lo, 0) // BLOCK_M, n_tiles)
    else:
        if HAS_ALIBI:
            causal_offset = seqlen_k - seqlen_q  # ALiBi's distances are bottom-right aligned too
        else:
            causal_offset = 0
        m_lo = 0
        n_tiles = n_q
        n_masked = 0
    if not IS_LOCAL:
        if start_n + BLOCK_N > seqlen_k:
            n_masked = n_tiles
    if VARLEN:
        # The grid covers the longest sequence's keys: a block past this one's has no work and stores nothing (its
        # dK / dV rows are masked by seqlen_k).
        live = (start_n < seqlen_k).to(gl.int32)
        n_tiles = n_tiles * live
        n_masked = n_masked * live
        if IS_LOCAL:
            n_lead = n_lead * live
            n_skip = n_skip * live

    dtype: gl.constexpr = q_desc.dtype
    if SPLIT_D:
        # One more leading dimension: the consumers index it at a runtime 0 (_bwd_step_split_d).
        k_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    else:
        k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    lse2_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], lse2_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], delta_desc.layout)
    if SPLIT_D:
        # P^T and dS^T of two tiles (slots 2 * buf, 2 * buf + 1), each warpgroup writing its half of the columns.
        # A 64-byte swizzle (32 bf16 columns): each half is a whole swizzle column block of its own, at a plain
        # byte offset (with 128-byte rows a half would start inside the XOR pattern of the other's row).
        x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        ds_bufs = gl.allocate_shared_memory(dtype, [4, BLOCK_N, BLOCK_M], x_layout)
    elif DQ_SPLIT_D:
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    else:
        # One buffer per warpgroup: each waits for its own dQ wgmma before its next store.
        ds_layout1: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_N, BLOCK_M], dtype)
        ds_bufs = gl.allocate_shared_memory(dtype, [2, WG_N, BLOCK_M], ds_layout1)
    # DQ_TMA_REDUCE: DQ_TMA_REDUCE fp32 dQ tiles of [BLOCK_M, DQ_N] per warpgroup (D128: 16 KB each; 1: 198,128 B
    # in all, 2: 230,896 B of 232,448). With one, a tile's stores wait for the previous tile's reduce to have read
    # the buffer, issued a whole tile earlier.
    dq_bufs = 0
    dq_b = 0
    dq_c0 = 0
    if DQ_TMA_REDUCE:
        if SPLIT_D:
            # D256 has 1.5 KB to spare: dQ goes through the tile's Q / dO ring slot (_bwd_step_split_d); dq_bufs
            # are the barriers that say both warpgroups are done reading it.
            dq_bufs = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(STAGES):
                mbarrier.init(dq_bufs.index(i), count=2)
        else:
            DQ_N: gl.constexpr = HEAD_DIM // 2 if DQ_SPLIT_D else HEAD_DIM
            if _dq_tiled(dq_desc):
                dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * DQ_TMA_REDUCE, BLOCK_M * DQ_N // 32, 32],
                                                    dq_desc.layout)
            else:
                dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * DQ_TMA_REDUCE, 1, BLOCK_M, DQ_N],
                                                    dq_desc.layout)
        dq_b = q_start if VARLEN else off_b  # varlen: dq_desc's first row dimension aliases its second
        if _dq_tiled(dq_desc):
            dq_b = off_b * (seqlen_q_pad // BLOCK_M)  # the batch's first query tile (_bwd_step's tiled rows)
        dq_c0 = off_hk * group_size * HEAD_DIM
    else:
        dq_desc = 0
    # HAS_BIAS: a [BLOCK_M, BLOCK_N] bias tile per ring stage beside Q's (D128, 16-bit bias: +32 KB, 230,896 B).
    bias_bufs = 0
    bias_b = 0
    bias_h0 = 0
    bias_h_step = 0
    if HAS_BIAS:
        bias_bufs = gl.allocate_shared_memory(bias_desc.dtype, [STAGES, 1, 1, BLOCK_M, BLOCK_N], bias_desc.layout)
        bias_b = gl.minimum(off_b, bias_batch - 1)  # 0 for a batch-broadcast bias
        bias_h0 = gl.minimum(off_hk * group_size, bias_heads - 1)  # the group's first query head, or 0
        bias_h_step = gl.minimum(bias_heads - 1, 1)
    else:
        bias_desc = 0
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        # Both consumer warpgroups release every Q and dO buffer.
        mbarrier.init(q_empty.index(i), count=2)
        mbarrier.init(do_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)

    if VARLEN:
        dk_base = DK + k_start.to(gl.int64) * stride_dkn + off_hk * stride_dkh
        dv_base = DV + k_start.to(gl.int64) * stride_dvn + off_hk * stride_dvh
        dq_base = DQAccum + q_start.to(gl.int64) * stride_dqm + off_hk * group_size * HEAD_DIM
        desc_b = 0
        q_r0 = q_start
        kv_r0 = k_start
        row_b = 0
        row_c0 = 16 * (off_b + q_start // 16)  # common._row_base
    else:
        dk_base = DK + off_b.to(gl.int64) * stride_dkb + off_hk * stride_dkh
        dv_base = DV + off_b.to(gl.int64) * stride_dvb + off_hk * stride_dvh
        dq_base = DQAccum + off_b.to(gl.int64) * seqlen_q_pad * stride_dqm + off_hk * group_size * HEAD_DIM
        desc_b = off_b
        q_r0 = 0
        kv_r0 = 0
        row_b = off_b * heads_q
        row_c0 = 0
    # Features that are off pass constexpr 0 to the partitions (their None arguments cannot be captured).
    alibi_ptr = 0
    if HAS_ALIBI:
        alibi_ptr = Alibi + off_b * stride_alibi_b + off_hk * group_size
    if not SOFTCAP:
        softcap_log2 = 0.0
    if not IS_LOCAL:
        window_left = 0
        window_right = 0
    if BLOCK_SPARSE:
        # The transposed lists of this key block (its SPARSE_N-key mask block) and batch; heads in the partitions.
        sp_num_base = off_b * stride_bm_b + (start_n // SPARSE_N) * stride_bm_n
        sp_idx_base = off_b * stride_bi_b + (start_n // SPARSE_N) * stride_bi_n
        off_h0 = off_hk * group_size
        gl.static_assert(SPARSE_M % BLOCK_M == 0 and SPARSE_N % BLOCK_N == 0,
                         "BLOCK_SPARSE: whole query tiles and key programs per mask block")
    if BLOCK_SPARSE and SPLIT_D:
        gl.warp_specialize([
            (_consumer_split_d_partition,
             (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty, do_ready,
              do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked, n_tiles, group_size, seqlen_q,
              seqlen_k, causal_offset, qk_scale, softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip,
              alibi_ptr, softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, 0, HEAD_DIM, BLOCK_M,
              STAGES, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS, DQ_TMA_REDUCE, QNum, QIdx, FullQNum,
              FullQIdx, sp_num_base, sp_idx_base, stride_bm_h, stride_bi_h, off_b, off_h0, Aux0, Aux1, Aux2, Aux3,
              MASK_MOD, BLOCK_SPARSE, SPARSE_M)),
            (_consumer1_split_d_partition,
             (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty, do_ready,
              do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked, n_tiles, group_size, seqlen_q,
              seqlen_k, causal_offset, qk_scale, softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip,
              alibi_ptr, softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, HEAD_DIM, BLOCK_M,
              STAGES, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS, DQ_TMA_REDUCE, QNum, QIdx, FullQNum,
              FullQIdx, sp_num_base, sp_idx_base, stride_bm_h, stride_bi_h, off_b, off_h0, Aux0, Aux1, Aux2, Aux3,
              MASK_MOD, BLOCK_SPARSE, SPARSE_M)),
            (_sparse_load_partition, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem.index(0),
                                      v_smem.index(0), q_bufs, do_bufs, lse2_bufs, delta_bufs, kv_bar, q_ready,
                                      q_empty, do_ready, do_empty, desc_b, row_b, start_n, off_hk * HEAD_DIM, off_h0,
                                      group_size, QNum, QIdx, FullQNum, FullQIdx, sp_num_base, sp_idx_base,
                                      stride_bm_h, stride_bi_h, HEAD_DIM, BLOCK_M, STAGES, SPARSE_M)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif BLOCK_SPARSE:
        gl.warp_specialize([
            (_consumer_partition, (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready,
                                   q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                   n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                   softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                   softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs, 0,
                                   HEAD_DIM, BLOCK_M, STAGES, IS_CAUSAL, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                                   DQ_TMA_REDUCE, HAS_BIAS, False, False, QNum, QIdx, FullQNum, FullQIdx,
                                   sp_num_base, sp_idx_base, stride_bm_h, stride_bi_h, off_b, off_h0, Aux0, Aux1,
                                   Aux2, Aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_M, 0, 0, 0, 0, 0, 1.0, False,
                                   STORE_VIA_SMEM)),
            (_consumer1_partition, (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready,
                                    q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                    n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                    softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                    softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs,
                                    HEAD_DIM, BLOCK_M, STAGES, IS_CAUSAL, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                                    DQ_TMA_REDUCE, HAS_BIAS, False, False, QNum, QIdx, FullQNum, FullQIdx, sp_num_base,
                                    sp_idx_base, stride_bm_h, stride_bi_h, off_b, off_h0, Aux0, Aux1, Aux2, Aux3,
                                    MASK_MOD, BLOCK_SPARSE, SPARSE_M, 0, 0, 0, 0, 0, 1.0, False, STORE_VIA_SMEM)),
            (_sparse_load_partition, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_bufs,
                                      do_bufs, lse2_bufs, delta_bufs, kv_bar, q_ready, q_empty, do_ready, do_empty,
                                      desc_b, row_b, start_n, off_hk * HEAD_DIM, off_h0, group_size, QNum, QIdx,
                                      FullQNum, FullQIdx, sp_num_base, sp_idx_base, stride_bm_h, stride_bi_h,
                                      HEAD_DIM, BLOCK_M, STAGES, SPARSE_M)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif SPLIT_D:
        gl.warp_specialize([
            (_consumer_split_d_partition,
             (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty, do_ready,
              do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked, n_tiles, group_size, seqlen_q,
              seqlen_k, causal_offset, qk_scale, softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip,
              alibi_ptr, softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, 0, HEAD_DIM, BLOCK_M,
              STAGES, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS, DQ_TMA_REDUCE, None, None, None, None, 0, 0,
              0, 0, 0, 0, None, None, None, None, None, False, 128, STORE_VIA_SMEM)),
            (_consumer1_split_d_partition,
             (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready, q_empty, do_ready,
              do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo, n_masked, n_tiles, group_size, seqlen_q,
              seqlen_k, causal_offset, qk_scale, softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip,
              alibi_ptr, softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, HEAD_DIM, BLOCK_M,
              STAGES, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, DQ_CHUNKS, DQ_TMA_REDUCE, None, None, None, None, 0, 0,
              0, 0, 0, 0, None, None, None, None, None, False, 128, STORE_VIA_SMEM)),
            (_load_partition,
             (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem.index(0), v_smem.index(0), q_bufs,
              do_bufs, lse2_bufs, delta_bufs, kv_bar, q_ready, q_empty, do_ready, do_empty, desc_b, q_r0, kv_r0,
              row_b, row_c0, start_n, off_hk * HEAD_DIM, off_hk * group_size, m_lo, n_tiles, group_size, n_lead,
              n_masked if IS_LOCAL else 0, n_skip, 0, 0, 0, 0, 0, HEAD_DIM, BLOCK_M, STAGES, IS_LOCAL)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready,
                                   q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                   n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                   softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                   softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs, 0,
                                   HEAD_DIM, BLOCK_M, STAGES, IS_CAUSAL, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                                   DQ_TMA_REDUCE, HAS_BIAS, ROWS_IN_ACC, ROWS_ZERO_FILL, None, None, None, None, 0,
                                   0, 0, 0, 0, 0, None, None, None, None, None, False, 128, drop_seed, drop_base0,
                                   drop_head, drop_row_groups, dropout_threshold, dropout_scale, HAS_DROPOUT,
                                   STORE_VIA_SMEM)),
            (_consumer1_partition, (k_smem, v_smem, q_bufs, do_bufs, lse2_bufs, delta_bufs, ds_bufs, kv_bar, q_ready,
                                    q_empty, do_ready, do_empty, ds_ready, dk_base, dv_base, dq_base, start_n, m_lo,
                                    n_masked, n_tiles, group_size, seqlen_q, seqlen_k, causal_offset, qk_scale,
                                    softmax_scale, stride_dkn, stride_dvn, stride_dqm, n_lead, n_skip, alibi_ptr,
                                    softcap_log2, window_left, window_right, dq_desc, dq_bufs, dq_b, dq_c0, bias_bufs,
                                    HEAD_DIM, BLOCK_M, STAGES, IS_CAUSAL, DQ_SPLIT_D, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                                    DQ_TMA_REDUCE, HAS_BIAS, ROWS_IN_ACC, ROWS_ZERO_FILL, None, None, None, None, 0,
                                    0, 0, 0, 0, 0, None, None, None, None, None, False, 128, drop_seed, drop_base0,
                                    drop_head, drop_row_groups, dropout_threshold, dropout_scale, HAS_DROPOUT,
                                    STORE_VIA_SMEM)),
            (_load_partition, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_bufs, do_bufs,
                               lse2_bufs, delta_bufs, kv_bar, q_ready, q_empty, do_ready, do_empty, desc_b, q_r0,
                               kv_r0, row_b, row_c0, start_n, off_hk * HEAD_DIM, off_hk * group_size, m_lo, n_tiles,
                               group_size, n_lead, n_masked if IS_LOCAL else 0, n_skip, bias_desc, bias_bufs, bias_b,
                               bias_h0, bias_h_step, HEAD_DIM, BLOCK_M, STAGES, IS_LOCAL, HAS_BIAS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
