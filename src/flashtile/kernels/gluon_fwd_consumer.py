"""The Hopper Gluon one-tile forward's consumer warpgroups (gluon_fwd.py has the schedule): _kv_step (S = Q K^T, the
softmax's update and O += P V for one key block) and the partition that walks a query tile's key blocks (dense,
windowed or block-sparse) and stores O and lse.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .common import LOG2E, _to_f32_16bit
from .gluon_dropout import FRESH_KEYS_FWD_MIN_HEAD_DIM, dropout_row_counters, dropout_to_p, dropout_words
from .gluon_epilogue import _store_rows_via
from .gluon_fwd_common import (LN2, WG_M, _alibi_mma_operands, _alibi_row_shift, _bias_release, _bias_tile,
                               _feature_scores, _fixed_max, _mask_scores, _new_max, _rescale, _row_max, _to_p,
                               _turn_pass, _turn_wait)
from .gluon_sparse import _list_tile_key, _mask_mod_scores, _sparse_tile_key


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
        if HAS_BIAS:
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
        if IS_LOCAL and MASKED:
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
        if IS_LOCAL and MASKED or HAS_BIAS:
            # A window can leave a row without a visible key so far: m stays -inf (also with a sink of -inf, one
            # head's sink turned off); subtract 0 so exp2 gives 0.
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
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # -inf: no key seen yet (and no sink, or one of -inf)
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
        m_sub = m_i
        if IS_LOCAL or HAS_BIAS:
            # A window (or a -inf bias) can hide this whole block from a row, and a sink may be -inf (one head's sink
            # turned off): m = -inf; subtract 0 so exp2 gives 0, not NaN.
            m_sub = gl.where(m_i == float("-inf"), 0.0, m_i)
        p_f32 = gl.exp2(s - m_sub[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        if HAS_SINK:
            l_i = l_i + gl.exp2(sink_log2 - m_sub)
    elif HAS_BIAS:
        # As _kv_step's bias-alone branch: natural-log scores, the factor log2(e) folded into the exp2 argument.
        s = _mask_scores(s * sm_scale + _to_f32_16bit(bias), 0, row0, seqlen_k, causal_offset, BLOCK_N, IS_CAUSAL)
        m_i = gl.max(s, axis=1) * LOG2E  # [WG_M]; -inf where the bias hides every key of the block
        if HAS_SINK:
            m_i = gl.maximum(m_i, sink_log2)
        m_sub = gl.where(m_i == float("-inf"), 0.0, m_i)  # still -inf with a sink of -inf
        p_f32 = gl.exp2(s * LOG2E - m_sub[:, None])  # [WG_M, BLOCK_N]
        l_i = gl.sum(p_f32, axis=1)  # [WG_M]
        if HAS_SINK:
            l_i = l_i + gl.exp2(sink_log2 - m_sub)
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
