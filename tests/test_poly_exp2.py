"""The Gluon forward's FMA-pipe exp2 (kernels/gluon_fwd._exp2_asm), emulated step by step in PyTorch on the CPU:
the same fp32 constants, the same roundings (add.rm, exact subtractions, fp32 FMAs) and the same integer add of
floor(x) into the polynomial's exponent bits, over a dense range of inputs against float64 2^x."""
import math

import pytest
import torch

gluon_fwd = pytest.importorskip("flashtile.kernels.gluon_fwd")

MAGIC = 1.5 * 2**23


def _f32(x):
    return torch.as_tensor(x, dtype=torch.float64).to(torch.float32)


def _fma(a, b, c):
    """fp32 fma.rn: the product of two fp32 values is exact in float64, then one rounding (double rounding of the
    sum can differ from a true fma in rare ties: far below the tolerances here)."""
    return (a.double() * b.double() + c.double()).to(torch.float32)


def poly_exp2(x):
    """What the PTX of _exp2_asm computes for one emulated score, fp32 in and out."""
    c0, c1, c2, c3 = (_f32(c) for c in gluon_fwd.POLY_EXP2_COEFFS)
    xc = torch.maximum(x, _f32(-127.0))  # max.ftz.f32 (maps -inf to -127)
    # add.rm: the exact sum rounded down to the integer grid of [2^23, 2^24) is MAGIC + floor(xc) (|x| < 2^22)
    r = (torch.floor(xc.double()) + MAGIC).to(torch.float32)
    rb = r - _f32(MAGIC)  # exact (Sterbenz)
    f = xc - rb  # in [0, 1]: exact, except that a tiny negative x rounds to 1 - |x| = 1.0 (n = -1, still right)
    assert bool(((f >= 0) & (f <= 1)).all())
    p = _fma(_fma(_fma(f, c3, c2), f, c1), f, c0)
    bits = (r.view(torch.int32).to(torch.int64) << 23) + p.view(torch.int32).to(torch.int64)  # shl.b32 + add.s32
    bits = ((bits + 2**31) % 2**32) - 2**31  # 32-bit wraparound
    return bits.to(torch.int32).view(torch.float32)


def test_constants_are_fp32_exact_in_the_ptx():
    """The coefficients are fp32 values, and the PTX carries exactly them (0fXXXXXXXX spellings)."""
    for c in gluon_fwd.POLY_EXP2_COEFFS:
        assert float(_f32(c)) == c
    asm = gluon_fwd._exp2_asm.fn(4)  # the PTX of pack 16 with 4 scores on the polynomial
    spelled = gluon_fwd._POLY_EXP2_PTX.value
    for c, hexed in zip(gluon_fwd.POLY_EXP2_COEFFS + (MAGIC, -127.0), spelled):
        assert int(hexed[2:], 16) == int(_f32(c).view(torch.int32)) & 0xFFFFFFFF
    assert asm.count("ex2.approx.ftz.f32") == 12 and asm.count("add.rm.ftz.f32") == 4
    for hexed in spelled:
        assert hexed in asm


def test_relative_error_dense_range():
    """Max relative error over [-126, 8] on a dense grid (every fp32 fraction class): <= 1e-4 (measured 8.6e-5), a
    twentieth of bf16's half ulp; 2^integer is exact (p(0) = 1)."""
    x = torch.cat([torch.linspace(-126.0, 8.0, 2_000_001, dtype=torch.float32),
                   torch.arange(-126, 9, dtype=torch.float32),
                   -torch.logspace(-30, 0, 2001, dtype=torch.float32),  # tiny negatives: p(f) near 1
                   torch.logspace(-30, -1, 2001, dtype=torch.float32)])  # tiny positives (x = s - m rounds above 0)
    got = poly_exp2(x).double()
    ref = torch.exp2(x.double())
    rel = ((got - ref) / ref).abs()
    assert rel.max().item() <= 1.0e-4, rel.max().item()
    ints = torch.arange(-126, 9, dtype=torch.float32)
    assert torch.equal(poly_exp2(ints).double(), torch.exp2(ints.double()))
    assert float(poly_exp2(torch.zeros(1))) == 1.0


def test_large_negative_and_masked_scores_give_zero():
    """Scores masked to -inf give exactly +0.0; below -127 (clamped) too; in [-127, -126) a value below 2^-126
    (ftz territory: nothing P or the row sum can see next to the row maximum's 1)."""
    x = torch.tensor([float("-inf"), -1e30, -3e4, -1000.0, -200.0, -127.0], dtype=torch.float32)
    got = poly_exp2(x)
    assert torch.equal(got, torch.zeros_like(got)) and not torch.signbit(got).any()
    x = torch.linspace(-127.0, -126.0, 10001, dtype=torch.float32)[:-1]
    got = poly_exp2(x)
    assert bool(((got >= 0) & (got < 2.0**-126)).all())


def test_monotone_at_integer_boundaries():
    """The polynomial's end, p(1-) ~ 2 (1 - 8.6e-5), meets the next power of two without a jump larger than the
    error bound; P stays monotone in the score across the boundary."""
    for n in range(-20, 5):
        below = torch.tensor([math.nextafter(float(n), -math.inf)], dtype=torch.float32)
        at = torch.tensor([float(n)], dtype=torch.float32)
        assert float(poly_exp2(below)) <= float(poly_exp2(at)) * (1 + 1e-4)
