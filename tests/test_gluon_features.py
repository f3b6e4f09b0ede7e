"""The Hopper Gluon forward's score features on sm90 (GPU tier): softcap, ALiBi, sinks and windows against the
float64 reference, the one-tile lazy rescale on them, softcap's fixed row max (its launch arguments on CPU), ALiBi by
one more wgmma, the refusal of rows without keys, and the backward on a forward with features."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants
from gluon_fwd_utils import (FEATURE_SHAPES, ON_HOPPER, _check_gluon_forward, _cu, _dropout_keep, _feature_inputs,
                             _growing_keys, sink_logits)
from utils import (alibi_slopes, assert_close_rule, assert_varlen_matches_each_sequence, make_qkv, record_calls,
                   record_constexpr)


# (id, causal, window_size, softcap, alibi: None / "h" / "bh", sink)
FEATURES = [
    ("softcap", False, (-1, -1), 30.0, None, False),
    ("softcap-causal", True, (-1, -1), 30.0, None, False),
    ("alibi", False, (-1, -1), 0.0, "h", False),
    ("alibi-bh-causal", True, (-1, -1), 0.0, "bh", False),
    ("sink", False, (-1, -1), 0.0, None, True),
    ("sink-causal", True, (-1, -1), 0.0, None, True),
    ("window-256-0", False, (256, 0), 0.0, None, False),
    ("window-100-50", False, (100, 50), 0.0, None, False),
    ("window-300-inf", False, (300, -1), 0.0, None, False),
    ("window-0-0", False, (0, 0), 0.0, None, False),
    ("causal-window-64", True, (64, -1), 0.0, None, False),
    ("window-softcap-alibi", False, (256, 0), 30.0, "h", False),
    ("window-softcap-alibi-sink", False, (200, 100), 30.0, "bh", True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in
                                                       FEATURE_SHAPES])
@pytest.mark.parametrize("feature", FEATURES, ids=[f[0] for f in FEATURES])
def test_features_match_reference(feature, shape, head_dim):
    """Softcap, ALiBi, sinks and sliding windows (each a constexpr of the kernel) against the float64 reference."""
    causal, q, k, v, feats = _feature_inputs(feature, shape, head_dim)
    _check_gluon_forward(q, k, v, causal, feats)


# The one-tile kernel's lazy rescale (session 30: D256's default, d64-3wg, the "default-lr" twin) on the calls it
# serves: score features, sinks, windows (rows that see no key in a block keep m = -inf), a bias, dropout, varlen;
# keys scaled up along the sequence move most rows' max in most blocks, spike keys move some rows' max once. Three
# consumers take no bias, dropout or ALiBi with softcap (those calls run the two-consumer default, not lazy at D64).
LAZY_ONE_TILE = [
    ("softcap", False, dict(softcap=30.0)),
    ("softcap60", False, dict(softcap=60.0)),  # past FIXED_MAX_LIMIT: the running max, lazily rescaled
    ("alibi-bh-causal", True, dict(alibi="bh")),
    ("sink", False, dict(sink=True)),
    ("window-100-50", False, dict(window_size=(100, 50))),
    ("window-softcap-alibi-sink", False, dict(window_size=(200, 100), softcap=30.0, alibi="bh", sink=True)),
    ("bias-causal", True, dict(bias=True)),
    ("dropout", False, dict(dropout_p=0.2)),
    ("varlen-causal", True, dict(varlen=True)),
    ("sink-window-fp16", True, dict(sink=True, window_size=(300, 0), dtype=torch.float16)),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("scores", ["growing", "spikes"])
@pytest.mark.parametrize("case", LAZY_ONE_TILE, ids=[c[0] for c in LAZY_ONE_TILE])
@pytest.mark.parametrize("variant,head_dim", [("default-lr", 64), ("default-lr", 128), ("default", 256),
                                              ("d64-3wg", 64)], ids=["d64", "d128", "d256", "d64-3wg"])
def test_lazy_rescale_one_tile_matches_reference(variant, head_dim, case, scores, monkeypatch):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, causal, spec = case
    spec = dict(spec)
    batch, seqlen, heads_q, heads_kv = 2, 1000, 4, 2
    dtype = spec.get("dtype", torch.bfloat16)
    q, k, v = make_qkv(batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    if scores == "growing":
        k = _growing_keys(k)
    else:
        k[:, 500] *= 30
        k[-1, 900, 0] *= 60
    feats = _spec_feats(spec, batch, heads_q, seqlen, seqlen)
    config = gluon_variants.takes_config(variant, head_dim, feats.get("attn_bias"), feats["alibi_slopes"],
                                         spec.get("dropout_p", 0.0), feats["softcap"])
    if gluon_variants.VARIANTS[variant][head_dim].consumers == 3 and config.consumers == 2:
        pytest.skip("three consumers take no bias, dropout or ALiBi with softcap (takes_config)")
    assert config.lazy_rescale
    if spec.get("varlen"):
        _check_variant_varlen(q, k, v, causal, variant)
        return
    _check_variant_forward(q, k, v, causal, variant, feats, spec.get("dropout_p", 0.0))


def _spec_feats(spec, batch, heads_q, seqlen_q, seqlen_k):
    """gluon_forward keywords of a test case's spec: window_size, softcap, sink (gluon_fwd_utils.sink_logits), ALiBi
    slopes (B, H) and bias (a (1, H, Sq, Sk) bf16 N(0, 1) bias)."""
    feats = dict(window_size=spec.get("window_size", (-1, -1)), softcap=spec.get("softcap", 0.0),
                 sink=sink_logits(heads_q) if spec.get("sink") else None,
                 alibi_slopes=alibi_slopes(heads_q, batch) if spec.get("alibi") else None)
    if spec.get("bias"):
        feats["attn_bias"] = torch.randn(1, heads_q, seqlen_q, seqlen_k, device="cuda", dtype=torch.bfloat16)
    return feats


def _check_variant_varlen(q, k, v, causal, variant, lens_k=(300, 700, 1000), **feats):
    """The batch of 2 x 1000 tokens packed as sequences of 300, 700 and 1000 queries (and lens_k keys, 2000 in all)
    through gluon_forward(variant) with feats (ones that hold for every sequence), each sequence against the float64
    reference run alone."""
    lens_q = [300, 700, 1000]
    cu_q, cu_k = _cu(lens_q, "cuda"), _cu(list(lens_k), "cuda")
    qv, kv, vv = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
    lens = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1000, max_seqlen_k=max(lens_k))
    assert gluon_launch.gluon_supported(qv, kv, vv, causal=causal, **feats, **lens)
    out, lse = gluon_launch.gluon_forward(qv, kv, vv, causal=causal, variant=variant, **feats, **lens)
    assert_varlen_matches_each_sequence(out, lse, qv, kv, vv, lens_q, list(lens_k), cu_q, cu_k, causal, **feats)


def _check_variant_forward(q, k, v, causal, variant, feats, dropout_p=0.0, softmax_scale=None):
    """gluon_forward(variant) on dense q / k / v with feats (dropout_p > 0: the reference takes the kernels' Philox keep
    mask) against the float64 reference: out by DESIGN.md's rule, lse (undropped) within 2e-3."""
    batch, seqlen_q, heads_q = q.shape[:3]
    run_feats, ref_feats = dict(feats), dict(feats)
    if dropout_p:
        seed = 1234567890123
        run_feats.update(dropout_p=dropout_p, rng=torch.tensor([seed], dtype=torch.int64, device=q.device))
        ref_feats.update(dropout_p=dropout_p,
                         dropout_mask=_dropout_keep(seed, batch, heads_q, seqlen_q, k.shape[1], dropout_p))
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **run_feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, softmax_scale, causal=causal, variant=variant, **run_feats)
    ref = flashtile.attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, **ref_feats)
    low = flashtile.attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=False, **ref_feats)
    assert_close_rule("out", out, ref, low, q.dtype)
    _, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, **feats)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


# Softcap's fixed row max (GluonConfig.fixed_max, kernels/gluon_fwd_common.FIXED_MAX_HEADROOM, session 34): random
# scores; scores saturated at +-softcap (q and k scaled up) with rows whose every score sits at -softcap (the spread
# the headroom is sized for) beside rows at +softcap, at softcap 50 (Gemma 2's) and at the limit (51.9); windows,
# dropout, GQA, varlen with rows that see no key. Past the limit (60) and in fp16 the kernel keeps the running max.
FIXED_MAX_CASES = [
    ("softcap30", False, dict(softcap=30.0)),
    ("softcap30-causal", True, dict(softcap=30.0)),
    ("softcap5-window", False, dict(softcap=5.0, window_size=(200, 100))),
    ("softcap30-dropout", False, dict(softcap=30.0, dropout_p=0.2)),
    ("softcap50-saturated", False, dict(softcap=50.0, saturate=True)),
    ("softcap51.9-saturated-causal", True, dict(softcap=51.9, saturate=True)),
    ("softcap60-saturated", False, dict(softcap=60.0, saturate=True, fixed=False)),
    ("softcap30-fp16", True, dict(softcap=30.0, dtype=torch.float16, fixed=False)),
    ("softcap5-window-fp16", False, dict(softcap=5.0, window_size=(200, 100), dtype=torch.float16, fixed=False)),
    ("softcap30-varlen-causal", True, dict(softcap=30.0, varlen=True)),
]


def _saturated(q, k):
    """q / k whose scores reach softcap's saturated ends: q x 8 and k x 8 (scores ~ N(0, 64^2) / sqrt(D) x sqrt(D):
    about a third beyond +-60, so most rows hold both ends), key dim 0 set to 8, and the first 100 query rows
    (1000, 0, ...) / the next 100 (-1000, 0, ...): every score of those rows is +-8000 / sqrt(D) (+-500 at D256) before
    the cap, so all sit at +softcap (P = 2^64 each under the fixed max) or all at -softcap (the smallest P the headroom
    allows)."""
    q, k = q * 8, k * 8
    k[..., 0] = 8
    q[:, :200] = 0
    q[:, :100, :, 0] = 1000
    q[:, 100:200, :, 0] = -1000
    return q, k


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("case", FIXED_MAX_CASES, ids=[c[0] for c in FIXED_MAX_CASES])
@pytest.mark.parametrize("variant,head_dim", [("default", 64), ("default", 128), ("default", 256), ("d64-3wg", 64)],
                         ids=["d64", "d128", "d256", "d64-3wg"])
def test_fixed_max_softcap_matches_reference(variant, head_dim, case, monkeypatch):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, causal, spec = case
    batch, heads_q, heads_kv = 2, 4, 2
    dtype = spec.get("dtype", torch.bfloat16)
    fixed = record_constexpr(monkeypatch, gluon_launch, "gluon_launch_args", "FIXED_MAX")
    q, k, v = make_qkv(batch, 1000, 1000, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    if spec.get("varlen"):
        # Sequences of (300 queries, 100 keys), (700, 700), (1000, 1200): causal rows 0-199 of the first see no key.
        _check_variant_varlen(q, k, v, causal, variant, lens_k=(100, 700, 1200), softcap=spec["softcap"])
    else:
        if spec.get("saturate"):
            q, k = _saturated(q, k)
        feats = dict(softcap=spec["softcap"], window_size=spec.get("window_size", (-1, -1)))
        _check_variant_forward(q, k, v, causal, variant, feats, spec.get("dropout_p", 0.0))
    assert fixed == [spec.get("fixed", True)]


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_fixed_max_launch_args():
    """FIXED_MAX where the config asks for it (the served configs, not their "-rmax" twins) on bf16 softcap calls up
    to FIXED_MAX_LIMIT (softcap 51.98, not 52) with a window, dropout or varlen, never with ALiBi, a sink or a bias
    (each can move a row's max past the cap), in fp16, without softcap, or from a config without fixed_max; nothing
    else of the launch changes."""
    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 1000)
    fm, base = gluon_variants.VARIANTS["default"][128], gluon_variants.VARIANTS["default-rmax"][128]

    def launch(config=fm, q=q, **kw):
        return gluon_launch.gluon_launch_args(q, q, q, torch.empty_like(q), lse, 0.125, kw.pop("causal", False),
                                              config, **kw)

    rng = torch.zeros(1, dtype=torch.int64)
    for kw in (dict(softcap=30.0), dict(softcap=51.9, causal=True), dict(softcap=5.0, window_size=(100, 0)),
               dict(softcap=30.0, dropout_p=0.1, rng=rng)):
        grid, args, constexprs, options = launch(**kw)
        assert constexprs.pop("FIXED_MAX"), kw
        grid_b, args_b, constexprs_b, options_b = launch(base, **kw)
        assert (grid, constexprs, options) == (grid_b, constexprs_b, options_b), kw
    for kw in (dict(), dict(softcap=52.0), dict(softcap=30.0, alibi_slopes=torch.ones(4)),
               dict(softcap=30.0, sink=torch.zeros(4)),
               dict(softcap=30.0, attn_bias=torch.zeros(1, 4, 1000, 1000, dtype=torch.bfloat16))):
        assert "FIXED_MAX" not in launch(**kw)[2], kw
    q16 = q.half()
    assert "FIXED_MAX" not in launch(q=q16, softcap=30.0)[2]
    assert "FIXED_MAX" not in launch(base, softcap=30.0)[2]
    packed, cu = q.view(2000, 4, 128), torch.tensor([0, 1000, 2000], dtype=torch.int32)
    assert launch(q=packed, softcap=30.0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1000,
                  max_seqlen_k=1000)[2]["FIXED_MAX"]
    assert gluon_variants.VARIANTS["d64-3wg"][64].fixed_max and gluon_variants.VARIANTS["d64-3wg"][64].consumers == 3


# ALiBi's one-sided key blocks by one more wgmma (GluonConfig.alibi_mma, session 31; d64-3wg's three consumers since
# session 32): rows on both sides of their diagonal (q == k, q < k, q > k, bottom-right aligned), slopes (H,)
# and (B, H), large slopes (x 16: the bf16 split of slope / scale must carry its low bits), a scale that is not a power
# of two, windows with sinks, dropout, fp16, varlen.
ALIBI_MMA_CASES = [
    ("q1000-k1000", False, 1000, 1000, dict()),
    ("q1000-k1000-causal", True, 1000, 1000, dict(per_batch=True)),
    ("q300-k1000", False, 300, 1000, dict(per_batch=True)),
    ("q1000-k300", False, 1000, 300, dict()),
    ("q300-k1000-causal", True, 300, 1000, dict()),
    ("large-slopes", False, 1000, 1000, dict(slope_factor=16.0, softmax_scale=0.3)),
    # wide enough that each tile has fully visible key blocks on both sides of its rows' diagonals (a narrower window
    # leaves only masked blocks, which take the |i - j| path)
    ("window-sink", False, 1000, 1000, dict(window_size=(600, 400), sink=True)),
    ("dropout", False, 1000, 1000, dict(dropout_p=0.2)),
    ("fp16-causal", True, 1000, 1000, dict(dtype=torch.float16)),
    ("varlen", False, 1000, 1000, dict(varlen=True)),
    ("varlen-causal", True, 1000, 1000, dict(varlen=True)),
    # three consumers: ptxas spills 8 B here (gluon_launch's note on d64-3wg's alibi_mma)
    ("varlen-window-sink", False, 1000, 1000, dict(varlen=True, window_size=(600, 400), sink=True)),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("case", ALIBI_MMA_CASES, ids=[c[0] for c in ALIBI_MMA_CASES])
@pytest.mark.parametrize("variant,head_dim", [("default", 64), ("default", 128), ("d64-3wg", 64)],
                         ids=["d64", "d128", "d64-3wg"])
def test_alibi_by_mma_matches_reference(variant, head_dim, case, monkeypatch):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, causal, seqlen_q, seqlen_k, spec = case
    batch, heads_q, heads_kv = 2, 4, 2
    dtype = spec.get("dtype", torch.bfloat16)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    slopes = alibi_slopes(heads_q, batch if spec.get("per_batch") else None) * spec.get("slope_factor", 1.0)
    feats = dict(alibi_slopes=slopes, window_size=spec.get("window_size", (-1, -1)),
                 sink=sink_logits(heads_q) if spec.get("sink") else None)
    assert gluon_variants.VARIANTS[variant][head_dim].alibi_mma
    compiled = record_constexpr(monkeypatch, gluon_launch, "gluon_launch_args", "ALIBI_MMA")
    # three consumers (d64-3wg) take ALiBi through the wgmma, but not dropout (takes_config: the default's tiles)
    consumers = record_constexpr(monkeypatch, gluon_launch, "gluon_launch_args", "CONSUMERS")
    expected_consumers = 2 if spec.get("dropout_p") else gluon_variants.VARIANTS[variant][head_dim].consumers
    if spec.get("varlen"):  # (H,) slopes: the same for every sequence
        _check_variant_varlen(q, k, v, causal, variant, **feats)
        assert compiled == [True] and consumers == [expected_consumers]
        return
    _check_variant_forward(q, k, v, causal, variant, feats, spec.get("dropout_p", 0.0), spec.get("softmax_scale"))
    assert compiled == [True] and consumers == [expected_consumers]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_refuses_windows_with_rows_without_keys():
    """Sq - Sk > window right: the first rows see no key (output 0, lse -inf), left to the portable kernel."""
    q, k, v = make_qkv(1, 300, 200, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    assert not gluon_launch.gluon_supported(q, k, v, window_size=(50, 50))
    assert gluon_launch.gluon_supported(q, k, v, window_size=(50, 100))
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    assert not gluon_launch.gluon_supported(q, k, v, window_size=(50, 100), dropout_p=0.1)  # no seed
    assert gluon_launch.gluon_supported(q, k, v, window_size=(50, 100), dropout_p=0.1, rng=seed)
    assert not gluon_launch.gluon_supported(q, k, v, attn_bias=torch.zeros(1, 1, 300, 200, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
def test_flash_attn_func_features_backward(monkeypatch, head_dim):
    """FLASHTILE_GLUON=1 routes a window + softcap + ALiBi + sink forward to the Gluon kernel; the backward (and the
    sink's gradient, computed from lse) matches the portable path's."""
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(1, 1000, 1000, 4, 2, head_dim, torch.bfloat16, "cuda", requires_grad=True)
    sink = torch.randn(4, device="cuda", requires_grad=True)
    feats = dict(window_size=(256, 0), softcap=30.0, alibi_slopes=alibi_slopes(4))
    out = flashtile.flash_attn_func(q, k, v, sink=sink, **feats)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, sink=sink, **feats)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v, sink), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=1e-2)
