"""Block-sparse flashtile.attention's backward through the Hopper Gluon backward (gluon_bwd_launch.sparse_ok /
gluon_backward(mods=...), bwd_launch._gluon_sparse_backward): GPU tier on sm90 only; on CPU the support check, the
launch arguments, the dispatch's switches and refusals (the kernel replaced by a recorder). The reference
comparison over every mask and shape is test_gluon_sparse.py's, which checks that both directions took Gluon."""
import warnings

import pytest
import torch

import flashtile
from flashtile import bwd_launch, gluon_bwd_launch, gluon_launch, launch
from flashtile.launch import ModArgs
from test_gluon_sparse import ON_HOPPER, hide_all
from test_programmable import check, late_rows, softcap_grad, softcap_mod
from utils import make_qkv, record_calls



def _mods(block_size=(128, 128), mask=flashtile.causal_mask, seqlen=512, score_mod=None, aux=()):
    bm = flashtile.create_block_mask(mask, None, None, seqlen, seqlen, block_size=block_size, device="cpu")
    return ModArgs.make(aux, score_mod, None, bm.mask_mod.triton(), bm)


def test_sparse_bwd_refused_off_hopper():
    """CPU tensors (and the interpreter) never take the Gluon block-sparse backward."""
    q = torch.randn(1, 512, 2, 64, dtype=torch.bfloat16)
    assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods())


def test_sparse_bwd_support_rules(monkeypatch):
    """With the dense conditions granted (gluon_bwd_supported): block masks whose query blocks are whole 64-row
    tiles and key blocks whole key programs (128 keys; 64 at D256), D64 / D128 / D256, a mask_mod or none; refused:
    no block mask, a score_mod, a window (causal flag), other head dims, (64, 64) / (128, 64) blocks below D256, the
    atomics variant, a failed mask_mod."""
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: True)
    for head_dim in (64, 128, 256):
        q = torch.empty(1, 512, 2, head_dim, dtype=torch.bfloat16)
        for block in ((128, 128), (64, 128), (256, 256), (128, 256), (256, 128)):
            assert gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods(block)), (head_dim, block)
        for block in ((64, 64), (128, 64)):
            assert gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods(block)) == (head_dim == 256)
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods((32, 128)))
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods(), variant="atomics")
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, 0), _mods())
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), ModArgs.make((), None, None, None))
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), None)
        assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods(score_mod=lambda: 0))
    q = torch.empty(1, 512, 2, 96, dtype=torch.bfloat16)
    assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), _mods())
    q = torch.empty(1, 512, 2, 64, dtype=torch.bfloat16)
    mods = _mods()
    monkeypatch.setitem(gluon_bwd_launch._sparse_failed, mods.mask_mod, RuntimeError("x"))
    assert not gluon_bwd_launch.sparse_ok(q, q, q, q, q, (-1, -1), mods)


def test_dkdv_launch_args_sparse():
    """mods: the transposed lists (q_num, q_idx, full_q_num, full_q_idx) with their (batch, head, key block)
    strides (0 along broadcast dims), the aux tensors (None for absent ones), BLOCK_SPARSE / MASK_MOD / SPARSE_M /
    SPARSE_N; a dense launch passes None for all 14 (the kernel it always compiled)."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 1000, 2, 128, dtype=torch.bfloat16)
    config = gluon_bwd_launch.VARIANTS["default"][128]
    rows, acc = torch.empty(2, 4, 1024), torch.empty(2, 1024, 4, 128)
    limits = torch.full((8,), 300, dtype=torch.int32)
    for block in ((128, 128), (64, 256)):
        bm = flashtile.create_block_mask(flashtile.sliding_window_mask(256), None, None, 1000, 1000,
                                         block_size=block, device="cpu")
        mods = ModArgs.make((limits,), None, None, bm.mask_mod.triton(), bm)
        grid, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1,
                                                                      False, config, mods=mods)
        assert grid == (8, 4)  # 128-key programs whatever the key block
        assert constexprs["BLOCK_SPARSE"] and constexprs["MASK_MOD"] is mods.mask_mod
        assert (constexprs["SPARSE_M"], constexprs["SPARSE_N"]) == block
        assert not (constexprs["IS_CAUSAL"] or constexprs["IS_LOCAL"] or constexprs["HAS_BIAS"])
        tail = args[-17:-3]  # the fourteen block-sparse arguments, then dropout's three
        assert all(a is b for a, b in zip(tail[:4], mods.q_lists))
        num, idx = mods.q_lists[0], mods.q_lists[1]
        assert tail[4:10] == (0, 0, num.stride(2), 0, 0, idx.stride(2))  # B and H broadcast (size 1)
        assert tail[10] is limits and tail[11:] == (None,) * 3
    _, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, False, config)
    assert args[-17:-3] == (None,) * 14 and "BLOCK_SPARSE" not in constexprs


@pytest.mark.skipif(not launch.interpreter_active(), reason="runs the preprocess on CPU tensors: interpreter only")
def test_gluon_backward_launches_the_sparse_kernel(monkeypatch):
    """gluon_backward(mods=...) launches the dK/dV kernel once with BLOCK_SPARSE on the (cdiv(Sk, 128), B * Hk)
    grid and returns dq, dk, dv of the inputs' shapes. The kernel is replaced by a recorder (no GPU here)."""
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((grid, args, kwargs))

    monkeypatch.setattr(gluon_bwd_launch, "_attn_bwd_dkdv_hopper", Recorder())
    monkeypatch.setattr(gluon_bwd_launch.fast_launch, "enabled", lambda: False)
    q = torch.randn(1, 300, 4, 64, dtype=torch.float16)
    k = torch.randn(1, 300, 2, 64, dtype=torch.float16)
    out, lse = torch.randn_like(q), torch.randn(1, 4, 300)  # lse fp32
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 300, 300, device="cpu")
    mods = ModArgs.make((), None, None, bm.mask_mod.triton(), bm)
    dq, dk, dv = gluon_bwd_launch.gluon_backward(q, q, k, k, out, lse, 0.125, mods=mods)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    (grid, args, kwargs), = seen
    assert grid == (3, 2) and kwargs["BLOCK_SPARSE"] and kwargs["MASK_MOD"] is mods.mask_mod
    assert args[-17] is mods.q_lists[0]


@pytest.fixture
def sparse_dispatch(monkeypatch):
    """bwd_launch._gluon_sparse_backward with a tested triton, sparse_ok granted and gluon_backward recorded."""
    seen = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_bwd_launch, "sparse_ok", lambda *a, **kw: True)
    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward",
                        lambda *a, **kw: seen.append((a[6], a[7], kw["mods"])) or ("dq", "dk", "dv"))
    for var in ("FLASHTILE_GLUON_SPARSE", "FLASHTILE_GLUON_BWD", "FLASHTILE_GLUON"):
        monkeypatch.delenv(var, raising=False)
    return seen


def test_sparse_backward_switches(sparse_dispatch, monkeypatch):
    """FLASHTILE_GLUON_SPARSE (read per call) switches the backward as it does the forward: "0" never (the sparse
    bench's flashtile-sparse-portable), "1" always; unset: as FLASHTILE_GLUON_BWD. Not causal, the call's scale,
    the mods handed on."""
    q = torch.empty(1, 8, 2, 64)
    mods = _mods()

    def run():
        return bwd_launch._gluon_sparse_backward(q, q, q, q, q, None, None, 0.25, -1, -1, mods)

    assert run() == ("dq", "dk", "dv") and sparse_dispatch.pop() == (0.25, False, mods)
    monkeypatch.setenv("FLASHTILE_GLUON_SPARSE", "0")
    assert run() is None and not sparse_dispatch
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    assert run() is None
    monkeypatch.setenv("FLASHTILE_GLUON_SPARSE", "1")
    assert run() is not None and sparse_dispatch.pop()
    monkeypatch.delenv("FLASHTILE_GLUON_SPARSE")
    assert run() is None and not sparse_dispatch  # unset: FLASHTILE_GLUON_BWD=0 holds


def test_failing_sparse_backward_falls_back_for_that_mask(monkeypatch):
    """A block-sparse backward that fails to build warns once and sends that mask_mod to the portable kernels; the
    dense Gluon backward stays on."""
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: True)
    monkeypatch.setattr(gluon_bwd_launch, "_sparse_failed", {})
    monkeypatch.delenv("FLASHTILE_GLUON_SPARSE", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    calls = []

    def broken(*a, **kw):
        calls.append(1)
        raise TypeError("simulated Gluon build failure")

    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward", broken)
    q = torch.empty(1, 512, 2, 64, dtype=torch.bfloat16)
    mods = _mods()
    with pytest.warns(RuntimeWarning, match="block-sparse backward failed"):
        assert bwd_launch._gluon_sparse_backward(q, q, q, q, q, None, None, 0.1, -1, -1, mods) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bwd_launch._gluon_sparse_backward(q, q, q, q, q, None, None, 0.1, -1, -1, mods) is None
    assert calls == [1] and gluon_bwd_launch._disabled is None


def _sparse(calls):
    """For each recorded gluon_backward call: whether it was the block-sparse one (given mods)."""
    return [kw.get("mods") is not None for kw in calls]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
@pytest.mark.parametrize("block_size", [(128, 128), (64, 128), (256, 256), (128, 256), (256, 128)],
                         ids=["128x128", "64x128", "256x256", "128x256", "256x128"])
def test_gluon_sparse_bwd_block_sizes(block_size, head_dim, dtype, monkeypatch):
    """Blocks of whole 64-row query tiles and key programs (two or four programs per listed key block, one to four
    query tiles per listed query block), and a mask_mod without a block mask (every 128 x 128 block partial)."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    q, k, v = make_qkv(2, 1100, 1100, 4, 2, head_dim, dtype, "cuda")
    mask = flashtile.sliding_window_mask(300)
    block_mask = flashtile.create_block_mask(mask, None, None, 1100, 1100, block_size=block_size)
    check(q, k, v, dtype, mask, block_mask=block_mask)
    check(q, k, v, dtype, mask)
    assert _sparse(calls) == [True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_gluon_sparse_bwd_without_keys(head_dim, monkeypatch):
    """A mask that hides everything (no listed block: dK = dV = 0 for every key block, dQ = 0) and one whose first
    rows see nothing (their dQ rows 0), under NaN-poisoned outputs."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    q, k, v = make_qkv(1, 600, 600, 4, 2, head_dim, torch.bfloat16, "cuda")
    bm = flashtile.create_block_mask(hide_all, None, None, 600, 600)
    out = flashtile.attention(q, k, v, block_mask=bm)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in (dq, dk, dv))
    bm = flashtile.create_block_mask(late_rows, None, None, 600, 600)
    out = flashtile.attention(q, k, v, block_mask=bm)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv)) and torch.equal(dq[:, :40], torch.zeros_like(dq[:, :40]))
    assert _sparse(calls) == [True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_gluon_sparse_bwd_is_taken_and_can_be_switched_off(monkeypatch):
    """On sm90 the block-sparse backward takes the Gluon kernel by default; FLASHTILE_GLUON_SPARSE=0 or
    FLASHTILE_GLUON_BWD=0 send it to the portable kernels, which agree; a (64, 64) block mask and a score_mod stay
    portable; D256 with (128, 64) blocks (64-key programs) is taken."""
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    q, k, v = make_qkv(1, 2048, 2048, 8, 8, 128, torch.bfloat16, "cuda")
    bm = flashtile.create_block_mask(flashtile.sliding_window_mask(512), None, None, 2048, 2048)
    dout = torch.randn_like(q)

    def grads(block_mask=bm, **kw):
        return torch.autograd.grad(flashtile.attention(q, k, v, block_mask=block_mask, **kw), (q, k, v), dout)

    ours = grads()
    assert _sparse(calls) == [True]
    for var in ("FLASHTILE_GLUON_SPARSE", "FLASHTILE_GLUON_BWD"):
        monkeypatch.setenv(var, "0")
        portable = grads()
        monkeypatch.delenv(var)
        assert _sparse(calls) == [True]
        for a, b in zip(ours, portable):
            torch.testing.assert_close(a, b, atol=3e-2, rtol=0)
    small = flashtile.create_block_mask(flashtile.sliding_window_mask(512), None, None, 2048, 2048,
                                        block_size=(64, 64))
    grads(small)
    grads(score_mod=softcap_mod, score_mod_grad=softcap_grad)
    assert _sparse(calls) == [True]
    q, k, v = make_qkv(1, 512, 512, 2, 2, 256, torch.bfloat16, "cuda")
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 512, 512, block_size=(128, 64))
    check(q, k, v, torch.bfloat16, flashtile.causal_mask, block_mask=bm)
    assert _sparse(calls) == [True, True]
