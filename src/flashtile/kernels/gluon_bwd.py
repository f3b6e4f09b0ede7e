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
kernels/gluon_fwd._feature_scores, so P is the one the forward's lse belongs to: SOFTCAP (softcap * tanh(score /
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
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .common import LOG2E, _tanh, _to_f32_16bit
from .gluon_dropout import (dropout_keep_t, dropout_kept, dropout_kept_grad, dropout_kept_p, dropout_rescale,
                            dropout_rng, dropout_signed)
from .gluon_epilogue import _store_rows_via
from .gluon_grid import _heavy_first
from .gluon_sparse import _list_tile_key, _sparse_tile_key

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
    forward's (gluon_fwd._feature_scores), None when their feature is off. HAS_BIAS: bias_bufs is the
    loader's [STAGES, 1, 1, BLOCK_M, 2 * WG_N] ring of bias tiles (this warpgroup reads its WG_N key columns),
    else 0. BLOCK_SPARSE and MASKED (a block mask's partial query block): MASK_MOD(off_b, off_h, q_idx, kv_idx,
    aux0..aux3) on the transposed tile (kv_idx [WG_N, 1] on rows, q_idx [1, BLOCK_M] on columns; clamped to the
    last position with aux tensors, as gluon_sparse._mask_mod_scores) beside the key-end mask.
    ROWS_IN_ACC (plain / causal only; variants d64-bm128*): lse2_bufs / delta_bufs hold -lse2 / qk_scale and -delta
    (folded by the launcher); the S^T wgmma starts from the first and the dP^T one from the second (_issue_rows_t),
    so P^T = exp2(acc * qk_scale) and dS^T = P^T * acc: no [BLOCK_M] row vector is live beside the accumulators
    (at BLOCK_M 128 each is 32 registers per thread). ROWS_ZERO_FILL: the launcher filled the rows past seqlen_q
    with -inf / 0 (P = 0, dS = 0 there), so the slices need no mask.
    HAS_DROPOUT (not ROWS_IN_ACC): the forward's dropout mask of this tile (gluon_dropout.dropout_keep_t: seed
    drop_seed, the query head's first counter drop_base, drop_row_groups = ceil(max_k / 8) per row, threshold
    drop_thr), drawn while S^T runs: dV takes P^T's kept entries times dropout_scale = 1 / (1 - dropout_p), and
    dP^T (the gradient of the dropped, scaled P^T) becomes the undropped P^T's the same way before dS^T. At D128
    (LATE_DP) the mask rides in P^T's sign once P^T is made (gluon_dropout.dropout_signed). DROPOUT_ONCE (head dims
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
        score_scale = 1.0  # a constant: dropout_kept's multiplies fold away
    keep = 0  # the dropout mask (HAS_DROPOUT; a placeholder otherwise)
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
        if HAS_DROPOUT:  # integer work beside the S^T wgmma
            keep = dropout_keep_t(drop_seed, drop_base, drop_row_groups, key0, m, drop_thr, WG_N, BLOCK_M, s_layout)
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
    # Dropout at D128 (LATE_DP): the mask rides in P^T's sign from here, so its 32 booleans per thread no longer live
    # beside dP^T's accumulator and dK / dV (spill loads / stores per tile loop 298 -> 176); |p| is the probability.
    # D64 keeps the booleans: it had no spills there, and the signed form compiled to more instructions.
    SIGNED_MASK: gl.constexpr = HAS_DROPOUT and LATE_DP
    p = dropout_signed(p, keep, SIGNED_MASK)
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
        dp = dropout_kept(dp, keep, score_scale, HAS_DROPOUT)
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
        p_v = dropout_kept(p, keep, score_scale, HAS_DROPOUT)  # [WG_N, BLOCK_M]: the forward's dropped, scaled P^T
        p_op = gl.convert_layout(p_v.to(dtype), op_layout, assert_trivial=True)
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
                          HAS_DROPOUT: gl.constexpr = False, STORE_VIA_SMEM: gl.constexpr = False):
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
    if LPT_HEADS > 0:  # causal: the first key blocks (the most query tiles) of LPT_HEADS heads at a time
        pid_n, pid_bh = _heavy_first(pid_n, pid_bh, gl.num_programs(0), gl.num_programs(1), LPT_HEADS)
    start_n = pid_n * BLOCK_N
    off_b = pid_bh // heads_kv
    off_hk = pid_bh % heads_kv
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
