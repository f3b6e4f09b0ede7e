"""The D64 Gluon forward with three consumer warpgroups (gluon_variants.VARIANTS["d64-3wg"], BLOCK_M 192, and the
persistent grid's "persistent-3wg-tma[-lpt8]" and "-q2[-de]"): launch arguments and config rules on CPU, and the GPU
tier (sm90) against the float64 reference."""
import math
from dataclasses import replace

import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants
from gluon_fwd_utils import sink_logits
from utils import (alibi_slopes, assert_close_rule, assert_varlen_matches_each_sequence, make_qkv,
                   record_calls)

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
VARIANT = "d64-3wg"
needs_gluon = pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")


def test_config_rules():
    """Three consumers: BLOCK_M 192, registers that fit 64K with the loader's warpgroup (setmaxnreg takes
    multiples of 8), D64 only; a persistent config of three takes no host schedule (its cost model lists 128-row
    tiles)."""
    config = gluon_variants.VARIANTS[VARIANT][64]
    assert set(gluon_variants.VARIANTS[VARIANT]) == {64}
    assert config.consumers == 3 and config.block_m == 192 and not config.persistent
    assert gluon_variants.VARIANTS["default"][64].block_m == 128
    assert config.consumer_regs % 8 == 0 and config.loader_regs % 8 == 0
    assert 3 * 128 * config.consumer_regs + 128 * config.loader_regs <= 65536
    assert config.maxnreg * 16 * 32 <= 65536  # 16 warps at launch: 3 consumer warpgroups + the loader's
    with pytest.raises(ValueError, match="consumers"):
        gluon_variants.GluonConfig(128, 3, consumers=3, persistent=True, schedule=True)
    for name in ("persistent-3wg-tma", "persistent-3wg-tma-lpt8", "persistent-3wg-tma-q2", "persistent-3wg-tma-q2-de"):
        persistent = gluon_variants.VARIANTS[name][64]
        assert persistent.persistent and persistent.tma_store and persistent.block_m == 192
        assert (persistent.consumer_regs, persistent.loader_regs, persistent.maxnreg) == (160, 24, 128)
    with pytest.raises(ValueError, match="consumers"):
        gluon_variants.GluonConfig(128, 3, consumers=4)


def test_takes_config_gives_a_bias_the_default():
    """The bias ring holds [128, BLOCK_N] boxes: a three-consumer variant serves a bias with the default config."""
    bias = torch.zeros(1, 4, 300, 300, dtype=torch.bfloat16)
    assert gluon_variants.takes_config(VARIANT, 64) is gluon_variants.VARIANTS[VARIANT][64]
    assert gluon_variants.takes_config(VARIANT, 64, bias) is gluon_variants.VARIANTS["default"][64]
    assert gluon_variants.takes_config("default", 128, bias) is gluon_variants.VARIANTS["default"][128]
    slopes = torch.ones(4)
    # Without alibi_mma, ALiBi's per-column term spills three consumers' registers: the default takes ALiBi.
    assert not gluon_variants.VARIANTS["persistent-3wg-tma"][64].alibi_mma
    assert gluon_variants.takes_config("persistent-3wg-tma", 64, alibi_slopes=slopes) is \
        gluon_variants.VARIANTS["default"][64]
    # With alibi_mma (d64-3wg's) the ALiBi columns leave the registers (a wgmma): three consumers take ALiBi, but not
    # with softcap (no wgmma then), a bias or dropout.
    am = gluon_variants.VARIANTS[VARIANT][64]
    assert am.consumers == 3 and am.alibi_mma
    assert gluon_variants.takes_config(VARIANT, 64, alibi_slopes=slopes) is am
    assert gluon_variants.takes_config(VARIANT, 64, alibi_slopes=slopes, softcap=30.0) is \
        gluon_variants.VARIANTS["default"][64]
    assert gluon_variants.takes_config(VARIANT, 64, bias, slopes) is gluon_variants.VARIANTS["default"][64]
    assert gluon_variants.takes_config(VARIANT, 64, alibi_slopes=slopes, dropout_p=0.1) is \
        gluon_variants.VARIANTS["default"][64]


@needs_gluon
def test_launch_args():
    """Grid over 192-row tiles (dense and varlen's max_seqlen_q), CONSUMERS=3 and maxnreg 128; the default config
    CONSUMERS=2 (the kernel's default value: it compiles as before). P by pairs (P_CVT_ASM) but with varlen and a
    window."""
    config = gluon_variants.VARIANTS[VARIANT][64]
    for seqlen_q, causal in ((1000, False), (192, True), (193, True), (1, False)):
        q = torch.empty(2, seqlen_q, 4, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 1000, 2, 64, dtype=torch.bfloat16)
        out, lse = torch.empty_like(q), torch.empty(2, 4, seqlen_q)
        grid, args, constexprs, options = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, causal, config)
        assert grid == (math.ceil(seqlen_q / 192), 2 * 4)
        assert constexprs["CONSUMERS"] == 3 and constexprs["IS_CAUSAL"] == causal and constexprs["RAGGED"]
        assert options == dict(num_warps=4, maxnreg=128)
        assert args[0].block_shape == [1, 1, 64, 64]  # Q in three [64, D] boxes
        assert constexprs["P_CVT_ASM"]
        _, _, constexprs, _ = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, causal, config,
                                                             window_size=(256, 0))
        assert constexprs["P_CVT_ASM"] and constexprs["IS_LOCAL"]  # a dense window keeps it
        grid, _, constexprs, options = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, causal,
                                                                      gluon_variants.VARIANTS["default"][64])
        assert grid == (math.ceil(seqlen_q / 128), 2 * 4) and constexprs["CONSUMERS"] == 2
    lens = [300, 0, 1, 577]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    qv = torch.empty(sum(lens), 4, 64, dtype=torch.bfloat16)
    grid, _, constexprs, _ = gluon_launch.gluon_launch_args(qv, qv, qv, torch.empty_like(qv), torch.empty(4, sum(lens)),
                                                            0.125, True, config, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                            max_seqlen_q=577, max_seqlen_k=577)
    assert grid == (4, 4 * 4) and constexprs["VARLEN"] and constexprs["CONSUMERS"] == 3
    # P by pairs (session 33), but not with varlen and a window, whose full-block loops it made spill.
    assert constexprs["P_CVT_ASM"]
    _, _, constexprs, _ = gluon_launch.gluon_launch_args(qv, qv, qv, torch.empty_like(qv), torch.empty(4, sum(lens)),
                                                         0.125, False, config, window_size=(256, 0), cu_seqlens_q=cu,
                                                         cu_seqlens_k=cu, max_seqlen_q=577, max_seqlen_k=577)
    assert not constexprs["P_CVT_ASM"]


@needs_gluon
def test_forward_launches_the_variant(monkeypatch):
    """gluon_forward with the variant launches CONSUMERS=3 on a 192-row grid (softcap, sinks, windows and ALiBi
    through the wgmma too), never the persistent kernel, and a bias or ALiBi with softcap with the default config.
    The kernel is replaced by a recorder (no GPU here)."""
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid, kwargs))

    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", Recorder())
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper_persistent", None)
    q = torch.empty(1, 1000, 4, 64, dtype=torch.bfloat16)
    for causal in (False, True):
        gluon_launch.gluon_forward(q, q, q, causal=causal, variant=VARIANT)
        grid, kwargs = seen.pop()
        assert grid == (6, 4) and kwargs["CONSUMERS"] == 3 and kwargs["maxnreg"] == 128
        assert kwargs["IS_CAUSAL"] == causal and kwargs["CONSUMER_REGS"] == 160
    gluon_launch.gluon_forward(q, q, q, variant=VARIANT, attn_bias=torch.zeros(1, 4, 1000, 1000, dtype=torch.bfloat16))
    grid, kwargs = seen.pop()
    assert grid == (8, 4) and kwargs["CONSUMERS"] == 2 and kwargs["HAS_BIAS"]
    gluon_launch.gluon_forward(q, q, q, causal=True, variant=VARIANT, alibi_slopes=torch.ones(4))
    grid, kwargs = seen.pop()
    assert grid == (6, 4) and kwargs["CONSUMERS"] == 3 and kwargs["HAS_ALIBI"] and kwargs["ALIBI_MMA"]
    gluon_launch.gluon_forward(q, q, q, causal=True, variant=VARIANT, alibi_slopes=torch.ones(4), softcap=30.0)
    grid, kwargs = seen.pop()
    assert grid == (8, 4) and kwargs["CONSUMERS"] == 2 and kwargs["HAS_ALIBI"] and not kwargs.get("ALIBI_MMA")
    gluon_launch.gluon_forward(q, q, q, variant=VARIANT, softcap=30.0, sink=torch.zeros(4), window_size=(256, 0))
    grid, kwargs = seen.pop()
    assert grid == (6, 4) and kwargs["CONSUMERS"] == 3 and kwargs["SOFTCAP"] and kwargs["HAS_SINK"]


@needs_gluon
def test_persistent_variant_off_its_kernel_takes_the_default_config(monkeypatch):
    """A call of a persistent variant that the persistent kernel cannot take (D256, batch > 1, Sk % 64 != 0: ragged
    descriptors) runs the one-tile kernel with the default's measured config (8 heads per causal group), not the
    variant's listed order's 4."""
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(kwargs)

    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", Recorder())
    q = torch.empty(2, 1000, 2, 256, dtype=torch.bfloat16)
    assert not gluon_launch.takes_persistent(gluon_variants.VARIANTS["persistent-sched4"][256], q, q, causal=True)
    gluon_launch.gluon_forward(q, q, q, causal=True, variant="persistent-sched4")
    assert seen.pop()["LPT_HEADS"] == gluon_variants.VARIANTS["default"][256].lpt_heads == 8


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype): Sq off the 192-row tile (a third / two thirds of the last
# tile), q < k (causal bottom-right), GQA / MQA, ragged batches (Sk % 128 != 0), 1 x 1, fp16. Batch > 1 with
# Sq % 64 == 0 (the persistent grid's O by TMA): the last tile's warpgroups 1 and 2 past Sq (1024, 256, 4096), or
# warpgroup 2 alone (896).
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (1, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (1, 777, 999, 8, 1, torch.bfloat16), (1, 1, 1, 2, 1, torch.bfloat16),
          (1, 1000, 1000, 4, 2, torch.float16), (3, 256, 512, 4, 2, torch.bfloat16),
          (2, 1000, 1000, 4, 2, torch.bfloat16), (3, 130, 257, 2, 2, torch.bfloat16),
          (1, 192, 192, 2, 2, torch.bfloat16), (1, 193, 385, 2, 2, torch.bfloat16),
          (2, 4096, 4096, 2, 1, torch.bfloat16), (2, 896, 896, 4, 2, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(monkeypatch, shape, causal):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, 64, dtype, "cuda", requires_grad=False)
    assert gluon_launch.gluon_supported(q, k, v, causal=causal)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant=VARIANT)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)



PERSISTENT = ("persistent-3wg-tma", "persistent-3wg-tma-lpt8", "persistent-3wg-tma-q2", "persistent-3wg-tma-q2-de",
              "persistent-3wg-tma-q2-lr")


@needs_gluon
def test_persistent_launch_args():
    """The persistent variants of three consumers: tiles of 192 rows, CONSUMERS=3, O by TMA where no [64, D] box
    reaches into the next sequence and else from the registers (never O_VIA_SMEM, whose turn order is for two);
    causal in groups of 8 heads (lpt8); P by pairs (session 33)."""
    for name in PERSISTENT:
        config = gluon_variants.VARIANTS[name][64]
        for batch, seqlen_q, o_tma in ((2, 1024, True), (1, 1000, True), (2, 1000, False), (2, 193, False)):
            q = torch.empty(batch, seqlen_q, 4, 64, dtype=torch.bfloat16)
            out, lse = torch.empty_like(q), torch.empty(batch, 4, seqlen_q)
            assert gluon_launch.takes_persistent(config, q, q, causal=True)
            grid, args, constexprs, options = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, True,
                                                                                  config, sm_count=132)
            n_m, n_bh, n_tiles = args[-4:-1]
            assert (n_m, n_bh, n_tiles) == (math.ceil(seqlen_q / 192), batch * 4, math.ceil(seqlen_q / 192) * batch * 4)
            assert grid == (min(n_tiles, 132), ) and options == dict(num_warps=4, maxnreg=128)
            assert constexprs["CONSUMERS"] == 3 and constexprs["O_TMA"] == o_tma and "O_VIA_SMEM" not in constexprs
            assert constexprs["P_CVT_ASM"]
            assert constexprs.get("LPT_HEADS", 0) == config.lpt_heads and "SCHEDULE" not in constexprs
            # Three consumers never take O_VIA_SMEM, so a deferred epilogue always reaches the kernel.
            assert constexprs.get("DEFER_EPILOGUE", False) == config.defer_epilogue


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("max_ctas", [0, 7], ids=["grid", "7cta"])
@pytest.mark.parametrize("variant", PERSISTENT)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_persistent_matches_reference(monkeypatch, shape, causal, variant, max_ctas):
    """The persistent kernel with three consumers on the full grid and on 7 CTAs (each walks dozens of tiles: the
    ring, turn and Q barriers' running phases across tiles of 192 rows), NaN-poisoned outputs."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    monkeypatch.setitem(gluon_variants.VARIANTS, "under-test",
                        {64: replace(gluon_variants.VARIANTS[variant][64], max_ctas=max_ctas)})
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, 64, dtype, "cuda", requires_grad=False)
    if causal and not gluon_launch.gluon_supported(q, k, v, causal=causal):
        pytest.skip("rows without keys: the Gluon forward refuses them")
    calls = record_calls(monkeypatch, gluon_launch, "persistent_launch_args")
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant="under-test")
    assert calls
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


# (id, causal, window_size, softcap, alibi: None / "h" / "bh", sink, bias): the score features the three
# consumers share with the default (a bias or ALiBi with softcap runs the default config: gluon_variants.takes_config;
# ALiBi without softcap runs three consumers, its columns by the wgmma, since session 32).
FEATURES = [
    ("softcap-causal", True, (-1, -1), 30.0, None, False, False),
    ("alibi-bh", False, (-1, -1), 0.0, "bh", False, False),
    ("alibi-causal-sink", True, (-1, -1), 0.0, "h", True, False),
    ("window-256-0", False, (256, 0), 0.0, None, False, False),
    ("window-100-50", False, (100, 50), 0.0, None, False, False),
    ("window-softcap-alibi-sink", False, (200, 100), 30.0, "bh", True, False),
    ("bias-causal", True, (-1, -1), 0.0, None, False, True),
]
FEATURE_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (2, 300, 1000, 4, 2)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in
                                                       FEATURE_SHAPES])
@pytest.mark.parametrize("feature", FEATURES, ids=[f[0] for f in FEATURES])
def test_features_match_reference(monkeypatch, feature, shape):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, causal, window_size, softcap, alibi, sink, bias = feature
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, 64, torch.bfloat16, "cuda", requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap, sink=sink_logits(heads_q) if sink else None,
                 alibi_slopes=alibi_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None,
                 attn_bias=torch.randn(1, heads_q, seqlen_q, -(-seqlen_k // 8) * 8, device="cuda",  # 16-byte rows
                                       dtype=torch.bfloat16)[..., :seqlen_k] if bias else None)
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant=VARIANT, **feats)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, **feats)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False, **feats),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


# (id, sequence lengths q, sequence lengths k, heads_q, heads_kv): empty and single-token sequences, lengths off
# the 192-row tile, Sq > Sk (causal: rows without keys, whole tiles without keys), GQA / MQA.
VARLEN_CASES = [
    ("mixed", [1, 17, 0, 300, 129, 64, 577], [5, 1, 9, 300, 200, 0, 600], 4, 2),
    ("equal-1000", [1000, 1000], [1000, 1000], 4, 4),
    ("q-gt-k", [457, 130, 1], [130, 257, 1], 8, 1),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_varlen_matches_each_sequence_alone(monkeypatch, case, causal):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, lens_q, lens_k, heads_q, heads_kv = case
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(sum(lens), heads, 64, generator=gen, device="cuda").to(torch.bfloat16)
               for lens, heads in ((lens_q, heads_q), (lens_k, heads_kv), (lens_k, heads_kv)))
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
                  for lens in (lens_q, lens_k))
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **varlen)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, variant=VARIANT, **varlen)
    assert_varlen_matches_each_sequence(out, lse, q, k, v, lens_q, lens_k, cu_q, cu_k, causal)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal, seqlen, variant", [(False, 4200, "persistent-3wg-tma-q2-lr"),
                                                     (False, 8300, "persistent-3wg-tma-q2-lr"), (False, 16500, VARIANT),
                                                     (True, 8200, VARIANT)],
                         ids=["full-4200", "full-8300", "full-16500", "causal-8200"])
def test_long_d64_rows_dispatch_to_the_variant(monkeypatch, causal, seqlen, variant):
    """flash_attn_func at D64 past configs.GLUON_FWD_LONG's thresholds takes the three-consumer forward (plain rows
    up to 16K keys in the persistent grid: configs.GLUON_FWD_PERSISTENT); output and gradients (the Gluon backward on
    its out / lse) against the float64 reference."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(1, seqlen, seqlen, 2, 1, 64, torch.bfloat16, "cuda")
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert [call.get("variant") for call in calls] == [variant]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = flashtile.attention_ref(q, k, v, causal=causal)
    low = flashtile.attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_rule("out", out, ref, low, torch.bfloat16)
    refs = torch.autograd.grad(ref, (q, k, v), dout.double())
    lows = torch.autograd.grad(low, (q, k, v), dout)
    for name, got, r, lp in zip(("dq", "dk", "dv"), grads, refs, lows):
        assert_close_rule(name, got, r, lp, torch.bfloat16)
