"""Pieces the Hopper Gluon forwards share (the one-tile kernel, gluon_fwd.py, and the persistent one,
gluon_fwd_persistent.py): TMA loads of ragged (varlen) tiles, the consumer warpgroups' turn-taking, score features and
masks, the row max and the rescale of O (lazy or fixed-max), and P's conversion to 16 bits.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .common import LOG2E, _tanh, _to_f32_16bit

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
