"""The Gluon kernels' heavy-first grid order for causal launches (GluonConfig / GluonBwdConfig.lpt_heads,
kernels/gluon_grid._heavy_first; the persistent forward's tile order too): only the order in which the programs
(tiles) start changes, so the forward's out and lse and the backward's dK / dV are the other order's bit for bit
(dQ's reduce-adds land in another order: close). Shapes with several batches and heads, head counts that leave the
last group of heads short, Sq != Sk. On CPU: the launch arguments (the constexpr only where it applies)."""
from dataclasses import replace

import pytest
import torch

from flashtile import gluon_bwd_launch, gluon_launch, gluon_variants, launch
from utils import make_qkv

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
GROUP = 8  # a group smaller than the shapes' head counts: several groups, the last one short
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): 15 / 9 / 20 (batch x kv heads for the backward) heads per grid
SHAPES = [(3, 700, 700, 5, 5), (3, 1000, 1000, 6, 3), (1, 333, 1000, 4, 4), (5, 256, 256, 4, 2)]
IDS = [f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in SHAPES]


def _variants(module, base):
    """Variants "lpt" (base's configs with lpt_heads GROUP) and "head-major" (lpt_heads 0) for monkeypatch."""
    configs = {d: replace(module.VARIANTS[name][d], lpt_heads=0)
               for d, name in base.items()}
    return {"lpt": {d: replace(c, lpt_heads=GROUP) for d, c in configs.items()}, "head-major": configs}


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_forward_order_changes_nothing(monkeypatch, shape, head_dim):
    for name, variant in _variants(gluon_variants, {d: "default" for d in (64, 128, 256)}).items():
        monkeypatch.setitem(gluon_variants.VARIANTS, name, variant)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=True, variant="lpt")
    out0, lse0 = gluon_launch.gluon_forward(q, k, v, causal=True, variant="head-major")
    assert torch.equal(out, out0) and torch.equal(lse, lse0)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("order", [dict(lpt_heads=GROUP), dict(lpt_heads=GROUP, schedule=True), dict(schedule=True)],
                         ids=["lpt", "lpt-listed", "listed"])
@pytest.mark.parametrize("base_variant,head_dim", [("persistent-tma", 64), ("persistent-tma", 128),
                                                   ("persistent", 256)], ids=["tma-d64", "tma-d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_persistent_order_changes_nothing(monkeypatch, shape, base_variant, head_dim, order):
    """The persistent kernel's tiles by groups of heads, with the grid's stride or listed per CTA by the host
    (persistent_schedule.py; groups of GROUP or all heads), against rank by rank over all heads with the stride: on
    the 132-SM grid and on 7 CTAs (each CTA walks many tiles of several groups). D256 takes batch > 1 only where
    Sk % 64 == 0 (takes_persistent)."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    if head_dim == 256 and batch > 1 and seqlen_k % 64:
        pytest.skip("D256 with ragged descriptors runs the one-tile kernel")
    for max_ctas in (0, 7):
        base = {d: replace(c, max_ctas=max_ctas) for d, c in gluon_variants.VARIANTS[base_variant].items()}
        monkeypatch.setitem(gluon_variants.VARIANTS, "ordered", {d: replace(c, **order) for d, c in base.items()})
        monkeypatch.setitem(gluon_variants.VARIANTS, "rank-major", base)
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                           requires_grad=False)
        assert gluon_launch.takes_persistent(base[head_dim], q, k, causal=True)
        out, lse = gluon_launch.gluon_forward(q, k, v, causal=True, variant="ordered")
        out0, lse0 = gluon_launch.gluon_forward(q, k, v, causal=True, variant="rank-major")
        assert torch.equal(out, out0) and torch.equal(lse, lse0), max_ctas
        # The listed order reached the kernel (a list exists now, outside any capture).
        constexprs = gluon_launch.persistent_launch_args(q, k, v, out, lse, 0.1, True,
                                                         gluon_variants.VARIANTS["ordered"][head_dim])[2]
        assert constexprs.get("SCHEDULE", False) == order.get("schedule", False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_backward_order_changes_nothing(monkeypatch, shape, head_dim):
    base = {64: "d64-bm128", 128: "default", 256: "default"}
    for name, variant in _variants(gluon_bwd_launch, base).items():
        monkeypatch.setitem(gluon_bwd_launch.VARIANTS, name, variant)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=q.dtype, device="cuda")
    scale = head_dim ** -0.5
    out, lse = launch._flash_attn_forward(q, k, v, scale, -1, 0, 0.0, None, None)[:2]
    dq, dk, dv = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, True, variant="lpt")
    dq0, dk0, dv0 = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, True, variant="head-major")
    assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    torch.testing.assert_close(dq, dq0, atol=1e-2, rtol=1e-2)


def test_order_constexpr_only_for_dense_causal():
    """LPT_HEADS (and the persistent kernel's SCHEDULE) reaches the kernels of dense causal launches only (forward,
    persistent forward, backward): full, windowed (causal + left window included) and varlen launches keep the
    kernels (constexprs) they had. Launch arguments only: CPU tensors, no GPU."""
    pytest.importorskip("triton.experimental.gluon")
    q = torch.randn(2, 256, 4, 128, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 256)
    cfg = replace(gluon_variants.VARIANTS["default"][128], lpt_heads=GROUP)
    persistent = replace(gluon_variants.VARIANTS["persistent-tma"][128], lpt_heads=GROUP)
    bwd = replace(gluon_bwd_launch.VARIANTS["default"][128], lpt_heads=GROUP)
    dq_accum = torch.empty(2, 256, 4, 128)
    cases = [(True, (-1, -1), GROUP), (False, (-1, -1), None), (False, (64, 0), None), (True, (64, -1), None)]
    try:
        for causal, window, want in cases:
            constexprs = gluon_launch.gluon_launch_args(q, q, q, q, lse, 0.1, causal, cfg, window_size=window)[2]
            assert constexprs.get("LPT_HEADS") == want, ("forward", causal, window)
            constexprs = gluon_bwd_launch.dkdv_launch_args(q, q, q, q, lse, lse, q, q, dq_accum, 0.1, causal, bwd,
                                                           window_size=window)[2]
            assert constexprs.get("LPT_HEADS") == want, ("backward", causal, window)
        listed = replace(persistent, schedule=True)
        for causal, want in [(True, GROUP), (False, None)]:
            _, args, constexprs, _ = gluon_launch.persistent_launch_args(q, q, q, q, lse, 0.1, causal, persistent, 132)
            assert constexprs.get("LPT_HEADS") == want and "SCHEDULE" not in constexprs, causal
            assert args[-1] is lse  # Schedule, unused
            _, args, constexprs, _ = gluon_launch.persistent_launch_args(q, q, q, q, lse, 0.1, causal, listed, 132)
            assert constexprs.get("SCHEDULE") == (True if causal else None), causal
            assert (args[-1] is lse) != causal and args[-1].dtype == (torch.int32 if causal else lse.dtype)
        packed = q.reshape(512, 4, 128)
        cu = torch.tensor([0, 200, 512], dtype=torch.int32)
        constexprs = gluon_launch.gluon_launch_args(packed, packed, packed, packed, lse.reshape(4, 256 * 2), 0.1, True,
                                                    cfg, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=312,
                                                    max_seqlen_k=312)[2]
        assert "LPT_HEADS" not in constexprs and constexprs["VARLEN"]
    except (RuntimeError, TypeError, ValueError) as exc:  # descriptors of CPU tensors on a triton without them
        pytest.skip(f"no host TMA descriptors for CPU tensors here: {exc}")


def test_schedule_is_the_persistent_kernels():
    """schedule lists the persistent kernel's tiles; the one-tile kernel's programs have one tile each."""
    pytest.importorskip("triton.experimental.gluon")
    with pytest.raises(ValueError, match="schedule"):
        replace(gluon_variants.VARIANTS["default"][128], schedule=True)
    assert replace(gluon_variants.VARIANTS["persistent"][256], schedule=True).schedule
