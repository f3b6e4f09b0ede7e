"""The Hopper Gluon backward's gradients against the float64 reference on sm90 (GPU tier): the default over shapes
and head dims, both dK / dV epilogues, and every other variant."""
import pytest
import torch

import flashtile
from flashtile import configs, gluon_bwd_launch, launch
from gluon_bwd_utils import ON_HOPPER
from utils import assert_close_rule, make_qkv, record_calls, record_constexpr, references


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype): tails, q != k (both ways), GQA / MQA, batches with tails
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (1, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (1, 257, 130, 2, 2, torch.bfloat16), (1, 777, 999, 8, 1, torch.bfloat16),
          (3, 1000, 1000, 4, 2, torch.bfloat16), (1, 1, 1, 2, 1, torch.bfloat16), (2, 1000, 1000, 4, 2, torch.float16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(monkeypatch, shape, head_dim, causal):
    """FLASHTILE_GLUON_BWD=1: flash_attn_func's gradients from the Gluon backward against the float64 reference."""
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device="cuda")
    grads = torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    assert calls
    ref64, reflow = references(q, k, v, dout, causal)
    for name, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64[1:], reflow[1:]):
        assert_close_rule(name, got, r64, rlow, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_both_dkdv_epilogues(monkeypatch, head_dim, causal):
    """dK / dV stored through shared memory (a short program) and from the accumulators (the rows' threshold 0):
    both calls through the Gluon backward with the intended constexpr, bitwise the same dK / dV, on a shape with key
    and query tails, GQA and NaN-poisoned outputs."""
    from flashtile import plans

    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    flags = record_constexpr(monkeypatch, gluon_bwd_launch, "dkdv_launch_args", "STORE_VIA_SMEM")
    q, k, v = make_qkv(2, 1000, 1100, 4, 2, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=q.dtype, device="cuda")
    grads = []
    for most in (4096, 0):
        monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS", most)
        monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256", most)
        plans.clear()  # a signature's plan holds its first call's launches
        grads.append(torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout))
    plans.clear()
    assert len(calls) == 2 and flags == [True, False]
    assert torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][2], grads[1][2])
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-2, atol=1e-3)  # dQ: the adds' order differs
    ref64, reflow = references(q, k, v, dout, causal)
    for name, got, r64, rlow in zip(("dq", "dk", "dv"), grads[0], ref64[1:], reflow[1:]):
        assert_close_rule(name, got, r64, rlow, torch.bfloat16)


# Every variant besides the default (gluon_bwd_launch.VARIANTS), at each head dim it has, against the float64
# reference, both masks: the check script times them; this keeps them correct. Tails of a 128-row tile (333,
# 1000), q != k both ways, GQA, two batches; the plain-only variants (d64-bm128*) take these plain / causal calls.
# Variants that only reorder the causal grid (lptN, head-major) are left to test_gluon_grid_order.py: the same
# results bit for bit as another order.
OTHER_VARIANTS = [(name, head_dim) for name, configs_ in gluon_bwd_launch.VARIANTS.items()
                  if name != "default" and not name.startswith("lpt") and name != "head-major"
                  for head_dim in sorted(configs_)]
OTHER_SHAPES = [(2, 1000, 1000, 4, 2, torch.bfloat16), (1, 333, 333, 2, 2, torch.bfloat16),
                (1, 333, 1000, 4, 1, torch.bfloat16), (1, 1000, 333, 2, 2, torch.float16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant,head_dim", OTHER_VARIANTS, ids=[f"{v}-d{d}" for v, d in OTHER_VARIANTS])
@pytest.mark.parametrize("shape", OTHER_SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                                     for b, sq, sk, hq, hk, dt in OTHER_SHAPES])
def test_other_bwd_variant(monkeypatch, shape, variant, head_dim, causal):
    """gluon_backward(variant=...) from flashtile's forward (out, lse) against the float64 reference, outputs and
    row buffers NaN-poisoned."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device="cuda")
    scale = head_dim ** -0.5
    out, lse = launch._flash_attn_forward(q, k, v, scale, -1, 0 if causal else -1, 0.0, None, None)[:2]
    grads = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal, variant=variant)
    ref64, reflow = references(q, k, v, dout, causal)
    for name, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64[1:], reflow[1:]):
        assert_close_rule(name, got, r64, rlow, dtype)
