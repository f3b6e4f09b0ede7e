"""Hopper (sm90) forward in Gluon: TMA, mbarriers, async wgmma, warp specialization (FA3's schedule).

One program per (128-row query tile, batch * query head), three partitions:
  - load (1 warp): TMA loads of the two 64-row Q halves, then K and V blocks into a STAGES-deep ring;
  - two consumer warpgroups (the default partition and a 4-warp worker), each owning 64 query rows.
Each consumer runs the online softmax with intra-warpgroup overlap: the QK^T of block j is issued
together with the PV of block j-1, and the softmax of block j runs while that PV is in flight. With
PINGPONG the two warpgroups take turns issuing their GEMMs (two mbarriers pass the turn), so one
warpgroup's softmax overlaps the other's GEMMs. CONSUMERS=3 (the D64 variant, as FA3's hdim 64): 192-row
tiles, three consumer warpgroups and three Q boxes, the turn going round a ring of three barriers, so each
softmax overlaps two other warpgroups' GEMMs (at D64 one warpgroup's two GEMMs take about as long as its
softmax's MUFU work: docs/perf-log.md).

Dense (B, S, H, D) q/k/v viewed as 2D (B * S, H * D) TMA tensors, head_dim 64/128/256, fp16/bf16; causal
and sliding windows aligned bottom-right, the host guaranteeing that every real row sees at least one key.
Rows of a tile past seqlen_q read the next batch's queries (or TMA's zero fill) and are never stored; keys
past seqlen_k are masked to -inf in the last block for the rows below seqlen_q (the causal block-relative mask
leaves them visible to the rows past it: _mask_scores). RAGGED (batch > 1 with Sk % BLOCK_N != 0, and varlen): the
same 2D tensors through ragged 4-D descriptors (gluon_launch.ragged_descriptor), so boxes past a sequence's end
are zero-filled, never the next sequence's rows (whose values, even masked, could be non-finite: 0 * inf = NaN).
VARLEN: packed (total, H, D) q/k/v at int32 cu_seqlens, the grid over max_seqlen_q; each program reads its
sequence's bounds, leaves at once past its rows, and handles rows that see no key (output 0, lse -inf).
Score features, each a constexpr (off, the plain kernel compiles as it did without them), in the order of
kernels/common._scores: SOFTCAP (softcap * tanh(score / softcap), common._tanh's tanh.approx.f32), HAS_ALIBI
(-slope * |i + Sk - Sq - j|), HAS_BIAS (an additive fp16/bf16 bias, TMA-loaded by the load partition into its own
shared-memory ring next to K / V; gluon_launch.bias_ok says which layouts), then the masks (causal, IS_LOCAL
window, sequence end); HAS_SINK starts the online softmax from one logit per head (m = sink, l = 1), so lse
includes the sink as kernels/fwd.py's does.
BLOCK_SPARSE (flashtile.attention with a block mask): the loader and both consumer warpgroups walk the same key
tiles, those of the tile's full key blocks then its partial ones (_sparse_tile_key); partial tiles evaluate the
user's mask_mod (_mask_mod_scores), full ones run the dense unmasked step, empty blocks are never loaded.
Writes Out (B, Sq, Hq, D) and Lse (B, Hq, Sq) fp32 (varlen: Out like q, Lse (Hq, total_q)), natural log, as
kernels/fwd.py does.

This file holds the kernel, its load partition and the store of rows that see no key; gluon_fwd_consumer.py the
consumer warpgroups (_kv_step, _consumer_partition); gluon_fwd_common.py what they share with the persistent kernel
(gluon_fwd_persistent.py): masks, score features, the row max and rescale, P's conversion, the warpgroups' turns.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_dropout import dropout_rng
from .gluon_fwd_common import RAGGED_BILLION, WG_M, _tma_load
from .gluon_fwd_consumer import _consumer_partition
from .gluon_grid import _batch_and_head, _batch_fast, _heavy_first
from .gluon_sparse import _sparse_tile_key


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty,
                    q_row, q_col, kv_row, kv_col, n_blocks, q_end, kv_end,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RAGGED: gl.constexpr = False,
                    b_desc=None, b_bufs=None, b_ready=None, b_empty=None, b_row=0, b_col=0,
                    HAS_BIAS: gl.constexpr = False, n_full=0, full_ptr=None, part_ptr=None, list_off=0,
                    BLOCK_SPARSE: gl.constexpr = False, SPARSE_N: gl.constexpr = 128,
                    CONSUMERS: gl.constexpr = 2):
    # BLOCK_SPARSE: key tile j starts at _sparse_tile_key(j) (kv_row then holds no key offset); the next tile's
    # index is read one tile ahead, so a TMA's coordinates never wait on a load of the same iteration.
    # HAS_BIAS: the bias box [BLOCK_M, BLOCK_N] at (b_row, b_col + j * BLOCK_N) of the 2-D bias descriptor joins
    # each key block, in its own ring (b_ready / b_empty), between K (needed first) and V (needed a step later).
    # Every warpgroup's Q rows on one barrier; a box past the tensor's end is zero-filled and still counts its bytes.
    mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
    _tma_load(q_desc, q_row, q_end, q_col, q_bar, q_smem.index(0), RAGGED)
    _tma_load(q_desc, q_row + WG_M, q_end, q_col, q_bar, q_smem.index(1), RAGGED)
    if CONSUMERS == 3:
        _tma_load(q_desc, q_row + 2 * WG_M, q_end, q_col, q_bar, q_smem.index(2), RAGGED)
    if BLOCK_SPARSE:
        full_ptr += list_off
        part_ptr += list_off
        next_key = _sparse_tile_key(0, n_full, n_blocks, full_ptr, part_ptr, BLOCK_N, SPARSE_N)
    for j in range(n_blocks):
        stage = j % STAGES
        if BLOCK_SPARSE:
            key_row = kv_row + next_key
            next_key = _sparse_tile_key(j + 1, n_full, n_blocks, full_ptr, part_ptr, BLOCK_N, SPARSE_N)
        else:
            key_row = kv_row + j * BLOCK_N
        # Fresh barriers count as having completed phase 1, so the first lap through the ring does not wait.
        empty_phase = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(stage), empty_phase)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        _tma_load(k_desc, key_row, kv_end, kv_col, k_ready.index(stage), k_bufs.index(stage), RAGGED)
        if HAS_BIAS:
            mbarrier.wait(b_empty.index(stage), empty_phase)
            mbarrier.expect(b_ready.index(stage), b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(b_desc, [b_row, b_col + j * BLOCK_N], b_ready.index(stage),
                                            b_bufs.index(stage))
        mbarrier.wait(v_empty.index(stage), empty_phase)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        _tma_load(v_desc, key_row, kv_end, kv_col, v_ready.index(stage), v_bufs.index(stage), RAGGED)


@gluon.jit
def _store_rows_without_keys(out_ptr, lse_ptr, stride_om, seqlen_q, start_m, sink_ptr, HEAD_DIM: gl.constexpr,
                             BLOCK_M: gl.constexpr, HAS_SINK: gl.constexpr):
    """Rows start_m + [0, BLOCK_M) (those < seqlen_q) of a tile that sees no key: output 0, lse -inf (the sink's
    logit with a sink, the only term of the row's softmax), as the portable kernel writes them."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    lse_fill = float("-inf")
    if HAS_SINK:
        lse_fill = gl.load(sink_ptr)
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))  # [HEAD_DIM]
    zeros = gl.zeros([WG_M, HEAD_DIM], out_ptr.dtype.element_ty, layout)
    for half in gl.static_range(BLOCK_M // WG_M):
        rows = start_m + half * WG_M + gl.arange(0, WG_M, layout=gl.SliceLayout(1, layout))  # [WG_M]
        in_seq = rows < seqlen_q
        gl.store(out_ptr + rows.to(gl.int64)[:, None] * stride_om + cols[None, :], zeros, mask=in_seq[:, None])
        gl.store(lse_ptr + rows, gl.full([WG_M], lse_fill, gl.float32, gl.SliceLayout(1, layout)), mask=in_seq)


# Shape-like ints are not specialized (divisibility, == 1): one compiled kernel per (config, head dim, causal,
# dtype) instead of one per seqlen class. TMA does the loads, so the hints would buy nothing there.
@gluon.jit(do_not_specialize=["stride_lse_b", "stride_lse_h", "seqlen_q", "seqlen_k", "heads_q",
                              "group_size", "stride_alibi_b", "window_left", "window_right", "bias_rows_b",
                              "bias_rows_h", "dropout_threshold"])
def _attn_fwd_hopper(q_desc, k_desc, v_desc, Out, Lse, Alibi, Sink,
                     stride_ob, stride_om, stride_oh, stride_lse_b, stride_lse_h, stride_alibi_b,
                     seqlen_q, seqlen_k, heads_q, group_size, qk_scale, softcap_log2, window_left, window_right,
                     CuSeqlensQ, CuSeqlensK, b_desc, bias_rows_b, bias_rows_h, sm_scale,
                     KvNum, KvIdx, FullKvNum, FullKvIdx, stride_bm_b, stride_bm_h, stride_bm_m,
                     stride_bi_b, stride_bi_h, stride_bi_m, Aux0, Aux1, Aux2, Aux3,
                     Rng, dropout_scale, dropout_threshold,
                     HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                     IS_LOCAL: gl.constexpr = False, SOFTCAP: gl.constexpr = False, HAS_ALIBI: gl.constexpr = False,
                     HAS_SINK: gl.constexpr = False, VARLEN: gl.constexpr = False, RAGGED: gl.constexpr = False,
                     P_CVT_ASM: gl.constexpr = False, TREE_MAX: gl.constexpr = False,
                     HAS_BIAS: gl.constexpr = False, MASK_MOD: gl.constexpr = None,
                     BLOCK_SPARSE: gl.constexpr = False, SPARSE_M: gl.constexpr = 128,
                     SPARSE_N: gl.constexpr = 128, CONSUMERS: gl.constexpr = 2, EVEN_N: gl.constexpr = False,
                     LPT_HEADS: gl.constexpr = 0, HAS_DROPOUT: gl.constexpr = False,
                     O_VIA_SMEM: gl.constexpr = False, LAZY_RESCALE: gl.constexpr = False,
                     ALIBI_MMA: gl.constexpr = False, FIXED_MAX: gl.constexpr = False,
                     BATCH_FAST: gl.constexpr = False):
    """q_desc: (B * Sq, Hq * D) boxes [64, D]; k_desc / v_desc: (B * Sk, Hk * D) boxes [BLOCK_N, D].
    RAGGED: the three are gluon_launch's ragged 4-D descriptors over those 2-D tensors, so no box reads past its
    sequence's end (zero fill): batch > 1 with Sk % BLOCK_N != 0, and VARLEN. VARLEN: q / k / v packed
    (total, H, D) at int32 CuSeqlensQ / CuSeqlensK (B + 1,), seqlen_q / seqlen_k the maxima (the grid), Out
    packed like q (stride_ob 0) and Lse (Hq, total_q) (stride_lse_b 0); a sequence's rows may see no key.
    qk_scale = softmax_scale * log2(e) (softmax_scale / softcap under SOFTCAP, softcap_log2 = softcap * log2(e)).
    Alibi: fp32 slopes read at off_b * stride_alibi_b + off_h; Sink: fp32 (Hq,) logits. IS_LOCAL: a window
    (window_left, window_right, Sq + Sk for an unbounded side, as launch.ScoreArgs passes them); causal alone is
    IS_CAUSAL. Launch with num_warps=4 (consumer warpgroup 0) and a grid of (cdiv(Sq, 128), B * Hq).
    P_CVT_ASM: the key loop's P packed by pairs (_to_p); TREE_MAX: its row maxima as trees (_row_max).
    HAS_BIAS: b_desc is a 2-D fp16/bf16 TMA descriptor (rows, Sk) with boxes [BLOCK_M, BLOCK_N] over the bias's
    storage: query row i of (batch b, head h) is row b * bias_rows_b + h * bias_rows_h + i (0 steps along broadcast
    dims; varlen: i and the keys are positions in the sequence). Rows of a tile past seqlen_q may read the next
    head's rows (or the zero fill): they are never stored. Keys past Sk are zero-filled and masked.
    sm_scale = softmax_scale (the bias-alone path scales by it, not by qk_scale).
    BLOCK_SPARSE (flashtile.flex, plain scores: no causal / window / softcap / ALiBi / sink / bias): the key tiles
    come from a block mask of (SPARSE_M, SPARSE_N) blocks, SPARSE_M a multiple of the 128-row tile and SPARSE_N of
    BLOCK_N (gluon_launch.sparse_ok): KvNum / FullKvNum (B, H, Sq / SPARSE_M) count the partial / full key blocks
    of each query block, KvIdx / FullKvIdx (B, H, Sq / SPARSE_M, Sk / SPARSE_N) list them (strides stride_bm_* and
    stride_bi_*, 0 along broadcast dims), as kernels/fwd.py reads them; partial blocks evaluate MASK_MOD (flex's
    adapter, reading Aux0..Aux3). Empty blocks are never loaded; a tile without blocks writes 0 and lse -inf.
    Dense launches pass None for these fourteen arguments (constexprs: the plain kernel compiles as before).
    CONSUMERS: consumer warpgroups of WG_M rows each, 2 (BLOCK_M 128) or 3 (BLOCK_M 192: the D64 variant, whose
    ping-pong hides each warpgroup's softmax behind the other two's GEMMs; not with HAS_BIAS, whose ring of
    [BLOCK_M, BLOCK_N] boxes would not fit, nor BLOCK_SPARSE, whose lists are per 128-row tile); the grid's first
    dim is then cdiv(Sq, 64 * CONSUMERS).
    EVEN_N (BLOCK_SPARSE with Sk % SPARSE_N == 0): no listed key tile reaches past Sk (_mask_mod_scores).
    LPT_HEADS (> 0: dense causal launches, GluonConfig.lpt_heads): programs start by groups of that many heads, every
    head's longest rows first (gluon_grid._heavy_first); 0: head by head, each head's longest rows first.
    BATCH_FAST (a bias shared by the batch, bias_rows_b 0): the grid's second index counts the batch fastest (head
    h, batch b at h * B + b), and without LPT_HEADS the programs start batch by batch at each (head, query tile): the
    B programs that read one bias tile run side by side, so it comes from DRAM once (gluon_grid._batch_fast).
    HAS_DROPOUT (two consumers): Rng holds the int64 Philox seed; probabilities dropped where their 15-bit draw is
    below dropout_threshold (kernels/common._dropout_keep's draws, made by gluon_dropout), the kept ones scaled by
    dropout_scale = 1 / (1 - dropout_p); Lse stays the undropped one (what kernels/bwd.py expects).
    O_VIA_SMEM (two consumers): each warpgroup's output rows leave through its Q tile in 16-byte row pieces
    (_consumer_partition); gluon_launch_args sets it where configs.GLUON_FWD_SMEM_EPILOGUE says.
    ALIBI_MMA (HAS_ALIBI without SOFTCAP or HAS_BIAS, BLOCK_N 128): the one-sided key blocks' ALiBi columns by one
    more wgmma (_kv_step), from CONSUMERS x (4 KB + 2 x 2 KB) of shared memory.
    FIXED_MAX (SOFTCAP without HAS_ALIBI, HAS_BIAS, HAS_SINK or BLOCK_SPARSE; bf16, softcap * log2(e) <=
    FIXED_MAX_LIMIT: gluon_launch.fixed_max_ok): rows subtract one fixed max instead of a running one
    (FIXED_MAX_HEADROOM)."""
    gl.static_assert(not FIXED_MAX or (SOFTCAP and not (HAS_ALIBI or HAS_BIAS or HAS_SINK or BLOCK_SPARSE)),
                     "FIXED_MAX: softcap without ALiBi, a bias, a sink or a block mask")
    gl.static_assert(not FIXED_MAX or q_desc.dtype == gl.bfloat16, "FIXED_MAX: bf16 (fp16 P tops out at 65504)")
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not HAS_BIAS and not BLOCK_SPARSE),
                     "CONSUMERS: 2, or 3 without a bias or a block mask")
    gl.static_assert(CONSUMERS == 2 or not HAS_DROPOUT, "HAS_DROPOUT: two consumers")
    gl.static_assert(CONSUMERS == 2 or not O_VIA_SMEM, "O_VIA_SMEM: two consumers")
    gl.static_assert(not ALIBI_MMA or (HAS_ALIBI and not (SOFTCAP or HAS_BIAS)),
                     "ALIBI_MMA: ALiBi without softcap or a bias")
    # The draws follow key_lo + j * BLOCK_N, not a block mask's listed tiles.
    gl.static_assert(not (HAS_DROPOUT and BLOCK_SPARSE), "HAS_DROPOUT: no block mask")
    gl.static_assert(LPT_HEADS == 0 or (IS_CAUSAL and not (IS_LOCAL or VARLEN or BLOCK_SPARSE)),
                     "LPT_HEADS: dense causal launches")
    BLOCK_M: gl.constexpr = CONSUMERS * WG_M
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    if BATCH_FAST and LPT_HEADS == 0:
        pid_m, pid_bh = _batch_fast(pid_m, pid_bh, gl.num_programs(0), gl.num_programs(1) // heads_q)
    if LPT_HEADS > 0:  # causal: the longest rows of LPT_HEADS heads at a time (gluon_grid._heavy_first)
        pid_m, pid_bh = _heavy_first(pid_m, pid_bh, gl.num_programs(0), gl.num_programs(1), LPT_HEADS)
        pid_m = gl.num_programs(0) - 1 - pid_m
    elif IS_CAUSAL or IS_LOCAL or BLOCK_SPARSE:
        pid_m = gl.num_programs(0) - 1 - pid_m  # longest rows first (a causal block mask's too)
    off_b, off_h = _batch_and_head(pid_bh, heads_q, BATCH_FAST)
    off_hk = off_h // group_size
    start_m = pid_m * BLOCK_M
    # Dropout's counters from the maxima: seqlen_q / seqlen_k are still those here under VARLEN.
    drop_seed, drop_base, _, drop_row_groups = dropout_rng(Rng, off_b * heads_q + off_h, seqlen_q, seqlen_k,
                                                           HAS_DROPOUT)
    if VARLEN:
        # Sequence off_b: rows [q_start, q_start + seqlen_q) of the packed q, keys likewise.
        q_start = gl.load(CuSeqlensQ + off_b)
        seqlen_q = gl.load(CuSeqlensQ + off_b + 1) - q_start
        k_start = gl.load(CuSeqlensK + off_b)
        seqlen_k = gl.load(CuSeqlensK + off_b + 1) - k_start
        if start_m >= seqlen_q:  # a tile of the max_seqlen_q grid past this sequence's rows
            return
    else:
        q_start = off_b * seqlen_q
        k_start = off_b * seqlen_k

    # Key blocks [0, n_blocks) from key key_lo are visited; [n_lead, n_full) need no mask (fully visible to
    # every real row of the tile).
    # The block-sparse walk's state for the partitions: constants (nothing captured) in dense launches.
    list_off = 0
    sparse_b = 0
    sparse_h = 0
    loader_full = 0
    if BLOCK_SPARSE:
        # Full key blocks, then partial ones (_sparse_tile_key), SPARSE_N // BLOCK_N tiles each; keys from 0.
        causal_offset = 0
        num_off = off_b * stride_bm_b + off_h * stride_bm_h + (start_m // SPARSE_M) * stride_bm_m
        idx_off = off_b * stride_bi_b + off_h * stride_bi_h + (start_m // SPARSE_M) * stride_bi_m
        n_full = gl.load(FullKvNum + num_off) * (SPARSE_N // BLOCK_N)
        n_blocks = n_full + gl.load(KvNum + num_off) * (SPARSE_N // BLOCK_N)
        list_off = idx_off
        sparse_b = off_b
        sparse_h = off_h
        loader_full = n_full
        key_lo = 0
        n_lead = 0
    elif IS_LOCAL:
        # As kernels/common._key_range: row r sees keys r + diag - left <= j <= r + diag + right, j < Sk.
        causal_offset = seqlen_k - seqlen_q
        first_row = start_m + causal_offset
        last_row = gl.minimum(start_m + BLOCK_M, seqlen_q) - 1 + causal_offset
        lo = gl.maximum(first_row - window_left, 0) // BLOCK_N * BLOCK_N
        hi = gl.maximum(gl.minimum(last_row + window_right + 1, seqlen_k), lo)
        full_lo = gl.cdiv(gl.maximum(last_row - window_left, 0), BLOCK_N) * BLOCK_N
        full_lo = gl.minimum(gl.maximum(full_lo, lo), hi)
        full_hi = gl.maximum(gl.minimum(first_row + window_right + 1, seqlen_k), 0) // BLOCK_N * BLOCK_N
        full_hi = gl.minimum(gl.maximum(full_hi, full_lo), hi)
        key_lo = lo
        n_blocks = gl.cdiv(hi - lo, BLOCK_N)  # >= 1: the tile's first row sees a key (host guarantees it)
        n_lead = (full_lo - lo) // BLOCK_N
        n_full = (full_hi - lo) // BLOCK_N
    elif IS_CAUSAL:
        causal_offset = seqlen_k - seqlen_q  # >= 0: row r sees keys <= r + causal_offset
        n_blocks = gl.cdiv(gl.minimum(seqlen_k, start_m + BLOCK_M + causal_offset), BLOCK_N)
        n_full = gl.minimum(start_m + causal_offset + 1, seqlen_k) // BLOCK_N
        key_lo = 0
        n_lead = 0
    else:
        if HAS_ALIBI:
            causal_offset = seqlen_k - seqlen_q  # ALiBi's distances are bottom-right aligned too
        else:
            causal_offset = 0
        n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
        n_full = seqlen_k // BLOCK_N
        key_lo = 0
        n_lead = 0

    out_ptr = Out + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
    lse_ptr = Lse + off_b.to(gl.int64) * stride_lse_b + off_h.to(gl.int64) * stride_lse_h
    if VARLEN:
        out_ptr += q_start.to(gl.int64) * stride_om
        lse_ptr += q_start
    if VARLEN or BLOCK_SPARSE:
        # No row of this tile sees a key (Sk = 0, Sq > Sk under a causal / window mask, or no listed block).
        if n_blocks <= 0:
            _store_rows_without_keys(out_ptr, lse_ptr, stride_om, seqlen_q, start_m, Sink + off_h, HEAD_DIM,
                                     BLOCK_M, HAS_SINK)
            return
    if RAGGED:
        # Ragged coordinates (_tma_load): rows counted from 2**30 - seqlen, plus each sequence's end row.
        q_row = RAGGED_BILLION - seqlen_q + start_m
        kv_row = RAGGED_BILLION - seqlen_k + key_lo
    else:
        q_row = q_start + start_m
        kv_row = k_start + key_lo

    dtype: gl.constexpr = q_desc.dtype
    # The descriptors' own layouts, as rank 2 (a ragged descriptor's is rank 4 with the same swizzle).
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, HEAD_DIM],
                                       gl.NVMMASharedLayout.get_default_for([WG_M, HEAD_DIM], dtype))
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # Every consumer warpgroup releases every K and V buffer.
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turn_bars.index(i), count=1)
    if HAS_BIAS:
        # The bias ring: one [BLOCK_M, BLOCK_N] box per key block, STAGES deep like K / V (D128: 2 x 32 KB).
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_M, BLOCK_N], b_desc.layout)
        b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(b_ready.index(i), count=1)
            mbarrier.init(b_empty.index(i), count=2)
        b_row = off_b * bias_rows_b + off_h * bias_rows_h + start_m
    else:
        b_bufs = k_bufs
        b_ready = k_ready
        b_empty = k_empty
        b_row = 0
    alibi_q = q_smem  # stand-ins the partitions do not read without ALIBI_MMA
    alibi_k = q_smem
    if ALIBI_MMA:
        # Per consumer warpgroup: its [2, WG_M, 16] (a, -a) and [BLOCK_N, 16] (key offsets) operands.
        alibi_q = gl.allocate_shared_memory(gl.bfloat16, [2 * CONSUMERS, WG_M, 16],
                                            gl.NVMMASharedLayout.get_default_for([WG_M, 16], gl.bfloat16))
        alibi_k = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS, BLOCK_N, 16],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, 16], gl.bfloat16))

    alibi_ptr = Alibi
    if HAS_ALIBI:
        alibi_ptr = Alibi + off_b * stride_alibi_b + off_h
    sink_ptr = Sink
    if HAS_SINK:
        sink_ptr = Sink + off_h
    if CONSUMERS == 3:
        # 16 warps with the loader's padded warpgroup: 3 x 128 consumer threads at CONSUMER_REGS (160) and the
        # loader's 128 at LOADER_REGS (24) fit 64K registers; the default partition gets what is left. The
        # block-sparse arguments ride along (None here: sparse_ok keeps block masks on two consumers) so that
        # CONSUMERS lands in its slot.
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                                   out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full,
                                   n_blocks, qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left,
                                   window_right, 0, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, IS_LOCAL, SOFTCAP,
                                   HAS_ALIBI, HAS_SINK, VARLEN, P_CVT_ASM, TREE_MAX, b_bufs, b_ready, b_empty, sm_scale,
                                   HAS_BIAS, FullKvIdx, KvIdx, list_off, sparse_b, sparse_h, Aux0, Aux1, Aux2, Aux3,
                                   MASK_MOD, BLOCK_SPARSE, SPARSE_N, CONSUMERS, False, 0, 0, 0, 0, 1.0, False, False,
                                   LAZY_RESCALE, alibi_q, alibi_k, ALIBI_MMA, FIXED_MAX)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                                   out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full,
                                   n_blocks, qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left,
                                   window_right, 1, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, IS_LOCAL, SOFTCAP,
                                   HAS_ALIBI, HAS_SINK, VARLEN, P_CVT_ASM, TREE_MAX, b_bufs, b_ready, b_empty,
                                   sm_scale, HAS_BIAS, FullKvIdx, KvIdx, list_off, sparse_b, sparse_h, Aux0, Aux1,
                                   Aux2, Aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_N, CONSUMERS, False, 0, 0, 0, 0, 1.0,
                                   False, False, LAZY_RESCALE, alibi_q, alibi_k, ALIBI_MMA, FIXED_MAX)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                                   out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full,
                                   n_blocks, qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left,
                                   window_right, 2, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, IS_LOCAL, SOFTCAP,
                                   HAS_ALIBI, HAS_SINK, VARLEN, P_CVT_ASM, TREE_MAX, b_bufs, b_ready, b_empty,
                                   sm_scale, HAS_BIAS, FullKvIdx, KvIdx, list_off, sparse_b, sparse_h, Aux0, Aux1,
                                   Aux2, Aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_N, CONSUMERS, False, 0, 0, 0, 0, 1.0,
                                   False, False, LAZY_RESCALE, alibi_q, alibi_k, ALIBI_MMA, FIXED_MAX)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready,
                               v_empty, q_row, off_h * HEAD_DIM, kv_row, off_hk * HEAD_DIM, n_blocks,
                               q_start + seqlen_q, k_start + seqlen_k, BLOCK_N, STAGES, RAGGED, b_desc, b_bufs,
                               b_ready, b_empty, b_row, key_lo, HAS_BIAS, loader_full, FullKvIdx, KvIdx,
                               list_off, BLOCK_SPARSE, SPARSE_N, CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                                   out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full,
                                   n_blocks, qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left,
                                   window_right, 0, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, IS_LOCAL, SOFTCAP,
                                   HAS_ALIBI, HAS_SINK, VARLEN, P_CVT_ASM, TREE_MAX, b_bufs, b_ready, b_empty, sm_scale,
                                   HAS_BIAS, FullKvIdx, KvIdx, list_off, sparse_b, sparse_h, Aux0, Aux1, Aux2, Aux3,
                                   MASK_MOD, BLOCK_SPARSE, SPARSE_N, 2, EVEN_N, drop_seed, drop_base,
                                   drop_row_groups, dropout_threshold, dropout_scale, HAS_DROPOUT, O_VIA_SMEM,
                                   LAZY_RESCALE, alibi_q, alibi_k, ALIBI_MMA, FIXED_MAX)),
            (_consumer_partition, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                                   out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full,
                                   n_blocks, qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left,
                                   window_right, 1, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, IS_LOCAL, SOFTCAP,
                                   HAS_ALIBI, HAS_SINK, VARLEN, P_CVT_ASM, TREE_MAX, b_bufs, b_ready, b_empty,
                                   sm_scale, HAS_BIAS, FullKvIdx, KvIdx, list_off, sparse_b, sparse_h, Aux0, Aux1,
                                   Aux2, Aux3, MASK_MOD, BLOCK_SPARSE, SPARSE_N, 2, EVEN_N, drop_seed, drop_base,
                                   drop_row_groups, dropout_threshold, dropout_scale, HAS_DROPOUT, O_VIA_SMEM,
                                   LAZY_RESCALE, alibi_q, alibi_k, ALIBI_MMA, FIXED_MAX)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready,
                               v_empty, q_row, off_h * HEAD_DIM, kv_row, off_hk * HEAD_DIM, n_blocks,
                               q_start + seqlen_q, k_start + seqlen_k, BLOCK_N, STAGES, RAGGED, b_desc, b_bufs,
                               b_ready, b_empty, b_row, key_lo, HAS_BIAS, loader_full, FullKvIdx, KvIdx,
                               list_off, BLOCK_SPARSE, SPARSE_N)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
