"""Dropout in the Hopper Gluon forward: its support rule and launch arguments on CPU; on sm90 (GPU tier) out against
the float64 reference with philox's keep mask, the mask exactly, varlen draws, and flash_attn_func's routing."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants, launch, philox
from gluon_fwd_utils import FEATURE_SHAPES, ON_HOPPER, _cu, _dropout_keep, _feature_inputs, _packed
from utils import assert_close_rule, make_qkv, record_calls


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_dropout_support_rule(as_if_hopper):
    """Dropout with its int64 seed on q's device, at every head dim, alone or with the score features; not without a
    seed, not p >= 1, not with a bias (the draws' shared memory does not fit beside the bias ring), not above
    p = 0.96875 (threshold 0x7C00: the fp16 compare of gluon_dropout.dropout_to_p holds up to there)."""
    seed = torch.zeros(1, dtype=torch.int64)
    for head_dim in (64, 128, 256):
        q, k, v = make_qkv(2, 300, 500, 4, 2, head_dim, torch.bfloat16, "cpu", requires_grad=False)
        assert gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, rng=seed)
        assert gluon_launch.gluon_supported(q, k, v, causal=True, window_size=(64, 0), softcap=5.0,
                                            alibi_slopes=torch.rand(4), sink=torch.zeros(4), dropout_p=0.1, rng=seed)
        assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.1)
        assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, rng=seed.int())
        assert not gluon_launch.gluon_supported(q, k, v, dropout_p=1.0, rng=seed)
        assert gluon_launch.gluon_supported(q, k, v, dropout_p=0.96875, rng=seed)
        assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.969, rng=seed)  # threshold 0x7C08
        bias = torch.zeros(1, 4, 300, 504, dtype=torch.bfloat16)[..., :500]
        assert gluon_launch.gluon_supported(q, k, v, attn_bias=bias)
        assert not gluon_launch.gluon_supported(q, k, v, attn_bias=bias, dropout_p=0.1, rng=seed)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_dropout_launch_args():
    """Dropout: the seed, 1 / (1 - p) and philox's threshold as the last three arguments and HAS_DROPOUT, the rest
    of the launch unchanged; a three-consumer variant takes the default's two consumers (the draws' registers)."""
    q = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16)
    out, lse, seed = torch.empty_like(q), torch.empty(2, 4, 1000), torch.zeros(1, dtype=torch.int64)
    config = gluon_variants.VARIANTS["default"][64]
    grid, args, constexprs, options = gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, True, config)
    grid_d, args_d, constexprs_d, options_d = gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, True, config,
                                                                             dropout_p=0.1, rng=seed)
    assert args_d[-3] is seed and args_d[-2:] == (1 / 0.9, philox.dropout_threshold(0.1))
    assert args[-3] is lse and args[-2:] == (1.0, 0) and "HAS_DROPOUT" not in constexprs
    assert constexprs_d.pop("HAS_DROPOUT") and constexprs_d == constexprs and (grid_d, options_d) == (grid, options)
    assert gluon_variants.takes_config("d64-3wg", 64).consumers == 3
    assert gluon_variants.takes_config("d64-3wg", 64, dropout_p=0.1) is gluon_variants.VARIANTS["default"][64]


# (id, causal, window_size, softcap, alibi, sink) with dropout 0.3 on top
DROPOUT_FEATURES = [("plain", False, (-1, -1), 0.0, None, False), ("causal", True, (-1, -1), 0.0, None, False),
                    ("window-softcap-alibi-sink", False, (200, 100), 30.0, "bh", True)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", FEATURE_SHAPES[1:], ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in
                                                           FEATURE_SHAPES[1:]])
@pytest.mark.parametrize("feature", DROPOUT_FEATURES, ids=[f[0] for f in DROPOUT_FEATURES])
def test_dropout_matches_reference(feature, shape, head_dim):
    """Dropout in the Gluon forward (gluon_dropout's draws): out equals the float64 reference with philox's keep mask
    (the portable kernels' draws), lse the undropped one, and out the portable kernel's (same mask) within bf16
    rounding."""
    causal, q, k, v, feats = _feature_inputs(feature, shape, head_dim)
    seed, p = 1234567890123, 0.3
    rng = torch.tensor([seed], dtype=torch.int64, device="cuda")
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, dropout_p=p, rng=rng, **feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, dropout_p=p, rng=rng, **feats)
    (batch, seqlen_q, heads_q, _), seqlen_k = q.shape, k.shape[1]
    keep = _dropout_keep(seed, batch, heads_q, seqlen_q, seqlen_k, p)
    ref_feats = dict(feats, dropout_p=p, dropout_mask=keep)
    ref = flashtile.attention_ref(q, k, v, causal=causal, **ref_feats)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False, **ref_feats),
                      torch.bfloat16)
    _, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, **feats)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)
    window_left, window_right = (-1, 0) if causal else feats["window_size"]
    out_portable, _ = launch._portable_forward(q, k, v, q.shape[-1] ** -0.5, window_left, window_right,
                                               feats["softcap"], feats["alibi_slopes"], feats["sink"], dropout_p=p,
                                               rng=rng)
    # Within a bf16 rounding of each other: 1 / (1 - p) lifts some outputs to 4, where one bf16 step is 2^-5
    # (session 35: one such element, the two kernels one step apart).
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=2 ** -7)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("p, dtype", [(0.3, torch.bfloat16), (0.96875, torch.bfloat16), (0.6, torch.float16),
                                      (0.01, torch.bfloat16)], ids=["p0.3", "p0.96875", "p0.6-fp16", "p0.01"])
def test_dropout_mask_is_exact(head_dim, p, dtype):
    """q = 0 makes every probability 1 / Sk, and v[j] = the one-hot row e_(j % D) makes out[i, c] * Sk * (1 - p) the
    number of kept keys j = c (mod D) of row i: it must equal the count from philox's mask exactly, so a single
    misplaced draw fails (a comparison within bf16 tolerance would not see it). p = 0.96875 is the largest the
    kernel's fp16 compare serves (threshold 0x7C00): every key it keeps has a draw of inf's or a NaN's pattern;
    p = 0.01 (threshold 328) compares against a subnormal fp16 pattern."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, seed = 2, 300, 1000, 4, 2, 77
    q = torch.zeros(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda").to(dtype)
    one_hot = torch.nn.functional.one_hot(torch.arange(seqlen_k, device="cuda") % head_dim, head_dim).float()
    v = one_hot.to(dtype)[None, :, None].expand(batch, -1, heads_kv, -1).contiguous()
    out, _ = gluon_launch.gluon_forward(q, k, v, dropout_p=p, rng=torch.tensor([seed], device="cuda"))
    counts = _dropout_keep(seed, batch, heads_q, seqlen_q, seqlen_k, p).float() @ one_hot  # (B, Hq, Sq, D)
    got = (out.float() * (seqlen_k * (1 - p))).round().permute(0, 2, 1, 3)
    assert torch.equal(got, counts)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
def test_varlen_dropout_matches_dense_draws(head_dim):
    """Varlen with dropout: each sequence's draws are those of a (B, Hq, max_seqlen_q, max_seqlen_k) batch at its
    own positions, as the portable varlen kernel draws them (same output within bf16 rounding)."""
    seqlens_q, seqlens_k = [300, 0, 129, 777], [500, 70, 129, 700]
    q, k, v = _packed(seqlens_q, seqlens_k, 4, 2, head_dim, device="cuda")
    cu_q, cu_k = _cu(seqlens_q, "cuda"), _cu(seqlens_k, "cuda")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k))
    rng = torch.tensor([42], dtype=torch.int64, device="cuda")
    for causal in (False, True):
        assert gluon_launch.gluon_supported(q, k, v, causal=causal, dropout_p=0.2, rng=rng, **varlen)
        out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, dropout_p=0.2, rng=rng, **varlen)
        out_portable, lse_portable = launch._portable_forward(q, k, v, head_dim ** -0.5, -1, 0 if causal else -1, 0.0,
                                                              None, None, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                              dropout_p=0.2, rng=rng)
        torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
        torch.testing.assert_close(lse, lse_portable, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_func_dropout_takes_gluon(monkeypatch, causal):
    """flash_attn_func with dropout runs the Gluon forward where configs.py wants it; under one torch seed its output
    and the (portable) backward's gradients equal the portable forward's."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(2, 1024, 1024, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    dout = torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(5)
    out = flashtile.flash_attn_func(q, k, v, dropout_p=0.1, causal=causal)
    assert len(calls) == 1 and calls[0]["dropout_p"] == 0.1
    grads = torch.autograd.grad(out, (q, k, v), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    torch.manual_seed(5)
    out_portable = flashtile.flash_attn_func(q, k, v, dropout_p=0.1, causal=causal)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_dropout_above_the_half_compare_takes_portable(monkeypatch):
    """dropout_p = 0.98 (threshold 32113, above the Gluon forward's fp16 compare, 0x7C00) runs the portable forward;
    its output is the reference's with philox's mask of that threshold."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(2, 1024, 1024, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    torch.manual_seed(5)
    out = flashtile.flash_attn_func(q, k, v, dropout_p=0.98)
    assert not calls
    torch.manual_seed(5)
    seed = torch.randint(2**63 - 1, (1,), dtype=torch.int64, device="cuda").item()  # the draw flashtile makes
    keep = _dropout_keep(seed, 2, 8, 1024, 1024, 0.98)
    assert abs(keep.float().mean().item() - 0.02) < 0.002
    ref64 = flashtile.attention_ref(q, k, v, dropout_p=0.98, dropout_mask=keep)
    ref = flashtile.attention_ref(q, k, v, dropout_p=0.98, dropout_mask=keep, upcast=False)
    assert_close_rule("out", out, ref64, ref, torch.bfloat16)
