"""Block-sparse flashtile.attention through the Hopper Gluon forward (gluon_launch.sparse_ok /
gluon_sparse_forward): GPU tier on sm90 only; on CPU the support check and the dispatch's refusals."""
import pytest
import torch
import triton
import triton.language as tl

import flashtile
from flashtile import gluon_bwd_launch, gluon_launch
from flashtile.launch import ModArgs
from test_programmable import check, late_rows, per_head
from utils import assert_close_rule, make_qkv, record_calls

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@triton.jit
def bounded_window(b, h, q_idx, kv_idx, limits):
    """A custom mask_mod reading an aux tensor: causal, at most limits[b, h] keys back."""
    return (kv_idx <= q_idx) & (q_idx - kv_idx < tl.load(limits + b * 8 + h))


def hide_all(b, h, q_idx, kv_idx):
    return kv_idx < 0


# name -> (mask factory of the document ids and the batch's limits, whether the block mask needs the real B / H)
MASKS = {
    "causal": (lambda ids, lim: flashtile.causal_mask, False),
    "window256": (lambda ids, lim: flashtile.sliding_window_mask(256), False),
    "window200-both": (lambda ids, lim: flashtile.sliding_window_mask(200, causal=False), False),
    "document": (lambda ids, lim: flashtile.document_mask(ids), False),
    "document-causal": (lambda ids, lim: flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids)),
                        False),
    "prefix-lm": (lambda ids, lim: flashtile.prefix_lm_mask(300), False),
    "block-diagonal": (lambda ids, lim: flashtile.block_diagonal_mask(200), False),
    "dilated4": (lambda ids, lim: flashtile.dilated_mask(4), False),
    "strided": (lambda ids, lim: flashtile.strided_mask(5), False),
    "or-masks": (lambda ids, lim: flashtile.or_masks(flashtile.block_diagonal_mask(256), flashtile.strided_mask(7)),
                 False),
    "per-batch-head": (lambda ids, lim: per_head, True),
    "empty-rows": (lambda ids, lim: late_rows, False),
    "custom-aux": (lambda ids, lim: flashtile.flex.mods.Mod(bounded_window, (lim,)), True),
}
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): lengths off the 128 grid, Sq != Sk, GQA / MQA, batch 2 with
# Sk % 128 != 0 (ragged descriptors), and Sk a multiple of 128 (EVEN_N: partial tiles without the sequence-end mask).
SHAPES = [(2, 1000, 1000, 8, 2), (1, 777, 1300, 4, 1), (2, 130, 257, 4, 4), (2, 400, 768, 4, 2)]


def _mask(name, seqlen_k):
    ids = (torch.arange(seqlen_k, device="cuda") * 7 // seqlen_k).to(torch.int32)
    limits = torch.randint(50, 400, (2 * 8,), device="cuda", dtype=torch.int32)
    factory, needs_bh = MASKS[name]
    return factory(ids, limits), needs_bh


def _count_gluon(monkeypatch):
    return record_calls(monkeypatch, gluon_launch, "gluon_sparse_forward")


def test_sparse_refused_off_hopper():
    """CPU tensors (and the interpreter) never take the Gluon block-sparse path; the refusals that do not need a
    GPU: no block mask, a score_mod, windows, head dims and block sizes the kernel's tiles do not fit."""
    q = torch.randn(1, 256, 2, 64)
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 256, 256, device="cpu")
    mods = ModArgs.make((), None, None, bm.mask_mod.triton(), bm)
    assert not gluon_launch.sparse_ok(q, q, q, -1, -1, mods)
    assert not gluon_launch.sparse_ok(q, q, q, -1, -1, ModArgs.make((), None, None, bm.mask_mod.triton()))
    assert not gluon_launch.sparse_ok(q, q, q, -1, -1, ModArgs.make((), lambda: 0, None, None, bm))
    assert not gluon_launch.sparse_ok(q, q, q, -1, 0, mods)
    small = flashtile.create_block_mask(flashtile.causal_mask, None, None, 256, 256, block_size=(64, 64),
                                        device="cpu")
    assert not gluon_launch.sparse_ok(q, q, q, -1, -1, ModArgs.make((), None, None, None, small))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in SHAPES])
@pytest.mark.parametrize("name", list(MASKS))
def test_gluon_sparse_matches_reference(name, shape, head_dim, monkeypatch):
    """out, lse, dq, dk, dv of flashtile.attention with a block mask, the forward and the backward both on the
    Gluon kernels, against the float64 reference (ready-made masks, per-batch / per-head masks, a custom aux mask,
    rows without keys; lengths off the 128 grid, GQA / MQA); outputs NaN-poisoned so unwritten rows fail."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = _count_gluon(monkeypatch)
    bwd_calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    mask, needs_bh = _mask(name, seqlen_k)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda")
    block_mask = flashtile.create_block_mask(mask, batch if needs_bh else None, heads_q if needs_bh else None,
                                             seqlen_q, seqlen_k)
    check(q, k, v, torch.bfloat16, mask, block_mask=block_mask)
    assert calls, "the block-sparse forward did not take the Gluon kernel"
    assert [kw.get("mods") is not None for kw in bwd_calls] == [True], \
        "the block-sparse backward did not take the Gluon kernel"


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [(128, 128), (256, 256), (128, 256), (256, 128)],
                         ids=["128x128", "256x256", "128x256", "256x128"])
def test_gluon_sparse_block_sizes(block_size, dtype, monkeypatch):
    """Blocks that are multiples of the kernel's tiles (two key tiles per listed block, two query tiles per row of
    the lists), and a mask_mod without a block mask (every 128 x 128 block partial)."""
    calls = _count_gluon(monkeypatch)
    q, k, v = make_qkv(2, 1100, 1100, 4, 2, 128, dtype, "cuda")
    mask = flashtile.sliding_window_mask(300)
    block_mask = flashtile.create_block_mask(mask, None, None, 1100, 1100, block_size=block_size)
    check(q, k, v, dtype, mask, block_mask=block_mask)
    check(q, k, v, dtype, mask)
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_gluon_sparse_rows_and_tiles_without_keys(monkeypatch):
    """A mask that hides everything (no listed block: the whole tile writes 0 and lse -inf) and one that hides the
    first rows: exactly what the portable kernel writes."""
    calls = _count_gluon(monkeypatch)
    q, k, v = make_qkv(1, 600, 600, 2, 2, 64, torch.bfloat16, "cuda", requires_grad=False)
    for mask in (hide_all, late_rows):
        bm = flashtile.create_block_mask(mask, None, None, 600, 600)
        out, lse = flashtile.attention(q, k, v, block_mask=bm, return_lse=True)
        monkeypatch.setenv("FLASHTILE_GLUON_SPARSE", "0")
        out_p, lse_p = flashtile.attention(q, k, v, block_mask=bm, return_lse=True)
        monkeypatch.delenv("FLASHTILE_GLUON_SPARSE")
        assert torch.isfinite(out).all()
        assert torch.equal(torch.isinf(lse), torch.isinf(lse_p))
        torch.testing.assert_close(out, out_p, atol=2e-2, rtol=0)
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_gluon_sparse_is_taken_and_can_be_switched_off(monkeypatch):
    """flashtile.attention's block-sparse forward takes the Gluon kernel by default on sm90;
    FLASHTILE_GLUON_SPARSE=0 (read per call) or FLASHTILE_GLUON=0 send it to the portable kernel, which agrees;
    a score_mod and a (64, 64) block mask stay portable."""
    calls = _count_gluon(monkeypatch)
    q, k, v = make_qkv(1, 2048, 2048, 8, 8, 128, torch.bfloat16, "cuda", requires_grad=False)
    bm = flashtile.create_block_mask(flashtile.sliding_window_mask(512), None, None, 2048, 2048)
    out = flashtile.attention(q, k, v, block_mask=bm)
    assert len(calls) == 1
    for var in ("FLASHTILE_GLUON_SPARSE", "FLASHTILE_GLUON"):
        monkeypatch.setenv(var, "0")
        out_portable = flashtile.attention(q, k, v, block_mask=bm)
        monkeypatch.delenv(var)
        assert len(calls) == 1
        torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    ref = flashtile.attention_ref(q, k, v, mask_mod=flashtile.sliding_window_mask(512))
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, mask_mod=flashtile.sliding_window_mask(512),
                                                               upcast=False), torch.bfloat16)
    small = flashtile.create_block_mask(flashtile.sliding_window_mask(512), None, None, 2048, 2048,
                                        block_size=(64, 64))
    flashtile.attention(q, k, v, block_mask=small)
    flashtile.attention(q, k, v, block_mask=bm, score_mod=_scale_mod)
    assert len(calls) == 1


def _scale_mod(score, b, h, q_idx, kv_idx):
    return score * 0.5
