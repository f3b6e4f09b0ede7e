"""Small @triton.jit helpers shared by the forward and backward kernels."""
import triton
import triton.language as tl


LOG2E = tl.constexpr(1.4426950408889634)
# Philox-4x32 rounds of the dropout draws: 7, as flash-attn's CUDA kernels (and PyTorch's SDPA flash backend,
# built from them) use; 10 (Triton's and Random123's default) is the Philox authors' choice with a safety margin
# over the fewest rounds that pass their statistical tests. 7 cuts the draws' integer work by 30 %.
# flashtile.philox.ROUNDS is the CPU path's copy (a test ties them).
PHILOX_ROUNDS = tl.constexpr(7)


@triton.jit
def _tanh(x, APPROX: tl.constexpr = False):
    """tanh(x) for fp32 x. APPROX: the GPU's one-instruction tanh.approx.f32 (relative error about 2^-11,
    finer than fp16/bf16 inputs carry; NVIDIA only). Else (fp32 inputs, the interpreter: no libdevice there) to
    ~2-4 ulps: for |x| < 1/4 the odd Taylor series to x^11 (truncation below 3e-10 relative), past it (1 - e) / (1 +
    e) with e = 2^(-2|x| log2 e) <= 0.61, which saturates to +-1 without NaN. (1 - 2 / (e^2x + 1) alone lost x's
    leading bits near 0: an absolute error ~1e-7 that softcap scaled into the scores, 1e-4 relative; the fuzz's
    fp32 softcap-50 case was past DESIGN's bound with it.)"""
    if APPROX:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    x2 = x * x
    near = x + x * x2 * (-0.3333333333 + x2 * (0.1333333333 + x2 * (-0.0539682540 + x2 * (0.0218694885
                                                                                          - x2 * 0.0088632355))))
    e = tl.math.exp2(tl.abs(x) * (-2.0 * LOG2E))
    far = (1.0 - e) / (1.0 + e)
    return tl.where(x2 < 0.0625, near, tl.where(x < 0.0, -far, far))


@triton.jit
def _to_f32_16bit(x):
    """fp32 of x (a bias tile of the Gluon kernels). bf16 by bit moves on packed pairs (low half shifted up, high
    half masked: two instructions per pair, where cvt.f32.bf16 of each half compiled to three; NVIDIA only, inline
    PTX); fp16 and fp32 through .to()."""
    if x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi; shl.b32 lo, $2, 16; and.b32 hi, $2, 0xFFFF0000; mov.b32 $0, lo; mov.b32 $1, hi; }",
            "=f,=f,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    return x.to(tl.float32)


@triton.jit
def _scores(qk, q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, softcap_log2, alibi_slope,
            window_left, window_right, bias_ptr, stride_bias_m, stride_bias_n,
            MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
            HAS_BIAS: tl.constexpr, off_b=0, off_h=0, aux0=None, aux1=None, aux2=None, aux3=None,
            SCORE_MOD: tl.constexpr = None, SCORE_MOD_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None):
    """The one place where raw q.k products become scores, in a fixed order: softcap, ALiBi, bias, the user
    score_mod, masks (causal / window, the user mask_mod, sequence bounds).

    qk: raw dot products; q_idx / k_idx: query and key positions broadcastable to qk's shape ([M, 1]
    and [1, N] in the forward and dQ kernels, [1, M] and [N, 1] in the dK/dV kernel, which works on
    the transposed tile). Returns (s, t, g): s in log2 units (natural-log ones under SCORE_MOD, below), -inf where
    masked; t = tanh(qk * qk_scale) under SOFTCAP (the backward's chain rule needs 1 - t^2), else s.
    qk_scale is softmax_scale * log2(e), or softmax_scale / softcap under SOFTCAP (then softcap_log2 =
    softcap * log2(e)). bias_ptr points at this (batch, head)'s additive bias, read at
    (q_idx, k_idx) with the given strides (0 along broadcast dims). Only MASKED blocks evaluate masks:
    the loop bounds decide which blocks are full.

    Programmable attention (flashtile.flex): SCORE_MOD(score, b, h, q_idx, kv_idx, aux0..aux3) gets the
    score in natural-log units and returns the new one; MASK_MOD(b, h, q_idx, kv_idx, aux0..aux3) returns
    True where a key is visible; both are generated adapters around the user's functions, and positions
    past the sequence ends are clamped to the last one so mods may index aux tensors with them.
    Returns (s, t, g): g = d SCORE_MOD / d score from SCORE_MOD_GRAD (the backward's chain rule), else t; s stays in
    natural-log units then (_log2_units / _exp2_minus convert it).
    SOFTCAP: 0 off, 1 on, 2 on with the GPU's approximate tanh (fp16/bf16 inputs; see _tanh).
    """
    if SOFTCAP:
        t = _tanh(qk * qk_scale, SOFTCAP == 2)
        s = t * softcap_log2
    else:
        s = qk * qk_scale
        t = s
    if HAS_ALIBI:
        # -slope * |i + Sk - Sq - j|, in log2 units
        s = s - (alibi_slope * LOG2E) * tl.abs(q_idx + (seqlen_k - seqlen_q) - k_idx).to(tl.float32)
    if HAS_BIAS:
        in_bounds = (q_idx < seqlen_q) & (k_idx < seqlen_k)
        bias = tl.load(bias_ptr + q_idx.to(tl.int64) * stride_bias_m + k_idx.to(tl.int64) * stride_bias_n,
                       mask=in_bounds, other=0.0)
        s = s + bias.to(tl.float32) * LOG2E
    g = t
    if SCORE_MOD is not None:
        s_nat = s * (1.0 / LOG2E)
        q_mod = tl.minimum(q_idx, seqlen_q - 1)
        k_mod = tl.minimum(k_idx, seqlen_k - 1)
        if SCORE_MOD_GRAD is not None:
            g = SCORE_MOD_GRAD(s_nat, off_b, off_h, q_mod, k_mod, aux0, aux1, aux2, aux3)
        s = SCORE_MOD(s_nat, off_b, off_h, q_mod, k_mod, aux0, aux1, aux2, aux3)  # natural-log units: _exp2_minus
    if MASKED:
        visible = k_idx < seqlen_k
        if IS_LOCAL:
            # Bottom-right aligned window: query i sees keys i + Sk - Sq - left <= j <= i + Sk - Sq + right.
            shifted = q_idx + (seqlen_k - seqlen_q)
            visible = visible & (k_idx <= shifted + window_right) & (k_idx >= shifted - window_left)
        if MASK_MOD is not None:
            visible = visible & MASK_MOD(off_b, off_h, tl.minimum(q_idx, seqlen_q - 1),
                                         tl.minimum(k_idx, seqlen_k - 1), aux0, aux1, aux2, aux3)
        s = tl.where(visible, s, float("-inf"))
    return s, t, g


@triton.jit
def _log2_units(x, SCORE_MOD: tl.constexpr):
    """x, a score (or a row's maximum of them) from _scores, in log2 units: under SCORE_MOD it came in natural-log
    units."""
    if SCORE_MOD is not None:
        x = x * LOG2E
    return x


@triton.jit
def _exp2_minus(s, m, SCORE_MOD: tl.constexpr):
    """exp2(s - m) for scores s from _scores and m (a running max, an lse) in log2 units. Under SCORE_MOD, s is in
    natural-log units and s * log2(e) - m is one fma: a large score the mod made (an offset shared by a row, e.g. a
    position bias not aligned to the row) is not rounded a second time before the difference, which is small (the
    fp32 backward's gradients against PyTorch's: the fuzz's programmable seeds 269 / 294 on the H200)."""
    if SCORE_MOD is not None:
        p = tl.math.exp2(tl.fma(s, LOG2E, -m))
    else:
        p = tl.math.exp2(s - m)
    return p


@triton.jit
def _dropout_keep(seed, rng_base, q_idx, start_n, max_k, threshold, BLOCK_N: tl.constexpr,
                  KEYS_ON_ROWS: tl.constexpr):
    """Dropout's keep mask of a tile of queries q_idx and keys start_n + [0, BLOCK_N): [M, BLOCK_N] for q_idx
    [M, 1], or [BLOCK_N, M] for q_idx [1, M] with KEYS_ON_ROWS (the dK/dV kernel's transposed tiles). start_n is
    a multiple of 8. True where the element's 15-bit draw is >= threshold (philox.dropout_threshold(dropout_p)):
    with probability (32768 - threshold) / 32768, within 1/32768 of 1 - dropout_p.

    One Philox call (tl.randint4x of PHILOX_ROUNDS rounds, keyed by seed) per eight consecutive keys: element
    (b, h, i, j) of a (B, Hq, max_q, max_k) layout uses counter rng_base + i * ceil(max_k / 8) + j // 8, with
    rng_base = (b * Hq + h) * max_q * ceil(max_k / 8), positions within the sequence, and takes output
    (j % 8) // 2 of its four, the low 15 bits of its low 16-bit half for even j, of its high half for odd j. The
    draw depends only on the element, not on the tiling, so the dK/dV and dQ kernels regenerate the forward's
    mask exactly, and flashtile.philox.dropout_bits reproduces it on the CPU. (tl.rand4x per four keys with a
    float compare took twice the Philox calls and an int-to-float conversion per key.)
    """
    groups = start_n // 8 + tl.arange(0, BLOCK_N // 8)
    row_groups = (max_k + 7) // 8
    if KEYS_ON_ROWS:
        r0, r1, r2, r3 = tl.randint4x(seed, rng_base + q_idx.to(tl.int64) * row_groups + groups[:, None],
                                     PHILOX_ROUNDS)
    else:
        r0, r1, r2, r3 = tl.randint4x(seed, rng_base + q_idx.to(tl.int64) * row_groups + groups[None, :],
                                     PHILOX_ROUNDS)
    thr = tl.cast(threshold, tl.uint32)
    # t: [M, G, b, a] (keys on rows: [G, M, b, a]) holding output 2a + b of group g, b joined first. Triton lays
    # the key tile out 4 keys per thread before it picks the MMA layout, splitting a group's eight keys between
    # threads at a; in this order its shared-memory exchanges all move 32-bit outputs (two keys each), the last
    # one straight into the dot's register layout. Joined a first (the rand4x order), the booleans were exchanged
    # too, packed and unpacked per key: 894 instead of 766 SASS instructions per thread and key tile (D128
    # forward, offline compile). The dK/dV tile has a group's keys on eight lanes and exchanges the booleans.
    t = tl.join(tl.join(r0.to(tl.uint32, bitcast=True), r1.to(tl.uint32, bitcast=True)),
                tl.join(r2.to(tl.uint32, bitcast=True), r3.to(tl.uint32, bitcast=True)))
    if KEYS_ON_ROWS:  # one return statement: the compiler visits the code after a static if's return
        w = tl.reshape(tl.permute(t, (0, 3, 2, 1)), (BLOCK_N // 2, q_idx.shape[1]))  # [BLOCK_N / 2, M]
        keep = tl.join((w & 0x7FFF) >= thr, (w & 0x7FFF0000) >= (thr << 16))  # [BLOCK_N / 2, M, 2]: low, high
        keep = tl.reshape(tl.permute(keep, (0, 2, 1)), (BLOCK_N, q_idx.shape[1]))
    else:
        w = tl.reshape(tl.permute(t, (0, 1, 3, 2)), (q_idx.shape[0], BLOCK_N // 2))  # [M, BLOCK_N / 2]
        keep = tl.join((w & 0x7FFF) >= thr, (w & 0x7FFF0000) >= (thr << 16))
        keep = tl.reshape(keep, (q_idx.shape[0], BLOCK_N))
    return keep


@triton.jit
def _seq_range(CuSeqlens, off_b, seqlen, IS_VARLEN: tl.constexpr):
    """(first token, length) of sequence off_b: from cu_seqlens in varlen mode, (0, seqlen) when dense."""
    if IS_VARLEN:
        start = tl.load(CuSeqlens + off_b)
        return start, tl.load(CuSeqlens + off_b + 1) - start
    return 0, seqlen


@triton.jit
def _row_base(off_b, off_h, q_start, stride_b, stride_h, IS_VARLEN: tl.constexpr):
    """Offset of a (batch, query head)'s first row in the backward's Delta / Lse2 buffers (launch.py
    Geometry.row_buffer_shape). Dense: lse's layout. Varlen: sequence b's rows start at 16 * (b + q_start // 16),
    a multiple of 16 (so the row loads are aligned vectors) and clear of the other sequences' rows."""
    if IS_VARLEN:
        return off_h * stride_h + 16 * (off_b + q_start // 16)
    return off_b * stride_b + off_h * stride_h


@triton.jit
def _seq_offset(off_b, start, stride_b, stride_s, IS_VARLEN: tl.constexpr):
    """Element offset of a sequence's first token: packed tokens in varlen mode, the batch stride when dense."""
    if IS_VARLEN:
        return start.to(tl.int64) * stride_s
    return off_b * stride_b


@triton.jit
def _load_tile(ptrs, offs_rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Load a [rows, HEAD_DIM_PAD] tile, zero outside the sequence and the real head dim."""
    if MASK_ROWS:
        if HEAD_DIM == HEAD_DIM_PAD:
            return tl.load(ptrs, mask=offs_rows[:, None] < n_rows, other=0.0)
        return tl.load(ptrs, mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if HEAD_DIM == HEAD_DIM_PAD:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _store_tile(ptrs, value, offs_rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Store a [rows, HEAD_DIM_PAD] tile, only the rows inside the sequence and the real head dim."""
    if HEAD_DIM == HEAD_DIM_PAD:
        tl.store(ptrs, value, mask=offs_rows[:, None] < n_rows)
    else:
        tl.store(ptrs, value, mask=(offs_rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _key_start(KeyStart, off_b, LEFTPAD: tl.constexpr):
    """First cache token of batch b's keys: KeyStart[b] in a left-padded KV cache, else 0."""
    if LEFTPAD:
        return tl.load(KeyStart + off_b)
    return 0


@triton.jit
def _page_slot(tokens, page_size, PAGE_SHIFT: tl.constexpr):
    """(page index, slot) of int32 cache tokens in pages of page_size tokens: a shift and a mask when the page
    size is the power of two 2**PAGE_SHIFT (known at compile time; PAGE_SHIFT -1 otherwise), else a division."""
    if PAGE_SHIFT >= 0:
        return tokens >> PAGE_SHIFT, tokens & ((1 << PAGE_SHIFT) - 1)
    return tokens // page_size, tokens % page_size


@triton.jit
def _tile_pages(block_table, start_n, offs_n, seqlen_k, key_start, page_size, PAGED: tl.constexpr,
                PAGE_SHIFT: tl.constexpr):
    """Page numbers of the key tile starting at key start_n (see _kv_tile_ptrs): one per row [BLOCK_N] (PAGED 1)
    or one for the tile (PAGED 2); 0 for keys at or past seqlen_k, so a tile past the end (the next tile of the
    last one, when the page numbers are read a tile ahead) reads inside the block table and gets a valid page."""
    if PAGED == 2:
        first = start_n
    else:
        first = start_n + offs_n  # [BLOCK_N]
    page, _ = _page_slot((first + key_start).to(tl.int32), page_size, PAGE_SHIFT)
    return tl.load(block_table + page, mask=first < seqlen_k, other=0)  # one return: a scalar or [BLOCK_N]


@triton.jit
def _kv_tile_ptrs(tile_ptrs, head_base, start_n, offs_kn, offs_d, stride_n, stride_page, pages, page_size,
                  key_start, PAGED: tl.constexpr, PAGE_SHIFT: tl.constexpr):
    """Pointers of a [BLOCK_N, HEAD_DIM_PAD] K or V tile: consecutive rows, or rows gathered through a page
    table (paged KV cache: key j is cache token t = key_start + j, in page block_table[t // page_size] at
    slot t % page_size; any page size), whose entries for this tile _tile_pages read into `pages`.
    Contiguous tiles have key_start folded into tile_ptrs.
    PAGED: 0 contiguous; 1 one page lookup per row; 2 the tile lies in one page (page_size a multiple of
    BLOCK_N and tiles starting at multiples of BLOCK_N, i.e. key_start = 0): one lookup per tile and rows
    at a fixed stride, which the compiler can see. PAGE_SHIFT: see _page_slot."""
    if PAGED == 2:
        _, slot0 = _page_slot((start_n + key_start).to(tl.int32), page_size, PAGE_SHIFT)
        rows = pages.to(tl.int64) * stride_page + (slot0 + (offs_kn - start_n)).to(tl.int64) * stride_n
        return head_base + rows[:, None] + offs_d[None, :]
    if PAGED:
        _, slot = _page_slot((offs_kn + key_start).to(tl.int32), page_size, PAGE_SHIFT)  # [BLOCK_N]
        rows = pages.to(tl.int64) * stride_page + slot.to(tl.int64) * stride_n  # [BLOCK_N]
        return head_base + rows[:, None] + offs_d[None, :]
    return tile_ptrs + start_n * stride_n


@triton.jit
def _key_range(start_m, seqlen_q, seqlen_k, window_left, window_right,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LEFT_BOUNDED: tl.constexpr):
    """Key range of a query block: [lo, full_lo) and [full_hi, hi) need masks, [full_lo, full_hi) none.

    window_left / window_right are finite here: the launcher passes Sq + Sk for an unbounded side and
    right = 0 for causal. Only real rows count (padding rows are never stored). Blocks outside the
    window are never visited, so work scales with the window. Operands of // are kept >= 0.
    Without a left window (LEFT_BOUNDED false) lo = full_lo = 0 at compile time, so the kernels drop
    the leading masked segment (with run-time bounds the D128 backward was 12 % slower; perf-log.md).
    """
    return _key_range_of_rows(start_m, tl.minimum(start_m + BLOCK_M, seqlen_q) - 1, seqlen_q, seqlen_k, window_left,
                              window_right, BLOCK_N, LEFT_BOUNDED)


@triton.jit
def _key_range_of_rows(first_q, last_q, seqlen_q, seqlen_k, window_left, window_right, BLOCK_N: tl.constexpr,
                       LEFT_BOUNDED: tl.constexpr):
    """_key_range of any rows whose query positions lie in [first_q, last_q] (the decode kernel's packed tiles)."""
    diag = seqlen_k - seqlen_q
    first_row = first_q + diag
    last_row = last_q + diag
    full_hi = tl.maximum(tl.minimum(first_row + window_right + 1, seqlen_k), 0) // BLOCK_N * BLOCK_N
    if LEFT_BOUNDED:
        lo = tl.maximum(first_row - window_left, 0) // BLOCK_N * BLOCK_N
        hi = tl.maximum(tl.minimum(last_row + window_right + 1, seqlen_k), lo)
        full_lo = tl.cdiv(tl.maximum(last_row - window_left, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
        return lo, full_lo, full_hi, hi
    hi = tl.maximum(tl.minimum(last_row + window_right + 1, seqlen_k), 0)
    return 0, 0, tl.minimum(full_hi, hi), hi


@triton.jit
def _segment(SEGMENT: tl.constexpr, lo, full_lo, full_hi, hi):
    """Bounds of loop segment 0 (masked blocks before the full ones), 1 (full blocks, no masks) or 2
    (masked blocks after); kernels loop over tl.static_range(3) and pass MASKED = SEGMENT != 1."""
    if SEGMENT == 0:
        return lo, full_lo
    if SEGMENT == 1:
        return full_lo, full_hi
    return full_hi, hi


@triton.jit
def _query_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_LOCAL: tl.constexpr):
    """Query range of a key block (the dK/dV loop), like _key_range seen from the keys' side.

    Key j is seen by queries j - (Sk - Sq) - right <= i <= j - (Sk - Sq) + left. Padding keys past Sk need
    no mask here: they only feed dK/dV rows that are never stored. Without causal or window masks
    lo = full_lo = 0 at compile time and the kernel drops the leading masked segment.
    """
    diag = seqlen_k - seqlen_q
    first_key = start_n - diag
    last_key = tl.minimum(start_n + BLOCK_N, seqlen_k) - 1 - diag
    rows_end = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    hi = tl.cdiv(tl.maximum(tl.minimum(last_key + window_left + 1, seqlen_q), 0), BLOCK_M) * BLOCK_M
    full_hi = tl.maximum(tl.minimum(first_key + window_left + 1, seqlen_q), 0) // BLOCK_M * BLOCK_M
    if IS_LOCAL:
        lo = tl.minimum(tl.maximum(first_key - window_right, 0) // BLOCK_M * BLOCK_M, rows_end)
        hi = tl.maximum(hi, lo)
        full_lo = tl.cdiv(tl.maximum(last_key - window_right, 0), BLOCK_M) * BLOCK_M
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
        return lo, full_lo, full_hi, hi
    return 0, 0, tl.minimum(full_hi, hi), hi


@triton.jit
def _sparse_tile_start(virt, hi, idx_ptr, SPARSE_BLOCK: tl.constexpr):
    """Where the block-sparse loop's tile at offset virt starts: inside the listed block idx_ptr[virt //
    SPARSE_BLOCK]. The loops run over count * SPARSE_BLOCK offsets [lo, hi): one flat loop over every tile of
    every listed block, which the compiler pipelines like the dense one (a loop per block would restart the
    pipeline at every block). They look one tile ahead and carry the start into the next iteration, so a
    tile's K/V (or Q/dO) addresses do not hang on a load of the same iteration: with the index load in the
    iteration, the pipeliner counted one level of indirection and gave each load half the stages (as for
    pages: see PAGE_PREFETCH in fwd._attn_fwd_inner). 0 once virt reaches hi: the last look-ahead reads
    nothing past the list."""
    return tl.load(idx_ptr + virt // SPARSE_BLOCK, mask=virt < hi, other=0) * SPARSE_BLOCK + virt % SPARSE_BLOCK


@triton.jit
def _block_list(FULL: tl.constexpr, Num, Idx, FullNum, FullIdx, off_b, off_h, block,
                stride_num_b, stride_num_h, stride_num_m, stride_idx_b, stride_idx_h, stride_idx_m):
    """(count, first index pointer) of the partial (FULL = 0) or full (FULL = 1) block list of row `block` of a
    block mask for (off_b, off_h): counts Num / FullNum and index lists Idx / FullIdx with their strides."""
    num_off = off_b * stride_num_b + off_h * stride_num_h + block * stride_num_m
    idx_off = off_b * stride_idx_b + off_h * stride_idx_h + block * stride_idx_m
    if FULL:
        return tl.load(FullNum + num_off), FullIdx + idx_off
    return tl.load(Num + num_off), Idx + idx_off


@triton.jit
def _query_block(pid_m, pid_bh, heads_q, group_size, seqlen_q, seqlen_k, Rng, CuSeqlensQ, CuSeqlensK,
                 BLOCK_M: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Where a (query block, batch * query head) program works, shared by the forward, probabilities and dQ
    kernels: (off_b, off_h, off_hk, start_m, seed, rng_base, q_start, seqlen_q, k_start, seqlen_k). The
    dropout counters use the maxima seqlen_q / seqlen_k as given; the returned lengths are this sequence's
    in varlen mode (the caller returns when start_m >= seqlen_q)."""
    off_b = (pid_bh // heads_q).to(tl.int64)
    off_h = (pid_bh % heads_q).to(tl.int64)
    seed, rng_base = _dropout_rng(Rng, pid_bh, seqlen_q, seqlen_k, HAS_DROPOUT)
    q_start, seq_q = _seq_range(CuSeqlensQ, off_b, seqlen_q, IS_VARLEN)
    k_start, seq_k = _seq_range(CuSeqlensK, off_b, seqlen_k, IS_VARLEN)
    return off_b, off_h, off_h // group_size, pid_m * BLOCK_M, seed, rng_base, q_start, seq_q, k_start, seq_k


@triton.jit
def _dropout_base(bh, max_q, max_k):
    """First dropout counter of (batch, query head) bh = b * Hq + h: the (B, Hq, max_q, ceil(max_k / 8))
    layout of _dropout_keep."""
    return bh.to(tl.int64) * max_q * ((max_k + 7) // 8)


@triton.jit
def _dropout_rng(Rng, pid_bh, seqlen_q, seqlen_k, HAS_DROPOUT: tl.constexpr):
    """(seed, first counter of this (batch, head)) of the dropout RNG: counters are laid out as
    (B, Hq, max_q, max_k) (see _dropout_keep); (0, 0) without dropout."""
    seed = 0
    base = 0
    if HAS_DROPOUT:  # one return statement: Triton wants one return type, and the branch is resolved statically
        seed = tl.load(Rng)
        base = _dropout_base(pid_bh, seqlen_q, seqlen_k)
    return seed, base
