"""Host side of the Hopper Gluon forward (kernels/gluon_fwd.py): support check, descriptors, launch. The
schedules it launches (GluonConfig, VARIANTS, takes_config) are data in gluon_variants.py.

launch.py uses it for the dense and varlen forward without dropout, mods or paged keys (plain, causal, sliding
window, softcap, ALiBi, sinks, and an additive bias in the layouts bias_ok accepts) when
configs.gluon_fwd_wanted() and gluon_supported() agree; FLASHTILE_GLUON=1 takes it wherever it is supported,
=0 never. Batch > 1 with Sk % BLOCK_N != 0 and varlen read through ragged TMA descriptors (ragged_descriptor), so
no key block reads another sequence's rows. Block-sparse flashtile.attention calls (a block mask and its mask_mod,
sparse_ok) take the same kernel through gluon_sparse_forward. Importing this module never fails: on a triton
without Gluon's Hopper API, or under the interpreter, gluon_supported() is False.
"""
import functools
import math
import os
import warnings

import torch
import triton

from . import configs, fast_launch, philox
from . import launch as _launch  # the NaN-poisoning allocator (a module import: tests patch its attributes)
from .gluon_variants import VARIANTS, alibi_by_mma, takes_config
from .launch import _arch
from .persistent_schedule import persistent_schedule

try:
    from triton.experimental.gluon import language as _gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor

    from .kernels.gluon_dropout import HALF_COMPARE_MAX_THRESHOLD
    from .kernels.gluon_fwd import _attn_fwd_hopper
    from .kernels.gluon_fwd_common import FIXED_MAX_LIMIT, WG_M
    from .kernels.gluon_fwd_persistent import _attn_fwd_hopper_persistent
    GLUON_IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001  (any failure means: no Gluon path on this triton)
    _attn_fwd_hopper = _attn_fwd_hopper_persistent = None
    FIXED_MAX_LIMIT = 0.0
    HALF_COMPARE_MAX_THRESHOLD = 0
    GLUON_IMPORT_ERROR = exc

LOG2E = 1.4426950408889634
BLOCK_M = 128  # two consumer warpgroups of WG_M = 64 rows (GluonConfig.block_m: the config's own)
# Gluon is experimental and its API moves between triton releases: by default the kernel is used only with the
# releases it was checked on (the H200 machine's); FLASHTILE_GLUON=1 tries it on any.
TESTED_TRITON = ("3.6.",)
_disabled = None  # the exception that made a launch fail in this process (then the portable path serves)


def tested_triton():
    return triton.__version__.startswith(TESTED_TRITON)


def disable(exc):
    """Stop using the Gluon forward in this process after a launch failed to build (e.g. an API change in an
    untested triton), with one warning; the caller falls back to the portable kernels."""
    global _disabled
    if _disabled is None:
        warnings.warn(f"flashtile: the Hopper Gluon forward failed ({type(exc).__name__}: {exc}); using the portable "
                      f"Triton kernels from now on (FLASHTILE_GLUON=0 silences this)", RuntimeWarning, stacklevel=3)
    _disabled = exc


HEAD_DIMS = (64, 128, 256)
_DTYPES = (torch.float16, torch.bfloat16)


def _tma_2d_ok(t):
    """t (B, S, H, D), or packed varlen (total, H, D), viewed as a 2D (B * S, H * D) TMA tensor: rows of a head
    contiguous, 16-byte aligned."""
    shape, s = t.shape, t.stride()  # one read each (host time)
    if len(shape) == 3:
        total, heads, head_dim = shape
        return (s[2] == 1 and (s[1] == head_dim or heads == 1)
                and s[0] * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0)
    batch, seqlen, heads, head_dim = shape
    return (s[3] == 1 and (s[2] == head_dim or heads == 1)
            and (s[0] == seqlen * s[1] or batch == 1)
            and s[1] * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0)


def _varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Packed (total, H, D) q / k / v at int32 cu_seqlens (B + 1,) on q's device (launch.Geometry's varlen form;
    interface.py has validated the values). Rows of one sequence are found from cu_seqlens on the device, so
    nothing here depends on the lengths but the grid (max_seqlen_q) and the int32 / 2**30 row limits."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (q, k, v)):
        return False
    if not all(isinstance(c, torch.Tensor) and c.dtype == torch.int32 and c.dim() == 1 and c.device == q.device
               and c.numel() >= 2 and c.stride(0) == 1 for c in (cu_seqlens_q, cu_seqlens_k)):
        return False
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        return False
    # Ragged descriptors address at most 2**30 rows; empty q or k (a TMA descriptor needs a base address) and
    # max_seqlen_q == 0 (an empty grid) are left to the portable path.
    return 0 < q.shape[0] <= RAGGED_ROWS and 0 < k.shape[0] <= RAGGED_ROWS and max_seqlen_q > 0


def mask_mode(causal, window_size):
    """(is_causal, is_local, window_left, window_right) of flash-attn's (causal, window_size), -1 = unbounded:
    causal is the window (left, 0), and the window (-1, 0) is plain causal (the kernel's IS_CAUSAL path)."""
    left, right = window_size
    left = int(left) if left is not None and left >= 0 else -1  # no generator: this runs several times per call
    right = int(right) if right is not None and right >= 0 else -1
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    return is_causal, not is_causal and (left >= 0 or right >= 0), left, right


def _supported_device(*tensors):
    """CUDA tensors on a Hopper (sm90) device: the Gluon kernel uses its TMA, wgmma and setmaxnreg."""
    return all(t.is_cuda for t in tensors) and _arch(tensors[0].device) == (9, 0)


def alibi_ok(alibi_slopes, q, batch, heads_q):
    """No ALiBi, or slopes the Gluon kernels read: fp32 (Hq,) or (B, Hq) on q's device."""
    return alibi_slopes is None or (
        isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.device == q.device
        and alibi_slopes.dtype == torch.float32 and tuple(alibi_slopes.shape) in ((heads_q, ), (batch, heads_q)))


def dropout_ok(dropout_p, rng, q):
    """No dropout, or 0 < dropout_p < 1 with the seed the Gluon kernels read: an int64 tensor on q's device."""
    return dropout_p == 0 or (0 < dropout_p < 1 and isinstance(rng, torch.Tensor) and rng.dtype == torch.int64
                              and rng.device == q.device)


BIAS_DTYPES = (torch.float16, torch.bfloat16)


def bias_layout(attn_bias, seqlen_q, seqlen_k):
    """(rows, row stride, rows per batch, rows per head) of the 2-D (rows, Sk) TMA view of a 4-D attn_bias
    (B or 1, Hq or 1, Sq, Sk) in which query row i of (b, h) is row b * rows_b + h * rows_h + i, or None where
    there is none: an fp16 / bf16 bias whose last dim is Sk and contiguous, whose query dim is not broadcast
    (Sq == 1 aside) and whose row stride is a positive multiple of 16 bytes with each batch / head stride a
    multiple of it (size-1 and expanded (stride 0) dims step by 0: every batch / head reads the first one's
    rows), 16-byte aligned, under 2**31 rows."""
    if not (isinstance(attn_bias, torch.Tensor) and attn_bias.dim() == 4 and attn_bias.dtype in BIAS_DTYPES):
        return None
    (bb, hb, sq, sk), (sb, sh, sm, sn) = attn_bias.shape, attn_bias.stride()
    if sq != seqlen_q or sk != seqlen_k or sn != 1 or sm < sk or sm * attn_bias.element_size() % 16:
        return None
    if attn_bias.data_ptr() % 16 or attn_bias.numel() == 0:
        return None
    steps = []
    for size, stride in ((bb, sb), (hb, sh)):
        if size == 1 or stride == 0:  # broadcast (a size-1 dim, or an expanded one): every b / h reads row 0's
            steps.append(0)
        elif stride > 0 and stride % sm == 0:
            steps.append(stride // sm)
        else:
            return None
    rows = (bb - 1) * steps[0] + (hb - 1) * steps[1] + sq
    # int32 TMA row coordinates, a query tile (BLOCK_M rows) past the last row included.
    if rows + BLOCK_M >= 2**31:
        return None
    return rows, sm, steps[0], steps[1]


def bias_ok(attn_bias, q, seqlen_q, seqlen_k):
    """No bias, or one the Gluon forward reads through TMA (bias_layout) on q's device; any 16-bit dtype (an fp16
    bias with bf16 q too). Refused (the portable kernel serves them): fp32 biases (their [128, BLOCK_N] ring would
    take 2 x 64 KB, which does not fit beside K / V at D128 / D256), a broadcast query or key dim (size 1 or stride
    0 where Sq / Sk > 1), a non-contiguous last dim, row strides that are not multiples of 16 bytes, batch / head
    strides that are not whole rows, a base address off 16 bytes, and over 2**31 rows. Varlen is taken (positions
    within each sequence index the (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k) bias)."""
    if attn_bias is None:
        return True
    return attn_bias.device == q.device and bias_layout(attn_bias, seqlen_q, seqlen_k) is not None


def gluon_supported(q, k, v, causal=False, dropout_p=0.0, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    attn_bias=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                    rng=None, **other_features):
    """True when the Gluon forward can compute flash_attn_func(q, k, v, causal=causal, window_size=window_size,
    softcap=softcap, alibi_slopes=alibi_slopes, sink=sink), or flash_attn_varlen_func with cu_seqlens_q / _k
    and max_seqlen_q / _k: CUDA sm90, no interpreter, fp16/bf16 dense (B, S, H, D) or packed varlen (total, H, D)
    with int32 cu_seqlens, head_dim 64, 128 or 256, heads_q % heads_kv == 0, TMA-compatible strides, (dense)
    every query row seeing at least one key (causal: seqlen_q <= seqlen_k; a window's right side:
    seqlen_q - seqlen_k <= right; varlen rows without keys are handled in the kernel), ALiBi slopes fp32 (Hq,)
    or (B, Hq), sink (Hq,), attn_bias fp16 / bf16 (B or 1, Hq or 1, Sq, Sk) in a layout bias_ok accepts (varlen:
    (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k)); dropout 0 <= dropout_p <= 0.96875 with rng, the int64 (1,)
    Philox seed on q's device, without a bias; no paged keys (block_table) or mods."""
    if _attn_fwd_hopper is None or _disabled is not None or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if other_features and any(v_ is not None and (isinstance(v_, torch.Tensor) or v_)
                              for v_ in other_features.values()):
        return False
    if softcap < 0 or not dropout_ok(dropout_p, rng, q):
        return False
    if philox.dropout_threshold(dropout_p) > HALF_COMPARE_MAX_THRESHOLD:  # dropout_p > 0.96875 (gluon_dropout)
        return False
    if dropout_p and attn_bias is not None:
        # The draws' per-warp exchange takes ~3.8 KB of shared memory, which the bias ring has used up (D128 / D256:
        # 233,600 B of 232,448 at launch).
        return False
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        if not _varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
            return False
    elif not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
              and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):  # no generator: ~1 us less per call
        return False
    if not _supported_device(q, k, v):
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype != dtype or v.dtype != dtype:
        return False
    if varlen:  # (total, H, D): sizes as a batch of cu_seqlens.numel() - 1 sequences of the maximal lengths
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max(max_seqlen_k, 1)
        (heads_q, head_dim), (heads_kv, head_dim_k) = q.shape[1:], k.shape[1:]
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv, head_dim_k = k.shape[1], k.shape[2], k.shape[3]
        if k.shape[0] != batch:
            return False
    if head_dim not in HEAD_DIMS or k.shape != v.shape or head_dim_k != head_dim:
        return False
    if heads_kv == 0 or heads_q % heads_kv or seqlen_q == 0 or seqlen_k == 0 or batch == 0:
        return False
    if not alibi_ok(alibi_slopes, q, batch, heads_q):
        return False
    if attn_bias is not None and not bias_ok(attn_bias, q, max_seqlen_q if varlen else seqlen_q,
                                             max_seqlen_k if varlen else seqlen_k):
        return False
    if sink is not None and not (isinstance(sink, torch.Tensor) and sink.device == q.device
                                 and tuple(sink.shape) == (heads_q, )):
        return False
    _, _, _, right = mask_mode(causal, window_size)
    if not varlen and right >= 0 and seqlen_q - seqlen_k > right:  # rows without keys: the portable kernel's
        return False
    # int32 TMA coordinates; a ragged descriptor (batch > 1, possibly) addresses at most 2**30 rows.
    if not varlen and max(batch * seqlen_q, batch * seqlen_k) >= (2**31 if batch == 1 else RAGGED_ROWS):
        return False
    # Batch > 1 with Sk % BLOCK_N != 0 and varlen read through ragged descriptors (ragged_descriptor): a key
    # block past a sequence's end is zero-filled instead of reading the next sequence's keys and values.
    return _tma_2d_ok(q) and _tma_2d_ok(k) and _tma_2d_ok(v)


@functools.lru_cache(maxsize=None)  # layouts are immutable; building one costs ~10 us of host time per descriptor
def shared_layout(block_shape, gl_dtype):
    """The NVMMA shared-memory layout (128-byte swizzle where the rows allow) of a TMA box of block_shape."""
    return _gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


@functools.lru_cache(maxsize=None)  # keyed by torch's dtype: hashing a gluon dtype is Python code (~0.5 us)
def torch_layout(block_shape, dtype):
    """shared_layout(block_shape, ...) of 16-bit torch dtype dtype."""
    return shared_layout(block_shape, _gl.float16 if dtype == torch.float16 else _gl.bfloat16)


def tma_descriptor(t, shape, strides, block_shape, layout):
    """Gluon's TensorDescriptor without its dataclass checks, which cost ~5 us of host time per descriptor on the
    H200 machine (four to six per call). The callers' support checks cover them (16-byte aligned base and strides,
    unit last stride, positive sizes: _tma_2d_ok, gluon_bwd_launch._tma_3d_ok; the block shapes are the kernels'
    constants), and the driver still refuses a bad one when it encodes the tensor map at launch.
    tests/test_gluon_dispatch.py checks that the two constructions agree and that the checked one accepts the inputs."""
    desc = _GluonDescriptor.__new__(_GluonDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.layout, desc.padding = (
        t, shape, strides, block_shape, layout, "zero")
    return desc


def _descriptor(t, block_rows, ragged=False):
    """t (B, S, H, D) or packed (total, H, D) as a 2D (rows, H * D) TMA tensor with boxes [block_rows, D], or
    with ragged, the ragged 4-D view of it (ragged_descriptor)."""
    shape, strides = t.shape, t.stride()
    head_dim, heads = shape[-1], shape[-2]
    rows, row_stride = (shape[0], strides[0]) if len(shape) == 3 else (shape[0] * shape[1], strides[1])
    if ragged:
        gl_dtype = _gl.float16 if t.dtype == torch.float16 else _gl.bfloat16
        return ragged_descriptor(t, rows, row_stride, heads * head_dim, block_rows, head_dim, gl_dtype)
    return tma_descriptor(t, [rows, heads * head_dim], [row_stride, 1], [block_rows, head_dim],
                          torch_layout((block_rows, head_dim), t.dtype))


RAGGED_ROWS = 2**30


def ragged_descriptor(t, rows, row_stride, width, block_rows, block_cols, gl_dtype):
    """The rows x width matrix at t (row stride row_stride) as triton.tools.ragged_tma's 4-D "ragged" descriptor:
    shape (2**31 - 2**16, 2**31 - 2**16, 2**30, width), strides (2**34 - row_stride, row_stride, row_stride, 1),
    boxes [1, 1, block_rows, block_cols]. The box at (2**30, end, 2**30 - n + r, c) holds rows r... of the n rows
    that end at row `end` (the address wraps modulo 2**64 back to row end - n + r), and the hardware zero-fills
    (loads) or drops (stores) every row at or past `end`: per-sequence bounds from one host descriptor, no
    per-sequence state and nothing recompiled per length (kernels/gluon_fwd_common._tma_load)."""
    assert rows <= RAGGED_ROWS
    max_int = 0x7FFF0000
    return tma_descriptor(t, [max_int, max_int, RAGGED_ROWS, width], [2**34 - row_stride, row_stride, row_stride, 1],
                          [1, 1, block_rows, block_cols], shared_layout((1, 1, block_rows, block_cols), gl_dtype))


def bias_descriptor(attn_bias, seqlen_q, seqlen_k, block_n):
    """(descriptor, rows per batch, rows per head) of attn_bias (bias_layout's 2-D view, boxes [BLOCK_M,
    block_n])."""
    rows, row_stride, rows_b, rows_h = bias_layout(attn_bias, seqlen_q, seqlen_k)
    desc = tma_descriptor(attn_bias, [rows, seqlen_k], [row_stride, 1], [BLOCK_M, block_n],
                          torch_layout((BLOCK_M, block_n), attn_bias.dtype))
    return desc, rows_b, rows_h


def gluon_launch_args(q, k, v, out, lse, softmax_scale, causal, config, window_size=(-1, -1), softcap=0.0,
                      alibi_slopes=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                      max_seqlen_k=0, attn_bias=None, mods=None, dropout_p=0.0, rng=None):
    """(grid, args, constexprs, launch options) of one launch; shared by gluon_forward and the offline
    compile check so both compile the same kernel. Features off leave the constexprs at the plain kernel's.
    mods: a launch.ModArgs with a block mask (sparse_ok): the block-sparse walk, MASK_MOD in partial blocks.
    Varlen (cu_seqlens_q given): q / k / v / out packed (total, H, D), lse (Hq, total_q); the grid covers
    max_seqlen_q rows of every sequence and the kernel reads each one's lengths from cu_seqlens.
    attn_bias: 4-D, as gluon_supported takes it (its 2-D TMA descriptor: bias_descriptor).
    dropout_p > 0: rng the int64 (1,) Philox seed (the kernel's HAS_DROPOUT; two-consumer configs only)."""
    varlen = cu_seqlens_q is not None
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k
        heads_q, head_dim, heads_kv = q.shape[1], q.shape[2], k.shape[1]
        # (total, H, D) out and (Hq, total_q) lse: no batch stride; the kernel adds each sequence's first row.
        out_strides, lse_strides = (0, out.stride(0), out.stride(1)), (0, lse.stride(0))
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        out_strides, lse_strides = (out.stride(0), out.stride(1), out.stride(2)), (lse.stride(0), lse.stride(1))
    # Zero-filled key blocks past each sequence's end, where a block could reach into the next sequence.
    # Block-sparse: a listed key block of SPARSE_N > BLOCK_N keys can put a whole tile past Sk.
    key_block = max(config.block_n, mods.block_size[1]) if mods is not None else config.block_n
    ragged = varlen or (batch > 1 and seqlen_k % key_block != 0)
    is_causal, is_local, left, right = mask_mode(causal, window_size)
    unbounded = seqlen_q + seqlen_k  # as launch.ScoreArgs: no position difference reaches it
    alibi = alibi_slopes.float().contiguous() if alibi_slopes is not None else lse  # lse: an unread placeholder
    sink_t = sink.float().contiguous() if sink is not None else lse
    args = (_descriptor(q, WG_M.value, ragged), _descriptor(k, config.block_n, ragged),
            _descriptor(v, config.block_n, ragged), out, lse,
            alibi, sink_t, *out_strides, *lse_strides,
            alibi.stride(0) if alibi_slopes is not None and alibi.dim() == 2 else 0,
            seqlen_q, seqlen_k, heads_q, heads_q // heads_kv,
            softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E, float(softcap) * LOG2E,
            left if left >= 0 else unbounded, right if right >= 0 else unbounded,
            cu_seqlens_q if varlen else lse, cu_seqlens_k if varlen else lse,
            *(bias_descriptor(attn_bias, seqlen_q, seqlen_k, config.block_n) if attn_bias is not None
              else (lse, 0, 0)), float(softmax_scale), *_sparse_args(mods),
            rng if dropout_p else lse, 1.0 / (1.0 - dropout_p), philox.dropout_threshold(dropout_p))
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages, IS_CAUSAL=is_causal,
                      PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs, LOADER_REGS=config.loader_regs,
                      IS_LOCAL=is_local, SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None,
                      HAS_SINK=sink is not None, VARLEN=varlen, RAGGED=ragged,
                      # Three consumers with varlen and a window: P by pairs spilled in the full-block loops (5 LDL +
                      # 5 STL per block, session 33's offline count), P per element did not.
                      P_CVT_ASM=config.p_cvt_asm and not (config.consumers == 3 and varlen and is_local),
                      TREE_MAX=config.tree_max,
                      HAS_BIAS=attn_bias is not None, CONSUMERS=config.consumers)
    alibi_mma = alibi_by_mma(config, alibi_slopes, softcap, attn_bias)
    if config.consumers != 2:
        assert attn_bias is None and (alibi_slopes is None or alibi_mma) and mods is None and not dropout_p, \
            "a bias, ALiBi (but by ALIBI_MMA), dropout or a block mask runs two consumers (takes_config, sparse_ok)"
    if dropout_p:
        assert philox.dropout_threshold(dropout_p) <= HALF_COMPARE_MAX_THRESHOLD, "p > 0.96875 (gluon_supported)"
        constexprs.update(HAS_DROPOUT=True)
    # O through each warpgroup's Q tile: dense launches of two consumers at the head dims
    # configs.GLUON_FWD_SMEM_EPILOGUE lists (plain and causal since session 19, with score features, windows, sinks,
    # a bias and dropout under the plain causal mask since session 24; configs.py has the numbers). Other dropout
    # launches (no mask, or a window), varlen and block-sparse launches, three consumers and the other head dims
    # keep the register stores.
    if (not varlen and mods is None and config.consumers == 2 and not (dropout_p and not is_causal)
            and head_dim in configs.GLUON_FWD_SMEM_EPILOGUE):
        constexprs.update(O_VIA_SMEM=True)
    if config.lazy_rescale:
        constexprs.update(LAZY_RESCALE=True)
    if alibi_mma:
        constexprs.update(ALIBI_MMA=True)
    if config.fixed_max and fixed_max_ok(q.dtype, softcap, alibi_slopes, sink, attn_bias, mods):
        constexprs.update(FIXED_MAX=True)
    if config.batch_fast_bias and attn_bias is not None and batch > 1 and bias_layout(
            attn_bias, seqlen_q, seqlen_k)[2] == 0:  # rows per batch 0: one bias for the whole batch
        constexprs.update(BATCH_FAST=True)
    if config.lpt_heads and is_causal and not varlen and mods is None:  # (is_causal excludes a window: mask_mode)
        constexprs.update(LPT_HEADS=config.lpt_heads)  # only then: other launches keep their kernels
    if mods is not None:
        # EVEN_N: every listed key block lies inside Sk, so partial tiles need no sequence-end mask.
        constexprs.update(MASK_MOD=mods.mask_mod, BLOCK_SPARSE=True, SPARSE_M=mods.block_size[0],
                          SPARSE_N=mods.block_size[1], EVEN_N=seqlen_k % mods.block_size[1] == 0)
    grid = (math.ceil(seqlen_q / config.block_m), batch * heads_q)
    return grid, args, constexprs, dict(num_warps=4, maxnreg=config.maxnreg)


def block_list_args(lists, aux):
    """The 14 block-sparse kernel arguments of a block mask's four lists (num, idx, full_num, full_idx; the forward
    walks kv_lists, the backward the transposed q_lists): the lists, the (batch, head, block) strides of num and idx
    (0 along broadcast dims) and four aux tensors (None for absent ones)."""
    num, idx = lists[0], lists[1]
    strides = [0 if num.shape[i] == 1 else num.stride(i) for i in range(3)]
    strides += [0 if idx.shape[i] == 1 else idx.stride(i) for i in range(3)]
    return (*lists, *strides, *aux, *(None,) * (4 - len(aux)))


def _sparse_args(mods):
    """The block-sparse arguments of _attn_fwd_hopper (block_list_args of the key-block lists); all None without
    mods, so a dense launch compiles the kernel it always did."""
    return (None,) * 14 if mods is None else block_list_args(mods.kv_lists, mods.aux)


SPARSE_HEAD_DIMS = (64, 128, 256)  # D256: 64-key tiles, two per 128-key block
_sparse_failed = {}  # mask_mod adapter -> the exception its Gluon build raised (then the portable kernel serves it)


def sparse_ok(q, k, v, window_left, window_right, mods, variant="default"):
    """True when the Gluon forward can run flashtile.attention's block-sparse call: gluon_supported's dense
    conditions (sm90, fp16 / bf16, TMA-compatible strides, GQA), head dim 64, 128 or 256, no causal / window
    (flex.attention refuses causal with a block mask; causal with a lone mask_mod stays portable), a block mask whose
    query block is a multiple of the 128-row tile and whose key block a multiple of the variant's BLOCK_N (so a tile
    never straddles two blocks: other block sizes, e.g. (64, 64) or (128, 64), run the portable kernel, which
    shrinks its tiles to the blocks), a mask_mod or none, and no score_mod (kernels/gluon_fwd has no score_mod
    hook: the portable kernel serves it). A mask_mod whose Gluon build failed once stays portable."""
    if mods is None or mods.block_size is None or mods.score_mod is not None or mods.score_mod_grad is not None:
        return False
    if window_left >= 0 or window_right >= 0 or q.shape[-1] not in SPARSE_HEAD_DIMS:
        return False
    config = VARIANTS[variant].get(q.shape[-1])
    rows, cols = mods.block_size
    if config is None or config.consumers != 2 or rows % BLOCK_M or cols % config.block_n:
        return False
    if mods.mask_mod is not None and mods.mask_mod in _sparse_failed:
        return False
    return gluon_supported(q, k, v)


def record_sparse_failure(failed, direction, mods, exc):
    """A block-sparse launch of the Gluon `direction` ("forward" / "backward") failed to build (e.g. a mask_mod that
    Gluon cannot compile): one warning, and failed (that module's registry) sends the mask_mod to the portable
    kernels from now on; the dense Gluon kernels stay on."""
    warnings.warn(f"flashtile: the Hopper Gluon block-sparse {direction} failed for this mask_mod "
                  f"({type(exc).__name__}: {exc}); it runs the portable Triton kernels from now on "
                  f"(FLASHTILE_GLUON_SPARSE=0 silences this)", RuntimeWarning, stacklevel=4)
    failed[mods.mask_mod] = exc


def sparse_failed(mods, exc):
    """A block-sparse forward launch failed to build: that mask_mod runs the portable forward from now on."""
    record_sparse_failure(_sparse_failed, "forward", mods, exc)


def gluon_sparse_forward(q, k, v, softmax_scale, mods, variant="default"):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq) of flashtile.attention(q, k, v, block_mask=...) with the
    block lists and mask_mod in mods (a launch.ModArgs that sparse_ok accepts), natural log, as the portable
    forward writes them (so either block-sparse backward, Gluon or portable, runs on them)."""
    poison = _launch.poison_outputs()
    shape = q.shape
    out = _launch._empty(shape, q, poison=poison)
    lse = _launch._empty((shape[0], shape[2], shape[1]), q, torch.float32, poison)
    config = VARIANTS[variant][q.shape[-1]]
    grid, args, constexprs, options = gluon_launch_args(q, k, v, out, lse, float(softmax_scale), False, config,
                                                        mods=mods)
    fast_launch.launch(_attn_fwd_hopper, grid, args, {**constexprs, **options})
    return out, lse


def fixed_max_ok(dtype, softcap, alibi_slopes=None, sink=None, attn_bias=None, mods=None):
    """Softcap bounds every score: the kernel's FIXED_MAX serves bf16 calls with softcap * log2(e) <= FIXED_MAX_LIMIT
    (softcap <= 51.98, Gemma 2's 50 among them) and no ALiBi, sink, bias or block mask (each can move a row's max
    past the cap's bound). fp16's P has no room for the spread (kernels/gluon_fwd_common.FIXED_MAX_HEADROOM)."""
    return (dtype == torch.bfloat16 and 0 < softcap * LOG2E <= FIXED_MAX_LIMIT and alibi_slopes is None
            and sink is None and attn_bias is None and mods is None)


def plain_dense(causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None, cu_seqlens_q=None,
                attn_bias=None):
    """A dense, plain or causal call without window, softcap, ALiBi, sink or bias: the calls the persistent kernel
    takes (takes_persistent) and configs.GLUON_FWD_MIN_KEYS_PLAIN / GLUON_FWD_PERSISTENT route."""
    return not (mask_mode(causal, window_size)[1] or softcap or alibi_slopes is not None or sink is not None
                or cu_seqlens_q is not None or attn_bias is not None)


def takes_persistent(config, q, k, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None,
                     cu_seqlens_q=None, attn_bias=None):
    """True when a launch with config runs the persistent kernel: config.persistent, a plain_dense call (the
    others and varlen run _attn_fwd_hopper with the same config), and not D256 through ragged descriptors (batch >
    1, Sk % BLOCK_N != 0: ptxas spills 12-56 B there)."""
    if not (config.persistent and _attn_fwd_hopper_persistent is not None
            and plain_dense(causal, window_size, softcap, alibi_slopes, sink, cu_seqlens_q, attn_bias)):
        return False
    return not (q.shape[-1] == 256 and q.shape[0] > 1 and k.shape[1] % config.block_n != 0)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_launch_args(q, k, v, out, lse, softmax_scale, causal, config, sm_count=None):
    """(grid, args, constexprs, launch options) of the persistent kernel (takes_persistent): dense (B, S, H, D)
    q / k / v, lse (B, Hq, Sq); the grid is min(tiles, ctas_per_sm * SMs (sm_count, or q's device's), max_ctas)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    ragged = batch > 1 and seqlen_k % config.block_n != 0
    is_causal, _, _, _ = mask_mode(causal, (-1, -1))
    n_m, n_bh = math.ceil(seqlen_q / config.block_m), batch * heads_q
    n_tiles = n_m * n_bh
    if sm_count is None:
        sm_count = _sm_count(q.device.index if q.device.index is not None else torch.cuda.current_device())
    ctas = min(n_tiles, config.ctas_per_sm * sm_count)
    if config.max_ctas:
        ctas = min(ctas, config.max_ctas)
    o_tma = config.tma_store and (batch == 1 or seqlen_q % WG_M.value == 0) and _tma_2d_ok(out)
    out_strides, lse_strides = out.stride(), lse.stride()
    args = (_descriptor(q, WG_M.value, ragged), _descriptor(k, config.block_n, ragged),
            _descriptor(v, config.block_n, ragged), _descriptor(out, WG_M.value) if o_tma else out, out, lse,
            *out_strides[:3], *lse_strides[:2],
            seqlen_q, seqlen_k, heads_q, heads_q // heads_kv, softmax_scale * LOG2E, n_m, n_bh, n_tiles)
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages, IS_CAUSAL=is_causal,
                      PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs, LOADER_REGS=config.loader_regs,
                      RAGGED=ragged, P_CVT_ASM=config.p_cvt_asm, TREE_MAX=config.tree_max, O_TMA=o_tma)
    if config.q_buffers != 1:
        constexprs.update(Q_BUFFERS=config.q_buffers)
    o_via_smem = config.consumers == 2 and not o_tma and head_dim in configs.GLUON_FWD_SMEM_EPILOGUE
    if config.defer_epilogue and not o_via_smem:
        constexprs.update(DEFER_EPILOGUE=True)
    if config.lazy_rescale:
        constexprs.update(LAZY_RESCALE=True)
    if config.consumers != 2:
        constexprs.update(CONSUMERS=config.consumers)  # its O leaves by TMA or from the registers
    elif o_via_smem:  # O through one shared tile (session 20)
        constexprs.update(O_VIA_SMEM=True)
    schedule = None
    if config.schedule and is_causal:
        schedule = persistent_schedule(q.device, n_m, n_bh, ctas, config.lpt_heads or n_bh, seqlen_q, seqlen_k,
                                       config.block_m, config.block_n)
    if schedule is not None:
        constexprs.update(SCHEDULE=True)  # the list holds the order: LPT_HEADS would only split the compiles
    elif config.lpt_heads and is_causal:
        constexprs.update(LPT_HEADS=config.lpt_heads)
    args += (lse if schedule is None else schedule, )  # Schedule: unused without SCHEDULE
    return (ctas, ), args, constexprs, dict(num_warps=4, maxnreg=config.maxnreg)


def gluon_forward(q, k, v, softmax_scale=None, causal=False, variant="default", window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                  max_seqlen_k=0, attn_bias=None, dropout_p=0.0, rng=None):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq), or (Hq, total_q) for packed varlen q / k / v with
    cu_seqlens_q / _k, natural log (as the portable forward writes it, including the sink when there is one, so
    the existing backward runs on them). Requires gluon_supported(q, k, v, causal, window_size=..., softcap=...,
    alibi_slopes=..., sink=..., attn_bias=..., cu_seqlens_q=..., ...) and softmax_scale > 0 (without score
    features the running max is taken before scaling). attn_bias: 4-D (B or 1, Hq or 1, Sq, Sk), added to the
    scores after softcap and ALiBi, before the masks (kernels/common._scores' order). dropout_p > 0: rng is the
    int64 (1,) Philox seed; the probabilities are dropped as the portable kernels drop them (the same draws), so the
    portable backward regenerates the mask."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    poison = _launch.poison_outputs()  # NaN-poisoned under FLASHTILE_POISON_OUTPUTS=1, as the other launchers
    shape = q.shape
    out = _launch._empty(shape, q, poison=poison)
    if cu_seqlens_q is not None:
        lse = _launch._empty((shape[1], shape[0]), q, torch.float32, poison)
    else:
        lse = _launch._empty((shape[0], shape[2], shape[1]), q, torch.float32, poison)
    config = takes_config(variant, q.shape[-1], attn_bias, alibi_slopes, dropout_p, softcap)
    if not dropout_p and takes_persistent(config, q, k, causal, window_size, softcap, alibi_slopes, sink,
                                          cu_seqlens_q, attn_bias):
        # launch.py says causal as the window (-1, 0): the persistent kernel knows only plain and causal.
        is_causal = mask_mode(causal, window_size)[0]
        grid, args, constexprs, options = persistent_launch_args(q, k, v, out, lse, float(softmax_scale), is_causal,
                                                                 config)
        fast_launch.launch(_attn_fwd_hopper_persistent, grid, args, {**constexprs, **options})
        return out, lse
    if config.persistent:  # a persistent variant's call the persistent kernel cannot take (D256 ragged): the one-tile
        config = VARIANTS["default"][q.shape[-1]]  # kernel with its own measured config, not the variant's order
    grid, args, constexprs, options = gluon_launch_args(q, k, v, out, lse, float(softmax_scale), causal, config,
                                                        window_size, float(softcap), alibi_slopes, sink,
                                                        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                        attn_bias, dropout_p=dropout_p, rng=rng)
    fast_launch.launch(_attn_fwd_hopper, grid, args, {**constexprs, **options})
    return out, lse
