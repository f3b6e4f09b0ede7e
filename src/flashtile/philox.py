"""Philox-4x32-10 in PyTorch integer ops, bit-exact with Triton's tl.rand / tl.rand4x, so the CPU path
regenerates the kernels' dropout masks (dropout_uniform is the mask's layout).

Every value lives in an int64 tensor holding an unsigned 32-bit number; 32 x 32-bit products are split
into 16-bit halves so nothing overflows int64.
"""
import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # round multipliers
_ROUNDS = 10  # Triton's default
# tl.rand's scale: the largest float32 such that (2**31 - 1) * scale < 1.
_UNIFORM_SCALE = torch.tensor(4.6566127342e-10, dtype=torch.float32)


def _mul_hi_lo(a, x):
    """(high, low) 32-bit halves of the 64-bit product of the constant a and x (< 2**32)."""
    x_hi, x_lo = x >> 16, x & 0xFFFF
    prod_lo, prod_hi = a * x_lo, a * x_hi  # each < 2**48
    high = (prod_hi + (prod_lo >> 16)) >> 16
    low = (prod_lo + ((prod_hi & 0xFFFF) << 16)) & _MASK32
    return high, low


def randint4x(seed, offsets):
    """tl.randint4x(seed, offsets): the four 32-bit Philox outputs per counter, as int64 values in [0, 2**32).

    seed an int (64-bit key), offsets an int64 tensor of counters."""
    c0, c1 = offsets & _MASK32, (offsets >> 32) & _MASK32
    c2 = c3 = torch.zeros_like(offsets)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed, offsets):
    """tl.randint(seed, offsets): the first of the four outputs."""
    return randint4x(seed, offsets)[0]


def _uniform(bits):
    # Triton reads the bits as int32 and folds negatives with ~x, leaving 31 random bits.
    folded = torch.where(bits >= 2**31, _MASK32 - bits, bits)
    return folded.to(torch.float32) * _UNIFORM_SCALE


def rand(seed, offsets):
    """tl.rand(seed, offsets): float32 uniform in [0, 1), bit-exact with Triton."""
    return _uniform(randint(seed, offsets))


def rand4x(seed, offsets):
    """tl.rand4x(seed, offsets): four float32 uniforms per counter, stacked on a new last dimension."""
    return torch.stack([_uniform(bits) for bits in randint4x(seed, offsets)], -1)


def dropout_uniform(seed, bh, rows, cols, max_q, max_k):
    """The uniform that decides dropout at element (bh, i, j) of a (B * Hq, max_q, max_k) layout (bh, rows,
    cols: int64 tensors that broadcast), as kernels/common._dropout_keep draws it: one Philox call per four
    consecutive keys, counter (bh * max_q + i) * ceil(max_k / 4) + j // 4, output j % 4 of the four."""
    groups = (bh * max_q + rows) * ((max_k + 3) // 4) + cols // 4
    lanes = torch.broadcast_to(cols % 4, groups.shape)
    return torch.gather(rand4x(seed, groups), -1, lanes.unsqueeze(-1)).squeeze(-1)
