"""The Hopper Gluon forward (gluon_launch.py): GPU tier on sm90 only; on CPU just the import guard."""
from dataclasses import replace

import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants, launch, philox
from utils import (alibi_slopes, assert_close_rule, assert_varlen_matches_each_sequence, make_qkv, record_calls,
                   record_constexpr)

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_unsupported_without_hopper():
    """Importing never fails; CPU tensors (and the interpreter) never take the Gluon path."""
    q = torch.randn(1, 8, 2, 64)
    assert not gluon_launch.gluon_supported(q, q, q)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype)
# Batches > 1 with seqlen_k % BLOCK_N != 0 read through ragged descriptors (b2-q1000-k1000, b3-q130-k257).
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (1, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (1, 777, 999, 8, 1, torch.bfloat16), (1, 1, 1, 2, 1, torch.bfloat16),
          (1, 1000, 1000, 4, 2, torch.float16), (3, 256, 512, 4, 2, torch.bfloat16),
          (2, 1000, 1000, 4, 2, torch.bfloat16), (3, 130, 257, 2, 2, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(shape, head_dim, causal):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    assert gluon_launch.gluon_supported(q, k, v, causal=causal)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


def _assert_o_epilogues_agree(monkeypatch, launch_args, shape, head_dim, causal, variant="default"):
    """Two gluon_forward calls with O_VIA_SMEM on (head_dim in configs.GLUON_FWD_SMEM_EPILOGUE) and off: the spied
    launch_args function (gluon_launch's one-tile or persistent one) saw the constexpr set once then not, the two
    results are bitwise equal (NaN-poisoned outputs), and the first is within the reference's tolerance."""
    from flashtile import configs

    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    q, k, v = make_qkv(*shape, head_dim, torch.bfloat16, "cuda", requires_grad=False)
    flags = record_constexpr(monkeypatch, gluon_launch, launch_args, "O_VIA_SMEM")
    outs = []
    for heads in (frozenset({head_dim}), frozenset()):
        monkeypatch.setattr(configs, "GLUON_FWD_SMEM_EPILOGUE", heads)
        outs.append(gluon_launch.gluon_forward(q, k, v, causal=causal, variant=variant))
    assert flags == [True, False]  # one launch each, the first through shared memory
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    ref = flashtile.attention_ref(q, k, v, causal=causal)
    assert_close_rule("out", outs[0][0], ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False),
                      torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_o_via_smem_matches_register_stores(monkeypatch, head_dim, causal):
    """The one-tile kernel's two epilogues (O through the Q tile, O from the accumulators) give the same bits, on a
    shape with a query tail (rows past Sq never stored), ragged key blocks and GQA, into NaN-poisoned outputs."""
    _assert_o_epilogues_agree(monkeypatch, "gluon_launch_args", (2, 777, 999, 8, 2), head_dim, causal)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("variant", ["persistent", "persistent-7cta", "persistent-sched4", "persistent-lr",
                                     "persistent-sched4-lr"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
def test_persistent_o_via_smem_matches_register_stores(monkeypatch, head_dim, causal, variant):
    """The persistent kernel's O through one shared tile the consumers take in turns (O_VIA_SMEM) gives the register
    stores' bits: on 7 CTAs (each runs dozens of epilogues: the o_free barrier's running parity) and the full grid,
    with a query tail (Sq % 64 != 0, batch 2: no TMA store), GQA, into NaN-poisoned outputs."""
    if variant.startswith("persistent-sched4") and not causal:
        pytest.skip("the listed schedule orders causal tiles")
    _assert_o_epilogues_agree(monkeypatch, "persistent_launch_args", (2, 600, 640, 8, 2), head_dim, causal, variant)


# The persistent kernel on 7 CTAs (dozens of tiles each: the barriers' running phases) and the 132-SM grid.
# (2, 960, ...): Sq % 128 == 64 with batch 2, so the last tile's second warpgroup has no rows (its TMA store box
# would land on the next sequence's first rows).
PERSISTENT_SHAPES = [(4, 512, 512, 16, 16, torch.bfloat16), (3, 300, 700, 8, 2, torch.bfloat16),
                     (1, 1000, 1000, 4, 2, torch.float16), (2, 640, 640, 8, 8, torch.bfloat16),
                     (2, 960, 960, 4, 2, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("variant", ["persistent", "persistent-7cta", "persistent-tma", "persistent-tma-7cta",
                                     "persistent-tma-q2", "persistent-tma-7cta-q2", "persistent-tma-q2-lpt8",
                                     "persistent-tma-q2-de", "persistent-tma-7cta-q2-de", "persistent-tma-q2-de-lpt8",
                                     "persistent-tma-q2-de-sched4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                                          for b, sq, sk, hq, hk, dt in PERSISTENT_SHAPES])
def test_persistent_matches_reference(shape, head_dim, causal, variant, monkeypatch):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant=variant)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


# The "-lr" variants (GluonConfig.lazy_rescale, kernels/gluon_fwd_common._lazy_max). Random scores never move a row's
# max by 2^8 after key block 0, so every rescale is skipped; keys scaled up along the sequence move most rows' max in
# most blocks (about 30-85 % of them per block); spike keys move some rows' max once, mid-row (under the causal mask
# some warps of a step rescale while others skip: a flag read by the wrong warp would show).
LAZY_VARIANTS = ["persistent-tma-q2-lr", "persistent-tma-q2-de-lr", "persistent-tma-q2-de-lpt8-lr",
                 "persistent-tma-q2-de-sched4-lr", "persistent-tma-sched4-lr", "persistent-3wg-tma-q2-lr",
                 "persistent-lr", "persistent-sched4-lr"]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("scores", ["random", "growing", "spikes"])
@pytest.mark.parametrize("shape", [(2, 1024, 1024, 8, 2, torch.bfloat16), (1, 1000, 1000, 4, 1, torch.bfloat16),
                                   (1, 640, 1000, 4, 2, torch.float16)], ids=["b2-1024", "b1-1000", "q640-k1000-fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", LAZY_VARIANTS)
def test_lazy_rescale_matches_reference(variant, causal, shape, scores, monkeypatch):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    for head_dim in gluon_variants.VARIANTS[variant]:
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda",
                           requires_grad=False)
        if scores == "growing":
            k = _growing_keys(k)
        elif scores == "spikes":
            k[:, 500] *= 30
            k[-1, 900, 0] *= 60
        config = gluon_variants.VARIANTS[variant][head_dim]
        assert gluon_launch.takes_persistent(config, q, k, causal=causal)
        out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant=variant)
        ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
        assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
        torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_refuses_rows_without_keys():
    q, k, v = make_qkv(1, 257, 130, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    assert not gluon_launch.gluon_supported(q, k, v, causal=True)
    assert gluon_launch.gluon_supported(q, k, v, causal=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_key_blocks_spanning_two_sequences_stay_in_their_sequence():
    """A key block past one sequence's end is zero-filled (ragged descriptors), not the next sequence's values:
    an inf in sequence 1's values leaves sequence 0 finite (masked, 0 * inf would be NaN)."""
    q, k, v = make_qkv(2, 1000, 1000, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    v = v.clone()
    v[1, :64] = float("inf")
    assert gluon_launch.gluon_supported(q, k, v)
    out, _ = gluon_launch.gluon_forward(q, k, v)
    assert torch.isfinite(out[0]).all()
    ref = flashtile.attention_ref(q[:1], k[:1], v[:1])
    assert_close_rule("out", out[:1], ref, flashtile.attention_ref(q[:1], k[:1], v[:1], upcast=False),
                      torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_func_takes_it_by_default(monkeypatch, causal):
    """flash_attn_func routes the plain forward to the Gluon kernel where configs.py wants it (D128 from 1K
    keys) unless FLASHTILE_GLUON=0, and the backward runs on its out / lse."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=0)



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
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): tails, q != k, GQA, and a batch with block-aligned keys
FEATURE_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (1, 777, 999, 8, 2), (2, 512, 1024, 4, 1),
                  (2, 300, 1000, 4, 2)]  # the last: key blocks span sequences (ragged descriptors)


def _feature_inputs(feature, shape, head_dim):
    """(causal, q, k, v, gluon_forward's feature keywords) of a FEATURES entry at a FEATURE_SHAPES shape, bf16 CUDA."""
    _, causal, window_size, softcap, alibi, sink = feature
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap, sink=torch.randn(heads_q, device="cuda") if sink else None,
                 alibi_slopes=alibi_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None)
    return causal, q, k, v, feats


def _check_gluon_forward(q, k, v, causal, feats):
    """The Gluon forward takes these features and its out / lse (natural log) match the float64 reference
    (DESIGN.md's rule; lse within 2e-3)."""
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, **feats)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, **feats)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False, **feats),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


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


def _growing_keys(k):
    """k scaled up along the sequence (x 1 + position / 32): most rows' max moves in most key blocks."""
    return k * (1 + torch.arange(k.shape[1], device=k.device) / 32).to(k.dtype)[None, :, None, None]


def _spec_feats(spec, batch, heads_q, seqlen_q, seqlen_k):
    """gluon_forward keywords of a test case's spec: window_size, softcap, sink (N(0, 1) logits), ALiBi slopes (B, H)
    and bias (a (1, H, Sq, Sk) bf16 N(0, 1) bias)."""
    feats = dict(window_size=spec.get("window_size", (-1, -1)), softcap=spec.get("softcap", 0.0),
                 sink=torch.randn(heads_q, device="cuda") if spec.get("sink") else None,
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
                 sink=torch.randn(heads_q, device="cuda") if spec.get("sink") else None)
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


def _dropout_keep(seed, batch, heads_q, seqlen_q, seqlen_k, p, device="cuda"):
    """(B, Hq, Sq, Sk) keep mask of philox's draws (the portable kernels' and the CPU path's)."""
    bh = torch.arange(batch * heads_q, device=device).view(batch, heads_q, 1, 1)
    rows = torch.arange(seqlen_q, device=device).view(1, 1, -1, 1)
    cols = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    return philox.dropout_keep_mask(seed, bh, rows, cols, seqlen_q, seqlen_k, p)


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


def test_a_failing_gluon_launch_falls_back_once(monkeypatch):
    """A Gluon launch that fails to build (e.g. an API change in an untested triton) warns once, disables the
    Gluon path for the process and lets the portable kernels answer; a supported call never takes it again."""
    from flashtile import launch

    q = torch.randn(1, 256, 2, 128, dtype=torch.bfloat16)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise TypeError("simulated Gluon API change")

    monkeypatch.setattr(gluon_launch, "_disabled", None)
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", broken)
    monkeypatch.setattr(gluon_launch, "_supported_device", lambda *tensors: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read per call by gluon_supported; no kernel runs here
    with pytest.warns(RuntimeWarning, match="Gluon forward failed"):
        assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None
    assert calls == [1] and gluon_launch._disabled is not None
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None
    assert calls == [1]  # disabled: not tried again
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None


def test_untested_triton_needs_the_opt_in(monkeypatch):
    from flashtile import launch

    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: False)
    monkeypatch.setattr(gluon_launch, "gluon_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None and not seen
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None and seen == [1]


# Varlen: CPU checks of the support rule, the launch arguments and the dispatch, then the GPU tier.
def _cu(seqlens, device="cpu"):
    return torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _packed(seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda total, heads: torch.randn(total, heads, head_dim, generator=gen).to(device, dtype)  # noqa: E731
    return make(sum(seqlens_q), heads_q), make(sum(seqlens_k), heads_kv), make(sum(seqlens_k), heads_kv)


@pytest.fixture
def as_if_hopper(monkeypatch):
    """gluon_supported's device and interpreter checks passed on CPU tensors (nothing is launched)."""
    monkeypatch.setattr(gluon_launch, "_disabled", None)
    monkeypatch.setattr(gluon_launch, "_supported_device", lambda *tensors: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")


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
def test_varlen_support_rule(as_if_hopper):
    lens_q, lens_k = [5, 0, 130, 1], [7, 3, 0, 1]
    q, k, v = _packed(lens_q, lens_k, 4, 2, 128)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=130, max_seqlen_k=7)
    assert gluon_launch.gluon_supported(q, k, v, **varlen)
    assert gluon_launch.gluon_supported(q, k, v, causal=True, **varlen)  # rows without keys: handled in the kernel
    assert gluon_launch.gluon_supported(q, k, v, window_size=(8, 0), softcap=5.0, sink=torch.zeros(4), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, **varlen)  # no seed
    assert gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, rng=torch.zeros(1, dtype=torch.int64), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, block_table=torch.zeros(4, 1, dtype=torch.int32), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, cu_seqlens_q=cu_q.long()))
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, cu_seqlens_k=_cu(lens_k[:3])))
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, max_seqlen_q=0))
    assert not gluon_launch.gluon_supported(q, k[:0], v[:0], **dict(varlen, cu_seqlens_k=_cu([0] * 4), max_seqlen_k=0))
    q96, k96, v96 = _packed(lens_q, lens_k, 4, 2, 96)
    assert not gluon_launch.gluon_supported(q96, k96, v96, **varlen)
    assert not gluon_launch.gluon_supported(q[None], k[None], v[None], **varlen)  # dense tensors with cu_seqlens
    # Dense batches whose key blocks would span two sequences are served now (ragged descriptors).
    qd, kd = torch.zeros(2, 1000, 4, 128, dtype=torch.bfloat16), torch.zeros(2, 1000, 2, 128, dtype=torch.bfloat16)
    assert gluon_launch.gluon_supported(qd, kd, kd)


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


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_o_via_smem_only_for_dense_two_consumer_launches(monkeypatch):
    """The one-tile kernel's O through shared memory (O_VIA_SMEM): dense launches of two consumers at the head dims
    configs.GLUON_FWD_SMEM_EPILOGUE lists, plain, causal, with score features, a window, a sink, a bias or dropout
    under the plain causal mask; other dropout launches (no mask, a window), varlen, three consumers and other head
    dims keep the kernel they had (no O_VIA_SMEM constexpr). (Block-sparse launches: the same rule in
    gluon_launch_args, not built here.)"""
    from flashtile import configs
    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1000)
    config = gluon_variants.VARIANTS["default"][128]

    def constexprs(q=q, out=out, lse=lse, config=config, **kw):
        return gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, kw.pop("causal", False), config, **kw)[2]

    assert constexprs()["O_VIA_SMEM"] and constexprs(causal=True)["O_VIA_SMEM"]
    rng = torch.zeros(1, dtype=torch.int64)
    for kw in (dict(window_size=(100, 0)), dict(softcap=30.0), dict(alibi_slopes=torch.ones(4)),
               dict(sink=torch.zeros(4)), dict(dropout_p=0.1, rng=rng, causal=True),
               dict(attn_bias=torch.zeros(1, 4, 1000, 1000, dtype=torch.bfloat16)),
               dict(softcap=30.0, alibi_slopes=torch.ones(4), causal=True)):
        assert constexprs(**kw)["O_VIA_SMEM"], kw
    assert "O_VIA_SMEM" not in constexprs(dropout_p=0.1, rng=rng)  # measured slower (configs.py)
    assert "O_VIA_SMEM" not in constexprs(dropout_p=0.1, rng=rng, window_size=(100, 0))
    packed, cu = q.view(2000, 4, 128), torch.tensor([0, 1000, 2000], dtype=torch.int32)
    assert "O_VIA_SMEM" not in constexprs(q=packed, out=packed, lse=torch.empty(4, 2000), cu_seqlens_q=cu,
                                          cu_seqlens_k=cu, max_seqlen_q=1000, max_seqlen_k=1000)
    q64 = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16)
    assert "O_VIA_SMEM" not in constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["d64-3wg"][64])
    assert 64 not in configs.GLUON_FWD_SMEM_EPILOGUE  # unmeasured at D64 (configs.py)
    assert "O_VIA_SMEM" not in constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["default"][64])
    monkeypatch.setattr(configs, "GLUON_FWD_SMEM_EPILOGUE", frozenset({64}))
    assert constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["default"][64])["O_VIA_SMEM"]
    assert "O_VIA_SMEM" not in constexprs()  # D128 out of the set
    # The persistent kernel's own O_VIA_SMEM (one shared tile where O is not stored by TMA;
    # test_persistent_launch_args) follows the same set.
    monkeypatch.setattr(configs, "GLUON_FWD_SMEM_EPILOGUE", frozenset({64, 256}))
    for variant in ("persistent", "persistent-tma"):
        assert "O_VIA_SMEM" not in gluon_launch.persistent_launch_args(
            q, q, q, out, lse, 0.125, True, gluon_variants.VARIANTS[variant][128], sm_count=132)[2]


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_varlen_launch_args():
    """Varlen: ragged 4-D descriptors, the grid over max_seqlen_q, packed out / (Hq, total) lse without batch
    strides; dense batches ragged only when a key block can span two sequences."""
    lens_q, lens_k = [300, 0, 1, 129], [1000, 5, 1, 0]
    q, k, v = _packed(lens_q, lens_k, 8, 2, 64)
    out, lse = torch.empty_like(q), torch.empty(8, q.shape[0])
    config = gluon_variants.VARIANTS["default"][64]
    grid, args, constexprs, _ = gluon_launch.gluon_launch_args(
        q, k, v, out, lse, 0.125, True, config, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k),
        max_seqlen_q=300, max_seqlen_k=1000)
    assert constexprs["VARLEN"] and constexprs["RAGGED"] and constexprs["IS_CAUSAL"]
    assert grid == (3, 4 * 8)
    q_desc, k_desc = args[0], args[1]
    assert q_desc.shape[2:] == [2**30, 8 * 64] and q_desc.block_shape == [1, 1, 64, 64]
    assert k_desc.strides == [2**34 - 2 * 64, 2 * 64, 2 * 64, 1] and k_desc.block_shape == [1, 1, config.block_n, 64]
    assert args[7:12] == (0, out.stride(0), out.stride(1), 0, lse.stride(0))  # out / lse strides: no batch
    # cu_seqlens_q / _k, then the bias arguments (placeholder, 0 rows per batch / head) and softmax_scale, then
    # the fourteen block-sparse arguments: None (constexprs) in a dense launch, then dropout's seed (the lse
    # placeholder), scale and threshold.
    assert args[-3] is lse and args[-2:] == (1.0, 0)
    assert args[-17:-3] == (None,) * 14
    args = args[:-17]
    assert args[-6].dtype == torch.int32 and args[-5].dtype == torch.int32 and args[-3:] == (0, 0, 0.125)
    for seqlen_k, ragged in ((1024, False), (1000, True)):
        qd = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16)
        kd = torch.empty(2, seqlen_k, 2, 64, dtype=torch.bfloat16)
        _, args, constexprs, _ = gluon_launch.gluon_launch_args(qd, kd, kd, torch.empty_like(qd),
                                                                torch.empty(2, 4, 1000), 0.125, False, config)
        assert constexprs["RAGGED"] == ragged and not constexprs["VARLEN"]
        assert len(args[0].shape) == (4 if ragged else 2)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_ragged_descriptor_addresses_one_sequence():
    """What the TMA unit computes for a ragged box (kernels/gluon_fwd_common._tma_load's coordinates): the element
    offset sum(coord * stride) modulo 2**64 lands on row end - n + r of the packed tensor, and rows r >= n are out of
    bounds (zero-filled), whatever lies after the sequence."""
    t = torch.empty(1000, 3, 4, 64, dtype=torch.bfloat16)[:, 1]  # a packed-qkv view: row stride 3 * 4 * 64
    rows, row_stride = t.shape[0], t.stride(0)
    desc = gluon_launch.ragged_descriptor(t, rows, row_stride, 4 * 64, 128, 64, gluon_launch._gl.bfloat16)
    billion = gluon_launch.RAGGED_ROWS
    for start, n in ((0, 1), (17, 300), (999, 1), (500, 500)):
        for r in (0, n - 1, n, n + 127):
            coords = (billion, start + n, billion - n + r, 64)  # outermost first, as the kernel passes them
            in_bounds = all(0 <= c < dim for c, dim in zip(coords, desc.shape))
            offset = sum(c * s for c, s in zip(coords, desc.strides)) % 2**64
            assert in_bounds == (r < n)
            if in_bounds:
                assert offset == (start + r) * row_stride + 64


def test_varlen_dispatch(monkeypatch, as_if_hopper):
    """launch._gluon_forward hands cu_seqlens / max_seqlen to the Gluon forward and asks configs.py with
    max_seqlen_k as the key count (D64 causal: from 4096 keys; varlen is not plain, GLUON_FWD_MIN_KEYS_PLAIN)."""
    from flashtile import launch

    calls = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(kw) or ("out", "lse"))
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    lens = [3000, 1, 5000]
    q, k, v = _packed(lens, lens, 4, 4, 64)
    cu = _cu(lens)
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 5000, 5000) == ("out", "lse")
    assert calls[0]["cu_seqlens_q"] is cu and calls[0]["max_seqlen_k"] == 5000
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 3000, 3000) is None
    assert len(calls) == 1
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 3000, 3000) == ("out", "lse")
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 5000, 5000) is None
    assert len(calls) == 2


# (id, sequence lengths q, sequence lengths k, heads_q, heads_kv): empty and single-token sequences, lengths off
# the 128 / 64 blocks, Sq > Sk (causal: rows without keys), GQA / MQA.
VARLEN_CASES = [
    ("mixed", [1, 17, 0, 300, 129, 64], [5, 1, 9, 300, 200, 0], 4, 2),
    ("equal-1000", [1000, 1000], [1000, 1000], 4, 4),
    ("q-gt-k", [257, 130, 1], [130, 257, 1], 8, 1),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_varlen_matches_each_sequence_alone(monkeypatch, case, head_dim, causal):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, lens_q, lens_k, heads_q, heads_kv = case
    q, k, v = _packed(lens_q, lens_k, heads_q, heads_kv, head_dim, device="cuda")
    cu_q, cu_k = _cu(lens_q, "cuda"), _cu(lens_k, "cuda")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **varlen)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, **varlen)
    assert lse.shape == (heads_q, q.shape[0])
    assert_varlen_matches_each_sequence(out, lse, q, k, v, lens_q, lens_k, cu_q, cu_k, causal)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_varlen_func_takes_it_by_default(monkeypatch, causal):
    """flash_attn_varlen_func routes to the Gluon kernel where configs.py wants it (D128 from 1K keys) and the
    varlen backward runs on its out / lse."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    lens = [1500, 1, 700, 1024]
    q, k, v = (t.requires_grad_() for t in _packed(lens, lens, 4, 2, 128, device="cuda"))
    cu = _cu(lens, "cuda")
    out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=0)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_unchecked_descriptors_match_the_checked_ones():
    """gluon_launch.tma_descriptor skips TensorDescriptor's dataclass checks for host time: on the descriptors the
    forward and backward build (dense, ragged, GQA, packed qkv strides, the backward's 3-D and row views) the
    checked constructor accepts the same fields, and every field agrees."""
    from dataclasses import fields

    from flashtile import gluon_bwd_launch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    qkv = torch.empty(2, 1000, 3, 4, 128, dtype=torch.bfloat16)
    dense = torch.empty(3, 256, 4, 64, dtype=torch.float16)
    rows = torch.empty(2, 4, 1024)
    built = [gluon_launch._descriptor(dense, 64), gluon_launch._descriptor(qkv[:, :, 1], 128),
             gluon_launch._descriptor(qkv[:, :, 2], 128, ragged=True),
             gluon_launch._descriptor(torch.empty(700, 2, 256, dtype=torch.bfloat16), 64, ragged=True),
             gluon_bwd_launch._descriptor(dense, 64), gluon_bwd_launch._row_descriptor(rows, 64)]
    for desc in built:
        checked = TensorDescriptor(*(getattr(desc, f.name) for f in fields(TensorDescriptor)))
        assert all(getattr(desc, f.name) == getattr(checked, f.name) for f in fields(TensorDescriptor)
                   if f.name != "base") and desc.base is checked.base


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper_persistent is None, reason="no Gluon in this triton")
@pytest.mark.parametrize("variant", ["persistent", "persistent-tma"])
def test_persistent_launch_takes_causal_from_the_window(monkeypatch, variant):
    """launch.py says causal as window_size=(-1, 0) with causal=False: the persistent launch must still run its
    causal path (IS_CAUSAL), the only mask it has. The kernel is replaced by a recorder (no GPU here)."""
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs)

    original = gluon_launch.persistent_launch_args
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper_persistent", Recorder())
    monkeypatch.setattr(gluon_launch, "persistent_launch_args",
                        lambda *args: original(*args, sm_count=132))
    q = torch.empty(2, 512, 4, 128, dtype=torch.bfloat16)
    for window, causal, expect in (((-1, 0), False, True), ((-1, -1), True, True), ((-1, -1), False, False)):
        seen.clear()
        gluon_launch.gluon_forward(q, q, q, causal=causal, variant=variant, window_size=window)
        assert seen["IS_CAUSAL"] == expect, (window, causal)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper_persistent is None, reason="no Gluon in this triton")
def test_persistent_launch_args():
    """The persistent variant: grid min(tiles, SMs, max_ctas), the tile counts the kernel walks, and which launches
    it takes (plain / causal dense; features, varlen and D256 through ragged descriptors run the one-tile kernel)."""
    config = gluon_variants.VARIANTS["persistent"][128]
    q = torch.empty(32, 512, 16, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(32, 16, 512)
    grid, args, constexprs, options = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, True, config,
                                                                          sm_count=132)
    n_m, n_bh, n_tiles, schedule = args[-4:]
    assert (n_m, n_bh, n_tiles) == (4, 32 * 16, 4 * 32 * 16) and grid == (132, )
    assert constexprs["IS_CAUSAL"] and not constexprs["RAGGED"] and constexprs["STAGES"] == config.stages
    assert not constexprs["O_TMA"] and args[3] is out and schedule is lse  # no list: the grid's stride
    assert options == dict(num_warps=4, maxnreg=config.maxnreg)
    small = torch.empty(1, 130, 2, 128, dtype=torch.bfloat16)
    grid, *_ = gluon_launch.persistent_launch_args(small, small, small, torch.empty_like(small),
                                                   torch.empty(1, 2, 130), 0.125, False, config, sm_count=132)
    assert grid == (4, )  # 2 query tiles x 2 heads
    grid, *_ = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False,
                                                   gluon_variants.VARIANTS["persistent-7cta"][128], sm_count=132)
    assert grid == (7, )
    kr = torch.empty(32, 1000, 16, 128, dtype=torch.bfloat16)
    _, args, constexprs, _ = gluon_launch.persistent_launch_args(q, kr, kr, out, lse, 0.125, False, config,
                                                                 sm_count=132)
    assert constexprs["RAGGED"] and len(args[0].shape) == 4
    # O by TMA where no [64, D] box reaches into the next sequence: batch 1 or Sq % 64 == 0.
    tma_config = gluon_variants.VARIANTS["persistent-tma"][128]
    for qt, o_tma in ((q, True), (small, True), (torch.empty(2, 130, 2, 128, dtype=torch.bfloat16), False)):
        _, args, constexprs, _ = gluon_launch.persistent_launch_args(qt, qt, qt, torch.empty_like(qt),
                                                                     torch.empty(qt.shape[0], qt.shape[2], qt.shape[1]),
                                                                     0.125, False, tma_config, sm_count=132)
        assert constexprs["O_TMA"] == o_tma and (args[3].block_shape == [64, 128] if o_tma else args[3] is args[4])
        # Without the TMA store, O leaves through one shared tile (configs.GLUON_FWD_SMEM_EPILOGUE's head dims).
        assert constexprs.get("O_VIA_SMEM", False) == (not o_tma)
    assert gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False, config, sm_count=132)[2]["O_VIA_SMEM"]
    # Q double-buffered: Q_BUFFERS=2 (the kernel's default, 1, is left out of the single-buffered launch's set).
    assert "Q_BUFFERS" not in constexprs
    q2 = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False,
                                             gluon_variants.VARIANTS["persistent-tma-q2"][128], sm_count=132)[2]
    assert q2["Q_BUFFERS"] == 2 and q2["O_TMA"]
    with pytest.raises(ValueError, match="q_buffers"):
        replace(gluon_variants.VARIANTS["default"][128], q_buffers=2)  # the one-tile kernel has one Q tile
    # The deferred epilogue: where O leaves by TMA, not where it goes through the one shared tile (O_VIA_SMEM).
    deferred = gluon_variants.VARIANTS["persistent-tma-q2-de"][128]
    assert gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False, deferred,
                                               sm_count=132)[2]["DEFER_EPILOGUE"]
    ragged = torch.empty(2, 130, 2, 128, dtype=torch.bfloat16)
    constexprs = gluon_launch.persistent_launch_args(ragged, ragged, ragged, torch.empty_like(ragged),
                                                     torch.empty(2, 2, 130), 0.125, False, deferred, sm_count=132)[2]
    assert constexprs["O_VIA_SMEM"] and "DEFER_EPILOGUE" not in constexprs
    with pytest.raises(ValueError, match="defer_epilogue"):
        replace(gluon_variants.VARIANTS["default"][128], defer_epilogue=True)
    base, lazy = (gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, True, gluon_variants.VARIANTS[name][128])[2]
                  for name in ("default", "default-lr"))  # the one-tile kernel's lazy rescale (session 30)
    assert lazy == {**base, "LAZY_RESCALE": True} and "LAZY_RESCALE" not in base
    # Served: D256's default and d64-3wg rescale lazily (ALiBi through the wgmma there too, since session 32); a D64
    # call that d64-3wg cannot take (dropout, ALiBi with softcap) gets the two-consumer default, which does not.
    for name, dim in (("default", 256), ("d64-3wg", 64)):
        t = torch.empty(1, 256, 2, dim, dtype=torch.bfloat16)
        assert gluon_launch.gluon_launch_args(t, t, t, torch.empty_like(t), torch.empty(1, 2, 256), 0.125, True,
                                              gluon_variants.VARIANTS[name][dim])[2]["LAZY_RESCALE"]
    assert gluon_variants.takes_config("d64-3wg", 64, alibi_slopes=torch.ones(2)).lazy_rescale
    assert not gluon_variants.takes_config("d64-3wg", 64, alibi_slopes=torch.ones(2), softcap=30.0).lazy_rescale
    assert not gluon_variants.takes_config("d64-3wg", 64, dropout_p=0.1).lazy_rescale
    base, lazy = (gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, True,
                                                      gluon_variants.VARIANTS[name][128], sm_count=132)[2]
                  for name in ("persistent", "persistent-lr"))
    assert lazy == {**base, "LAZY_RESCALE": True} and "LAZY_RESCALE" not in base
    assert gluon_launch.takes_persistent(config, q, q) and gluon_launch.takes_persistent(config, q, q, causal=True)
    assert not gluon_launch.takes_persistent(gluon_variants.VARIANTS["default"][128], q, q)
    assert not gluon_launch.takes_persistent(config, q, q, window_size=(64, 0))
    assert not gluon_launch.takes_persistent(config, q, q, softcap=30.0)
    assert not gluon_launch.takes_persistent(config, q, q, alibi_slopes=torch.zeros(16))
    assert not gluon_launch.takes_persistent(config, q, q, sink=torch.zeros(16))
    assert not gluon_launch.takes_persistent(config, q, q, cu_seqlens_q=torch.zeros(2, dtype=torch.int32))
    d256 = gluon_variants.VARIANTS["persistent"][256]
    q256, k256 = torch.empty(2, 512, 2, 256), torch.empty(2, 1000, 2, 256)
    assert gluon_launch.takes_persistent(d256, q256, q256) and not gluon_launch.takes_persistent(d256, q256, k256)


# Additive bias: which layouts the Gluon forward reads by TMA (CPU), its launch arguments, and the GPU tier.
@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_bias_support_rule(as_if_hopper):
    """fp16 / bf16 biases (B or 1, Hq or 1, Sq, Sk) with a contiguous last dim and 16-byte row strides go to Gluon
    (size-1 and expanded batch / head dims read the first one's rows); fp32, a broadcast query or key dim, a
    strided last dim, unaligned rows, dropout and biases on another device are refused (the portable kernel)."""
    batch, seqlen_q, seqlen_k, heads_q = 2, 300, 1000, 4
    q = torch.zeros(batch, seqlen_q, heads_q, 128, dtype=torch.bfloat16)
    k = torch.zeros(batch, seqlen_k, 2, 128, dtype=torch.bfloat16)

    def ok(bias, **kw):
        return gluon_launch.gluon_supported(q, k, k, attn_bias=bias, **kw)

    bf16 = dict(dtype=torch.bfloat16)
    for shape in ((1, heads_q, seqlen_q, seqlen_k), (batch, 1, seqlen_q, seqlen_k),
                  (batch, heads_q, seqlen_q, seqlen_k), (1, 1, seqlen_q, seqlen_k)):
        assert ok(torch.zeros(shape, **bf16)), shape
        assert ok(torch.zeros(shape, **bf16), causal=True, softcap=30.0, window_size=(64, 0)), shape
    assert ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, dtype=torch.float16))  # fp16 bias, bf16 q
    assert ok(torch.zeros(1, 1, seqlen_q, seqlen_k, **bf16).expand(batch, heads_q, -1, -1))  # stride-0 dims
    assert ok(torch.zeros(batch, heads_q, seqlen_q, 1008, **bf16)[..., :seqlen_k])  # padded rows
    assert ok(torch.zeros(heads_q, batch, seqlen_q, seqlen_k, **bf16).transpose(0, 1))  # heads outermost
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k))  # fp32: no room for its ring
    assert not ok(torch.zeros(1, heads_q, 1, seqlen_k, **bf16))  # Sq broadcast
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, **bf16)[:, :, :1].expand(-1, -1, seqlen_q, -1))
    assert not ok(torch.zeros(1, heads_q, seqlen_q, 1, **bf16))  # Sk broadcast
    assert not ok(torch.zeros(1, heads_q, seqlen_k, seqlen_q, **bf16).transpose(2, 3))  # last dim not contiguous
    assert not ok(torch.zeros(1, heads_q, seqlen_q, 1004, **bf16)[..., :seqlen_k])  # row stride 2008 B
    n = heads_q * seqlen_q * seqlen_k
    assert not ok(torch.zeros(n + 8, **bf16)[1:n + 1].view(1, heads_q, seqlen_q, seqlen_k))  # base 2 B off
    assert ok(torch.zeros(1, heads_q, seqlen_q + 1, seqlen_k, **bf16)[:, :, :seqlen_q])  # heads 301 rows apart
    head_stride = seqlen_q * seqlen_k + 8  # not a whole number of rows
    assert not ok(torch.zeros(heads_q * head_stride, **bf16).as_strided((1, heads_q, seqlen_q, seqlen_k),
                                                                        (0, head_stride, seqlen_k, 1)))
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, **bf16), dropout_p=0.1)
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, device="meta", **bf16))
    # Varlen: (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k), positions within each sequence.
    lens_q, lens_k = [5, 0, 130, 1], [7, 3, 0, 1000]
    qv, kv, vv = _packed(lens_q, lens_k, 4, 2, 128)
    varlen = dict(cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k), max_seqlen_q=130, max_seqlen_k=1000)
    assert gluon_launch.gluon_supported(qv, kv, vv, attn_bias=torch.zeros(4, 4, 130, 1000, **bf16), **varlen)
    assert not gluon_launch.gluon_supported(qv, kv, vv, attn_bias=torch.zeros(4, 4, 1, 1000, **bf16), **varlen)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_bias_launch_args():
    """The bias's 2-D TMA view: (rows, Sk) at its row stride, boxes [128, BLOCK_N], and the rows one batch / head
    steps (0 along broadcast dims); HAS_BIAS on, and the persistent kernel not taken."""
    config = gluon_variants.VARIANTS["default"][128]
    q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 1000, 2, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 300)
    padded = torch.empty(2, 4, 300, 1008, dtype=torch.bfloat16)[..., :1000]
    for bias, rows, steps in ((padded, 2 * 4 * 300, (1200, 300)),
                              (torch.empty(1, 4, 300, 1000, dtype=torch.float16), 4 * 300, (0, 300)),
                              (torch.empty(2, 1, 300, 1000, dtype=torch.bfloat16), 2 * 300, (300, 0)),
                              (torch.empty(1, 1, 300, 1000, dtype=torch.bfloat16).expand(2, 4, -1, -1), 300, (0, 0))):
        _, args, constexprs, _ = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, False, config,
                                                                attn_bias=bias)
        args = args[:-17]  # the block-sparse arguments (None) and dropout's three last
        desc = args[-4]
        assert constexprs["HAS_BIAS"] and args[-3:-1] == steps and args[-1] == 0.125
        assert desc.shape == [rows, 1000] and desc.strides == [bias.stride(2), 1]
        assert desc.block_shape == [128, config.block_n] and desc.base is bias
    _, args, constexprs, _ = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, False, config)
    assert not constexprs["HAS_BIAS"] and args[-21] is lse
    persistent = gluon_variants.VARIANTS["persistent"][128]
    assert gluon_launch.takes_persistent(persistent, q, q)
    assert not gluon_launch.takes_persistent(persistent, q, q, attn_bias=torch.empty(1, 4, 300, 300))


def test_bias_dispatch(monkeypatch, as_if_hopper):
    """launch._flash_attn_forward hands a bias the Gluon forward reads to it (FLASHTILE_GLUON=1 here), and keeps
    refused layouts (fp32) and dropout on the portable kernels."""
    from flashtile import launch

    calls = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(kw) or ("out", "lse"))
    monkeypatch.setattr(launch, "forward_launches", lambda *a, **kw: calls.append("portable") or [])
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    q = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    bias = torch.zeros(1, 2, 256, 256, dtype=torch.bfloat16)
    assert launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None, attn_bias=bias) == ("out", "lse")
    assert calls[-1]["attn_bias"] is bias
    launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None, attn_bias=bias.float())
    assert calls[-1] == "portable"
    assert launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) == ("out", "lse")
    assert "attn_bias" not in calls[-1]


# (id, bias shape as (batch or 1, heads or 1), bias dtype, causal, window_size, softcap, alibi, sink)
BIAS_CASES = [
    ("h", (1, "h"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("b", ("b", 1), torch.bfloat16, True, (-1, -1), 0.0, None, False),
    ("bh", ("b", "h"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("bh-fp16-bias", ("b", "h"), torch.float16, True, (-1, -1), 0.0, None, False),
    ("expanded", ("B", "H"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("h-softcap-alibi", (1, "h"), torch.bfloat16, False, (-1, -1), 30.0, "h", False),
    ("bh-window-sink", ("b", "h"), torch.bfloat16, False, (200, 100), 0.0, None, True),
    ("h-causal-alibi-softcap-sink", (1, "h"), torch.bfloat16, True, (-1, -1), 30.0, "bh", True),
]


def _bias(batch, heads, seqlen_q, seqlen_k, layout, dtype, seed=3):
    """A bias N(0, 2) of layout (batch or 1, heads or 1) ("B", "H": one (1, 1) bias expanded, stride 0), rows padded
    to a multiple of 8 keys, on cuda."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    padded = -(-seqlen_k // 8) * 8  # 16-byte rows, as TMA needs
    if layout == ("B", "H"):
        return (2 * torch.randn(1, 1, seqlen_q, padded, generator=gen, device="cuda")).to(dtype)[..., :seqlen_k].expand(
            batch, heads, -1, -1)
    b, h = batch if layout[0] == "b" else 1, heads if layout[1] == "h" else 1
    return (2 * torch.randn(b, h, seqlen_q, padded, generator=gen, device="cuda")).to(dtype)[..., :seqlen_k]


# Every case at D128 on three shapes (tails and q != k; GQA; a ragged batch), two at D64 / D256: each feature
# combination and head dim is another compile, and the GPU tier is near its time limit (perf-log).
BIAS_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (2, 300, 1000, 4, 2)]
BIAS_MATRIX = [(c, s, 128) for c in BIAS_CASES for s in BIAS_SHAPES] + [
    (c, BIAS_SHAPES[0], d) for c in (BIAS_CASES[1], BIAS_CASES[5]) for d in (64, 256)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("case,shape,head_dim", BIAS_MATRIX, ids=[
    f"{c[0]}-b{b}-q{sq}-k{sk}-h{hq}/{hk}-d{d}" for c, (b, sq, sk, hq, hk), d in BIAS_MATRIX])
def test_bias_matches_reference(monkeypatch, case, shape, head_dim):
    """An additive bias (HAS_BIAS: TMA-loaded ring beside K / V), alone and with causal, windows, softcap, ALiBi
    and sinks, against the float64 reference; outputs NaN-poisoned. Rows of a tile past Sq read the next head's
    bias rows and are never stored."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, layout, bias_dtype, causal, window_size, softcap, alibi, sink = case
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    if (causal or window_size[1] >= 0) and seqlen_q - seqlen_k > (0 if causal else window_size[1]):
        pytest.skip("rows without keys: the portable kernel's")
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap,
                 sink=torch.randn(heads_q, device="cuda") if sink else None,
                 alibi_slopes=alibi_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None,
                 attn_bias=_bias(batch, heads_q, seqlen_q, seqlen_k, layout, bias_dtype))
    _check_gluon_forward(q, k, v, causal, feats)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("variant,head_dim", [("default", 128), ("default-lr", 128), ("default", 256)],
                         ids=["d128", "d128-lazy", "d256-lazy"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bias_rows_without_keys_and_the_next_heads_rows(monkeypatch, causal, variant, head_dim):
    """A bias of -inf on every key of some rows (a mask as a bias): those rows get 0 and lse -inf, as the portable
    kernel writes them, also where the rows of a tile past Sq read them (head 1's first rows, read by head 0's last
    tile); NaN in the storage's key columns past Sk (row padding) is never read (TMA zero-fills past the view). With
    the lazy rescale (D256's default, "default-lr") a row's max stays -inf until it sees a key."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    q, k, v = make_qkv(1, 300, 1000, 2, 2, head_dim, torch.bfloat16, "cuda", requires_grad=False)
    storage = torch.randn(1, 2, 300, 1008, device="cuda").to(torch.bfloat16)
    storage[..., 1000:] = float("nan")  # past Sk
    bias = storage[..., :1000]
    bias[0, 0, 10] = float("-inf")  # row 10 of head 0 sees no key
    bias[0, 1, :45] = float("-inf")  # head 1's first rows: what the tile rows past Sq of head 0 read
    bias[0, 1, 200, 500:] = float("-inf")  # a row that sees only the first 500 keys
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, attn_bias=bias)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, attn_bias=bias, variant=variant)
    clean = bias.contiguous()
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, attn_bias=clean)
    assert torch.all(out[0, 10, 0] == 0) and lse[0, 0, 10] == float("-inf")
    assert torch.all(out[0, :45, 1] == 0) and torch.all(lse[0, 1, :45] == float("-inf"))
    lse_ref = torch.where(torch.isnan(lse_ref), float("-inf"), lse_ref)
    assert_close_rule("out", out, ref.nan_to_num(0.0),
                      flashtile.attention_ref(q, k, v, causal=causal, upcast=False, attn_bias=clean).nan_to_num(0.0),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_flash_attn_func_bias_takes_gluon(monkeypatch):
    """flash_attn_func routes a bf16 bias to the Gluon forward (D128 1K: configs.py wants it) and the portable
    backward (dq, dk, dv, dbias) runs on its out / lse; an fp32 bias stays on the portable forward."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    bias = _bias(2, 4, 1024, 1024, (1, "h"), torch.bfloat16).requires_grad_()
    out = flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v, bias), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=1e-2)
    monkeypatch.delenv("FLASHTILE_GLUON")
    flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias.detach().float())
    assert len(calls) == 1
