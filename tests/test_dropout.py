"""Dropout: the mask is drawn once from torch's generator and regenerated in the backward.

The returned attention probabilities carry the mask in their sign bit; out, dq, dk, dv (and the bias and
sink gradients) must equal the float64 reference computed with that mask.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

import flashtile
from conftest import DEVICE
from flashtile import philox
from test_attention import _check_lse
from test_varlen import cu, packed
from utils import assert_close_rule, make_qkv

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, features)
CASES = {
    "mha": (1, 45, 70, 2, 2, 32, False, torch.float16, {}),
    "gqa-causal": (2, 70, 45, 4, 2, 40, True, torch.float16, {}),
    "mqa-window": (1, 60, 60, 3, 1, 32, False, torch.float32, dict(window_size=(10, 5))),
    "causal-window-q1": (2, 1, 33, 2, 1, 16, True, torch.float32, dict(window_size=(8, -1))),
    "everything": (2, 37, 50, 4, 2, 24, True, torch.float32,
                   dict(window_size=(20, -1), softcap=5.0, alibi=True, bias=True, sink=True)),
}


def _features(case_features, batch, heads_q, seqlen_q, seqlen_k, device):
    """Materialize a case's features: ALiBi slopes, a bias and sink logits that require gradients."""
    features = dict(case_features)
    gen = torch.Generator().manual_seed(11)
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(heads_q, generator=gen).to(device)
    if features.pop("bias", False):
        features["attn_bias"] = torch.randn(heads_q, seqlen_q, seqlen_k, generator=gen).to(device).requires_grad_()
    if features.pop("sink", False):
        features["sink"] = torch.randn(heads_q, generator=gen).to(device).requires_grad_()
    return features


def _reference_grads(leaves, names, dout, dropout_p, keep, causal, features):
    """(out, grads of leaves) of attention_ref in float64 and in the leaves' own dtype."""
    results = []
    for upcast in (True, False):
        copies = {n: x.detach().clone().requires_grad_() for n, x in zip(names, leaves)}
        kwargs = dict(features, **{n: copies[n] for n in names if n in ("attn_bias", "sink")})
        ref = flashtile.attention_ref(copies["q"], copies["k"], copies["v"], causal=causal, upcast=upcast,
                                      dropout_p=dropout_p, dropout_mask=keep, **kwargs)
        results.append((ref.detach(), *torch.autograd.grad(ref, list(copies.values()), dout.to(ref.dtype))))
    return results


def _softmax_ref(q, k, causal, **features):
    """The float64 attention probabilities (B, Hq, Sq, Sk): attention_ref with one-hot values."""
    batch, seqlen_k, heads_kv = k.shape[:3]
    eye = torch.eye(seqlen_k, dtype=torch.float64, device=k.device)[None, :, None].expand(batch, -1, heads_kv, -1)
    return flashtile.attention_ref(q.detach(), k.detach(), eye, causal=causal, **features).detach().permute(0, 2, 1, 3)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_dropout_matches_reference_with_returned_mask(backend, case):
    _, device = backend
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, case_features = CASES[case]
    p = 0.3
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device)
    features = _features(case_features, batch, heads_q, seqlen_q, seqlen_k, device)
    torch.manual_seed(0)
    out, lse, probs = flashtile.flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True,
                                                **features)
    assert probs.shape == (batch, heads_q, seqlen_q, seqlen_k) and probs.dtype == dtype
    keep = ~torch.signbit(probs)
    names = ["q", "k", "v"] + [n for n in ("attn_bias", "sink") if n in features]
    leaves = [q, k, v] + [features[n] for n in names[3:]]
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device=device)
    grads = torch.autograd.grad(out, leaves, dout)
    plain = {n: x for n, x in features.items() if n not in ("attn_bias", "sink")}
    ref64, ref_lowp = _reference_grads(leaves, names, dout, p, keep, causal, plain)
    for name, got, r64, rlow in zip(["out"] + [f"d{n}" for n in names], (out, *grads), ref64, ref_lowp):
        assert got.shape == r64.shape
        assert_close_rule(name, got, r64, rlow, dtype)
    _check_lse(q, k, lse, causal, None, **features)
    # |probs| is the undropped softmax (the sink's share excluded).
    want = _softmax_ref(q, k, causal, **features)
    torch.testing.assert_close(probs.abs().double(), want, atol=2e-3 if dtype == torch.float16 else 1e-5, rtol=0)


def test_dropout_lse_gradient(backend):
    """A gradient flowing into lse (of the undropped softmax) combines with dropout exactly."""
    _, device = backend
    q, k, v = make_qkv(1, 33, 47, 2, 1, 16, torch.float32, device)
    torch.manual_seed(1)
    out, lse, probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.4, causal=True, return_attn_probs=True)
    w = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2)).to(device)
    grads = torch.autograd.grad(out.sum() + (lse * w).sum(), (q, k, v))
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out_r, lse_r = flashtile.attention_ref(*leaves, causal=True, return_lse=True, dropout_p=0.4,
                                           dropout_mask=~torch.signbit(probs))
    ref = torch.autograd.grad(out_r.sum() + (lse_r * w.double()).sum(), leaves)
    for got, r in zip(grads, ref):
        torch.testing.assert_close(got.double(), r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropped_fraction_matches_p(backend, p):
    """Over 2 * 2 * 128 * 128 = 65536 draws the dropped fraction is within 6 standard deviations of p."""
    _, device = backend
    q, k, v = make_qkv(2, 128, 128, 2, 2, 16, torch.float32, device, requires_grad=False)
    torch.manual_seed(3)
    out, _, probs = flashtile.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    dropped = torch.signbit(probs).double().mean().item()
    assert abs(dropped - p) <= 6 * math.sqrt(p * (1 - p) / probs.numel()), f"dropped {dropped:.4f}, p = {p}"
    # Independent of position: each query row drops about p of its 128 keys too.
    per_row = torch.signbit(probs).double().mean(-1)
    assert (per_row - p).abs().max().item() <= 6 * math.sqrt(p * (1 - p) / 128)
    assert torch.isfinite(out).all()


def test_seed_reproducibility(backend):
    """torch.manual_seed reproduces out and gradients bitwise; another seed or the next call differs."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 40, 2, 1, 16, torch.float32, device)

    def run():
        out = flashtile.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
        return (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))

    torch.manual_seed(5)
    first, following = run(), run()
    torch.manual_seed(5)
    again = run()
    torch.manual_seed(6)
    other = run()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], following[0])
    assert not torch.equal(first[0], other[0])


@pytest.mark.skipif(DEVICE != "cpu", reason="needs the kernels defined for the interpreter (on the GPU, "
                    "test_philox_counters checks the kernels' mask against flashtile.philox)")
def test_backends_draw_the_same_mask(monkeypatch):
    """The CPU path (flashtile.philox) regenerates the Triton kernels' Philox mask bit for bit."""
    q, k, v = make_qkv(2, 50, 70, 4, 2, 16, torch.float32, "cpu")
    results = []
    for interpret in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        torch.manual_seed(9)
        out, _, probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.4, causal=True, return_attn_probs=True)
        results.append((out, torch.signbit(probs), *torch.autograd.grad(out.sum(), (q, k, v))))
    (out_t, mask_t, *grads_t), (out_c, mask_c, *grads_c) = results
    assert torch.equal(mask_t, mask_c)
    for got, want in zip((out_t, *grads_t), (out_c, *grads_c)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_dropout_factor_matches_the_select(monkeypatch, dtype):
    """The dK/dV kernel's keep mask as a factor (0 or 1 / (1 - p), multiplied in: what ROCm builds run,
    bwd_launch._dropout_as_factor) gives the select form's gradients (deterministic=True: the portable kernels on
    every GPU). Bit for bit in the interpreter; a compiled kernel may contract the factor's product with the next
    operation into one FMA (one rounding instead of two; the select between them prevents it): dS = P (dP Z r - delta)
    feeds dK (and dQ in the fused backward), and fp32's FMA-tile dV moved too (session 49 on the H200: fp16 dV and
    dQ bitwise, dK and fp32 dV within a few units in the last place)."""
    from flashtile import bwd_launch

    q, k, v = make_qkv(2, 50, 70, 4, 2, 32, dtype, DEVICE)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(dtype=dtype, device=DEVICE)
    asked, grads = [], []
    for factor in (False, True):
        monkeypatch.setattr(bwd_launch, "_dropout_as_factor", lambda factor=factor: asked.append(factor) or factor)
        torch.manual_seed(4)
        out = flashtile.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    assert asked == [False, True]
    for name, got, want in zip(("dq", "dk", "dv"), *grads):
        if DEVICE == "cpu":
            assert torch.equal(got, want), name
        else:  # two roundings or one per element: a few units in the last place of the gradients' dtype
            tol = 1e-5 if dtype == torch.float32 else 4e-3
            torch.testing.assert_close(got, want, atol=tol * want.abs().max().item(), rtol=tol,
                                       msg=lambda detail, name=name: f"{name}: {detail}")


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_philox_counters(backend, p):
    """The mask layout: element (b, h, i, j) takes output (j % 8) // 2 of Philox counter
    ((b * H + h) * Sq + i) * ceil(Sk / 8) + j // 8 (an Sk that is not a multiple of 8 included), the low 15 bits
    of its low 16-bit half for even j and of its high half for odd j, and is kept when they are >=
    dropout_threshold(p); the kernels' tl.randint4x (on the GPU too) is flashtile.philox bit for bit. p = 0.3
    (threshold 9830) reads every bit of the 15, and the output word's bits 15 and 31 must not count."""
    _, device = backend
    shape = (2, 300, 500, 3, 3, 64) if device == "cuda" else (2, 9, 13, 3, 3, 16)
    q, k, v = make_qkv(*shape, torch.float32, device, requires_grad=False)
    torch.manual_seed(4)
    _, _, probs = flashtile.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    torch.manual_seed(4)
    seed = torch.randint(2**63 - 1, (1,), dtype=torch.int64, device=device).item()  # the draw flashtile makes
    B, H, Sq, Sk = probs.shape
    bh = torch.arange(B * H).reshape(B, H, 1, 1)
    i, j = torch.arange(Sq).reshape(-1, 1), torch.arange(Sk)
    groups = (bh * Sq + i) * ((Sk + 7) // 8) + j // 8
    outputs = torch.stack(philox.randint4x(seed, groups), -1)  # [B, H, Sq, Sk, 4]
    word = torch.gather(outputs, -1, ((j % 8) // 2).expand(B, H, Sq, Sk)[..., None])[..., 0]
    bits = torch.where(j % 2 == 0, word & 0x7FFF, (word >> 16) & 0x7FFF)
    assert philox.dropout_threshold(p) == round(p * 32768)
    keep = bits >= round(p * 32768)
    assert torch.equal(keep, ~torch.signbit(probs.cpu()))
    assert torch.equal(bits, philox.dropout_bits(seed, bh, i, j, Sq, Sk))
    assert torch.equal(keep, philox.dropout_keep_mask(seed, bh, i, j, Sq, Sk, p))
    for start, end in ((0, Sk), (5, 11), (8, 9)):  # the CPU path's per-tile form, tiles not aligned to 8 included
        assert torch.equal(bits[..., start:end], philox.dropout_bits_block(seed, bh, i, start, end, Sq, Sk))


@triton.jit
def _randint4x_kernel(seed, Offsets, Out, N: tl.constexpr, ROUNDS: tl.constexpr):
    cols = tl.arange(0, N)
    r0, r1, r2, r3 = tl.randint4x(seed, tl.load(Offsets + cols), ROUNDS)  # uint32 each
    tl.store(Out + cols, r0.to(tl.int64))
    tl.store(Out + N + cols, r1.to(tl.int64))
    tl.store(Out + 2 * N + cols, r2.to(tl.int64))
    tl.store(Out + 3 * N + cols, r3.to(tl.int64))


def test_philox_is_tritons_randint4x():
    """flashtile.philox.randint4x equals Triton's own tl.randint4x at kernels/common.PHILOX_ROUNDS rounds (7, as
    flash-attn's CUDA kernels), the generator the portable kernels call (the Gluon kernels' copy is checked
    against philox on the GPU: test_gluon_dropout.py / test_gluon_bwd_features.py), with counters past 2**32 and a
    64-bit seed."""
    from flashtile.kernels.common import PHILOX_ROUNDS
    assert philox.ROUNDS == PHILOX_ROUNDS == 7
    seed = 0x1234_5678_9ABC_DEF1
    # eight counters (the kernel's tl.arange needs a power of two), some past 2**32
    offsets = torch.tensor([0, 1, 2, 7, 2**31 - 1, 2**32 + 5, 3 * 2**40 + 11, 2**62 + 3], dtype=torch.int64)
    out = torch.empty(4, offsets.numel(), dtype=torch.int64, device=DEVICE)
    _randint4x_kernel[(1,)](seed, offsets.to(DEVICE), out, offsets.numel(), PHILOX_ROUNDS)
    assert torch.equal(out.cpu(), torch.stack(philox.randint4x(seed, offsets)))
    # Not the 10-round stream (Triton's default) the kernels drew before
    _randint4x_kernel[(1,)](seed, offsets.to(DEVICE), out, offsets.numel(), 10)
    assert not torch.equal(out.cpu(), torch.stack(philox.randint4x(seed, offsets)))


@pytest.mark.parametrize("p", [1e-12, 0.5 / 32768, 1 / 32768, 1e-4, 0.1, 0.17, 0.3, 0.5, 0.9, 0.96875, 0.97, 1 - 1e-4,
                               1 - 1e-12])
def test_dropout_threshold_rule(p):
    """The 15-bit rule keeps a draw r in [0, 32768) when r >= dropout_threshold(p): with probability
    (32768 - t) / 32768, within 1/32768 of 1 - p; any p > 0 drops and any p < 1 keeps with some probability."""
    t = philox.dropout_threshold(p)
    assert isinstance(t, int) and 1 <= t <= 32767
    keep_prob = (32768 - t) / 32768
    assert (torch.arange(32768) >= t).sum().item() == 32768 - t  # the rule over every 15-bit draw
    assert abs(keep_prob - (1 - p)) <= 1 / 32768
    if 0.5 / 32768 < p < 1 - 0.5 / 32768:  # unclamped: round to nearest
        assert abs(keep_prob - (1 - p)) <= 0.5 / 32768
    assert philox.dropout_threshold(0.0) == 0


def test_tiny_dropout_p_still_drops():
    """p = 1e-7 rounds to threshold 1, not 0: a draw of exactly 0 is dropped, so about one element in 32768 is
    (2**20 draws: 32 expected, within 6 standard deviations), and the draws are uniform over the 15 bits."""
    seed = 123456789
    bh, rows, cols = torch.arange(4).reshape(4, 1, 1), torch.arange(256).reshape(256, 1), torch.arange(1024)
    bits = philox.dropout_bits_block(seed, bh, rows, 0, 1024, 256, 1024)
    assert torch.equal(bits[..., 3:700:97], philox.dropout_bits(seed, bh, rows, cols[3:700:97], 256, 1024))
    dropped = (bits < philox.dropout_threshold(1e-7)).sum().item()
    expected = bits.numel() / 32768
    assert 0 < dropped and abs(dropped - expected) <= 6 * math.sqrt(expected), dropped
    assert dropped == (bits == 0).sum().item()
    # Each of the 15 bits is set in half of the draws (within 6 standard deviations), and none above them.
    for bit in range(15):
        ones = ((bits >> bit) & 1).double().mean().item()
        assert abs(ones - 0.5) <= 6 * math.sqrt(0.25 / bits.numel()), (bit, ones)
    assert bits.max().item() < 32768


def test_tiny_dropout_p_drops_in_the_kernels(backend):
    """The kernels (and the CPU path) get the threshold, not a rounded-away p: with p = 1e-7, 2 * 2 * 512 * 512
    scores lose about 32 (threshold 1: the 15-bit draws equal to 0), exactly those of flashtile.philox."""
    name, device = backend
    if name == "triton" and device == "cpu":
        pytest.skip("a million scores take the interpreter ~20 s; test_philox_counters checks its threshold")
    q, k, v = make_qkv(2, 512, 512, 2, 2, 16, torch.float32, device, requires_grad=False)
    torch.manual_seed(12)
    _, _, probs = flashtile.flash_attn_func(q, k, v, dropout_p=1e-7, return_attn_probs=True)
    torch.manual_seed(12)
    seed = torch.randint(2**63 - 1, (1,), dtype=torch.int64, device=device).item()
    dropped = torch.signbit(probs.cpu())
    assert 0 < dropped.sum().item() <= 32 + 6 * 6
    keep = philox.dropout_keep_mask(seed, torch.arange(4).reshape(2, 2, 1, 1), torch.arange(512)[:, None],
                                    torch.arange(512), 512, 512, 1e-7)
    assert torch.equal(~dropped, keep)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_dropout(backend, causal):
    """Each sequence against the reference with its slice of the returned (B, H, max_q, max_k) mask."""
    _, device = backend
    seqlens_q, seqlens_k = [1, 17, 0, 40, 33], [5, 1, 9, 40, 0]
    max_q, max_k = 41, 45  # larger than needed: the layout follows the given maxima
    dtype, p = torch.float32, 0.2
    q, k, v = packed(seqlens_q, seqlens_k, 4, 2, 16, dtype, device)
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    torch.manual_seed(2)
    out, lse, probs = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=p,
                                                       causal=causal, return_attn_probs=True)
    assert probs.shape == (len(seqlens_q), 4, max_q, max_k) and lse.shape == (4, q.shape[0])
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for b, (lq, lk) in enumerate(zip(seqlens_q, seqlens_k)):
        assert torch.all(probs[b, :, lq:] == 0) and torch.all(probs[b, :, :, lk:] == 0)
        if lq == 0 or lk == 0:
            continue
        qs, ks = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
        keep = ~torch.signbit(probs[b:b + 1, :, :lq, :lk])
        leaves = [x.detach()[s][None] for x, s in ((q, qs), (k, ks), (v, ks))]
        ref64, ref_lowp = _reference_grads(leaves, ["q", "k", "v"], dout[qs][None], p, keep, causal, {})
        got = (out[qs], grads[0][qs], grads[1][ks], grads[2][ks])
        for name, g, r64, rlow in zip(("out", "dq", "dk", "dv"), got, ref64, ref_lowp):
            assert_close_rule(f"sequence {b} {name}", g[None], r64, rlow, dtype)


def test_varlen_dropout_equals_dense(backend):
    """Equal-length sequences packed use the dense batch's counters: bitwise the same result and mask."""
    _, device = backend
    q, k, v = packed([30] * 3, [20] * 3, 2, 1, 16, torch.float16, device, seed=5)
    torch.manual_seed(8)
    out, _, probs = flashtile.flash_attn_varlen_func(q, k, v, cu([30] * 3, device), cu([20] * 3, device), 30, 20,
                                                     dropout_p=0.5, causal=True, return_attn_probs=True)
    torch.manual_seed(8)
    dense, _, dense_probs = flashtile.flash_attn_func(q.reshape(3, 30, 2, 16), k.reshape(3, 20, 1, 16),
                                                      v.reshape(3, 20, 1, 16), dropout_p=0.5, causal=True,
                                                      return_attn_probs=True)
    torch.testing.assert_close(out.reshape(3, 30, 2, 16), dense, rtol=0, atol=0)
    assert torch.equal(torch.signbit(probs), torch.signbit(dense_probs))


def test_zero_dropout_is_the_plain_path(backend):
    """dropout_p=0 draws nothing from the generator, returns no probabilities (as flash-attn) and is bitwise
    the default call."""
    _, device = backend
    q, k, v = make_qkv(1, 30, 30, 2, 2, 16, torch.float32, device, requires_grad=False)
    state = torch.get_rng_state()
    out, _, probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.0, causal=True, return_attn_probs=True)
    assert probs is None
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(out, flashtile.flash_attn_func(q, k, v, causal=True))


def test_dropout_under_torch_compile(monkeypatch):
    """fullgraph=True traces the seed draw and the ops; with the same torch seed the compiled step equals eager."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = make_qkv(1, 24, 24, 2, 1, 16, torch.float32, "cpu")

    def layer(q, k, v):
        return flashtile.flash_attn_func(q, k, v, dropout_p=0.3, causal=True).square().sum()

    torch.manual_seed(0)
    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(q, k, v)
    got_grads = torch.autograd.grad(got, (q, k, v))
    torch.manual_seed(0)
    want = layer(q, k, v)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, torch.autograd.grad(want, (q, k, v))):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("p,exc,match", [
    (-0.1, ValueError, r"dropout_p must be in \[0, 1\), got -0.1"),
    (1.0, ValueError, r"dropout_p must be in \[0, 1\), got 1.0"),
    (float("nan"), ValueError, r"dropout_p must be in \[0, 1\), got nan"),
    ("0.1", TypeError, "dropout_p must be a float, got str"),
    (True, TypeError, "dropout_p must be a float, got bool"),
], ids=["negative", "one", "nan", "str", "bool"])
def test_bad_dropout_p(p, exc, match):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, torch.float32, "cpu")
    with pytest.raises(exc, match=match):
        flashtile.flash_attn_func(q, k, v, dropout_p=p)
    with pytest.raises(exc, match=match):
        flashtile.flash_attn_varlen_func(q[0], k[0], v[0], cu([8], "cpu"), cu([8], "cpu"), 8, 8, dropout_p=p)


def test_dropout_through_the_block_sparse_loops():
    """The kernels carry dropout through the block-sparse loops too (flashtile.attention takes no dropout, so only
    the launcher reaches them): a causal block mask with dropout equals the built-in causal with the same seed,
    forward and backward, since the keep mask depends only on the element."""
    from flashtile import bwd_launch, launch
    from flashtile.flex.api import _Spec

    q, k, v = make_qkv(1, 96, 96, 2, 1, 32, torch.float32, DEVICE, requires_grad=False)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    rng = torch.tensor([1234567], dtype=torch.int64, device=DEVICE)
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 96, 96, block_size=(32, 32),
                                             device=DEVICE)
    mods = _Spec(None, None, block_mask.mask_mod, block_mask).mod_args()
    assert mods.block_size is not None  # the BLOCK_SPARSE loops
    scale = 0.2
    want, want_lse = launch._flash_attn_forward(q, k, v, scale, -1, 0, 0.0, None, None, dropout_p=0.3, rng=rng)
    got, got_lse = launch._flash_attn_forward(q, k, v, scale, -1, -1, 0.0, None, None, dropout_p=0.3, rng=rng,
                                              mods=mods)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want, launch._flash_attn_forward(q, k, v, scale, -1, 0, 0.0, None, None)[0])
    want_grads = bwd_launch._flash_attn_backward(dout, q, k, v, want, want_lse, None, scale, -1, 0, 0.0, None,
                                                 dropout_p=0.3, rng=rng)[:3]
    got_grads = bwd_launch._flash_attn_backward(dout, q, k, v, got, got_lse, None, scale, -1, -1, 0.0, None,
                                                dropout_p=0.3, rng=rng, mods=mods)[:3]
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
