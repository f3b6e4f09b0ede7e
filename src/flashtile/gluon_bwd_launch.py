"""Host side of the Hopper Gluon backward (kernels/gluon_bwd.py): support check, descriptors, launches.

bwd_launch._flash_attn_backward uses it for the dense and varlen backward (plain, causal, sliding window, softcap,
ALiBi, an additive bias without gradient whose layout TMA can read: gluon_bwd_bias.bias_tma_ok, bias_shared_ok) when
configs.gluon_bwd_wanted() and gluon_bwd_supported() agree; FLASHTILE_GLUON_BWD=1 takes it wherever it is
supported, =0 never. flashtile.attention's block-sparse calls (sparse_ok: a block mask, a mask_mod or none, D64 /
D128 / D256) take it through bwd_launch._gluon_sparse_backward, switched by FLASHTILE_GLUON_SPARSE as the sparse
forward.
Importing this module never fails: without Gluon's Hopper API, or under the interpreter, gluon_bwd_supported() is
False.
"""
import functools
import math
import os
import warnings
from dataclasses import dataclass, replace

import torch

# launch: the NaN-poisoning allocator and Geometry; bwd_launch: the preprocess and dQ conversion shared with the
# portable backward
from . import bwd_launch, configs, fast_launch, launch, philox
from .gluon_launch import (HALF_COMPARE_MAX_THRESHOLD, LOG2E, _supported_device, _varlen_ok, alibi_ok,
                           block_list_args, dropout_ok, mask_mode, record_sparse_failure, tma_descriptor, torch_layout)
from .gluon_bwd_bias import _bias_args, _broadcast, bias_tma_ok
from .gluon_variants import grid_order_variants

try:
    from triton.experimental.gluon import language as _gl
    from .kernels.gluon_bwd import _attn_bwd_dkdv_hopper
    from .kernels.gluon_bwd_step import DROPOUT_ONCE_MAX_HEAD_DIM, WG_N
    BLOCK_N = 2 * WG_N.value  # keys per program at D64 / D128; D256 (SPLIT_D) takes WG_N (block_n)
    _WG_N = WG_N.value
    _DROPOUT_ONCE_MAX_HEAD_DIM = DROPOUT_ONCE_MAX_HEAD_DIM.value
    GLUON_BWD_IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001  (any failure means: no Gluon backward on this triton)
    _attn_bwd_dkdv_hopper = None
    BLOCK_N = 128
    _WG_N = 64
    _DROPOUT_ONCE_MAX_HEAD_DIM = 0
    GLUON_BWD_IMPORT_ERROR = exc

_disabled = None  # the exception that made a launch fail in this process (then the portable path serves)


def disable(exc):
    """Stop using the Gluon backward in this process after a launch failed to build, with one warning."""
    global _disabled
    if _disabled is None:
        warnings.warn(f"flashtile: the Hopper Gluon backward failed ({type(exc).__name__}: {exc}); using the portable "
                      f"Triton kernels from now on (FLASHTILE_GLUON_BWD=0 silences this)", RuntimeWarning,
                      stacklevel=3)
    _disabled = exc


@dataclass(frozen=True)
class GluonBwdConfig:
    """One schedule: query rows per tile (BLOCK_M), ring depth, dQ split (see kernels/gluon_bwd.py). Registers:
    two consumer warpgroups at consumer_regs and the loader's warpgroup at loader_regs share 64K."""
    block_m: int = 64
    stages: int = 2
    dq_split_d: bool = True
    consumer_regs: int = 240
    loader_regs: int = 24
    maxnreg: int = 168
    dq_chunks: int = 1  # D256 only: dQ's half of the head dim in this many wgmma + atomic pieces
    dq_tma_reduce: int = 0  # dQ tiles through this many shared buffers per warpgroup and TMA reduce-adds; 0: atomics
    # Dense launches with dq_tma_reduce: dQ's fp32 buffer in tiles of one reduce-add each, stored in the
    # accumulator's register order (dq_tile; kernels/gluon_bwd_step._bwd_step).
    dq_tiled: bool = False
    # Plain / causal dense calls only (gluon_backward refuses the rest: refused_features): the S^T / dP^T wgmmas
    # start from -lse2 / qk_scale and -delta (kernel ROWS_IN_ACC), rows the preprocess writes folded, with -inf / 0
    # on the rows past seqlen_q so the kernel reads them unmasked (ROWS_ZERO_FILL).
    rows_in_acc: bool = False
    lpt_heads: int = 0  # dense causal: grid order by groups of this many heads (0: head by head)
    # Short programs' dK / dV through shared memory (kernel STORE_VIA_SMEM, configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS)
    # under a causal mask as well; False where that epilogue added spill loads / stores to the causal tile loops.
    smem_epilogue_causal: bool = True
    batch_fast_bias: bool = False  # a bias the batch shares: the grid walks the batch fastest (kernel BATCH_FAST)


# Variants the check script compares on the GPU; "default" is what gluon_backward uses. Shared memory at D128:
# K + V 64 KB, a Q + dO stage 32 KB, dS^T 2 x 16 KB: 160 KB at 2 stages, 192 KB at 3. D64 defaults to the per-key
# dQ (dq-keys): splitting dQ's 64 columns would slice K's 128-byte swizzle rows in half (dq-split tries it).
# D256 (the kernel's SPLIT_D, 64 keys per program): K + V 64 KB, a Q + dO stage 64 KB, P^T + dS^T 2 x 16 KB: 225 KB
# at 2 stages (230,928 B with the row slices and barriers, of 232,448); dq-chunks2 adds dQ in two 64-column pieces.
# dQ by TMA reduce-add (dq_tma_reduce): an fp32 [64, D / 2] tile per warpgroup at D128, [64, 64] at D64 (+32 KB:
# 198 / 133 KB in all), and D / 64 cp.reduce.async.bulk.tensor adds per tile and warpgroup (one with dq_tiled) in
# place of every thread's red.global.add; dq-reduce2 has two buffers per warpgroup (+64 KB). D256, with no shared
# memory to spare, stages dQ in the tile's own Q / dO ring slot once both warpgroups are done with it and hands the
# slot back to the loader a softmax later.
VARIANTS = {
    # dQ through shared memory and TMA reduce-adds (session 8: 1.12-1.45x the atomics' speed at 1K-16K, every head dim)
    # D128 / D256 causal: heavy-first grid order by groups of 8 heads (lpt_heads; session 13, below)
    # dQ's buffer tiled (dq_tiled; D64 / D128 session 25, D256 session 26, below)
    # D64 / D128: a bias the batch shares read in the batch-fast grid order (batch_fast_bias, session 46, below)
    "default": {64: GluonBwdConfig(stages=3, dq_split_d=False, dq_tma_reduce=1, dq_tiled=True, batch_fast_bias=True),
                128: GluonBwdConfig(stages=2, dq_tma_reduce=1, lpt_heads=8, dq_tiled=True, batch_fast_bias=True),
                256: GluonBwdConfig(stages=2, dq_tma_reduce=1, lpt_heads=8, dq_tiled=True)},
    # dQ by per-thread fp32 red.global.add (the default up to session 7)
    "atomics": {64: GluonBwdConfig(stages=3, dq_split_d=False), 128: GluonBwdConfig(stages=2),
                256: GluonBwdConfig(stages=2)},
    "stages3": {128: GluonBwdConfig(stages=3)},
    "dq-keys": {128: GluonBwdConfig(stages=2, dq_split_d=False)},
    "dq-split": {64: GluonBwdConfig(stages=3)},
    "dq-chunks2": {256: GluonBwdConfig(stages=2, dq_chunks=2)},
    "dq-reduce2": {64: GluonBwdConfig(stages=3, dq_split_d=False, dq_tma_reduce=2),
                   128: GluonBwdConfig(stages=2, dq_tma_reduce=2)},
    # D64 query tiles of 128 rows (session 12, offline): half the per-tile overhead (barriers, row slices, dQ
    # reduce issue) per score; plain / causal only (rows_in_acc). Shared memory per stage: Q + dO 2 x 16 KB, lse2 +
    # delta 1 KB. d64-bm128 (dQ per warpgroup over its 64 keys): K + V 32 KB, 2 stages 66 KB, dS^T 2 x [64, 128]
    # bf16 32 KB, dQ 2 x [128, 64] fp32 64 KB = 194 KB (3 stages: 227 KB + barriers, over the 227 KB limit).
    # d64-bm128-split (DQ_SPLIT_D: the warpgroups exchange dS^T and each adds dQ's 32 columns of its half over all
    # 128 keys): dS^T 2 x [128, 128] 64 KB, dQ 2 x [128, 32] fp32 32 KB, the same 194 KB; dQ's accumulator 32
    # instead of 64 registers per thread beside dK / dV, and half the reduce-add bytes (16 KB per warpgroup and
    # tile, 3.1 KB per MFLOP instead of 6.2), for one mbarrier exchange per tile.
    "d64-bm128": {64: GluonBwdConfig(block_m=128, stages=2, dq_split_d=False, dq_tma_reduce=1, rows_in_acc=True,
                                     dq_tiled=True)},
    # Under a causal mask (plain calls' variant: causal ones take d64-bm128), the shared-memory dK / dV epilogue moved
    # its masked loop from 1 to 5 spill loads / stores (session 12): it keeps the previous one. With session 25's
    # tiled dQ buffer that loop has 5 even so (tests/test_compile.py's budget); causal calls never run this variant,
    # so the choice was not measured again.
    "d64-bm128-split": {64: GluonBwdConfig(block_m=128, stages=2, dq_split_d=True, dq_tma_reduce=1,
                                           rows_in_acc=True, smem_epilogue_causal=False, dq_tiled=True)},
}
# The causal grid's order (kernels/gluon_grid._heavy_first): "head-major" is the order before session 13 (head by
# head; a head's first key blocks, the longest, first), "lptN" starts the first key blocks of N heads at a time.
# Session 13 (lpt-h200-2026-11-30-s13, 16K tokens, causal 1K / 2K / 4K / 8K, speed / cuDNN, head-major -> lpt8):
# D128 0.90 -> 0.91, 0.90 -> 0.93, 0.95 -> 0.97, 0.95 -> 0.99; D256 0.91 -> 0.94, 0.88 -> 0.92, 0.94 -> 0.97, 0.94
# -> 0.94. D64's d64-bm128 (0.99 / 1.01 / 1.08 / 1.03) was not faster with it (0.97 / 0.99 / 1.08 / 1.01): it keeps
# the old order. Groups of 32 heads ran slower than 8, the whole grid at once up to 38 % slower than head-major (the
# tiles in flight read more heads' Q / dO than L2 holds).
VARIANTS.update(grid_order_variants(VARIANTS["default"]))
# A bias the batch shares read in the batch-fast grid order (as the forward's GluonConfig.batch_fast_bias); its twin
# by head, the order before.
VARIANTS["default-bias-by-head"] = {d: replace(c, batch_fast_bias=False) for d, c in VARIANTS["default"].items()
                                    if d != 256}
# dQ's fp32 buffer tiled (dq_tiled, the default at D64 / D128 since session 25, D256 since 26): the buffer holds each
# warpgroup's [BLOCK_M, DQ_N] dQ tile as BLOCK_M * DQ_N contiguous floats in the wgmma accumulator's register order
# (bwd_launch.dq_tiled_offsets), so the staging stores are v4 and free of bank conflicts (row-major in 128-byte swizzled
# rows, a warp's v2 stores hit every bank twice: session 22's source counters, 8.7 % of the shared-memory wavefronts),
# one reduce-add adds the tile, and the preprocess's zeroing and the dQ conversion's reads are contiguous. D128 tile
# loops 552 / 523 / 549 / 518 -> 517 / 480 / 513 / 445 SASS instructions (offline, sm90,
# tests/gluon_bwd_compile_check.py's default case).
# Session 25 (bwd-dq-tiled-h200-2026-12-01-s25 call 2, 16K tokens, TFLOP/s, two passes in swapped order, row-major
# -> tiled; cuDNN in the same processes): D128 1K / 2K / 4K / 8K / 16K 417-409 / 471-472 / 509-510 / 528-529 /
# 543-544 -> 435-438 / 500-501 / 520-524 / 545-547 / 553-560 (cuDNN 419-427 / 482-485 / 514-519 / 526-534 / 473),
# causal 301-302 / 388-392 / 449-452 / 489-496 / 515 -> 325-327 / 421-424 / 468-471 / 513-517 / 542-543 (cuDNN 312-316 /
# 391-392 / 452-457 / 495-496 / 527-532); D64 (one pass) d64-bm128-split 1K / 4K / 16K 352 / 425 / 424 -> 361 / 437 /
# 462, d64-bm128 causal 258 / 388 / 453 -> 259 / 389 / 460. "dq-rows" keeps the row-major buffer.
# D256 (session 26): the same tiled buffer, the [64, 128] fp32 tile staged in the ring slot as before, one reduce-add
# of 256 rows of 32 in place of four; tile loops 459 / 444 / 456 / 439 -> 428 / 412 / 405 / 388 SASS (causal 500 / 496
# -> 471 / 443), no spills. h200-2026-12-01-s26 call 1, two passes in swapped order, TFLOP/s
# row-major -> tiled (cuDNN): 512 / 1K / 2K / 4K / 8K / 16K 260 / 309-310 / 342 / 361 / 370-373 / 377-378 -> 277-278 /
# 336-337 / 373-375 / 389-396 / 405-407 / 408-409 (237-238 / 299-300 / 346-349 / 371-375 / 356-357 / 321-327), causal
# 185 / 254-255 / 310-311 / 346 / 365 / 367-369 -> 191-192 / 270 / 330-332 / 366 / 384-387 / 399 (180 / 250-253 /
# 303-307 / 338-341 / 373-377 / 373-377).
VARIANTS["dq-rows"] = {d: replace(VARIANTS["default"][d], dq_tiled=False) for d in (64, 128, 256)}
HEAD_DIMS = (64, 128, 256)
DROPOUT_HEAD_DIMS = (64, 128)  # D256's split-D tiles have no dropout: the portable backward serves it


def block_n(head_dim):
    """Keys per program: 128 (64 per consumer warpgroup), 64 at D256 (both warpgroups on the same keys, each with
    half of the head dim: kernels/gluon_bwd.py SPLIT_D)."""
    return _WG_N if head_dim > 128 else BLOCK_N


def _tma_3d_ok(t):
    """t (B, S, H, D) as a 3-D (B, S, H * D) TMA tensor, or packed varlen (total, H, D) as (1, total, H * D):
    heads adjacent, 16-byte aligned strides and base."""
    s, size = t.stride(), t.element_size()  # one read each (host time)
    if t.dim() == 3:
        _, heads, head_dim = t.shape
        return (s[2] == 1 and (s[1] == head_dim or heads == 1) and s[0] * size % 16 == 0
                and t.data_ptr() % 16 == 0)
    _, _, heads, head_dim = t.shape
    return (s[3] == 1 and (s[2] == head_dim or heads == 1) and s[0] * size % 16 == 0 and s[1] * size % 16 == 0
            and t.data_ptr() % 16 == 0)


def gluon_bwd_supported(q, k, v, out, dout, causal=False, dropout_p=0.0, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, attn_bias=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                        max_seqlen_k=0, rng=None, **other_features):
    """True when the Gluon backward can compute the gradients of flash_attn_func(q, k, v, causal=causal,
    window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes), or of flash_attn_varlen_func with
    cu_seqlens_q / cu_seqlens_k (int32 (B + 1,)) and max_seqlen_q / max_seqlen_k: CUDA sm90, no interpreter,
    fp16/bf16 dense (B, S, H, D) or packed (total, H, D), head_dim 64, 128 or 256, heads_q % heads_kv == 0,
    TMA-compatible strides of q, k, v, dout, ALiBi slopes fp32 (Hq,) or (B, Hq) on q's device; attn_bias (dense
    only: 4-D, broadcastable to (B, Hq, Sq, Sk), no gradient) on q's device where bias_tma_ok and bias_shared_ok
    accept it (D64; D128 with an fp16 / bf16 bias); dropout 0 <= dropout_p <= 0.96875 at D64 / D128 (the kernel
    compares the draws as fp16: gluon_dropout.HALF_COMPARE_MAX_THRESHOLD), dense or varlen, without a bias, with
    rng, the forward's int64 (1,) Philox seed on q's device; no paged keys or mods. A bias with a gradient
    (bias_grad=True) is refused here and in bwd_launch._gluon_bwd_candidate."""
    if (_attn_bwd_dkdv_hopper is None or _disabled is not None
            or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")):
        return False
    if other_features and any(v_ not in (None, False, 0, 0.0) for v_ in other_features.values()):
        return False
    if not softcap >= 0 or not dropout_ok(dropout_p, rng, q):
        return False
    varlen = cu_seqlens_q is not None
    # With a bias, the draws' shared-memory exchange (~7.8 KB) does not fit beside the bias ring (D128 bf16 bias:
    # 238,688 B of 232,448).
    if dropout_p and (attn_bias is not None or q.shape[-1] not in DROPOUT_HEAD_DIMS
                      or philox.dropout_threshold(dropout_p) > HALF_COMPARE_MAX_THRESHOLD):
        return False
    tensors = (q, k, v, out, dout)
    for t in tensors:  # a loop, not all() over a generator: ~1 us less per call
        if not isinstance(t, torch.Tensor) or t.dim() != (3 if varlen else 4):
            return False
    if not _supported_device(*tensors):
        return False
    dtype = q.dtype
    if (dtype not in (torch.float16, torch.bfloat16) or k.dtype != dtype or v.dtype != dtype or out.dtype != dtype
            or dout.dtype != dtype):
        return False
    if out.shape != q.shape or dout.shape != q.shape or k.shape != v.shape:
        return False
    if varlen:
        if not _varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
            return False
        # The lengths of the longest sequences stand in for seqlen_q / seqlen_k in the checks below.
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max(max_seqlen_k, 1)
        _, heads_q, head_dim = q.shape
        heads_kv = k.shape[1]
        if head_dim not in HEAD_DIMS or k.shape[2] != head_dim:
            return False
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        if head_dim not in HEAD_DIMS or k.shape[0] != batch or k.shape[3] != head_dim:
            return False
    if heads_kv == 0 or heads_q % heads_kv or seqlen_q == 0 or seqlen_k == 0 or batch == 0:
        return False
    if not alibi_ok(alibi_slopes, q, batch, heads_q):
        return False
    if attn_bias is not None and (varlen or not (
            isinstance(attn_bias, torch.Tensor) and attn_bias.device == q.device and attn_bias.dim() == 4
            and attn_bias.shape[0] in (1, batch) and attn_bias.shape[1] in (1, heads_q)
            and bias_tma_ok(attn_bias, seqlen_q, seqlen_k)
            and bias_shared_ok(head_dim, VARIANTS["default"][head_dim], attn_bias.dtype))):
        return False
    if max(seqlen_q, seqlen_k) + BLOCK_N >= 2**31 or batch * heads_q * seqlen_q * head_dim >= 2**31:
        return False  # int32 TMA coordinates and row offsets
    if varlen and (q.shape[0] + BLOCK_N) * heads_q * head_dim >= 2**31:
        return False
    return _tma_3d_ok(q) and _tma_3d_ok(k) and _tma_3d_ok(v) and _tma_3d_ok(dout)


def _descriptor(t, block_rows):
    """t (B, S, H, D) as a (B, S, H * D) TMA tensor, or packed (total, H, D) as (1, total, H * D); boxes
    [1, block_rows, D]."""
    strides = t.stride()
    if t.dim() == 3:
        total, heads, head_dim = t.shape
        shape, desc_strides = [1, total, heads * head_dim], [total * strides[0], strides[0], 1]
    else:
        batch, seqlen, heads, head_dim = t.shape
        shape, desc_strides = [batch, seqlen, heads * head_dim], [strides[0], strides[1], 1]
    return tma_descriptor(t, shape, desc_strides, [1, block_rows, head_dim],
                          torch_layout((1, block_rows, head_dim), t.dtype))


@functools.lru_cache(maxsize=None)
def _row_layout():
    return _gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _row_descriptor(rows, block_m):
    """rows (B, Hq, Sq_pad) fp32 as a (B * Hq, Sq_pad) TMA tensor, or the varlen row layout (Hq, R) as itself;
    boxes [1, block_m], unswizzled. The 2-D shape and strides are computed rather than taken from
    rows.view(-1, Sq_pad) (~2 us of host time per view): the launch reads only the base's address and dtype."""
    if rows.dim() == 2:
        return tma_descriptor(rows, list(rows.shape), [rows.stride(0), 1], [1, block_m], _row_layout())
    batch, heads, width = rows.shape
    s = rows.stride()
    if s[2] != 1 or s[0] != heads * s[1]:  # what view() would refuse
        raise ValueError(f"row buffer of shape {tuple(rows.shape)} and strides {s} is not a (B * Hq, Sq_pad) matrix")
    return tma_descriptor(rows, [batch * heads, width], [s[1], 1], [1, block_m], _row_layout())


@functools.lru_cache(maxsize=None)  # called per backward with a bias: a dict look-up after the first (host time)
def bias_shared_ok(head_dim, config, bias_dtype):
    """Whether the bias ring (a [block_m, BLOCK_N] tile per stage) fits beside config's shared memory at head_dim:
    D64 (182,336 B with a 16-bit bias, 231,488 B with fp32, of 232,448) and D128 with a 16-bit bias (230,944 B);
    D128 with an fp32 bias (+64 KB) and D256 (SPLIT_D, 1.5 KB free) do not fit (sm90 compiles, triton 3.6)."""
    if head_dim > 128:
        return False
    size = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4}[bias_dtype]
    keys = block_n(head_dim)
    used = (2 * keys * head_dim * 2  # K, V
            + config.stages * (2 * config.block_m * head_dim * 2 + 2 * config.block_m * 4)  # Q, dO, lse2, delta
            + (2 * keys if config.dq_split_d else 2 * _WG_N) * config.block_m * 2  # dS^T
            + 2 * config.dq_tma_reduce * config.block_m * (head_dim // 2 if config.dq_split_d else head_dim) * 4
            + config.stages * config.block_m * keys * size)
    return used + SHARED_SLACK <= SHARED_LIMIT


SHARED_LIMIT = 232_448  # sm90's dynamic shared memory per block
SHARED_SLACK = 1_024  # barriers and alignment beyond the buffers' bytes (the compiles: 544 B D128, 576 B D64 fp32)


@functools.lru_cache(maxsize=None)
def _dq_layout():
    """The dQ reduce-add box's layout (128-byte swizzle), one object per process: fast_launch keys a descriptor's
    layout by identity, so a fresh one per call (as before) sent every dK/dV launch through JITFunction.run."""
    return _gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)


DQ_BOX_N = 32  # fp32 columns of a dQ reduce-add box: one 128-byte swizzle block


@functools.lru_cache(maxsize=None)
def _dq_tiled_layout():
    """The tiled dQ box's layout (128-byte swizzle, 2-D), one object per process as _dq_layout."""
    return _gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)


def dq_tile(config, head_dim, varlen):
    """(rows, columns) of one warpgroup's dQ tile where the launch keeps dQ's fp32 buffer tiled (config.dq_tiled:
    dense launches with TMA reduce-adds; D256: each warpgroup's half of the head dim, kernels/gluon_bwd SPLIT_D),
    else None."""
    if not (config.dq_tiled and config.dq_tma_reduce and not varlen):
        return None
    tile = config.block_m, head_dim // 2 if config.dq_split_d or head_dim == 256 else head_dim
    assert tile[0] * tile[1] // 32 <= 256, "one TMA box per tile: at most 256 rows of 32 floats"
    return tile


def _dq_descriptor(dq_accum, block_m, max_seqlen_q_pad=None, tile=None):
    """dq_accum (B, Sq_pad, Hq, D) fp32 as a (B, Sq_pad, Hq * D) TMA tensor, boxes [1, block_m, 32] in 128-byte
    swizzled rows. One box per reduce-add: triton 3.6 lowers a TMA reduce to a single message (its loads split a
    box wider than the swizzle, its reduce does not: a [1, 64, 64] box added only its first 32 columns).
    Varlen (max_seqlen_q_pad given): dq_accum (total_q + block_m, Hq, D) as (rows, max_seqlen_q_pad, Hq * D) with
    both row dimensions of stride one row, so the kernel's [q_start, m, col] adds at row q_start + m (the
    block_m spare rows take the last sequence's tile tail).
    tile (dq_tile; dense): the buffer in that order (bwd_launch.dq_tiled_offsets) as a 2-D (numel / 32, 32) TMA tensor
    with boxes of one tile: rows * columns / 32 rows of 128 bytes, 128-byte swizzled. The kernel's one reduce-add
    per tile (a whole box in one message, as above) starts at the tile's offset / 32."""
    if tile is not None:
        assert dq_accum.shape[1] % tile[0] == 0, "whole tiles of rows (Sq_pad a multiple of the tile's rows)"
        rows = dq_accum.numel() // 32
        return tma_descriptor(dq_accum, [rows, 32], [32, 1], [tile[0] * tile[1] // 32, 32], _dq_tiled_layout())
    layout = _dq_layout()
    if max_seqlen_q_pad is not None:
        rows, heads, head_dim = dq_accum.shape
        row = dq_accum.stride(0)
        return tma_descriptor(dq_accum, [rows, max_seqlen_q_pad, heads * head_dim], [row, row, 1],
                              [1, block_m, DQ_BOX_N], layout)
    batch, seqlen_q_pad, heads, head_dim = dq_accum.shape
    return tma_descriptor(dq_accum, [batch, seqlen_q_pad, heads * head_dim],
                          [dq_accum.stride(0), dq_accum.stride(1), 1], [1, block_m, DQ_BOX_N], layout)


def dkdv_launch_args(q, k, v, dout, lse2, delta, dk, dv, dq_accum, softmax_scale, causal, config,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                     max_seqlen_q=0, max_seqlen_k=0, attn_bias=None, mods=None, dropout_p=0.0, rng=None):
    """(grid, args, constexprs, launch options) of the dK/dV kernel; shared with the offline compile check.
    lse2, delta: (B, Hq, Sq_pad) fp32; dq_accum: (B, Sq_pad, Hq, D) fp32, Sq_pad a multiple of config.block_m.
    Varlen (cu_seqlens_q given): packed q / k / v / dout / dk / dv (total, H, D), lse2 / delta in the varlen row
    layout (Hq, R) (launch.Geometry.row_buffer_shape), dq_accum (total_q + block_m, Hq, D); the grid covers
    max_seqlen_k keys of every sequence.
    Features off pass None for their arguments and leave the constexprs at the plain kernel's (same signature,
    same compiled kernel); causal with a left window is the window (left, 0) (gluon_launch.mask_mode).
    attn_bias (dense only): 4-D broadcastable to (B, Hq, Sq, Sk) that bias_tma_ok accepts, or None.
    mods: a launch.ModArgs with a block mask that sparse_ok accepts (plain scores, dense), or None.
    dropout_p > 0: rng the forward's int64 (1,) Philox seed (the kernel's HAS_DROPOUT; D64 / D128)."""
    assert philox.dropout_threshold(dropout_p) <= HALF_COMPARE_MAX_THRESHOLD, "p > 0.96875 (gluon_bwd_supported)"
    varlen = cu_seqlens_q is not None
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k
        heads_q, head_dim, heads_kv = q.shape[1], q.shape[2], k.shape[1]
        seqlen_q_pad = -(-seqlen_q // config.block_m) * config.block_m
        dk_strides, dv_strides = (0, *dk.stride()[:2]), (0, *dv.stride()[:2])
        dq_desc = _dq_descriptor(dq_accum, config.block_m, seqlen_q_pad) if config.dq_tma_reduce else None
        dq_row_stride = dq_accum.stride(0)
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        seqlen_q_pad = dq_accum.shape[1]
        dk_strides, dv_strides = dk.stride()[:3], dv.stride()[:3]
        dq_desc = (_dq_descriptor(dq_accum, config.block_m, tile=dq_tile(config, head_dim, False))
                   if config.dq_tma_reduce else None)
        dq_row_stride = dq_accum.stride(1)
    is_causal, is_local, left, right = mask_mode(causal, window_size)
    unbounded = seqlen_q + seqlen_k  # as launch.ScoreArgs: no position difference reaches it
    alibi = alibi_slopes.float().contiguous() if alibi_slopes is not None else None
    keys = block_n(head_dim)
    args = (_descriptor(q, config.block_m), _descriptor(k, keys), _descriptor(v, keys),
            _descriptor(dout, config.block_m), _row_descriptor(lse2, config.block_m),
            _row_descriptor(delta, config.block_m), dk, dv, dq_accum, dq_desc,
            *dk_strides, *dv_strides, dq_row_stride,
            seqlen_q, seqlen_k, seqlen_q_pad, heads_q, heads_kv, heads_q // heads_kv,
            softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E, softmax_scale,
            alibi, (alibi.stride(0) if alibi.dim() == 2 else 0) if alibi is not None else None,
            float(softcap) * LOG2E if softcap > 0 else None,
            (left if left >= 0 else unbounded) if is_local else None,
            (right if right >= 0 else unbounded) if is_local else None,
            cu_seqlens_q, cu_seqlens_k,
            *(_bias_args(attn_bias, config.block_m, keys) if attn_bias is not None else (None, None, None)),
            *_sparse_args(mods), rng if dropout_p else None, 1.0 / (1.0 - dropout_p),
            philox.dropout_threshold(dropout_p))
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, STAGES=config.stages, IS_CAUSAL=is_causal,
                      DQ_SPLIT_D=config.dq_split_d, CONSUMER_REGS=config.consumer_regs,
                      LOADER_REGS=config.loader_regs, IS_LOCAL=is_local, SOFTCAP=softcap > 0,
                      HAS_ALIBI=alibi_slopes is not None, DQ_CHUNKS=config.dq_chunks,
                      DQ_TMA_REDUCE=config.dq_tma_reduce, VARLEN=varlen,
                      HAS_BIAS=attn_bias is not None)
    if config.rows_in_acc:  # only then: the other launches keep the constexprs (and kernels) they had
        constexprs.update(ROWS_IN_ACC=True, ROWS_ZERO_FILL=not varlen)
    if dropout_p:
        constexprs.update(HAS_DROPOUT=True)
    # The query rows a program walks (every head of its group): longer programs keep the kernel they had.
    # D256 (SPLIT_D): its own limit, dense and varlen only (the kernel's block-sparse D256 path keeps the old one).
    most = (configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS if head_dim <= 128 else
            configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256 if mods is None else -1)
    if seqlen_q * (heads_q // heads_kv) <= most and (config.smem_epilogue_causal or not is_causal):
        constexprs.update(STORE_VIA_SMEM=True)
    if config.lpt_heads and is_causal and not varlen and mods is None:  # (is_causal excludes a window: mask_mode)
        constexprs.update(LPT_HEADS=config.lpt_heads)
    if config.batch_fast_bias and attn_bias is not None and batch > 1 and _broadcast(attn_bias, 0):
        constexprs.update(BATCH_FAST=True)
    if mods is not None:
        constexprs.update(MASK_MOD=mods.mask_mod, BLOCK_SPARSE=True, SPARSE_M=mods.block_size[0],
                          SPARSE_N=mods.block_size[1])
    grid = (math.ceil(seqlen_k / keys), batch * heads_kv)
    return grid, args, constexprs, dict(num_warps=4, maxnreg=config.maxnreg)


def _sparse_args(mods):
    """The block-sparse arguments of _attn_bwd_dkdv_hopper (block_list_args of the transposed lists q_num, q_idx,
    full_q_num, full_q_idx); all None without mods, so a dense launch compiles the kernel it always did."""
    return (None,) * 14 if mods is None else block_list_args(mods.q_lists, mods.aux)


SPARSE_HEAD_DIMS = (64, 128, 256)  # D256: SPLIT_D's 64-key programs, two per 128-key block
_sparse_failed = {}  # mask_mod adapter -> the exception its Gluon backward build raised (then portable)


def sparse_ok(q, k, v, out, dout, window_size, mods, variant="default"):
    """True when the Gluon backward can compute the gradients of flashtile.attention's block-sparse call:
    gluon_bwd_supported's dense conditions (sm90, fp16 / bf16, TMA-compatible strides, GQA), head dim 64, 128 or 256,
    no window (flex.attention has no causal flag with a block mask), a block mask whose query block is a multiple of
    the backward's query tile (config.block_m, 64) and whose key block a multiple of its key program (block_n: 128,
    64 at D256; other block sizes, e.g. (64, 64) or (128, 64) below D256, run the portable kernels), a mask_mod or
    none, no score_mod. A mask_mod whose Gluon backward build failed once stays portable."""
    if mods is None or mods.block_size is None or mods.score_mod is not None or mods.score_mod_grad is not None:
        return False
    if tuple(window_size) != (-1, -1) or q.shape[-1] not in SPARSE_HEAD_DIMS:
        return False
    config = VARIANTS[variant].get(q.shape[-1])
    rows, cols = mods.block_size
    # dQ by TMA reduce-adds only: a listed query block may hold tiles wholly past Sq (Sq = 130 in a 256-row block),
    # whose adds (of zeros) TMA drops at the buffer's edge where the atomics variant's would land past it. With the
    # tiled buffer (dq_tile) such a tile's add lands in the next batch's first tile, or past the buffer's end (dropped):
    # adds of exact zeros (its rows have lse2 = +inf, so P = dS = 0), which leave those values as they are.
    if (config is None or not config.dq_tma_reduce or config.rows_in_acc or rows % config.block_m
            or cols % block_n(q.shape[-1])):
        return False
    if mods.mask_mod is not None and mods.mask_mod in _sparse_failed:
        return False
    return gluon_bwd_supported(q, k, v, out, dout)


def sparse_failed(mods, exc):
    """A block-sparse backward launch failed to build: that mask_mod runs the portable backward from now on."""
    record_sparse_failure(_sparse_failed, "backward", mods, exc)


def refused_features(causal, window_size, softcap, alibi_slopes, attn_bias, cu_seqlens_q, mods=None, dropout_p=0.0):
    """The names of the features a call has beyond plain or causal dense attention (the ones the rows_in_acc
    variants refuse); empty for a plain call. A causal mask given as the window (-1, 0) is causal, not a window."""
    return [name for name, on in (
        ("window_size", mask_mode(causal, window_size)[1]), ("softcap", bool(softcap)),
        ("alibi_slopes", alibi_slopes is not None), ("attn_bias", attn_bias is not None),
        ("mods", mods is not None), ("cu_seqlens_q", cu_seqlens_q is not None), ("dropout_p", bool(dropout_p))) if on]


def dropout_scaled_once(head_dim, dropout_p):
    """Whether the dK/dV kernel applies dropout's 1 / (1 - p) once per program rather than per score
    (kernels/gluon_bwd_step.DROPOUT_ONCE_MAX_HEAD_DIM, the rule the kernel applies to its HEAD_DIM): its dQ then lacks
    the factor, which gluon_backward's dQ conversion supplies."""
    return dropout_p > 0 and head_dim <= _DROPOUT_ONCE_MAX_HEAD_DIM


def gluon_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, dlse=None, variant="default",
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None, sink_parts=None,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None, mods=None,
                   dropout_p=0.0, rng=None):
    """dq, dk, dv (the shapes and dtypes of q, k, v) of flash_attn_func(q, k, v, softmax_scale, causal,
    window_size, softcap, alibi_slopes) from its out and lse (B, Hq, Sq) fp32; dlse: the gradient flowing into
    lse (lse's shape) or None. Requires gluon_bwd_supported(q, k, v, out, dout, causal, window_size=...,
    softcap=..., alibi_slopes=...). Softcap's tanh is tanh.approx.f32, as in the Gluon forward and the portable
    one for fp16/bf16 inputs, so P is recomputed as the forward's lse saw it. sink (Hq,) fp32, sink_parts: the
    preprocess writes the sink gradient's pieces there (bwd_launch.sink_parts / sink_grad). Launches: the portable
    preprocess (delta, lse2), the Gluon dK/dV kernel (dQ added into an fp32 buffer by TMA reduce-adds, or by
    atomics in variant "atomics"), and the conversion of that buffer to dq. Varlen (cu_seqlens_q / cu_seqlens_k
    int32 (B + 1,), max_seqlen_q / max_seqlen_k): packed (total, H, D) tensors and lse (Hq, total_q), as
    flash_attn_varlen_func's. attn_bias (dense only): the forward's additive bias (4-D, broadcastable to
    (B, Hq, Sq, Sk); no gradient) or None. mods: flashtile.attention's block mask and mask_mod (a launch.ModArgs
    that sparse_ok accepts; plain scores, dense) or None. dropout_p > 0 (D64 / D128): rng is the forward's Philox
    seed; the kernel regenerates its mask (gluon_dropout)."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    config = VARIANTS[variant][q.shape[-1]]
    if config.rows_in_acc:
        refused = refused_features(causal, window_size, softcap, alibi_slopes, attn_bias, cu_seqlens_q, mods,
                                   dropout_p)
        if refused:
            raise ValueError(f"variant {variant!r} takes plain or causal dense calls only, not {', '.join(refused)} "
                             f"(its tile loops would spill: gluon_bwd_launch.GluonBwdConfig.rows_in_acc)")
    if attn_bias is not None and not bias_shared_ok(q.shape[-1], config, attn_bias.dtype):
        raise ValueError(f"variant {variant!r} at head dim {q.shape[-1]} takes no {attn_bias.dtype} bias (the bias "
                         f"ring needs shared memory: bias_shared_ok)")
    poison = launch.poison_outputs()  # one environment read for the four buffers (host time)
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    if cu_seqlens_q is not None:
        geo = launch.Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        # The varlen row layout (rows of sequence b from 16 * (b + q_start // 16), ROW_PAD spare rows at the end).
        delta = launch._empty(geo.row_buffer_shape(q), q, torch.float32, poison)
        lse2 = launch._empty(geo.row_buffer_shape(q), q, torch.float32, poison)
        total_q, heads_q, head_dim = q.shape
        # block_m spare rows: the last sequence's last tile adds (zeros) past its end.
        dq_accum = launch._empty((total_q + config.block_m, heads_q, head_dim), q, torch.float32, poison)
    else:
        geo = launch.Geometry.of(q, k)
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_q_pad = math.ceil(seqlen_q / config.block_m) * config.block_m
        # Rows padded to whole query tiles (TMA boxes, 16-byte row strides); rows past seqlen_q stay unwritten
        # (rows_in_acc variants: see fold below).
        delta = launch._empty((batch, heads_q, seqlen_q_pad), q, torch.float32, poison)
        lse2 = launch._empty((batch, heads_q, seqlen_q_pad), q, torch.float32, poison)
        dq_accum = launch._empty((batch, seqlen_q_pad, heads_q, head_dim), q, torch.float32, poison)
    # The preprocess zeroes dq_accum's rows of real queries (tiled: whole 64-row blocks); the others (tile tails) only
    # receive adds of zeros and never reach dq (the conversion masks them).
    # ROWS_IN_ACC: the S^T / dP^T wgmmas start from the preprocess's folded rows (-lse2 / (scale * log2 e), -delta;
    # in the dK/dV kernel the scale and sign cost 46 more instructions per tile and thread), and read the padded
    # rows past seqlen_q unmasked (ROWS_ZERO_FILL: the preprocess writes lse2 -inf and delta 0 there).
    fold = (seqlen_q_pad, float(softmax_scale)) if config.rows_in_acc else None
    tile = dq_tile(config, head_dim, cu_seqlens_q is not None)
    bwd_launch.preprocess_launch(geo, out, dout, lse, dlse, delta, lse2, sink, sink_parts, dq_accum, fold, tile).run()
    dk, dv = launch._empty(k.shape, k, poison=poison), launch._empty(v.shape, v, poison=poison)
    grid, args, constexprs, options = dkdv_launch_args(q, k, v, dout, lse2, delta, dk, dv, dq_accum,
                                                       float(softmax_scale), causal, config, window_size,
                                                       float(softcap), alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                                       max_seqlen_q, max_seqlen_k, attn_bias, mods, dropout_p, rng)
    fast_launch.launch(_attn_bwd_dkdv_hopper, grid, args, {**constexprs, **options})
    dq = launch._empty(q.shape, q, poison=poison)
    dq_scale = float(softmax_scale)
    if dropout_scaled_once(head_dim, dropout_p):
        dq_scale /= 1.0 - dropout_p  # the kernel's dQ lacks dropout's 1 / (1 - p) there (gluon_bwd_step._bwd_step)
    if cu_seqlens_q is not None:  # the conversion's (B, Sq_pad, Hq, D) view: one batch of every packed row
        bwd_launch.dq_convert_launch(dq_accum[None], dq[None], dq_scale).run()
    else:
        bwd_launch.dq_convert_launch(dq_accum, dq, dq_scale, tile=tile).run()
    return dq, dk, dv
