"""Philox-4x32 (ROUNDS rounds) in PyTorch integer ops, bit-exact with Triton's tl.randint4x(seed, offsets,
ROUNDS), so the CPU path regenerates the kernels' dropout masks (dropout_bits is the mask's layout,
dropout_threshold its rule).

Every value lives in an int64 tensor holding an unsigned 32-bit number; 32 x 32-bit products are split
into 16-bit halves so nothing overflows int64.
"""
import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # round multipliers
ROUNDS = 7  # kernels/common.PHILOX_ROUNDS (why 7: there)


def _mul_hi_lo(a, x):
    """(high, low) 32-bit halves of the 64-bit product of the constant a and x (< 2**32)."""
    x_hi, x_lo = x >> 16, x & 0xFFFF
    prod_lo, prod_hi = a * x_lo, a * x_hi  # each < 2**48
    high = (prod_hi + (prod_lo >> 16)) >> 16
    low = (prod_lo + ((prod_hi & 0xFFFF) << 16)) & _MASK32
    return high, low


def randint4x(seed, offsets):
    """tl.randint4x(seed, offsets, ROUNDS): the four 32-bit Philox outputs per counter, as int64 values in [0, 2**32).

    seed an int (64-bit key), offsets an int64 tensor of counters."""
    c0, c1 = offsets & _MASK32, (offsets >> 32) & _MASK32
    c2 = c3 = torch.zeros_like(offsets)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed, offsets):
    """tl.randint(seed, offsets, ROUNDS): the first of the four outputs."""
    return randint4x(seed, offsets)[0]


DRAW_BITS = 15  # a key's draw: the low 15 bits of its 16-bit half of a Philox output (why 15: dropout_threshold)
DRAWS = 1 << DRAW_BITS


def dropout_threshold(p):
    """The integer threshold t of dropout probability p: a 15-bit draw r is kept when r >= t, so the keep
    probability is (32768 - t) / 32768. t = round(p * 32768), so t / 32768 is within 1/65536 of p, clamped to
    [1, 32767] (then within 1/32768) so that any p > 0 drops and any p < 1 keeps, each with probability at least
    1/32768; 0 for p == 0 (nothing dropped). 15 bits, not 16: the Hopper forward compares a draw as an fp16 bit
    pattern (kernels/gluon_dropout.dropout_to_p), whose order is the integers' only without the sign bit."""
    if p == 0:
        return 0
    return min(max(round(p * DRAWS), 1), DRAWS - 1)


def dropout_bits(seed, bh, rows, cols, max_q, max_k):
    """The 15-bit draw (int64 in [0, 32768)) that decides dropout at element (bh, i, j) of a (B * Hq, max_q, max_k)
    layout (bh, rows, cols: int64 tensors that broadcast), as kernels/common._dropout_keep draws it: one Philox
    call per eight consecutive keys, counter (bh * max_q + i) * ceil(max_k / 8) + j // 8; key j takes output
    (j % 8) // 2 of the four, the low 15 bits of its low 16-bit half for even j and of its high half for odd j."""
    groups = (bh * max_q + rows) * ((max_k + 7) // 8) + cols // 8
    outputs = torch.stack(randint4x(seed, groups), -1)  # [..., 4]
    word = torch.gather(outputs, -1, torch.broadcast_to((cols % 8) // 2, groups.shape).unsqueeze(-1)).squeeze(-1)
    return (word >> (16 * (cols % 2))) & (DRAWS - 1)


def dropout_bits_block(seed, bh, rows, col_start, col_end, max_q, max_k):
    """dropout_bits at the columns [col_start, col_end) ([..., col_end - col_start] for rows [..., 1]), with one
    Philox evaluation per eight keys instead of one per key (the CPU path's tiles)."""
    first, last = col_start // 8, (col_end + 7) // 8
    groups = (bh * max_q + rows) * ((max_k + 7) // 8) + torch.arange(first, last)  # [..., G]
    outputs = torch.stack(randint4x(seed, groups), -1)  # [..., G, 4]
    bits = torch.stack([outputs, outputs >> 16], -1).flatten(-3) & (DRAWS - 1)  # [..., 8 G]: key 8 g + 2 o + half
    return bits[..., col_start - 8 * first:col_end - 8 * first]


def dropout_keep_mask(seed, bh, rows, cols, max_q, max_k, p):
    """Boolean keep mask of dropout probability p at the elements of dropout_bits: its draw >= dropout_threshold(p)."""
    return dropout_bits(seed, bh, rows, cols, max_q, max_k) >= dropout_threshold(p)
