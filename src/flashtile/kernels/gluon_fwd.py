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
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .common import LOG2E, _tanh, _to_f32_16bit
from .gluon_dropout import (FRESH_KEYS_FWD_MIN_HEAD_DIM, dropout_rng, dropout_row_counters, dropout_to_p,
                            dropout_words)
from .gluon_epilogue import _store_rows_via
from .gluon_grid import _heavy_first
from .gluon_sparse import _list_tile_key, _mask_mod_scores, _sparse_tile_key

LN2 = gl.constexpr(0.6931471805599453)
WG_M = gl.constexpr(64)  # query rows per consumer warpgroup (the wgmma M of one warpgroup)
RAGGED_BILLION = gl.constexpr(0x40000000)  # 2**30: the ragged descriptors' row extent (gluon_launch)


@gluon.jit
def _tma_load(desc, row, seq_end, col, bar, buf, RAGGED: gl.constexpr):
    """TMA box at (row, col) of desc into buf. RAGGED: desc is gluon_launch's 4-D ragged descriptor over the packed
    2-D tensor, row = BILLION - seqlen + the row in the sequence and seq_end = the sequence's end row, so the
    hardware zero-fills every row past the sequence's end (triton.tools.ragged_tma's coordinates); buf is viewed
    with the descriptor's (leading unit dims, same bytes) layout."""
    if RAGGED:
        box = buf._reinterpret(buf.dtype, [1, 1, buf.shape[0], buf.shape[1]], desc.layout)
        tma.async_copy_global_to_shared(desc, [RAGGED_BILLION, seq_end, row, col], bar, box)
    else:
        tma.async_copy_global_to_shared(desc, [row, col], bar, buf)


@gluon.jit
def _to_p(p_f32, p_prev, P_CVT_ASM: gl.constexpr):
    """P for the PV wgmma: p_f32 rounded to p_prev's dtype (fp16/bf16). P_CVT_ASM: one cvt.rn.{b}f16x2.f32 per
    pair of a thread's scores (the operand's register pairs), which sm90's ptxas turns into one F2FP; the
    per-element cvts come out as F2FP plus a PRMT that swaps the halves (0.5 instructions per score, counted in
    the key loop's SASS)."""
    if P_CVT_ASM:
        # cvt.rn.{b}f16x2.f32 d, a, b puts a in d's upper half: the pair's second score.
        if p_prev.dtype == gl.float16:
            return gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [p_f32], dtype=p_prev.dtype,
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [p_f32], dtype=p_prev.dtype,
                                             is_pure=True, pack=2)
    else:
        return p_f32.to(p_prev.dtype)


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
def _turn_wait(turn_bars, j, WG: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    # The turn goes round the ring 0 -> 1 (-> 2) -> 0, one barrier per warpgroup, completed once per key block by
    # the warpgroup before it. Warpgroup 0 issues first: its first wait is on the fresh barrier's (already
    # complete) phase 1, so before block j it waits for completion j (parity (j & 1) ^ 1); the others wait for
    # completion j + 1 (parity j & 1). A barrier cannot complete twice ahead of its waiter: that would take the
    # warpgroup before it to pass two turns, the second one only after this warpgroup's own pass.
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turn_bars.index(WG), (j & 1) ^ 1)
        else:
            mbarrier.wait(turn_bars.index(WG), (j & 1) ^ 0)


@gluon.jit
def _turn_pass(turn_bars, WG: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    if PINGPONG:
        mbarrier.arrive(turn_bars.index((WG + 1) % CONSUMERS))


@gluon.jit
def _bias_tile(b_bufs, b_ready, j, WG: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr):
    """This warpgroup's [WG_M, BLOCK_N] rows of key block j's bias box, from shared memory into registers in the S
    accumulator's layout (16-bit; the 128-byte swizzle of the TMA box keeps the 8 rows a warp reads apart in banks)."""
    stage = j % STAGES
    mbarrier.wait(b_ready.index(stage), (j // STAGES) & 1)
    return b_bufs.index(stage).slice(WG * WG_M, WG_M, dim=0).load(layout)  # [WG_M, BLOCK_N]


@gluon.jit
def _bias_release(b_empty, j, STAGES: gl.constexpr):
    # Every thread's shared-memory reads of the box are done before the one elected thread arrives.
    gl.thread_barrier()
    mbarrier.arrive(b_empty.index(j % STAGES))


@gluon.jit
def _mask_scores(s, j, row0, seqlen_k, causal_offset, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                 BLOCK_RELATIVE: gl.constexpr = False):
    """-inf where key j * BLOCK_N + c is past seqlen_k or (causal) after row r's diagonal r + causal_offset.
    BLOCK_RELATIVE: the columns are counted from the block's first key (constants in each thread) and the bounds
    move instead, one per row (causal) or per block, so a compare per score takes no add. Causal then skips the
    sequence end: a row r < Sq sees no key past r + Sk - Sq <= Sk - 1, and rows past Sq are never stored (their
    extra keys are TMA's zero fill: a block past Sk is loaded only through a ragged or the tensor's end). Off where
    the bounds' registers spilled (three consumers; dropout's draws live across the mask)."""
    layout: gl.constexpr = s.type.layout
    if BLOCK_RELATIVE:
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))  # [BLOCK_N], from the block's first key
        if IS_CAUSAL:
            last = row0 + causal_offset - j * BLOCK_N + gl.arange(0, WG_M, layout=gl.SliceLayout(1, layout))
            visible = cols[None, :] <= last[:, None]  # [WG_M, BLOCK_N]; last: each row's last visible column
        else:
            visible = (cols < seqlen_k - j * BLOCK_N)[None, :]
        return gl.where(visible, s, float("-inf"))  # [WG_M, BLOCK_N]
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))  # [BLOCK_N]
    visible = (cols < seqlen_k)[None, :]
    if IS_CAUSAL:
        rows = row0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, layout))  # [WG_M]
        visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
    return gl.where(visible, s, float("-inf"))  # [WG_M, BLOCK_N]


@gluon.jit
def _feature_scores(s, key0, row0, seqlen_k, diag, qk_scale, softcap_log2, alibi_log2, window_left, window_right,
                    BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr,
                    SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr,
                    alibi_cols=0.0, ALIBI_SIDE: gl.constexpr = 0, CAP_SCALED: gl.constexpr = True,
                    bias=0.0, HAS_BIAS: gl.constexpr = False):
    """Raw q.k of keys key0 + [0, BLOCK_N) and rows row0 + [0, WG_M) -> scores in log2 units, as
    kernels/common._scores makes them: softcap, ALiBi, then (MASKED) causal / window / sequence-end masks.
    qk_scale is softmax_scale * log2(e), or softmax_scale / softcap under SOFTCAP (softcap_log2 = softcap * log2(e));
    alibi_log2 = slope * log2(e); diag = seqlen_k - seqlen_q.
    ALIBI_SIDE (unmasked blocks on one side of every row's diagonal: 1 keys <= i + diag, -1 keys >= i + diag):
    the bias -slope * |i + diag - key| is ALIBI_SIDE * (alibi_cols[c] + _alibi_row_shift's term of row i), so the
    scores come back without the row term (one FFMA per score; alibi_cols = alibi_log2 * [0, BLOCK_N)) and the
    caller adds it to the row max (softmax does not see a per-row constant; m and lse do).
    CAP_SCALED=False (SOFTCAP without ALiBi): tanh(score / softcap) comes back without the factor softcap_log2 > 0,
    which the caller folds into its exp2 argument (one FFMA) and its row max (max(c t) = c max(t), also rounded).
    HAS_BIAS: bias ([WG_M, BLOCK_N], natural-log units, 16-bit) * log2(e) is added after ALiBi, before
    the masks (not with CAP_SCALED=False)."""
    layout: gl.constexpr = s.type.layout
    if HAS_ALIBI and ALIBI_SIDE != 0:
        if SOFTCAP:
            s = _tanh(s * qk_scale, True) * softcap_log2 + ALIBI_SIDE * alibi_cols[None, :]
        else:
            s = s * qk_scale + ALIBI_SIDE * alibi_cols[None, :]
        if HAS_BIAS:
            s = s + _to_f32_16bit(bias) * LOG2E
        return s  # [WG_M, BLOCK_N], the row term left out
    if SOFTCAP:
        # common._tanh (a @triton.jit helper; Gluon can call it) with the GPU's tanh.approx.f32, as the portable
        # forward takes it for fp16/bf16 inputs.
        s = _tanh(s * qk_scale, True)
        if CAP_SCALED:
            s = s * softcap_log2
    else:
        s = s * qk_scale
    cols = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))  # [BLOCK_N] key positions
    rows = row0 + diag + gl.arange(0, WG_M, layout=gl.SliceLayout(1, layout))  # [WG_M] query positions + Sk - Sq
    if HAS_ALIBI:
        dist = gl.abs(rows.to(gl.float32)[:, None] - cols.to(gl.float32)[None, :])  # [WG_M, BLOCK_N]
        s = s - alibi_log2 * dist
    if HAS_BIAS:
        s = s + _to_f32_16bit(bias) * LOG2E
    if MASKED:
        visible = (cols < seqlen_k)[None, :]
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        if IS_LOCAL:
            visible = visible & (cols[None, :] <= rows[:, None] + window_right) & (
                cols[None, :] >= rows[:, None] - window_left)
        s = gl.where(visible, s, float("-inf"))
    return s  # [WG_M, BLOCK_N]


@gluon.jit
def _alibi_row_shift(key0, row0, diag, alibi_log2, layout: gl.constexpr, ALIBI_SIDE: gl.constexpr):
    """[WG_M] per-row term that _feature_scores' ALIBI_SIDE scores leave out: score = returned score + this.
    Keys on one side of row i's diagonal d_i = row0 + diag + i: -slope * |d_i - key| =
    ALIBI_SIDE * slope * ((key - key0) + (key0 - d_i)), in log2 units."""
    rows = gl.arange(0, WG_M, layout=layout).to(gl.float32)  # [WG_M]
    base = (key0 - row0 - diag).to(gl.float32)  # exact: positions < 2^24
    return (base - rows) * (ALIBI_SIDE * alibi_log2)  # [WG_M]


@gluon.jit
def _alibi_mma_operands(alibi_q, alibi_k, a, WG: gl.constexpr, BLOCK_N: gl.constexpr):
    """Warpgroup WG's operands of ALIBI_MMA's wgmma, in shared memory: alibi_k[WG] [BLOCK_N, 16] rows
    [c, c, c, 0, ...] (c < 256: exact in 16 bits) and alibi_q[2 WG] / alibi_q[2 WG + 1] [WG_M, 16] rows
    [a_hi, a_mid, a_lo, 0, ...] / their negations, a = slope * log2(e) / qk_scale split into three bf16 parts (a's
    fp32 value to ~2^-24), so that alibi_q[2 WG + (1 - side) // 2] @ alibi_k[WG]^T = side * a * c in the fp32
    accumulator. Written by the warpgroup's 128 threads, then fenced for the async proxy before its wgmmas read."""
    gl.static_assert(BLOCK_N % 128 == 0, "ALIBI_MMA: BLOCK_N a multiple of 128")
    k_layout: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])  # [128, 16]: one row per thread
    cols = gl.arange(0, 16, layout=gl.SliceLayout(0, k_layout))
    for r0 in gl.static_range(0, BLOCK_N, 128):
        c = (r0 + gl.arange(0, 128, layout=gl.SliceLayout(1, k_layout))).to(gl.float32)
        k_rows = gl.where(cols[None, :] < 3, c[:, None], 0.0)  # [128, 16]
        alibi_k.index(WG).slice(r0, 128, dim=0).store(k_rows.to(alibi_k.dtype))
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])  # [64, 16]
    qcols = gl.arange(0, 16, layout=gl.SliceLayout(0, q_layout))
    a_hi = a.to(gl.bfloat16).to(gl.float32)
    a_mid = (a - a_hi).to(gl.bfloat16).to(gl.float32)
    a_lo = (a - a_hi - a_mid).to(gl.bfloat16).to(gl.float32)
    parts = gl.where(qcols == 0, a_hi, gl.where(qcols == 1, a_mid, gl.where(qcols == 2, a_lo, 0.0)))  # [16]
    q_rows = gl.zeros([WG_M, 16], gl.float32, q_layout) + parts[None, :]
    alibi_q.index(2 * WG).store(q_rows.to(alibi_q.dtype))
    alibi_q.index(2 * WG + 1).store((-q_rows).to(alibi_q.dtype))
    fence_async_shared()  # the generic-proxy stores before the async-proxy (wgmma) reads
    gl.thread_barrier()  # all 128 threads stored before the warpgroup's wgmmas read


@gluon.jit
def _row_max(s, TREE_MAX: gl.constexpr):
    """Row max of a [WG_M, N] score tile. Triton reduces a thread's N / 4 scores of a row as one dependent chain
    of FMNMX (32 at N = 128, ~4 clocks each, before the shuffles and every exp2 of the row can start); TREE_MAX
    first halves the columns with elementwise maxima (reshape / permute / split: register renaming, no data
    movement) down to 8, so the same number of FMNMX forms a tree of depth ~5 + 1."""
    if TREE_MAX:
        x = s
        n: gl.constexpr = s.shape[1]
        for level in gl.static_range(4):
            if n >> level > 8:
                a, b = x.reshape([WG_M, 2, n >> (level + 1)]).permute(0, 2, 1).split()
                x = gl.maximum(a, b)
        return gl.convert_layout(gl.max(x, axis=1), gl.SliceLayout(1, s.type.layout))
    else:
        return gl.max(s, axis=1)


# LAZY_RESCALE (FA4's conditional rescaling): a row's running max moves only when a key block's max passes it by more
# than RESCALE_LOG2 (log2 units), so the unnormalized P stays <= 2^8 (16-bit P and the fp32 O / l hold that exactly as
# well as <= 1), and O is rescaled only in steps where some row's max moved: on long rows, rarely after the first
# blocks. The result is the same softmax (O / l and lse do not depend on which max a row subtracts).
RESCALE_LOG2 = gl.constexpr(8.0)


# FIXED_MAX (softcap without ALiBi, a bias or a sink, bf16): tanh bounds every score to [-c, c] (c = softcap_log2,
# log2 units), so no running max is needed: every row subtracts the same m = max(0, c - FIXED_MAX_HEADROOM) and keeps
# P = 2^(score - m) in [2^(-c - m), 2^(c - m)], m never moving (no row max, no rescale of O). The host takes it for
# c <= FIXED_MAX_LIMIT (softcap <= 51.98): then P <= 2^64 (l and O stay finite in fp32 up to 2^64 / keys in |v|, far
# past any bf16 activation) and every visible key's P is >= 2^(-c - m) >= 2^-86, 40 binary orders above fp32's (and
# bf16's) smallest normal: ex2.approx.ftz flushes none of them, and bf16 P keeps 8 bits at any of those magnitudes.
# fp16 P (largest 65504) has no such room: fp16 calls keep the running max.
FIXED_MAX_HEADROOM = gl.constexpr(64.0)
FIXED_MAX_LIMIT = 75.0  # softcap * log2(e) at most (the host's rule: gluon_launch.fixed_max_ok)


@gluon.jit
def _fixed_max(softcap_log2):
    """The m every row subtracts under FIXED_MAX (a scalar: one uniform operand of the exp2's FFMA)."""
    return gl.maximum(softcap_log2 - FIXED_MAX_HEADROOM, 0.0)


@gluon.jit
def _lazy_max(m_i, m_blk):
    """m_new[r] = m_blk[r] where it exceeds m_i[r] (finite) by more than RESCALE_LOG2, else m_i[r]."""
    return gl.where(m_blk > m_i + RESCALE_LOG2, m_blk, m_i)


_PACK = 16  # accumulator values per branch of _rescale_lazy: $0-15 out (tied to $16-31 in), $32-47 alpha, $48 flag
RESCALE_PACK = gl.constexpr(_PACK)
RESCALE_ASM = gl.constexpr(
    f"{{ .reg .pred p; setp.ne.u32 p, ${3 * _PACK}, 0; @!p bra.uni SKIP_${{:uid}}; "
    + " ".join(f"mul.f32 ${i}, ${_PACK + i}, ${2 * _PACK + i};" for i in range(_PACK)) + " SKIP_${:uid}: }")
RESCALE_CONSTRAINTS = gl.constexpr(",".join(["=f"] * _PACK + [str(i) for i in range(_PACK)] + ["f"] * _PACK
                                            + ["r"] * _PACK))


@gluon.jit
def _rescale_lazy(o_acc, alpha):
    """o_acc * alpha[:, None], skipped by the warps none of whose rows has alpha != 1: one vote per warp, then a
    warp-uniform branch around each RESCALE_PACK multiplies (the values stay in their registers when it jumps)."""
    moved = gl.inline_asm_elementwise(  # [WG_M], 1 in every row of a warp where some row's alpha != 1
        "{ .reg .pred p, q; setp.neu.f32 p, $2, 0f3F800000; setp.neu.or.f32 p, $3, 0f3F800000, p; "
        "vote.sync.any.pred q, p, 0xffffffff; selp.u32 $0, 1, 0, q; mov.b32 $1, $0; }",
        "=r,=r,f,f", [alpha], dtype=gl.int32, is_pure=True, pack=2)
    o_layout: gl.constexpr = o_acc.type.layout
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    a2 = gl.convert_layout(alpha, o_row)[:, None] + gl.zeros_like(o_acc)  # [WG_M, HEAD_DIM]: registers renamed
    m2 = gl.convert_layout(moved, o_row)[:, None] + gl.zeros(o_acc.shape, gl.int32, o_layout)
    return gl.inline_asm_elementwise(RESCALE_ASM, RESCALE_CONSTRAINTS, [o_acc, a2, m2], dtype=gl.float32,
                                     is_pure=True, pack=RESCALE_PACK)


@gluon.jit
def _new_max(m_i, m_blk, LAZY_RESCALE: gl.constexpr):
    """The running row max after a block whose row max is m_blk: _lazy_max's, or the plain maximum."""
    if LAZY_RESCALE:
        return _lazy_max(m_i, m_blk)
    return gl.maximum(m_i, m_blk)


@gluon.jit
def _rescale(o_acc, alpha, LAZY_RESCALE: gl.constexpr):
    """O to the new row max: o_acc * alpha[:, None], by _rescale_lazy's warp-skipping multiplies under LAZY_RESCALE."""
    if LAZY_RESCALE:
        return _rescale_lazy(o_acc, alpha)
    return o_acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_acc.type.layout))[:, None]


@gluon.jit
def _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn_bars,
             row0, seqlen_k, causal_offset, qk_scale, key_lo, softcap_log2, alibi_log2, window_left, window_right,
             WG: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
             MASKED: gl.constexpr, PINGPONG: gl.constexpr, IS_LOCAL: gl.constexpr, SOFTCAP: gl.constexpr,
             HAS_ALIBI: gl.constexpr, HAS_SINK: gl.constexpr, P_CVT_ASM: gl.constexpr = False,
             TREE_MAX: gl.constexpr = False, alibi_cols=0.0, ALIBI_SIDE: gl.constexpr = 0,
             b_bufs=None, b_ready=None, b_empty=None, sm_scale=0.0, HAS_BIAS: gl.constexpr = False,
             key0=0, seqlen_q=0, off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
             MASK_MOD: gl.constexpr = None, BLOCK_SPARSE: gl.constexpr = False,
             CONSUMERS: gl.constexpr = 2, EVEN_N: gl.constexpr = False,
             drop_seed=0, drop_rows=0, drop_thr=0, HAS_DROPOUT: gl.constexpr = False,
             LAZY_RESCALE: gl.constexpr = False, alibi_q=None, alibi_k=None, ALIBI_MMA: gl.constexpr = False,
             FIXED_MAX: gl.constexpr = False):
    """Key block j >= 1 (keys key_lo + j * BLOCK_N + [0, BLOCK_N)): issue S_j = Q K_j^T and O += P_{j-1} V_{j-1},
    softmax S_j while the PV runs, then rescale O to the new row max. Returns the updated (o_acc, m_i, l_i,
    p = P_j). causal_offset is Sk - Sq whenever a mask or ALiBi needs it. P_CVT_ASM: see _to_p. TREE_MAX: see
    _row_max. ALIBI_SIDE (HAS_ALIBI, unmasked blocks wholly on one side of every row's diagonal): the bias as a
    column vector plus a row term (_feature_scores), the row term added to the row max only.
    HAS_BIAS: block j's bias rows come from shared memory (_bias_tile; read while S_j runs); sm_scale =
    softmax_scale. A bias can hide every key of a row (-inf): the row max is then -inf and 0 is subtracted instead.
    BLOCK_SPARSE (plain scores only, MASKED tiles: a block mask's partial blocks): the tile's keys are
    key0 + [0, BLOCK_N), MASK_MOD is evaluated (_mask_mod_scores) and a row may have seen no key so far (0 is
    subtracted then). The full blocks run the dense unmasked step (every row of the tile real and seeing every key).
    HAS_DROPOUT: P_j's dropped entries are zeroed after l_i took them (gluon_dropout; drop_rows from
    dropout_row_counters, drop_thr the integer threshold); the draws are made while S_j runs.
    LAZY_RESCALE: a row's max moves only past _lazy_max's margin, and O is rescaled by the warps where one moved
    (_rescale_lazy). A row that saw no key yet (m_i = -inf: windows, a bias, block masks) takes the block's max as
    gl.maximum would.
    ALIBI_MMA (with ALIBI_SIDE, no softcap or bias): the column term ALIBI_SIDE * alibi_cols comes from one more
    wgmma (k = 16) into S, alibi_q [WG_M, 16] times alibi_k^T ([BLOCK_N, 16], _alibi_mma_operands), so the softmax
    takes plain's one FFMA per score instead of an FFMA and an FADD.
    FIXED_MAX (SOFTCAP alone, bf16): P = 2^(cap * tanh - _fixed_max), m_i unchanged and O not rescaled (no row max
    at all: see FIXED_MAX_HEADROOM)."""
    s_layout: gl.constexpr = m_i.type.layout.parent
    stage = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
    _turn_wait(turn_bars, j, WG, PINGPONG, CONSUMERS)
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)
    s_tok = warpgroup_mma(q_view, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    ALIBI_BY_MMA: gl.constexpr = ALIBI_MMA and ALIBI_SIDE != 0
    if ALIBI_BY_MMA:
        s_tok = warpgroup_mma(alibi_q.index(2 * WG + (1 - ALIBI_SIDE) // 2), alibi_k.index(WG).permute((1, 0)),
                              s_tok, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_bufs.index(prev), o_acc, is_async=True)
    _turn_pass(turn_bars, WG, PINGPONG, CONSUMERS)
    bias = 0.0
    if HAS_BIAS and not (HAS_ALIBI or IS_LOCAL or SOFTCAP):
        # Read while S_j runs (its latency hidden). With other features, after the wait: 32 more registers
        # live across it made ptxas spill (D128 window + softcap + ALiBi + sink + bias: 340 B).
        bias = _bias_tile(b_bufs, b_ready, j, WG, STAGES, s_layout)  # [WG_M, BLOCK_N], 16-bit
    if HAS_DROPOUT:
        words = dropout_words(drop_seed, drop_rows, key_lo + j * BLOCK_N, BLOCK_N, 4,  # integer work beside S_j
                              q_view.shape[1] >= FRESH_KEYS_FWD_MIN_HEAD_DIM)
    # wgmma groups retire in order: one outstanding means S_j is done and the PV may still run.
    s = warpgroup_mma_wait(1, deps=(s_tok, ))  # [WG_M, BLOCK_N]
    mbarrier.arrive(k_empty.index(stage))
    if HAS_BIAS and (HAS_ALIBI or IS_LOCAL or SOFTCAP):
        bias = _bias_tile(b_bufs, b_ready, j, WG, STAGES, s_layout)  # [WG_M, BLOCK_N], 16-bit
    if ALIBI_BY_MMA:
        # s = q.k + ALIBI_SIDE * alibi_cols / qk_scale: plain's softmax, the row term added to the max as below.
        m_layout: gl.constexpr = m_i.type.layout
        shift = _alibi_row_shift(key_lo + j * BLOCK_N, row0, causal_offset, alibi_log2, m_layout, ALIBI_SIDE)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) * qk_scale + shift, LAZY_RESCALE)  # [WG_M]
        alpha = gl.exp2(m_i - m_new)  # [WG_M]
        p_f32 = gl.exp2(s * qk_scale - (m_new - shift)[:, None])  # [WG_M, BLOCK_N]
    elif HAS_ALIBI and ALIBI_SIDE != 0:
        s = _feature_scores(s, key_lo + j * BLOCK_N, row0, seqlen_k, causal_offset, qk_scale, softcap_log2,
                            alibi_log2, window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                            False, alibi_cols, ALIBI_SIDE, bias=bias,
                            HAS_BIAS=HAS_BIAS)  # [WG_M, BLOCK_N], score - shift per row
        m_layout: gl.constexpr = m_i.type.layout
        shift = _alibi_row_shift(key_lo + j * BLOCK_N, row0, causal_offset, alibi_log2, m_layout, ALIBI_SIDE)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) + shift, LAZY_RESCALE)  # [WG_M], finite without a bias
        if HAS_BIAS and not HAS_SINK:
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        alpha = gl.exp2(m_i - m_sub)  # [WG_M]
        p_f32 = gl.exp2(s - (m_sub - shift)[:, None])  # [WG_M, BLOCK_N]
    elif FIXED_MAX:
        s = _feature_scores(s, key_lo + j * BLOCK_N, row0, seqlen_k, causal_offset, qk_scale, softcap_log2,
                            alibi_log2, window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                            MASKED, CAP_SCALED=False)  # [WG_M, BLOCK_N], tanh(score / softcap) or -inf
        m_new = m_i
        p_f32 = gl.exp2(s * softcap_log2 - _fixed_max(softcap_log2))  # [WG_M, BLOCK_N], one FFMA per score
    elif SOFTCAP and not HAS_ALIBI and not HAS_BIAS:
        s = _feature_scores(s, key_lo + j * BLOCK_N, row0, seqlen_k, causal_offset, qk_scale, softcap_log2,
                            alibi_log2, window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                            MASKED, CAP_SCALED=False)  # [WG_M, BLOCK_N], tanh(score / softcap) or -inf
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) * softcap_log2, LAZY_RESCALE)  # [WG_M]
        if IS_LOCAL and MASKED and not HAS_SINK:
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        alpha = gl.exp2(m_i - m_sub)  # [WG_M]
        p_f32 = gl.exp2(s * softcap_log2 - m_sub[:, None])  # [WG_M, BLOCK_N], one FFMA per score
    elif HAS_ALIBI or IS_LOCAL or SOFTCAP:
        s = _feature_scores(s, key_lo + j * BLOCK_N, row0, seqlen_k, causal_offset, qk_scale, softcap_log2,
                            alibi_log2, window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI,
                            MASKED, bias=bias, HAS_BIAS=HAS_BIAS)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX), LAZY_RESCALE)  # [WG_M]
        if (IS_LOCAL and MASKED or HAS_BIAS) and not HAS_SINK:
            # A window can leave a row without a visible key so far: m stays -inf; subtract 0 so exp2 gives 0.
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_sub = m_new
        alpha = gl.exp2(m_i - m_sub)  # [WG_M]
        p_f32 = gl.exp2(s - m_sub[:, None])  # [WG_M, BLOCK_N]
    elif HAS_BIAS:
        # Bias alone (or with causal): the scores in natural-log units, one FFMA each (s * scale + bias); the
        # row max before the factor log2(e) > 0, which the exp2 argument folds in (one FFMA), as plain does.
        s = s * sm_scale + _to_f32_16bit(bias)  # [WG_M, BLOCK_N]
        if MASKED:
            s = _mask_scores(s, j, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) * LOG2E, LAZY_RESCALE)  # [WG_M], log2 units
        if HAS_SINK:
            m_sub = m_new
        else:
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_sub)  # [WG_M]
        p_f32 = gl.exp2(s * LOG2E - m_sub[:, None])  # [WG_M, BLOCK_N]
    elif BLOCK_SPARSE and MASKED:
        s = _mask_mod_scores(s, key0, row0, seqlen_q, seqlen_k, off_b, off_h, aux0, aux1, aux2, aux3, BLOCK_N,
                             MASK_MOD, EVEN_N)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) * qk_scale, LAZY_RESCALE)  # [WG_M]; -inf until a key is seen
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_sub)  # [WG_M]
        p_f32 = gl.exp2(s * qk_scale - m_sub[:, None])  # [WG_M, BLOCK_N]
    else:
        if MASKED:
            s = _mask_scores(s, j, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL,
                             CONSUMERS == 2 and not HAS_DROPOUT)
        m_new = _new_max(m_i, _row_max(s, TREE_MAX) * qk_scale, LAZY_RESCALE)  # [WG_M], log2 units
        alpha = gl.exp2(m_i - m_new)  # [WG_M]
        p_f32 = gl.exp2(s * qk_scale - m_new[:, None])  # [WG_M, BLOCK_N]
    if FIXED_MAX:
        l_i = l_i + gl.sum(p_f32, axis=1)
    else:
        l_i = l_i * alpha + gl.sum(p_f32, axis=1)
    if HAS_DROPOUT:  # l_i counted the dropped entries, O does not
        p_next = dropout_to_p(p_f32, words, drop_thr, p.dtype)  # [WG_M, BLOCK_N]
    else:
        p_next = _to_p(p_f32, p, P_CVT_ASM)
    p_next = gl.convert_layout(p_next, p.type.layout, assert_trivial=True)
    # P_{j-1} (registers) is read by the PV wgmma until it retires: keep it alive through the wait.
    o_acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    mbarrier.arrive(v_empty.index(prev))
    if HAS_BIAS:
        _bias_release(b_empty, j, STAGES)
    if not FIXED_MAX:
        o_acc = _rescale(o_acc, alpha, LAZY_RESCALE)
    return o_acc, m_new, l_i, p_next


@gluon.jit
def _consumer_partition(q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars,
                        out_ptr, lse_ptr, stride_om, seqlen_q, seqlen_k, causal_offset, start_m, n_full, n_blocks,
                        qk_scale, key_lo, n_lead, alibi_ptr, sink_ptr, softcap_log2, window_left, window_right,
                        WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                        IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, IS_LOCAL: gl.constexpr,
                        SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_SINK: gl.constexpr,
                        VARLEN: gl.constexpr = False,
                        P_CVT_ASM: gl.constexpr = False, TREE_MAX: gl.constexpr = False,
                        b_bufs=None, b_ready=None, b_empty=None, sm_scale=0.0, HAS_BIAS: gl.constexpr = False,
                        full_ptr=None, part_ptr=None, list_off=0, off_b=0, off_h=0, aux0=None, aux1=None, aux2=None,
                        aux3=None, MASK_MOD: gl.constexpr = None, BLOCK_SPARSE: gl.constexpr = False,
                        SPARSE_N: gl.constexpr = 128, CONSUMERS: gl.constexpr = 2, EVEN_N: gl.constexpr = False,
                        drop_seed=0, drop_base=0, drop_row_groups=0, drop_thr=0, dropout_scale=1.0,
                        HAS_DROPOUT: gl.constexpr = False, O_VIA_SMEM: gl.constexpr = False,
                        LAZY_RESCALE: gl.constexpr = False, alibi_q=None, alibi_k=None,
                        ALIBI_MMA: gl.constexpr = False, FIXED_MAX: gl.constexpr = False):
    """Query rows start_m + WG * 64 + [0, 64) of the tile: the online softmax over n_blocks key blocks starting
    at key key_lo, of which [n_lead, n_full) need no mask (n_lead only under IS_LOCAL; else 0). Writes those rows
    of out (stride_om per row) and lse. alibi_ptr / sink_ptr point at this (batch, head)'s slope / sink logit.
    VARLEN: rows that saw no key (bottom-right causal or a window in a sequence with Sq > Sk) get 0 and lse -inf;
    HAS_BIAS likewise (a bias of -inf on every key a row sees), as the portable kernel writes them.
    BLOCK_SPARSE: the n_blocks key tiles of _sparse_tile_key (full_ptr / part_ptr), the first n_full unmasked (the
    first one masked anyway, as every block 0), the rest evaluating MASK_MOD(off_b, off_h, q_idx, kv_idx,
    aux0..aux3); rows that see no key get 0 and lse -inf.
    HAS_DROPOUT: probabilities dropped as kernels/common._dropout_keep drops them (Philox key drop_seed, counters
    from drop_base, drop_row_groups = ceil(max_k / 8) per row, 15-bit threshold drop_thr), the kept ones scaled by
    dropout_scale = 1 / (1 - dropout_p); lse stays the undropped one.
    O_VIA_SMEM: the rows leave through the warpgroup's Q tile (free after its last QK^T; the one-tile kernel loads
    no other Q into it) as 16-byte row pieces (gluon_epilogue._store_rows_via), else from the accumulator's layout
    in 4-byte pieces. LAZY_RESCALE: see _kv_step. ALIBI_MMA: the one-sided blocks' ALiBi columns by a wgmma (_kv_step),
    from this warpgroup's operands in alibi_q ([2 * CONSUMERS, WG_M, 16]) and alibi_k ([CONSUMERS, BLOCK_N, 16]),
    written here. FIXED_MAX: m_i is _fixed_max in every row from the first block on (_kv_step); a row that saw no
    key has l = 0 instead of m = -inf."""
    dtype: gl.constexpr = q_smem.dtype
    SCORES: gl.constexpr = SOFTCAP or HAS_ALIBI or IS_LOCAL  # scores pass through _feature_scores
    # One warpgroup, 64 rows: S is [64, BLOCK_N] and O [64, HEAD_DIM] in wgmma accumulator layouts; P feeds
    # the PV wgmma from registers (its accumulator layout converts to the operand layout without shuffles).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_view = q_smem.index(WG)
    row0 = start_m + WG * WG_M
    drop_rows = 0
    if HAS_DROPOUT:
        drop_rows = dropout_row_counters(drop_base, row0, drop_row_groups, WG_M, BLOCK_N, 4)  # [WG_M] int64
    alibi_log2 = 0.0
    if HAS_ALIBI:
        alibi_log2 = gl.load(alibi_ptr) * LOG2E
    sink_log2 = 0.0
    if HAS_SINK:
        sink_log2 = gl.load(sink_ptr) * LOG2E
    if ALIBI_MMA:
        _alibi_mma_operands(alibi_q, alibi_k, alibi_log2 / qk_scale, WG, BLOCK_N)

    if BLOCK_SPARSE:
        full_ptr += list_off
        part_ptr += list_off
        key0 = _sparse_tile_key(0, n_full, n_blocks, full_ptr, part_ptr, BLOCK_N, SPARSE_N)  # read before the waits
    # Key block 0 (always masked: cheap once, and it is the diagonal block of the first tile).
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    _turn_wait(turn_bars, 0, WG, PINGPONG, CONSUMERS)
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)
    s_tok = warpgroup_mma(q_view, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _turn_pass(turn_bars, WG, PINGPONG, CONSUMERS)
    bias = 0.0
    if HAS_BIAS:
        bias = _bias_tile(b_bufs, b_ready, 0, WG, STAGES, s_layout)  # [WG_M, BLOCK_N], 16-bit
    if HAS_DROPOUT:
        words = dropout_words(drop_seed, drop_rows, key_lo, BLOCK_N, 4, HEAD_DIM >= FRESH_KEYS_FWD_MIN_HEAD_DIM)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))  # [WG_M, BLOCK_N]
    mbarrier.arrive(k_empty.index(0))
    if HAS_BIAS:
        _bias_release(b_empty, 0, STAGES)
    if FIXED_MAX:
        s = _feature_scores(s, key_lo, row0, seqlen_k, causal_offset, qk_scale, softcap_log2, alibi_log2,
                            window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, True,
                            CAP_SCALED=False)  # [WG_M, BLOCK_N], tanh(score / softcap) or -inf
        m_fixed = _fixed_max(softcap_log2)
        p_f32 = gl.exp2(s * softcap_log2 - m_fixed)  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        m_i = gl.zeros_like(l_i) + m_fixed
    elif SCORES:
        s = _feature_scores(s, key_lo, row0, seqlen_k, causal_offset, qk_scale, softcap_log2, alibi_log2,
                            window_left, window_right, BLOCK_N, IS_CAUSAL, IS_LOCAL, SOFTCAP, HAS_ALIBI, True,
                            bias=bias, HAS_BIAS=HAS_BIAS)
        m_i = gl.max(s, axis=1)  # [WG_M]
        if HAS_SINK:
            # The sink is one more logit of every row: the running max and denominator start from it.
            m_i = gl.maximum(m_i, sink_log2)
            p_f32 = gl.exp2(s - m_i[:, None])  # [WG_M, BLOCK_N]
            l_i = gl.sum(p_f32, axis=1) + gl.exp2(sink_log2 - m_i)  # [WG_M]
        else:
            if IS_LOCAL or HAS_BIAS:
                # A window (or a -inf bias) can hide this whole block from a row: m = -inf; subtract 0 so exp2
                # gives 0, not NaN.
                p_f32 = gl.exp2(s - gl.where(m_i == float("-inf"), 0.0, m_i)[:, None])  # [WG_M, BLOCK_N]
            else:
                p_f32 = gl.exp2(s - m_i[:, None])  # [WG_M, BLOCK_N]
            l_i = gl.sum(p_f32, axis=1)  # [WG_M]
    elif HAS_BIAS:
        # As _kv_step's bias-alone branch: natural-log scores, the factor log2(e) folded into the exp2 argument.
        s = _mask_scores(s * sm_scale + _to_f32_16bit(bias), 0, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL)
        m_i = gl.max(s, axis=1) * LOG2E  # [WG_M]; -inf where the bias hides every key of the block
        if HAS_SINK:
            m_i = gl.maximum(m_i, sink_log2)
            m_sub = m_i
        else:
            m_sub = gl.where(m_i == float("-inf"), 0.0, m_i)
        p_f32 = gl.exp2(s * LOG2E - m_sub[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        if HAS_SINK:
            l_i = l_i + gl.exp2(sink_log2 - m_i)
    elif BLOCK_SPARSE:
        # Masked even when it is a full block: skipping the mask_mod there behind a run-time branch made ptxas spill
        # at D128 (window mask 0 -> 88 B).
        s = _mask_mod_scores(s, key0, row0, seqlen_q, seqlen_k, off_b, off_h, aux0, aux1, aux2, aux3, BLOCK_N,
                             MASK_MOD, EVEN_N)
        m_i = gl.max(s, axis=1) * qk_scale  # [WG_M]; -inf where the mask hides the whole tile from a row
        p_f32 = gl.exp2(s * qk_scale - gl.where(m_i == float("-inf"), 0.0, m_i)[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
    else:
        s = _mask_scores(s, 0, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL, CONSUMERS == 2 and not HAS_DROPOUT)
        m_i = gl.max(s, axis=1) * qk_scale  # [WG_M]; finite: every row sees key 0 (host guarantees it)
        if HAS_SINK:
            m_i = gl.maximum(m_i, sink_log2)
        p_f32 = gl.exp2(s * qk_scale - m_i[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        if HAS_SINK:
            l_i = l_i + gl.exp2(sink_log2 - m_i)
    if HAS_DROPOUT:
        p = dropout_to_p(p_f32, words, drop_thr, dtype)
    else:
        p = p_f32.to(dtype)
    p = gl.convert_layout(p, p_layout, assert_trivial=True)  # [WG_M, BLOCK_N]
    o_acc = gl.zeros([WG_M, HEAD_DIM], gl.float32, o_layout)

    # Masked blocks before the window's full ones (IS_LOCAL), fully visible blocks, then the masked ones (the
    # causal diagonal or the window's right edge, and the seqlen_k tail).
    if IS_LOCAL:
        for j in range(1, n_lead):
            o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                          v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                          softcap_log2, alibi_log2, window_left, window_right,
                                          WG, BLOCK_N, STAGES, IS_CAUSAL, True, PINGPONG, IS_LOCAL, SOFTCAP,
                                          HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX,
                                          b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                          HAS_BIAS=HAS_BIAS, CONSUMERS=CONSUMERS, drop_seed=drop_seed,
                                          drop_rows=drop_rows, drop_thr=drop_thr, HAS_DROPOUT=HAS_DROPOUT,
                                          LAZY_RESCALE=LAZY_RESCALE, FIXED_MAX=FIXED_MAX)
        full_start = gl.maximum(n_lead, 1)
    else:
        full_start = 1
    if HAS_ALIBI:
        # The unmasked blocks wholly left of every row's diagonal (all of them under causal: one FFMA per score
        # for the bias, _feature_scores' ALIBI_SIDE), those a row's diagonal crosses (the |.| path), and those
        # wholly right of it. Bounds from this warpgroup's 64 rows (those past Sq included).
        alibi_cols = 0.0  # ALIBI_MMA: the columns come from the wgmma
        if not ALIBI_MMA:
            alibi_cols = alibi_log2 * gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)).to(gl.float32)
        if IS_CAUSAL:
            left_end = n_full
            right_start = n_full
        else:
            diag_lo = row0 + causal_offset - key_lo  # the first row's diagonal, as a key offset from key_lo
            left_end = gl.minimum(gl.maximum(gl.maximum(diag_lo + 1, 0) // BLOCK_N, full_start), n_full)
            right_start = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(diag_lo + WG_M - 1, 0), BLOCK_N), left_end),
                                     n_full)
        for j in range(full_start, left_end):
            o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                          v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                          softcap_log2, alibi_log2, window_left, window_right,
                                          WG, BLOCK_N, STAGES, IS_CAUSAL, False, PINGPONG, IS_LOCAL, SOFTCAP,
                                          HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX, alibi_cols, 1,
                                          b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                          HAS_BIAS=HAS_BIAS, CONSUMERS=CONSUMERS, drop_seed=drop_seed,
                                          drop_rows=drop_rows, drop_thr=drop_thr, HAS_DROPOUT=HAS_DROPOUT,
                                          LAZY_RESCALE=LAZY_RESCALE, alibi_q=alibi_q, alibi_k=alibi_k,
                                          ALIBI_MMA=ALIBI_MMA, FIXED_MAX=FIXED_MAX)
        for j in range(left_end, right_start):
            o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                          v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                          softcap_log2, alibi_log2, window_left, window_right,
                                          WG, BLOCK_N, STAGES, IS_CAUSAL, False, PINGPONG, IS_LOCAL, SOFTCAP,
                                          HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX,
                                          b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                          HAS_BIAS=HAS_BIAS, CONSUMERS=CONSUMERS, drop_seed=drop_seed,
                                          drop_rows=drop_rows, drop_thr=drop_thr, HAS_DROPOUT=HAS_DROPOUT,
                                          LAZY_RESCALE=LAZY_RESCALE, FIXED_MAX=FIXED_MAX)
        for j in range(right_start, n_full):
            o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                          v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                          softcap_log2, alibi_log2, window_left, window_right,
                                          WG, BLOCK_N, STAGES, IS_CAUSAL, False, PINGPONG, IS_LOCAL, SOFTCAP,
                                          HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX, alibi_cols, -1,
                                          b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                          HAS_BIAS=HAS_BIAS, CONSUMERS=CONSUMERS, drop_seed=drop_seed,
                                          drop_rows=drop_rows, drop_thr=drop_thr, HAS_DROPOUT=HAS_DROPOUT,
                                          LAZY_RESCALE=LAZY_RESCALE, alibi_q=alibi_q, alibi_k=alibi_k,
                                          ALIBI_MMA=ALIBI_MMA, FIXED_MAX=FIXED_MAX)
    else:
        for j in range(full_start, n_full):
            o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                          v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                          softcap_log2, alibi_log2, window_left, window_right,
                                          WG, BLOCK_N, STAGES, IS_CAUSAL, False, PINGPONG, IS_LOCAL, SOFTCAP,
                                          HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX,
                                          b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                          HAS_BIAS=HAS_BIAS, CONSUMERS=CONSUMERS, drop_seed=drop_seed,
                                          drop_rows=drop_rows, drop_thr=drop_thr, HAS_DROPOUT=HAS_DROPOUT,
                                          LAZY_RESCALE=LAZY_RESCALE, FIXED_MAX=FIXED_MAX)
    for j in range(gl.maximum(n_full, 1), n_blocks):
        key0 = 0
        if BLOCK_SPARSE:
            key0 = _list_tile_key(part_ptr, j - n_full, True, BLOCK_N, SPARSE_N)  # read before the step's waits
        o_acc, m_i, l_i, p = _kv_step(j, o_acc, m_i, l_i, p, q_view, k_bufs, v_bufs, k_ready, k_empty, v_ready,
                                      v_empty, turn_bars, row0, seqlen_k, causal_offset, qk_scale, key_lo,
                                      softcap_log2, alibi_log2, window_left, window_right,
                                      WG, BLOCK_N, STAGES, IS_CAUSAL, True, PINGPONG, IS_LOCAL, SOFTCAP,
                                      HAS_ALIBI, HAS_SINK, P_CVT_ASM, TREE_MAX,
                                      b_bufs=b_bufs, b_ready=b_ready, b_empty=b_empty, sm_scale=sm_scale,
                                      HAS_BIAS=HAS_BIAS, key0=key0, seqlen_q=seqlen_q, off_b=off_b, off_h=off_h,
                                      aux0=aux0, aux1=aux1, aux2=aux2, aux3=aux3, MASK_MOD=MASK_MOD,
                                      BLOCK_SPARSE=BLOCK_SPARSE, CONSUMERS=CONSUMERS, EVEN_N=EVEN_N,
                                      drop_seed=drop_seed, drop_rows=drop_rows, drop_thr=drop_thr,
                                      HAS_DROPOUT=HAS_DROPOUT, LAZY_RESCALE=LAZY_RESCALE, FIXED_MAX=FIXED_MAX)

    # The last block's PV.
    last = (n_blocks - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_bufs.index(last), o_acc, is_async=True)
    o_acc, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    mbarrier.arrive(v_empty.index(last))

    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_o = gl.convert_layout(l_i, o_row)
    if HAS_DROPOUT:
        out = o_acc * (dropout_scale / l_o)[:, None]  # [WG_M, HEAD_DIM]
    else:
        out = o_acc * (1.0 / l_o)[:, None]  # [WG_M, HEAD_DIM]
    rows = row0 + gl.arange(0, WG_M, layout=o_row)  # [WG_M]
    in_seq = rows < seqlen_q
    m_o = gl.convert_layout(m_i, o_row)  # [WG_M]
    if VARLEN or HAS_BIAS or BLOCK_SPARSE:
        # The host cannot see per-sequence lengths (or a bias's -inf, or a mask_mod): a row without keys kept
        # m = -inf (its O and l are NaN / 0, row-local); write what the portable kernel writes.
        if FIXED_MAX:
            seen = l_o > 0.0  # [WG_M]: a seen key adds >= 2^-86 (FIXED_MAX_HEADROOM)
        else:
            seen = m_o > float("-inf")  # [WG_M]
        out = gl.where(seen[:, None], out, 0.0)
    if O_VIA_SMEM:
        _store_rows_via(q_view, out.to(dtype), out_ptr, stride_om, row0, seqlen_q)
    else:
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))  # [HEAD_DIM]
        o_ptrs = out_ptr + rows.to(gl.int64)[:, None] * stride_om + cols[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=in_seq[:, None])
    lse = (m_o + gl.log2(l_o)) * LN2  # [WG_M], natural log
    if VARLEN or HAS_BIAS or BLOCK_SPARSE:
        lse = gl.where(seen, lse, float("-inf"))
    gl.store(lse_ptr + rows, lse, mask=in_seq)


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
                     ALIBI_MMA: gl.constexpr = False, FIXED_MAX: gl.constexpr = False):
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
    if LPT_HEADS > 0:  # causal: the longest rows of LPT_HEADS heads at a time (gluon_grid._heavy_first)
        pid_m, pid_bh = _heavy_first(pid_m, pid_bh, gl.num_programs(0), gl.num_programs(1), LPT_HEADS)
        pid_m = gl.num_programs(0) - 1 - pid_m
    elif IS_CAUSAL or IS_LOCAL or BLOCK_SPARSE:
        pid_m = gl.num_programs(0) - 1 - pid_m  # longest rows first (a causal block mask's too)
    off_b = pid_bh // heads_q
    off_h = pid_bh % heads_q
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
