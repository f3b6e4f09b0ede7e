"""The Hopper Gluon backward's launch arguments on CPU: dkdv_launch_args with dropout, features, a bias, D256's split,
the dQ buffer's views, varlen and the dK / dV epilogue; the 128-row D64 variants (and the rows their preprocess fills,
through the interpreter)."""
import pytest
import torch

import flashtile
from flashtile import configs, gluon_bwd_bias, gluon_bwd_launch, philox
from flashtile.launch import ModArgs
from conftest import DEVICE


# dkdv_launch_args' last arguments: the block-sparse ones (4 lists, 6 strides, 4 aux tensors; None when dense,
# test_gluon_sparse_bwd.py has them); the tests below index the arguments before them from the end.
SPARSE_TAIL = 14
DROPOUT_TAIL = 3  # Rng, dropout_scale, dropout_threshold: the kernel's last arguments
TAIL = SPARSE_TAIL + DROPOUT_TAIL


def test_dkdv_launch_args_dropout():
    """Dropout: the seed tensor, 1 / (1 - p) and philox's integer threshold as the kernel's last three arguments,
    HAS_DROPOUT on; the rest of the launch as without it."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 500, 2, 128, dtype=torch.bfloat16)
    config = gluon_bwd_launch.VARIANTS["default"][128]
    rows, acc = torch.empty(2, 4, 320), torch.empty(2, 320, 4, 128)
    seed = torch.zeros(1, dtype=torch.int64)
    launch_args = [gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.125, True, config, **kw)
                   for kw in ({}, dict(dropout_p=0.25, rng=seed))]
    (grid, args, constexprs, options), (grid_d, args_d, constexprs_d, options_d) = launch_args
    assert args_d[-3] is seed and args_d[-2:] == (1 / 0.75, philox.dropout_threshold(0.25)) == (1 / 0.75, 8192)
    assert constexprs_d.pop("HAS_DROPOUT") and constexprs_d == constexprs and (grid_d, options_d) == (grid, options)
    assert all(a is b or a == b for a, b in zip(args_d[10:-3], args[10:-3]))


def test_dkdv_launch_args_leave_plain_and_causal_alone():
    """Features off: their kernel arguments are None (constexpr in the JIT: the plain / causal launch compiles to
    the kernel it did) and their constexprs False; on: the forward's scalars (gluon_launch.gluon_launch_args)."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 500, 2, 128, dtype=torch.bfloat16)
    config = gluon_bwd_launch.VARIANTS["default"][128]
    rows, acc = torch.empty(2, 4, 320), torch.empty(2, 320, 4, 128)

    def launch_args(causal, **kw):
        _, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.125, causal,
                                                                   config, **kw)
        assert args[-DROPOUT_TAIL:] == (None, 1.0, 0) and "HAS_DROPOUT" not in constexprs  # no dropout
        return args[:-TAIL][-10:-5], constexprs

    for causal in (False, True):
        tail, constexprs = launch_args(causal)
        assert tail == (None,) * 5 and constexprs["IS_CAUSAL"] == causal
        assert not (constexprs["IS_LOCAL"] or constexprs["SOFTCAP"] or constexprs["HAS_ALIBI"]
                    or constexprs["HAS_BIAS"])
    tail, constexprs = launch_args(True, window_size=(256, -1))  # causal + left window: the window (256, 0)
    assert tail[3:] == (256, 0) and constexprs["IS_LOCAL"] and not constexprs["IS_CAUSAL"]
    tail, constexprs = launch_args(False, window_size=(-1, 64))
    assert tail[3:] == (800, 64) and constexprs["IS_LOCAL"]  # unbounded side: Sq + Sk
    tail, constexprs = launch_args(False, window_size=(-1, 0))  # the plain causal kernel
    assert tail == (None,) * 5 and constexprs["IS_CAUSAL"] and not constexprs["IS_LOCAL"]
    slopes = torch.rand(2, 4)
    (alibi, stride_b, softcap_log2, _, _), constexprs = launch_args(False, softcap=30.0, alibi_slopes=slopes)
    assert torch.equal(alibi, slopes) and stride_b == 4 and constexprs["SOFTCAP"] and constexprs["HAS_ALIBI"]
    assert softcap_log2 == pytest.approx(30.0 * 1.4426950408889634)
    _, args, _, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.125, False, config,
                                                      softcap=30.0)
    args = args[:-TAIL]
    assert args[-12] == pytest.approx(0.125 / 30.0)  # qk_scale = softmax_scale / softcap, as the forward's
    assert args[-3:] == (None,) * 3  # no bias: bias_desc, bias_batch, bias_heads


def test_dkdv_launch_args_bias():
    """HAS_BIAS: the bias as a 4-D (B or 1, Hq or 1, Sq, Sk) TMA tensor with [1, 1, 64, BLOCK_N] boxes; broadcast
    dims (size 1 or stride 0) have size 1 and an aligned stride; bias_batch / bias_heads are its first two sizes."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    rows = torch.empty(2, 4, 320)
    for head_dim in (64, 128):
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 504, 2, head_dim, dtype=torch.bfloat16)
        acc = torch.empty(2, 320, 4, head_dim)
        config = gluon_bwd_launch.VARIANTS["default"][head_dim]
        plane = 300 * 504
        cases = ((torch.empty(2, 4, 300, 504, dtype=torch.bfloat16), [2, 4, 300, 504], [4 * plane, plane, 504, 1]),
                 (torch.empty(1, 4, 300, 504, dtype=torch.float16), [1, 4, 300, 504], [4 * plane, plane, 504, 1]),
                 (torch.empty(2, 1, 300, 504), [2, 1, 300, 504], [plane, plane, 504, 1]),
                 (torch.empty(300, 512)[:, :504].expand(2, 4, 300, 504), [1, 1, 300, 504],
                  [300 * 512, 300 * 512, 512, 1]))
        for bias, shape, strides in cases:
            _, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, True,
                                                                       config, attn_bias=bias)
            assert args[-TAIL:-DROPOUT_TAIL] == (None,) * SPARSE_TAIL
            args = args[:-TAIL]
            desc, batch, heads = args[-3:]
            assert constexprs["HAS_BIAS"] and desc.base is bias and (batch, heads) == tuple(shape[:2])
            assert list(desc.shape) == shape and list(desc.strides) == strides, (desc.shape, desc.strides)
            assert list(desc.block_shape) == [1, 1, 64, 128] and desc.layout.swizzle_byte_width == 128
            # one layout object per (box, dtype): fast_launch keys a descriptor's layout by identity
            assert desc.layout is gluon_bwd_bias._bias_descriptor(bias, 64, 128).layout
            assert args[-10:-3] == (None,) * 7  # the other features and varlen stay off
            # The batch-fast grid where the batch shares the bias (batch_fast_bias; not in the by-head twin)
            assert constexprs.get("BATCH_FAST", False) == (shape[0] == 1)
            by_head = gluon_bwd_launch.VARIANTS["default-bias-by-head"][head_dim]
            assert "BATCH_FAST" not in gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, True,
                                                                         by_head, attn_bias=bias)[2]


def test_dkdv_launch_args_d256_split_d():
    """D256 (the kernel's SPLIT_D): 64 keys per program (K / V boxes and grid), the same argument list; D64 / D128
    keep 128 keys per program."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    assert gluon_bwd_launch.block_n(256) == 64 and gluon_bwd_launch.block_n(128) == 128 == gluon_bwd_launch.block_n(64)
    rows = torch.empty(2, 4, 320)
    for head_dim, keys in ((256, 64), (128, 128)):
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 500, 2, head_dim, dtype=torch.bfloat16)
        acc = torch.empty(2, 320, 4, head_dim)
        config = gluon_bwd_launch.VARIANTS["default"][head_dim]
        grid, args, constexprs, options = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1,
                                                                            True, config)
        assert grid == (-(-500 // keys), 4) and constexprs["HEAD_DIM"] == head_dim
        assert list(args[1].block_shape) == [1, keys, head_dim] and list(args[0].block_shape) == [1, 64, head_dim]
        assert options["num_warps"] == 4


def test_dkdv_launch_args_dq_reduce():
    """dq-rows (the default with dQ's buffer row-major) and dq-reduce2 (D64 / D128): dq_accum also as a
    (B, Sq_pad, Hq * D) fp32 TMA tensor with [1, 64, 32] boxes (one 128-byte swizzle block: triton 3.6 lowers a TMA
    reduce to one message) and DQ_TMA_REDUCE the buffers per warpgroup; the atomics variant passes None there."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    rows = torch.empty(2, 4, 320)
    for head_dim in (64, 128, 256):
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 500, 2, head_dim, dtype=torch.bfloat16)
        acc = torch.empty(2, 320, 4, head_dim)
        _, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, False,
                                                                   gluon_bwd_launch.VARIANTS["atomics"][head_dim])
        assert args[8] is acc and args[9] is None and constexprs["DQ_TMA_REDUCE"] == 0
        for variant, bufs in ((("dq-rows", 1), ) if head_dim == 256 else (("dq-rows", 1), ("dq-reduce2", 2))):
            config = gluon_bwd_launch.VARIANTS[variant][head_dim]
            _, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, True,
                                                                       config)
            desc = args[9]
            assert desc.base is acc and list(desc.shape) == [2, 320, 4 * head_dim]
            assert list(desc.strides) == [320 * 4 * head_dim, 4 * head_dim, 1]
            assert list(desc.block_shape) == [1, 64, 32] and desc.layout.swizzle_byte_width == 128
            assert constexprs["DQ_TMA_REDUCE"] == bufs and config.dq_split_d == (head_dim != 64)
            assert config.dq_chunks == 1  # D256: the kernel stages the whole [64, 128] dQ half in a ring slot
    assert 256 not in gluon_bwd_launch.VARIANTS["dq-reduce2"]  # D256's single staging place is the ring slot


def test_dkdv_launch_args_dq_tiled():
    """dq_tiled (the default, the D64 128-row variants): dense launches see dQ's buffer as a flat
    (numel / 32, 32) TMA tensor with a box of one warpgroup tile (rows * columns / 32 rows of 128 bytes); varlen
    launches keep the row-major (rows, Sq_pad, Hq * D) view (dq_tile is None there, so the preprocess and conversion
    agree), and so does dq-rows."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    rows = torch.empty(2, 4, 384)
    for variant, head_dim, tile in (("default", 128, (64, 64)), ("default", 64, (64, 64)),
                                    ("d64-bm128", 64, (128, 64)), ("d64-bm128-split", 64, (128, 32)),
                                    ("default", 256, (64, 128))):
        config = gluon_bwd_launch.VARIANTS[variant][head_dim]
        assert gluon_bwd_launch.dq_tile(config, head_dim, False) == tile
        assert gluon_bwd_launch.dq_tile(config, head_dim, True) is None
        assert gluon_bwd_launch.dq_tile(gluon_bwd_launch.VARIANTS["dq-rows"][head_dim], head_dim, False) is None
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 500, 2, head_dim, dtype=torch.bfloat16)
        acc = torch.empty(2, 384, 4, head_dim)
        _, args, _, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, True, config)
        desc = args[9]
        assert desc.base is acc and list(desc.shape) == [acc.numel() // 32, 32] and list(desc.strides) == [32, 1]
        assert list(desc.block_shape) == [tile[0] * tile[1] // 32, 32] and desc.layout.swizzle_byte_width == 128


def test_dkdv_launch_args_varlen():
    """Varlen: q / k / dout as (1, total, H * D) descriptors, lse2 / delta as the (Hq, R) row layout, dq_accum
    (total_q + 64, Hq, D) with two aliased row dimensions for the reduce-adds, packed dK / dV strides with no
    batch stride, the grid over max_seqlen_k, the cu_seqlens tensors last and VARLEN set."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    q = torch.empty(700, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(900, 2, 128, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 300, 300, 700], dtype=torch.int32)
    cu_k = torch.tensor([0, 500, 630, 900], dtype=torch.int32)
    rows = torch.empty(4, 16 * 3 + 704 + 128)
    acc = torch.empty(700 + 64, 4, 128)
    for variant in ("default", "atomics"):
        config = gluon_bwd_launch.VARIANTS[variant][128]
        grid, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(
            q, k, k, q, rows, rows, k, k, acc, 0.1, True, config, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
            max_seqlen_q=400, max_seqlen_k=500)
        assert grid == (4, 3 * 2) and constexprs["VARLEN"]
        assert list(args[0].shape) == [1, 700, 512] and list(args[0].strides) == [700 * 512, 512, 1]
        assert list(args[1].shape) == [1, 900, 256] and list(args[1].block_shape) == [1, 128, 128]
        assert list(args[4].shape) == [4, rows.shape[1]] and list(args[4].strides) == [rows.shape[1], 1]
        assert args[10:17] == (0, 256, 128, 0, 256, 128, 512)  # dK / dV (batch, row, head), dq_accum's row
        assert args[17:20] == (400, 500, 448)  # max lengths, max_seqlen_q in whole 64-row tiles
        tail = args[:-TAIL]
        assert tail[-5] is cu_q and tail[-4] is cu_k and tail[-3:] == (None,) * 3  # then the bias arguments (off)
        desc = args[9]
        if variant == "atomics":
            assert desc is None
        else:
            assert list(desc.shape) == [764, 448, 512] and list(desc.strides) == [512, 512, 1]
    dense = gluon_bwd_launch.dkdv_launch_args(torch.empty(2, 300, 4, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 500, 2, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 500, 2, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 300, 4, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 4, 320), torch.empty(2, 4, 320),
                                              torch.empty(2, 500, 2, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 500, 2, 128, dtype=torch.bfloat16),
                                              torch.empty(2, 320, 4, 128), 0.1, False,
                                              gluon_bwd_launch.VARIANTS["default"][128])
    assert dense[1][:-TAIL][-5:] == (None,) * 5 and not dense[2]["VARLEN"]  # cu_seqlens, then the bias arguments


def test_short_programs_store_through_shared_memory(monkeypatch):
    """STORE_VIA_SMEM (dK / dV through shared memory) while a program's query rows (seqlen_q, or max_seqlen_q, times
    the query heads per KV head) are at most configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS (D64 / D128) or
    GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256; past it, for D256 block-sparse launches and for d64-bm128-split under a
    causal mask, the constexprs stay as they were (the kernel compiles as before). Dense and varlen."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS", 600)
    monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256", 600)
    rows = torch.empty(2, 4, 320)
    for head_dim in (64, 128, 256):
        config = gluon_bwd_launch.VARIANTS["default"][head_dim]
        acc = torch.empty(2, 320, 4, head_dim)
        for seqlen_q in (300, 301):  # two query heads per KV head: 600 and 602 rows
            q = torch.empty(2, seqlen_q, 4, head_dim, dtype=torch.bfloat16)
            k = torch.empty(2, 2000, 2, head_dim, dtype=torch.bfloat16)  # the key count does not matter
            _, _, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, True,
                                                                    config)
            if seqlen_q == 300:
                assert constexprs.pop("STORE_VIA_SMEM")
            assert "STORE_VIA_SMEM" not in constexprs
    monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256", 0)  # D256 off, D64 / D128 unchanged
    for head_dim, short in ((128, True), (256, False)):
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 2000, 2, head_dim, dtype=torch.bfloat16)
        constexprs = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, torch.empty(2, 320, 4, head_dim),
                                                       0.1, True, gluon_bwd_launch.VARIANTS["default"][head_dim])[2]
        assert constexprs.get("STORE_VIA_SMEM") is (True if short else None), head_dim
    # D256 block-sparse launches keep the register stores (the kernel's static_assert), D128 ones take it.
    monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256", 600)
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 256, 256, device="cpu")
    mods = ModArgs.make((), None, None, bm.mask_mod.triton(), bm)
    for head_dim, short in ((128, True), (256, False)):
        q = torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16)
        rows1, acc1 = torch.empty(1, 2, 256), torch.empty(1, 256, 2, head_dim)
        constexprs = gluon_bwd_launch.dkdv_launch_args(q, q, q, q, rows1, rows1, q, q, acc1, 0.1, False,
                                                       gluon_bwd_launch.VARIANTS["default"][head_dim], mods=mods)[2]
        assert constexprs["BLOCK_SPARSE"] and constexprs.get("STORE_VIA_SMEM") is (True if short else None)
    q = torch.empty(600, 4, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 300, 600], dtype=torch.int32)
    for most, short in ((600, True), (599, False)):  # varlen: max_seqlen_q 300
        monkeypatch.setattr(configs, "GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS", most)
        _, _, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(
            q, q[:, :2], q[:, :2], q, torch.empty(4, 800), torch.empty(4, 800), q[:, :2], q[:, :2],
            torch.empty(664, 4, 128), 0.1, False, config, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300,
            max_seqlen_k=300)
        assert constexprs.get("STORE_VIA_SMEM") is (True if short else None)
    # d64-bm128-split keeps the previous epilogue under a causal mask (its smem_epilogue_causal: it spilled there)
    q, k = torch.empty(2, 256, 4, 64, dtype=torch.bfloat16), torch.empty(2, 256, 4, 64, dtype=torch.bfloat16)
    rows, acc = torch.empty(2, 4, 256), torch.empty(2, 256, 4, 64)
    for variant, causal, short in (("d64-bm128-split", False, True), ("d64-bm128-split", True, False),
                                   ("d64-bm128", True, True)):
        _, _, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1, causal,
                                                                gluon_bwd_launch.VARIANTS[variant][64])
        assert constexprs.get("STORE_VIA_SMEM") is (True if short else None), (variant, causal)


BM128 = ("d64-bm128", "d64-bm128-split")


def test_bm128_variants_launch_args():
    """d64-bm128 / d64-bm128-split: 128-row query tiles at D64 (Q / dO / lse2 / delta / dQ boxes of 128 rows, 2
    stages), ROWS_IN_ACC and ROWS_ZERO_FILL on, dQ per warpgroup or split over the head dim; the default's
    constexprs do not name the two (its kernel compiles as before)."""
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    q = torch.empty(2, 333, 4, 64, dtype=torch.bfloat16)
    k = torch.empty(2, 1000, 2, 64, dtype=torch.bfloat16)
    rows, acc = torch.empty(2, 4, 384), torch.empty(2, 384, 4, 64)
    for variant, split in zip(BM128, (False, True)):
        config = gluon_bwd_launch.VARIANTS[variant][64]
        assert set(gluon_bwd_launch.VARIANTS[variant]) == {64} and config.rows_in_acc
        for causal in (False, True):
            grid, args, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, acc, 0.1,
                                                                          causal, config)
            assert grid == (8, 4) and constexprs["IS_CAUSAL"] == causal
            assert constexprs["BLOCK_M"] == 128 and constexprs["STAGES"] == 2 and constexprs["DQ_TMA_REDUCE"] == 1
            assert constexprs["ROWS_IN_ACC"] and constexprs["ROWS_ZERO_FILL"] and constexprs["DQ_SPLIT_D"] == split
            assert list(args[0].block_shape) == [1, 128, 64] and list(args[4].block_shape) == [1, 128]
            assert list(args[9].block_shape) == [128 * (32 if split else 64) // 32, 32]  # one tiled dQ tile
    _, _, constexprs, _ = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, torch.empty(2, 4, 384), rows, k, k, acc,
                                                            0.1, True, gluon_bwd_launch.VARIANTS["default"][64])
    assert "ROWS_IN_ACC" not in constexprs and "ROWS_ZERO_FILL" not in constexprs


@pytest.mark.parametrize("variant", BM128)
def test_bm128_variants_refuse_features(variant):
    """The plain-only variants raise a ValueError naming each feature they do not take (their loops would spill),
    before anything is allocated or launched; block-sparse calls never pick them."""
    q = torch.empty(1, 256, 2, 64, dtype=torch.bfloat16)
    for kw, name in ((dict(window_size=(128, 0)), "window_size"), (dict(softcap=30.0), "softcap"),
                     (dict(alibi_slopes=torch.ones(2)), "alibi_slopes"),
                     (dict(attn_bias=torch.zeros(1, 2, 256, 256)), "attn_bias"), (dict(mods=object()), "mods"),
                     (dict(cu_seqlens_q=torch.zeros(2, dtype=torch.int32)), "cu_seqlens_q")):
        with pytest.raises(ValueError, match=f"{variant}.*plain or causal.*{name}"):
            gluon_bwd_launch.gluon_backward(q, q, q, q, q, None, 0.125, True, variant=variant, **kw)


@pytest.mark.parametrize("variant", BM128)
def test_bm128_variants_fill_padded_rows(monkeypatch, variant):
    """ROWS_IN_ACC / ROWS_ZERO_FILL: the preprocess (kernels/bwd.py; on CPU, by the interpreter) hands the kernel
    -lse2 / qk_scale and -delta, with -inf / 0 past seqlen_q (the kernel reads them unmasked), and -inf on a row that
    saw no key. The default variant's rows are the preprocess's usual ones, the padding left as allocated."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    seen = {}

    class Stop(Exception):
        pass

    def capture(q, k, v, dout, lse2, delta, *rest):
        seen.update(lse2=lse2.clone(), delta=delta.clone())
        raise Stop

    monkeypatch.setattr(gluon_bwd_launch, "dkdv_launch_args", capture)
    gen = torch.Generator().manual_seed(0)
    q, out, dout = (torch.randn(2, 333, 4, 64, generator=gen).to(DEVICE) for _ in range(3))
    lse = torch.randn(2, 4, 333, generator=gen).to(DEVICE)
    lse[0, 1, 5] = float("-inf")  # a row that saw no key
    delta_ref = (out * dout).sum(-1).transpose(1, 2)  # (B, Hq, Sq)
    lse2_ref = torch.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    for name in (variant, "default"):
        with pytest.raises(Stop):
            gluon_bwd_launch.gluon_backward(dout, q, q, q, out, lse, 0.125, False, variant=name)
        lse2, delta = seen["lse2"], seen["delta"]
        assert lse2.shape == delta.shape == (2, 4, 384)
        if name == variant:
            qk_scale = 0.125 * 1.4426950408889634
            torch.testing.assert_close(lse2[..., :333], -lse2_ref / qk_scale, rtol=1e-6, atol=0)
            torch.testing.assert_close(delta[..., :333], -delta_ref, rtol=1e-5, atol=1e-5)
            assert lse2[0, 1, 5] == float("-inf")
            assert torch.all(lse2[..., 333:] == float("-inf")) and torch.all(delta[..., 333:] == 0)
        else:
            torch.testing.assert_close(lse2[..., :333], lse2_ref, rtol=1e-6, atol=0)
            torch.testing.assert_close(delta[..., :333], delta_ref, rtol=1e-5, atol=1e-5)
            assert torch.all(lse2[..., 333:].isnan()) and torch.all(delta[..., 333:].isnan())
