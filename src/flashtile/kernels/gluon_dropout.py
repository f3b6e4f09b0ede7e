"""Dropout's keep mask in the Hopper Gluon kernels: the draws of kernels/common._dropout_keep (the portable kernels'
and flashtile.philox's), made for a 64-row wgmma accumulator tile.

Element (b, h, i, j) takes the low 15 bits of 16-bit half j % 2 of output (j % 8) // 2 of the Philox call at
counter rng_base + i * ceil(max_k / 8) + j // 8. A thread of the wgmma accumulator holds, of every group of eight
keys, one pair of consecutive keys (2 (lane % 4) and the next): one 32-bit output of the group's call. So the four
lanes of a quad share their calls. Each lane makes a quarter of them (quad_layout: a group's call lands on lane
g % 4 of the quad), and one exchange inside the warp (to quad_layout's words; the compiler routes it through a
per-warp shared-memory scratch, st.shared + ldmatrix, no CTA barrier: ~3.8 KB) hands every lane its word of each
call: eight Philox calls per thread and 128-key block instead of thirty-two.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .common import PHILOX_ROUNDS

# The Gluon forward recomputes the Philox round keys per key block (dropout_words' FRESH_KEYS) from this head dim on
# (measured at D128; D256 compiled with fewer spills, not timed); below it, the hoisted keys measured faster.
FRESH_KEYS_FWD_MIN_HEAD_DIM = gl.constexpr(128)
# The forward's keep test (dropout_to_p) reads a 15-bit draw as an fp16 bit pattern: up to 0x7BFF the patterns
# order as the integers do, 0x7C00 (inf) lies above them and the NaN patterns compare unordered, counted as kept.
# So one half-precision compare equals the integer one for every threshold up to 0x7C00 (dropout_p <= 0.96875);
# gluon_launch sends larger ones to the portable forward, gluon_bwd_launch to the portable backward.
HALF_COMPARE_MAX_THRESHOLD = 0x7C00


@gluon.constexpr_function
def quad_layout(rows, cols, warps):
    """Layout of a [rows, cols] tile whose rows sit as the wgmma accumulator's (lanes 4-31 step rows by 1, 2, 4,
    warps by 16, a register by 8) and whose column c sits on lane c % 4 of the quad, the rest in registers. Two
    tiles take it: the Philox counters (a column per group of eight keys: each lane of a quad makes a quarter of the
    calls) and the 32-bit draws (word c holds keys 2c and 2c + 1: where the accumulator holds those keys)."""
    return gl.DistributedLinearLayout([[8, 0]] + [[0, c] for c in (4, 8, 16, 32, 64) if c < cols],
                                      [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      [[16 << w, 0] for w in range(warps.bit_length() - 1)], [], [rows, cols])


@gluon.jit
def _mul_a(x):
    """(low, high) 32-bit halves of Philox's round multiplier A = 0xD2511F53 times x (uint32): one mul.wide (one
    IMAD.WIDE) where umulhi and a low multiply compile to two IMADs."""
    return gl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xD2511F53; mov.b64 {$0, $1}, t; }",
                                     "=r,=r,r", [x], dtype=(gl.uint32, gl.uint32), is_pure=True, pack=1)


@gluon.jit
def _mul_b(x):
    """(low, high) halves of Philox's round multiplier B = 0xCD9E8D57 times x (as _mul_a)."""
    return gl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xCD9E8D57; mov.b64 {$0, $1}, t; }",
                                     "=r,=r,r", [x], dtype=(gl.uint32, gl.uint32), is_pure=True, pack=1)


@gluon.jit
def _philox4x32(seed, counter, FRESH_KEYS: gl.constexpr):
    """Philox-4x32 (PHILOX_ROUNDS rounds) of int64 counters under int64 key seed: tl.randint4x(seed, counter,
    PHILOX_ROUNDS)'s four uint32 outputs (the same rounds and key schedule as triton.language.random.philox_impl).
    FRESH_KEYS: the key passes through a mov the compiler may not move or merge, so each call recomputes the round
    keys (one add each) where LLVM would hoist all of them out of the tile loop into 2 * PHILOX_ROUNDS registers,
    which the D128 backward then spills and reloads every tile (session 23, H200 8K: its tile loops 1031 -> 990
    SASS instructions, spill loads / stores 153 -> 57; backward with dropout 1.52 -> 1.38x the one without)."""
    k0 = (seed & 0xFFFFFFFF).to(gl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(gl.uint32)
    if FRESH_KEYS:
        k0, k1 = gl.inline_asm_elementwise("mov.b32 $0, $2; mov.b32 $1, $3;", "=r,=r,r,r", [k0, k1],
                                           dtype=(gl.uint32, gl.uint32), is_pure=False, pack=1)
    c0 = counter.to(gl.uint32)
    c1 = (counter >> 32).to(gl.uint32)
    # Round 1 with c2 = c3 = 0: B * c2 = 0.
    lo_a, hi_a = _mul_a(c0)
    c0, c1, c2, c3 = c1 ^ k0, c0 * 0, hi_a ^ k1, lo_a
    for _ in gl.static_range(PHILOX_ROUNDS - 1):
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
        lo_b, hi_b = _mul_b(c2)
        lo_a, hi_a = _mul_a(c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
    return c0, c1, c2, c3


@gluon.jit
def dropout_rng(Rng, first_bh, seqlen_q, seqlen_k, HAS_DROPOUT: gl.constexpr):
    """(seed, first counter of (batch, query head) first_bh = b * Hq + h, counters per head, per row) of
    kernels/common._dropout_rng's (B, Hq, max_q, ceil(max_k / 8)) layout, seqlen_q / seqlen_k the maxima; zeros
    without dropout (one return statement: the branch is resolved at compile time)."""
    seed = 0
    base = 0
    per_head = 0
    row_groups = 0
    if HAS_DROPOUT:
        seed = gl.load(Rng)
        row_groups = (seqlen_k + 7) // 8
        per_head = seqlen_q.to(gl.int64) * row_groups
        base = first_bh.to(gl.int64) * per_head
    return seed, base, per_head, row_groups


@gluon.jit
def dropout_row_counters(rng_base, row0, row_groups, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                         WARPS: gl.constexpr):
    """[ROWS] int64 first Philox counters of rows row0 + [0, ROWS): rng_base + row * row_groups, row_groups =
    ceil(max_k / 8) (loop-invariant: computed once per tile)."""
    layout: gl.constexpr = quad_layout(ROWS, BLOCK_N // 8, WARPS)
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    return rng_base + rows.to(gl.int64) * row_groups


@gluon.jit
def dropout_words(seed, row_ctr, key0, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, FRESH_KEYS: gl.constexpr):
    """[ROWS, BLOCK_N / 2] uint32 draws of keys key0 + [0, BLOCK_N) (key0 a multiple of 8) in quad_layout: word c
    holds key 2c in its low half and key 2c + 1 in its high half. row_ctr from dropout_row_counters; FRESH_KEYS as
    _philox4x32 (the forward with dropout in session 23's A/B: D128 3.15-3.17 -> 3.04-3.05 ms, D64 4.42 -> 4.52:
    gluon_fwd sets it from FRESH_KEYS_FWD_MIN_HEAD_DIM on)."""
    ROWS: gl.constexpr = row_ctr.shape[0]
    G: gl.constexpr = BLOCK_N // 8
    layout: gl.constexpr = quad_layout(ROWS, G, WARPS)
    groups = key0 // 8 + gl.arange(0, G, layout=gl.SliceLayout(0, layout))  # [G]
    r0, r1, r2, r3 = _philox4x32(seed, row_ctr[:, None] + groups[None, :], FRESH_KEYS)  # [ROWS, G] each, uint32
    # t[m, g, x, y] = output 2x + y of group g, so the reshape puts output a of group g at word 4g + a.
    t = gl.join(gl.join(r0, r1), gl.join(r2, r3)).permute(0, 1, 3, 2)  # [ROWS, G, 2, 2]
    w = t.reshape([ROWS, BLOCK_N // 2])
    return gl.convert_layout(w, quad_layout(ROWS, BLOCK_N // 2, WARPS))  # the exchange inside each warp


@gluon.jit
def dropout_to_p(p, words, threshold, dtype: gl.constexpr):
    """P for the PV wgmma: p ([ROWS, BLOCK_N] fp32) rounded to dtype (fp16 / bf16), 0 where the key's 15-bit draw
    (dropout_words) is below threshold (philox.dropout_threshold, at most HALF_COMPARE_MAX_THRESHOLD). Per pair of
    keys three instructions: the rounding (F2FP), one compare of both draws of their word as fp16 (HSET2 with |x|:
    the absolute value drops the 16th bit, and its 0xFFFF / 0 halves are the mask) and an AND of the two. The
    integer compares and selects on fp32 took five per pair besides the rounding (D128 SASS per warp and key
    block: 943 -> 880 instructions; session 35: the D128 forward with dropout 5 % faster)."""
    # pack=2 hands the asm a thread's consecutive register pair of p: keys 2c and 2c + 1 of the wgmma accumulator,
    # in that order (test_dropout_mask_is_exact checks the draws key by key on the GPU); word c has key 2c's draw
    # in its low half, as cvt.rn.{b}f16x2.f32 d, a, b puts b (the pair's first) in d's low half.
    words = gl.convert_layout(gl.join(words, words).reshape([p.shape[0], p.shape[1]]), p.type.layout)
    thr = gl.zeros_like(words) + threshold.to(gl.uint32) * 0x10001
    if dtype == gl.float16:
        out = gl.inline_asm_elementwise(
            "{ .reg .b32 q, a, m; cvt.rn.f16x2.f32 q, $2, $1; abs.f16x2 a, $3; set.geu.u32.f16x2 m, a, $5; "
            "and.b32 $0, q, m; }", "=r,f,f,r,r,r,r", [p, words, thr], dtype=gl.float16, is_pure=True, pack=2)
    else:
        out = gl.inline_asm_elementwise(
            "{ .reg .b32 q, a, m; cvt.rn.bf16x2.f32 q, $2, $1; abs.f16x2 a, $3; set.geu.u32.f16x2 m, a, $5; "
            "and.b32 $0, q, m; }", "=r,f,f,r,r,r,r", [p, words, thr], dtype=gl.bfloat16, is_pure=True, pack=2)
    return out


@gluon.jit
def dropout_rescale(x, scale, ONCE: gl.constexpr):
    """x times scale = 1 / (1 - dropout_p) under ONCE (the factor a per-score scale of 1.0 left out); x otherwise."""
    if ONCE:
        x = x * scale
    return x


@gluon.jit
def dropout_signed(p, draws, threshold, HAS_DROPOUT: gl.constexpr):
    """Probabilities p >= 0 with the dropout mask in their sign bit: -p where dropped (a dropped 0 becomes -0.0,
    whose products below are 0 either way), so the mask takes no registers of its own after this; p without
    dropout. |p| is the probability again (an operand modifier, no instruction). draws: dropout_draws_t's 15-bit
    draws of p's tile, threshold at most HALF_COMPARE_MAX_THRESHOLD (gluon_bwd_launch sends larger ones to the
    portable backward). Per pair of scores four instructions: one compare of both draws as fp16 (HSET2, as
    dropout_to_p: its halves are 0xFFFF where dropped), a shift of the low half's mask to the sign bit and one
    LOP3 per score (p | (mask & sign)), where the integer compares and selects per score took more."""
    if HAS_DROPOUT:
        thr = gl.zeros_like(draws) + threshold.to(gl.uint16)
        # pack=2 hands the asm a thread's consecutive register pair: two 16-bit draws in one register (the first in
        # its low half) and the pair of p in order.
        p = gl.inline_asm_elementwise(
            "{ .reg .b32 m, lo, a, b; set.lt.u32.f16x2 m, $2, $3; shl.b32 lo, m, 16; mov.b32 a, $4; mov.b32 b, $5; "
            "lop3.b32 a, a, lo, 0x80000000, 0xF8; lop3.b32 b, b, m, 0x80000000, 0xF8; mov.b32 $0, a; mov.b32 $1, b; }",
            "=f,=f,r,r,f,f", [draws, thr, p], dtype=gl.float32, is_pure=True, pack=2)
    return p


@gluon.jit
def dropout_kept_p(p, scale, dtype: gl.constexpr, HAS_DROPOUT: gl.constexpr):
    """Of dropout_signed's p: the kept probabilities times scale = 1 / (1 - dropout_p), 0 where dropped, rounded to
    dtype (fp16 / bf16); p rounded without dropout. One cvt.rn.relu per pair both clamps the dropped (negative)
    entries and rounds (F2FP.RELU), where a max before the rounding took an FMNMX per score."""
    if HAS_DROPOUT:
        # cvt.rn.relu.{b}f16x2.f32 d, a, b puts a in d's upper half: the pair's second element. (One return
        # statement: the frontend types every return, even one behind a constexpr branch not taken.)
        if dtype == gl.float16:
            out = gl.inline_asm_elementwise("cvt.rn.relu.f16x2.f32 $0, $2, $1;", "=r,f,f", [p * scale],
                                            dtype=gl.float16, is_pure=True, pack=2)
        else:
            out = gl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,f,f", [p * scale],
                                            dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        out = p.to(dtype)
    return out


@gluon.jit
def dropout_kept_grad(x, p, scale, HAS_DROPOUT: gl.constexpr):
    """x where dropout_signed's p is kept (p >= 0), times scale; 0 where dropped. A dropped 0 (-0.0) counts as kept:
    callers multiply the result by |p| = 0. A NaN p gives 0 here (dropout_kept_p's cvt.relu keeps it NaN)."""
    if HAS_DROPOUT:
        x = gl.where(p >= 0.0, x * scale, 0.0)
    return x


@gluon.jit
def dropout_draws_t(seed, head_base, row_groups, key0, m, KEYS: gl.constexpr, QUERIES: gl.constexpr,
                    layout: gl.constexpr):
    """[KEYS, QUERIES] uint16 15-bit draws of a transposed tile, keys key0 + [0, KEYS) on rows (key0 a multiple of 8)
    and queries m + [0, QUERIES) on columns, in `layout` (the backward's S^T accumulator). head_base: the head's
    first counter (kernels/common._dropout_base), row_groups = ceil(max_k / 8). A group's eight keys lie on eight
    rows, which the accumulator spreads over lanes: each call is made once (a [KEYS / 8, QUERIES] blocked tile) and
    its draws move into place through shared memory (~7.8 KB of the kernel's)."""
    G: gl.constexpr = KEYS // 8
    calls: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    groups = key0 // 8 + gl.arange(0, G, layout=gl.SliceLayout(1, calls))  # [G]
    queries = m + gl.arange(0, QUERIES, layout=gl.SliceLayout(0, calls))  # [QUERIES]
    r0, r1, r2, r3 = _philox4x32(seed, head_base + queries.to(gl.int64)[None, :] * row_groups + groups[:, None],
                                 True)
    # Output a of group g holds key 8g + 2a in its low half and key 8g + 2a + 1 in its high half.
    r0, r1, r2, r3 = r0 & 0x7FFF7FFF, r1 & 0x7FFF7FFF, r2 & 0x7FFF7FFF, r3 & 0x7FFF7FFF
    d01 = gl.join(gl.join(r0 & 0xFFFF, r0 >> 16), gl.join(r1 & 0xFFFF, r1 >> 16))
    d23 = gl.join(gl.join(r2 & 0xFFFF, r2 >> 16), gl.join(r3 & 0xFFFF, r3 >> 16))
    draws = gl.join(d01, d23).to(gl.uint16)  # [G, QUERIES, half, a % 2, a // 2]
    draws = draws.permute(0, 4, 3, 2, 1).reshape([KEYS, QUERIES])  # key 8g + 4 (a // 2) + 2 (a % 2) + half
    return gl.convert_layout(draws, layout)


@gluon.jit
def dropout_keep_pairs(draws, threshold):
    """The keep mask of dropout_draws_t's draws as uint16: 0xFFFF where kept (draw >= threshold, at most
    HALF_COMPARE_MAX_THRESHOLD), 0 where dropped; a thread's register pair of the tile in one register, made by one
    fp16 compare (as dropout_to_p). dropout_masked / dropout_masked_p apply it."""
    thr = gl.zeros_like(draws) + threshold.to(gl.uint16)
    return gl.inline_asm_elementwise("set.geu.u32.f16x2 $0, $1, $2;", "=r,r,r", [draws, thr], dtype=gl.uint16,
                                     is_pure=True, pack=2)


@gluon.jit
def dropout_masked(x, keep, HAS_DROPOUT: gl.constexpr):
    """x (fp32) where dropout_keep_pairs' keep says kept, 0 where dropped; x itself without dropout. Per pair: the
    mask's halves widened to 32 bits (two PRMT, byte-replicating) and one AND per element."""
    if HAS_DROPOUT:
        x = gl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi, a, b; prmt.b32 lo, $4, 0, 0x1010; prmt.b32 hi, $4, 0, 0x3232; mov.b32 a, $2; "
            "mov.b32 b, $3; and.b32 a, a, lo; and.b32 b, b, hi; mov.b32 $0, a; mov.b32 $1, b; }",
            "=f,=f,f,f,r", [x, keep], dtype=gl.float32, is_pure=True, pack=2)
    return x


@gluon.jit
def dropout_masked_p(p, keep, dtype: gl.constexpr, HAS_DROPOUT: gl.constexpr):
    """p ([ROWS, COLS] fp32) rounded to dtype (fp16 / bf16), 0 where dropout_keep_pairs' keep says dropped: one AND
    of the rounded pair with the mask (the select before the rounding compiled to a select per 16-bit half with the
    pair split and joined again by PRMTs). p rounded without dropout."""
    if HAS_DROPOUT:
        # cvt.rn.{b}f16x2.f32 d, a, b puts b (the pair's first element) in d's low half, where keep has its mask.
        if dtype == gl.float16:
            out = gl.inline_asm_elementwise("{ .reg .b32 q; cvt.rn.f16x2.f32 q, $2, $1; and.b32 $0, q, $3; }",
                                            "=r,f,f,r", [p, keep], dtype=gl.float16, is_pure=True, pack=2)
        else:
            out = gl.inline_asm_elementwise("{ .reg .b32 q; cvt.rn.bf16x2.f32 q, $2, $1; and.b32 $0, q, $3; }",
                                            "=r,f,f,r", [p, keep], dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        out = p.to(dtype)
    return out
