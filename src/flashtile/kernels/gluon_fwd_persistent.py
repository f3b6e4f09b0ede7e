"""Hopper (sm90) forward in Gluon, persistent: kernels/gluon_fwd.py's schedule with one CTA per SM looping over tiles.

Short sequences give each program only a few key blocks (512 tokens: 4 blocks of 128), so a one-tile program's
fixed cost (the Q load, the K/V pipeline's fill, the epilogue's stores) is exposed. Here a grid of about one CTA
per SM walks the tiles (query tile, batch * head) with a stride of the grid, and the partitions keep running across
tile boundaries:
  - the loader warp waits only until every consumer has finished its last Q K^T of tile t (q_empty), then loads
    tile t+1's Q and its first K / V blocks into the ring while the consumers do tile t's last P V and epilogue;
    with Q_BUFFERS=2 (two Q tiles in shared memory) it loads tile t+1's Q as soon as it reaches that tile, into the
    buffer tile t-1 released, so the Q load's latency hides behind tile t's last blocks (session 27: +0-11 % at
    512-2K keys);
  - the consumer warpgroups (two, or three with CONSUMERS=3: 192-row tiles) take their GEMMs in turns across tiles
    as within one, so one warpgroup's epilogue overlaps the others' next GEMMs.
Every ring barrier, the Q barrier and the turn barriers are indexed by running counters (key blocks and tiles
this CTA has processed so far, never reset per tile): stage = c % STAGES, phase = (c // STAGES) & 1, with c the
CTA's global key-block count; tile t's Q barrier is q_bar[t % Q_BUFFERS], of phase (t // Q_BUFFERS) & 1. Each
consumer waits its turn once per key block, so its turn counter equals the key-block counter.
Tile order (_tile_coords): non-causal, the query tiles of one head adjacent and the heads of a batch (and KV group)
next, so the CTAs running at once share K / V in L2; causal, the longest query tiles first across all heads (well
balanced, but the tiles in flight then read many heads' K / V: slow, session 14), or with LPT_HEADS > 0
(GluonConfig.lpt_heads) by groups of that many heads, in each group the longest tiles first
(gluon_grid._heavy_first_linear): the tiles in flight then share fewer heads' K / V. The static stride can deal one CTA
tiles of nearly the same rank round after round (a stride just above a multiple of a group's tile count), so that CTA
gets most of the heavy tiles and the grid waits for it. With SCHEDULE the host lists each CTA's tiles instead
(persistent_schedule.py: the same order dealt by longest-processing-time list scheduling, each tile to the CTA that
frees first in a model of the tiles' costs).
Plain and causal (bottom-right), dense (B, S, H, D), head dims 64 / 128 / 256, RAGGED descriptors for batch > 1
with Sk % BLOCK_N != 0. Softcap, ALiBi, windows, sinks and varlen are not taken: gluon_launch runs the
one-tile-per-program kernel for them.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .gluon_epilogue import _store_rows_via
from .gluon_fwd_common import (LN2, RAGGED_BILLION, WG_M, _mask_scores, _new_max, _rescale, _row_max, _tma_load,
                               _to_p, _turn_pass, _turn_wait)
from .gluon_grid import _heavy_first_linear


@gluon.jit
def _listed_tile(Schedule, i, end):
    """The i-th listed tile (pid_m * n_bh + pid_bh; i == end, past the CTA's last tile, reads its last one again)."""
    return gl.load(Schedule + gl.num_programs(0) + 1 + gl.minimum(i, end - 1))


@gluon.jit
def _tile_loop(Schedule, n_tiles, SCHEDULE: gl.constexpr):
    """(first, end, step, listed) of the CTA's loop over tile numbers: every grid-th tile, or with SCHEDULE the CTA's
    slice of the host's list (Schedule: int32, the grid's ctas + 1 offsets, then the listed tiles) and its first
    listed tile (0 without SCHEDULE), for _next_tile."""
    if SCHEDULE:
        first = gl.load(Schedule + gl.program_id(0))
        end = gl.load(Schedule + gl.program_id(0) + 1)
        step = 1
        listed = _listed_tile(Schedule, first, end)
    else:
        first = gl.program_id(0)
        end = n_tiles
        step = gl.num_programs(0)
        listed = 0
    return first, end, step, listed


@gluon.jit
def _next_tile(Schedule, tile, end, listed, n_m, n_bh, IS_CAUSAL: gl.constexpr, LPT_HEADS: gl.constexpr,
               SCHEDULE: gl.constexpr):
    """(pid_m, pid_bh, the next listed tile) of loop step tile (_tile_loop): with SCHEDULE the listed tile, whose
    successor is read here, one tile ahead, so the load's latency hides behind this tile."""
    if SCHEDULE:
        pid_m = listed // n_bh
        pid_bh = listed % n_bh
        listed = _listed_tile(Schedule, tile + 1, end)
    else:
        pid_m, pid_bh = _tile_coords(tile, n_m, n_bh, IS_CAUSAL, LPT_HEADS)
    return pid_m, pid_bh, listed


@gluon.jit
def _tile_coords(tile, n_m, n_bh, IS_CAUSAL: gl.constexpr, LPT_HEADS: gl.constexpr = 0):
    """(pid_m, pid_bh) of the CTA's tile number tile (see the module docstring for the order)."""
    if LPT_HEADS > 0:  # causal, by groups of LPT_HEADS heads (gluon_grid._heavy_first)
        rank, pid_bh = _heavy_first_linear(tile, n_m, n_bh, LPT_HEADS)
        pid_m = n_m - 1 - rank
    elif IS_CAUSAL:
        pid_m = n_m - 1 - tile // n_bh
        pid_bh = tile % n_bh
    else:
        pid_m = tile % n_m
        pid_bh = tile // n_m
    return pid_m, pid_bh


@gluon.jit
def _tile_blocks(start_m, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 IS_CAUSAL: gl.constexpr):
    """(n_full, n_blocks) of the tile at start_m: key blocks [0, n_blocks) are visited, [1, n_full) unmasked."""
    if IS_CAUSAL:
        causal_offset = seqlen_k - seqlen_q  # >= 0: row r sees keys <= r + causal_offset
        n_blocks = gl.cdiv(gl.minimum(seqlen_k, start_m + BLOCK_M + causal_offset), BLOCK_N)
        n_full = gl.minimum(start_m + causal_offset + 1, seqlen_k) // BLOCK_N
    else:
        n_blocks = gl.cdiv(seqlen_k, BLOCK_N)
        n_full = seqlen_k // BLOCK_N
    return n_full, n_blocks


@gluon.jit
def _load_q_tile(q_desc, q_smem, q_bar, q_empty, t, q_row, q_end, q_col, CONSUMERS: gl.constexpr,
                 Q_BUFFERS: gl.constexpr, RAGGED: gl.constexpr):
    """Tile t's Q (CONSUMERS boxes of 64 rows from q_row) into buffer t % Q_BUFFERS once tile t - Q_BUFFERS's
    consumers released it (fresh barrier: phase 1 counts as complete, so the first tiles do not wait)."""
    qb = t % Q_BUFFERS
    mbarrier.wait(q_empty.index(qb), ((t // Q_BUFFERS) & 1) ^ 1)
    mbarrier.expect(q_bar.index(qb), CONSUMERS * q_desc.block_type.nbytes)
    for w in gl.static_range(CONSUMERS):
        _tma_load(q_desc, q_row + w * WG_M, q_end, q_col, q_bar.index(qb), q_smem.index(qb * CONSUMERS + w), RAGGED)


@gluon.jit
def _load_partition_p(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready,
                      v_empty, seqlen_q, seqlen_k, heads_q, group_size, n_m, n_bh, n_tiles, Schedule,
                      HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, RAGGED: gl.constexpr, LPT_HEADS: gl.constexpr = 0,
                      SCHEDULE: gl.constexpr = False, CONSUMERS: gl.constexpr = 2, Q_BUFFERS: gl.constexpr = 1):
    BLOCK_M: gl.constexpr = CONSUMERS * WG_M
    c = 0  # key blocks loaded by this CTA so far (all tiles): the ring's running counter
    t = 0  # tiles of this CTA so far
    first, end, step, listed = _tile_loop(Schedule, n_tiles, SCHEDULE)
    for tile in range(first, end, step):
        pid_m, pid_bh, listed = _next_tile(Schedule, tile, end, listed, n_m, n_bh, IS_CAUSAL, LPT_HEADS, SCHEDULE)
        off_b = pid_bh // heads_q
        off_h = pid_bh % heads_q
        start_m = pid_m * BLOCK_M
        n_full, n_blocks = _tile_blocks(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        q_start = off_b * seqlen_q
        k_start = off_b * seqlen_k
        if RAGGED:
            q_row = RAGGED_BILLION - seqlen_q + start_m
            kv_row = RAGGED_BILLION - seqlen_k
        else:
            q_row = q_start + start_m
            kv_row = k_start
        q_end = q_start + seqlen_q
        kv_end = k_start + seqlen_k
        q_col = off_h * HEAD_DIM
        kv_col = (off_h // group_size) * HEAD_DIM
        if Q_BUFFERS == 2:
            # Tile t's Q goes into buffer t % 2, which tile t-2 released, usually long before (this warp has since
            # loaded all of tile t-1's K / V; a short tile t-1 may leave it waiting): first, so its latency hides
            # behind tile t-1's last blocks.
            _load_q_tile(q_desc, q_smem, q_bar, q_empty, t, q_row, q_end, q_col, CONSUMERS, Q_BUFFERS, RAGGED)
        for j in range(n_blocks):
            stage = c % STAGES
            empty_phase = ((c // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(stage), empty_phase)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            _tma_load(k_desc, kv_row + j * BLOCK_N, kv_end, kv_col, k_ready.index(stage), k_bufs.index(stage),
                      RAGGED)
            if Q_BUFFERS == 1 and j == 0:
                # Q single-buffered: tile t-1's consumers release it after their last Q K^T. K_0 goes first: its
                # ring slot is usually free earlier, and the Q K^T needs both.
                _load_q_tile(q_desc, q_smem, q_bar, q_empty, t, q_row, q_end, q_col, CONSUMERS, Q_BUFFERS, RAGGED)
            mbarrier.wait(v_empty.index(stage), empty_phase)
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            _tma_load(v_desc, kv_row + j * BLOCK_N, kv_end, kv_col, v_ready.index(stage), v_bufs.index(stage),
                      RAGGED)
            c += 1
        t += 1


@gluon.jit
def _kv_step_p(c, j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn_bars,
               row0, seqlen_k, causal_offset, qk_scale, WG: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, PINGPONG: gl.constexpr,
               P_CVT_ASM: gl.constexpr, TREE_MAX: gl.constexpr, CONSUMERS: gl.constexpr,
               LAZY_RESCALE: gl.constexpr = False):
    """gluon_fwd_consumer._kv_step without score features, with the ring / turn position c (the CTA's running key-block
    count) apart from the tile's key block j >= 1 (the masks' columns). LAZY_RESCALE: gluon_fwd_common._lazy_max."""
    s_layout: gl.constexpr = m_i.type.layout.parent
    stage = c % STAGES
    prev = (c - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), (c // STAGES) & 1)
    _turn_wait(turn_bars, c, WG, PINGPONG, CONSUMERS)
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)
    s_tok = warpgroup_mma(q_view, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((c - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_bufs.index(prev), o_acc, is_async=True)
    _turn_pass(turn_bars, WG, PINGPONG, CONSUMERS)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))  # [WG_M, BLOCK_N]
    mbarrier.arrive(k_empty.index(stage))
    if MASKED:
        s = _mask_scores(s, j, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL, CONSUMERS == 2)
    m_new = _new_max(m_i, _row_max(s, TREE_MAX) * qk_scale, LAZY_RESCALE)  # [WG_M]; finite: every row saw key 0
    alpha = gl.exp2(m_i - m_new)  # [WG_M]
    p_f32 = gl.exp2(s * qk_scale - m_new[:, None])  # [WG_M, BLOCK_N]
    l_i = l_i * alpha + gl.sum(p_f32, axis=1)
    p_next = gl.convert_layout(_to_p(p_f32, p, P_CVT_ASM), p.type.layout, assert_trivial=True)
    o_acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    mbarrier.arrive(v_empty.index(prev))
    return _rescale(o_acc, alpha, LAZY_RESCALE), m_new, l_i, p_next


@gluon.jit
def _epilogue_p(o_acc, m_i, l_i, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh, stride_lse_b,
                stride_lse_h, seqlen_q, off_b, off_h, row0, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                O_TMA: gl.constexpr, O_VIA_SMEM: gl.constexpr):
    """One warpgroup's rows row0 + [0, 64) of a tile of (batch off_b, head off_h): O = o_acc / l_i and lse out
    (_consumer_partition_p's O_TMA / O_VIA_SMEM / register stores)."""
    o_layout: gl.constexpr = o_acc.type.layout
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = o_smem.dtype
    lse_ptr = Lse + off_b.to(gl.int64) * stride_lse_b + off_h.to(gl.int64) * stride_lse_h
    l_o = gl.convert_layout(l_i, o_row)
    out = o_acc * (1.0 / l_o)[:, None]  # [WG_M, HEAD_DIM]
    rows = row0 + gl.arange(0, WG_M, layout=o_row)  # [WG_M]
    in_seq = rows < seqlen_q
    if O_VIA_SMEM:
        # Epilogue e = 2 t + WG of this CTA waits for epilogue e - 1 (the other warpgroup's): completion e - 1 of
        # o_free, parity WG ^ 1 (the fresh barrier counts phase 1 as complete: epilogue 0 does not wait).
        mbarrier.wait(o_free, WG ^ 1)
        out_ptr = Out + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
        _store_rows_via(o_smem.index(0), out.to(dtype), out_ptr, stride_om, row0, seqlen_q)
        gl.thread_barrier()  # every warp has read o_smem back
        mbarrier.arrive(o_free)
    elif O_TMA:
        # The previous tile's store has read o_smem[WG] (one thread issued it: the barrier tells the rest).
        tma.store_wait(0)
        gl.thread_barrier()
        o_view = o_smem.index(WG)
        o_view.store(out.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        # Rows past seqlen_q are past the tensor's end (batch 1) or the host made Sq a multiple of 64, so a box
        # is wholly in or out of the sequence; one wholly out (a last tile's warpgroup when Sq % BLOCK_M != 0)
        # would land on the next sequence's first rows: it is not stored.
        if row0 < seqlen_q:
            tma.async_copy_shared_to_global(o_desc, [off_b * seqlen_q + row0, off_h * HEAD_DIM], o_view)
    else:
        out_ptr = Out + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))  # [HEAD_DIM]
        o_ptrs = out_ptr + rows.to(gl.int64)[:, None] * stride_om + cols[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=in_seq[:, None])
    lse = (gl.convert_layout(m_i, o_row) + gl.log2(l_o)) * LN2  # [WG_M], natural log
    gl.store(lse_ptr + rows, lse, mask=in_seq)


@gluon.jit
def _consumer_partition_p(q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn_bars,
                          o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh, stride_lse_b, stride_lse_h,
                          seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles, Schedule, qk_scale,
                          WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, P_CVT_ASM: gl.constexpr,
                          TREE_MAX: gl.constexpr, O_TMA: gl.constexpr, LPT_HEADS: gl.constexpr = 0,
                          SCHEDULE: gl.constexpr = False, O_VIA_SMEM: gl.constexpr = False,
                          CONSUMERS: gl.constexpr = 2, Q_BUFFERS: gl.constexpr = 1,
                          DEFER_EPILOGUE: gl.constexpr = False, LAZY_RESCALE: gl.constexpr = False):
    """Rows WG * 64 + [0, 64) of each of the CTA's tiles (gluon_fwd_consumer._consumer_partition's online softmax).
    O_TMA: O goes out through o_smem[WG] by a TMA store (o_desc: (B * Sq, Hq * D), boxes [64, D]) that runs on
    while the next tile's GEMMs do; the next epilogue waits for it before it writes the buffer again.
    O_VIA_SMEM: O goes out through o_smem[0], one tile the two warpgroups take in turns (their epilogues alternate,
    WG 0's first: the ping-pong's order), as 16-byte row pieces (gluon_epilogue._store_rows_via); o_free counts the
    epilogues that have read it back. The Q tile cannot serve (the next tile's Q is loaded into it meanwhile).
    DEFER_EPILOGUE (not with O_VIA_SMEM): tile t's epilogue (_epilogue_p) runs after tile t+1's first Q K^T is
    issued, behind that GEMM, its registers carried to the next iteration; the CTA's last tile's after the loop."""
    BLOCK_M: gl.constexpr = CONSUMERS * WG_M
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    if IS_CAUSAL:
        causal_offset = seqlen_k - seqlen_q
    else:
        causal_offset = 0
    c = 0  # key blocks consumed by this CTA so far (all tiles): ring and turn position
    t = 0  # tiles of this CTA so far: the Q buffer and its barrier's phase
    first, end, step, listed = _tile_loop(Schedule, n_tiles, SCHEDULE)
    if DEFER_EPILOGUE:
        gl.static_assert(not O_VIA_SMEM, "DEFER_EPILOGUE: O by TMA or from the registers")
        o_prev = gl.zeros([WG_M, HEAD_DIM], gl.float32, o_layout)
        m_prev = gl.zeros([WG_M], gl.float32, gl.SliceLayout(1, s_layout))
        l_prev = gl.zeros([WG_M], gl.float32, gl.SliceLayout(1, s_layout))
        b_prev = 0
        h_prev = 0
        row0_prev = 0
    for tile in range(first, end, step):
        pid_m, pid_bh, listed = _next_tile(Schedule, tile, end, listed, n_m, n_bh, IS_CAUSAL, LPT_HEADS, SCHEDULE)
        off_b = pid_bh // heads_q
        off_h = pid_bh % heads_q
        start_m = pid_m * BLOCK_M
        n_full, n_blocks = _tile_blocks(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        row0 = start_m + WG * WG_M
        qb = t % Q_BUFFERS
        q_view = q_smem.index(qb * CONSUMERS + WG)

        # Key block 0 (masked).
        stage0 = c % STAGES
        mbarrier.wait(q_bar.index(qb), (t // Q_BUFFERS) & 1)
        mbarrier.wait(k_ready.index(stage0), (c // STAGES) & 1)
        _turn_wait(turn_bars, c, WG, PINGPONG, CONSUMERS)
        s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)
        s_tok = warpgroup_mma(q_view, k_bufs.index(stage0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _turn_pass(turn_bars, WG, PINGPONG, CONSUMERS)
        if DEFER_EPILOGUE:
            if t > 0:
                _epilogue_p(o_prev, m_prev, l_prev, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                            stride_lse_b, stride_lse_h, seqlen_q, b_prev, h_prev, row0_prev, WG, HEAD_DIM, O_TMA,
                            O_VIA_SMEM)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))  # [WG_M, BLOCK_N]
        mbarrier.arrive(k_empty.index(stage0))
        s = _mask_scores(s, 0, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL, CONSUMERS == 2)
        m_i = gl.max(s, axis=1) * qk_scale  # [WG_M]; finite: every row sees key 0 (host guarantees it)
        p_f32 = gl.exp2(s * qk_scale - m_i[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        p = gl.convert_layout(p_f32.to(dtype), p_layout, assert_trivial=True)  # [WG_M, BLOCK_N]
        o_acc = gl.zeros([WG_M, HEAD_DIM], gl.float32, o_layout)

        for j in range(1, n_full):
            o_acc, m_i, l_i, p = _kv_step_p(c + j, j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty,
                                            v_ready, v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale,
                                            WG, BLOCK_N, STAGES, IS_CAUSAL, False, PINGPONG, P_CVT_ASM, TREE_MAX,
                                            CONSUMERS, LAZY_RESCALE)
        for j in range(gl.maximum(n_full, 1), n_blocks):
            o_acc, m_i, l_i, p = _kv_step_p(c + j, j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty,
                                            v_ready, v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale,
                                            WG, BLOCK_N, STAGES, IS_CAUSAL, True, PINGPONG, P_CVT_ASM, TREE_MAX,
                                            CONSUMERS, LAZY_RESCALE)
        # Every Q K^T of this tile has retired (each step waits for its S): the loader may load a Q into this buffer
        # (the next tile's, or with two buffers the one after).
        mbarrier.arrive(q_empty.index(qb))

        # The last block's PV.
        c_last = c + n_blocks - 1
        last = c_last % STAGES
        mbarrier.wait(v_ready.index(last), (c_last // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_bufs.index(last), o_acc, is_async=True)
        o_acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        mbarrier.arrive(v_empty.index(last))

        if DEFER_EPILOGUE:
            # Tile t's epilogue waits until tile t+1's first Q K^T is issued (or the loop ends).
            o_prev, m_prev, l_prev, b_prev, h_prev, row0_prev = o_acc, m_i, l_i, off_b, off_h, row0
        else:
            _epilogue_p(o_acc, m_i, l_i, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                        stride_lse_b, stride_lse_h, seqlen_q, off_b, off_h, row0, WG, HEAD_DIM, O_TMA, O_VIA_SMEM)
        c += n_blocks
        t += 1
    if DEFER_EPILOGUE:
        if t > 0:
            _epilogue_p(o_prev, m_prev, l_prev, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                        stride_lse_b, stride_lse_h, seqlen_q, b_prev, h_prev, row0_prev, WG, HEAD_DIM, O_TMA,
                        O_VIA_SMEM)
    if O_TMA:
        tma.store_wait(0)  # the last store reads o_smem: the CTA's shared memory must outlive it


@gluon.jit(do_not_specialize=["stride_lse_b", "stride_lse_h", "seqlen_q", "seqlen_k", "heads_q", "group_size",
                              "n_m", "n_bh", "n_tiles"])
def _attn_fwd_hopper_persistent(q_desc, k_desc, v_desc, o_desc, Out, Lse,
                                stride_ob, stride_om, stride_oh, stride_lse_b, stride_lse_h,
                                seqlen_q, seqlen_k, heads_q, group_size, qk_scale, n_m, n_bh, n_tiles, Schedule,
                                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, RAGGED: gl.constexpr = False,
                                P_CVT_ASM: gl.constexpr = False, TREE_MAX: gl.constexpr = False,
                                O_TMA: gl.constexpr = False, LPT_HEADS: gl.constexpr = 0,
                                SCHEDULE: gl.constexpr = False, O_VIA_SMEM: gl.constexpr = False,
                                CONSUMERS: gl.constexpr = 2, Q_BUFFERS: gl.constexpr = 1,
                                DEFER_EPILOGUE: gl.constexpr = False, LAZY_RESCALE: gl.constexpr = False):
    """_attn_fwd_hopper's plain / causal forward over n_tiles = n_m * n_bh tiles (n_m = cdiv(Sq, 64 * CONSUMERS)
    query tiles, n_bh = B * Hq), tile i on CTA i % grid, or with SCHEDULE the CTA's tiles in Schedule (an int32
    tensor, persistent_schedule.schedule_table for this grid; unused without SCHEDULE). Launch with num_warps=4 and a
    grid of min(n_tiles, SMs).
    O_TMA: o_desc is Out as a 2-D (B * Sq, Hq * D) TMA tensor with boxes [64, D] and batch == 1 or Sq % 64 == 0
    (a box never reaches into the next sequence); else o_desc is unused and O is stored from registers, or with
    O_VIA_SMEM through one shared-memory tile the consumers take in turns (32 KB at D256, which has no room for
    O_TMA's two).
    CONSUMERS: consumer warpgroups, 2 (128-row tiles) or 3 (192-row tiles, as _attn_fwd_hopper's D64 variant: each
    warpgroup's softmax behind the two others' GEMMs; 3 x 128 threads at CONSUMER_REGS <= 160); 3 takes neither
    SCHEDULE (the host's cost model lists 128-row tiles) nor O_VIA_SMEM (its turn order is written for two).
    Q_BUFFERS: 1, or 2 (tile t's Q in buffer t % 2: CONSUMERS x 64 x D x 2 B more shared memory, 224 KB in all at
    D128 with O_TMA). DEFER_EPILOGUE: each tile's epilogue behind the next tile's first Q K^T (not with O_VIA_SMEM).
    LAZY_RESCALE: O rescaled only when a row's max moved by more than 2^8 (gluon_fwd_common._lazy_max)."""
    gl.static_assert(LPT_HEADS == 0 or IS_CAUSAL, "LPT_HEADS: causal launches")
    gl.static_assert(not SCHEDULE or IS_CAUSAL, "SCHEDULE: causal launches")
    gl.static_assert(not (O_TMA and O_VIA_SMEM), "O_TMA or O_VIA_SMEM")
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not SCHEDULE and not O_VIA_SMEM),
                     "CONSUMERS: 2, or 3 without SCHEDULE or O_VIA_SMEM")
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [Q_BUFFERS * CONSUMERS, WG_M, HEAD_DIM],
                                       gl.NVMMASharedLayout.get_default_for([WG_M, HEAD_DIM], dtype))
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    o_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if O_TMA:
        o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, HEAD_DIM], o_desc.layout)
    elif O_VIA_SMEM:
        o_smem = gl.allocate_shared_memory(dtype, [1, WG_M, HEAD_DIM],
                                           gl.NVMMASharedLayout.get_default_for([WG_M, HEAD_DIM], dtype))
    else:
        o_smem = q_smem  # unused
    for i in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONSUMERS)  # every consumer warpgroup releases its Q
    mbarrier.init(o_free, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turn_bars.index(i), count=1)

    if CONSUMERS == 3:
        # 16 warps with the loader's padded warpgroup, as _attn_fwd_hopper's three consumers.
        gl.warp_specialize([
            (_consumer_partition_p, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                     turn_bars, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                                     stride_lse_b, stride_lse_h, seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles,
                                     Schedule, qk_scale, 0, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, P_CVT_ASM,
                                     TREE_MAX, O_TMA, LPT_HEADS, SCHEDULE, O_VIA_SMEM, CONSUMERS, Q_BUFFERS,
                                     DEFER_EPILOGUE, LAZY_RESCALE)),
            (_consumer_partition_p, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                     turn_bars, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                                     stride_lse_b, stride_lse_h, seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles,
                                     Schedule, qk_scale, 1, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, P_CVT_ASM,
                                     TREE_MAX, O_TMA, LPT_HEADS, SCHEDULE, O_VIA_SMEM, CONSUMERS, Q_BUFFERS,
                                     DEFER_EPILOGUE, LAZY_RESCALE)),
            (_consumer_partition_p, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                     turn_bars, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                                     stride_lse_b, stride_lse_h, seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles,
                                     Schedule, qk_scale, 2, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, P_CVT_ASM,
                                     TREE_MAX, O_TMA, LPT_HEADS, SCHEDULE, O_VIA_SMEM, CONSUMERS, Q_BUFFERS,
                                     DEFER_EPILOGUE, LAZY_RESCALE)),
            (_load_partition_p, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                                 v_ready, v_empty, seqlen_q, seqlen_k, heads_q, group_size, n_m, n_bh, n_tiles,
                                 Schedule, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, RAGGED, LPT_HEADS, SCHEDULE,
                                 CONSUMERS, Q_BUFFERS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_partition_p, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                     turn_bars, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                                     stride_lse_b, stride_lse_h, seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles,
                                     Schedule, qk_scale, 0, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, P_CVT_ASM,
                                     TREE_MAX, O_TMA, LPT_HEADS, SCHEDULE, O_VIA_SMEM, 2, Q_BUFFERS,
                                     DEFER_EPILOGUE, LAZY_RESCALE)),
            (_consumer_partition_p, (q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
                                     turn_bars, o_smem, o_free, o_desc, Out, Lse, stride_ob, stride_om, stride_oh,
                                     stride_lse_b, stride_lse_h, seqlen_q, seqlen_k, heads_q, n_m, n_bh, n_tiles,
                                     Schedule, qk_scale, 1, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG, P_CVT_ASM,
                                     TREE_MAX, O_TMA, LPT_HEADS, SCHEDULE, O_VIA_SMEM, 2, Q_BUFFERS,
                                     DEFER_EPILOGUE, LAZY_RESCALE)),
            (_load_partition_p, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                                 v_ready, v_empty, seqlen_q, seqlen_k, heads_q, group_size, n_m, n_bh, n_tiles,
                                 Schedule, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, RAGGED, LPT_HEADS, SCHEDULE, 2,
                                 Q_BUFFERS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
