"""The Hopper Gluon forward against the float64 reference on sm90 (GPU tier): the one-tile and persistent variants
over shapes, their two O epilogues, the lazy rescale, ragged key blocks, and flash_attn_func's default routing."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants
from gluon_fwd_utils import ON_HOPPER, _growing_keys
from utils import assert_close_rule, make_qkv, record_calls, record_constexpr


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
