"""Host launchers of KV-cache inference: the split-KV ("flash-decoding") kernel and its combine, the fused rotary
append, their launch plans (plans.py), and the varlen forward over a paged cache.

Inputs arrive validated by kvcache.py / interface.py; the shared pieces (Geometry, ScoreArgs, KernelLaunch, the
forward's launches, buffers and plans) come from launch.py.
"""
import functools
from dataclasses import replace

import torch

from . import configs, launch, plans
from .kernels.decode import _attn_combine, _attn_fwd_splitkv
from .kernels.rotary import _rotary_append
# Types and pure helpers by name; the policy functions through the module (as bwd_launch.py).
from .launch import Geometry, KernelLaunch, ScoreArgs, _cdiv, _head_dim_padded, _next_pow2, _signature, _strides3


@functools.lru_cache(maxsize=None)
def _num_sms(device):
    # Under the interpreter (CPU tensors) the heuristic plans for an H200, so tests exercise it as the GPU would.
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def uses_splitkv(geo, num_splits):
    """The split-KV kernel serves a KV-cache call when few query rows share each KV head: it reads each K/V
    byte once per group_size * Sq packed rows where the forward reads it once per query head, and splits
    long caches over more programs. Longer query chunks (prefill) keep the forward kernel, whose
    per-position query blocks skip work under causal masks. An explicit num_splits > 1 is always honoured."""
    rows = geo.seqlen_q * (geo.heads_q // geo.heads_kv)
    return geo.is_kvcache and (rows <= configs.DECODE_MAX_ROWS or num_splits > 1)


def splitkv_plan(geo, max_seqlen_k, num_splits, arch, dtype, device, interpreter):
    """(tile config, number of splits, dot precision): num_splits as given (at most configs.MAX_SPLITS), or from
    the heuristic when 0, for the longest row's max_seqlen_k keys; the tiles suit the precision's dots."""
    rows = geo.seqlen_q * (geo.heads_q // geo.heads_kv)
    precision = launch._dot_precision(dtype, arch)
    cfg = configs.decode_config(arch, _head_dim_padded(geo.head_dim), rows, dtype, interpreter, precision)
    return cfg, split_count(num_splits, splitkv_programs(geo, cfg), max_seqlen_k, cfg.BLOCK_N, device), precision


def splitkv_programs(geo, cfg):
    """Programs of one split of the split-KV kernel: a tile of cfg.BLOCK_M packed query rows per (batch, KV head)."""
    return geo.batch * geo.heads_kv * _cdiv(geo.seqlen_q * (geo.heads_q // geo.heads_kv), cfg.BLOCK_M)


def split_count(num_splits, programs, max_seqlen_k, block_n, device):
    """splitkv_plan's number of splits: num_splits (at most configs.MAX_SPLITS), or the heuristic's when 0."""
    if num_splits > 0:
        return min(num_splits, configs.MAX_SPLITS)
    return configs.num_splits_heuristic(programs, _cdiv(max_seqlen_k, block_n), _num_sms(device))


def splitkv_launches(geo, q, k, v, out, lse, sa, cfg, num_splits, precision):
    """The split-KV kernel, and with num_splits > 1 the combine kernel, writing out (q's shape) and lse
    (B, Hq, Sq). The splits' partial outputs go to an fp32 workspace (num_splits, B, Sq, Hq, D) and lse
    (num_splits, B, Hq, Sq); one split writes out and lse directly."""
    group_size = geo.heads_q // geo.heads_kv
    head_dim_pad = _head_dim_padded(geo.head_dim)
    if num_splits > 1:
        out_acc = launch._empty((num_splits, *q.shape), q, torch.float32)
        lse_acc = launch._empty((num_splits, *lse.shape), q, torch.float32)
        split_strides = out_acc.stride(0), lse_acc.stride(0)
    else:
        out_acc, lse_acc, split_strides = out, lse, (0, 0)
    acc4 = out_acc if num_splits == 1 else out_acc[0]
    lse3 = lse_acc if num_splits == 1 else lse_acc[0]
    main = KernelLaunch(
        _attn_fwd_splitkv, (num_splits, geo.batch * geo.heads_kv, _cdiv(geo.seqlen_q * group_size, cfg.BLOCK_M)),
        (q, k, v, out_acc, lse_acc, sa.alibi, geo.seqused_k if geo.seqused_k is not None else lse,
         geo.block_table if geo.block_table is not None else lse,
         geo.key_start_arg(lse), *_strides3(q), *_strides3(k), *_strides3(v), split_strides[0], *_strides3(acc4),
         split_strides[1], lse3.stride(0), lse3.stride(1), sa.stride_alibi_b, *geo.page_args(k),
         geo.seqlen_q, geo.heads_kv, group_size, num_splits, geo.seqused_add or 0, *sa.score_scalars()),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             IS_LOCAL=sa.constexprs["IS_LOCAL"], SOFTCAP=sa.constexprs["SOFTCAP"],
             HAS_ALIBI=sa.constexprs["HAS_ALIBI"], **geo.page_constexprs(k, cfg.BLOCK_N),
             LEFTPAD=geo.key_start is not None, LEFT_BOUNDED=sa.left_bounded,
             DOT_PRECISION=precision, HAS_SEQUSED_TENSOR=geo.seqused_k is not None),
        cfg.num_warps, cfg.num_stages, shrink=("BLOCK_N",),
    )
    if num_splits == 1:
        return [main]
    combine = KernelLaunch(
        _attn_combine, (geo.batch * geo.seqlen_q * geo.heads_q,),
        (out_acc, lse_acc, out, lse, split_strides[0], *_strides3(acc4), split_strides[1], lse3.stride(0),
         lse3.stride(1), *_strides3(out), lse.stride(0), lse.stride(1), geo.seqlen_q, geo.heads_q, num_splits),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_S=16),
    )
    return [main, combine]


def rotary_append_launches(q, q_out, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table,
                           interleaved, q_local, cache_add=0):
    """The KV-cache append with fused rotary as one launch (none when there is nothing to do).

    q_out: q's shape, written with the rotated q when rotary_cos is given (else neither read nor written).
    k, v (B, Sk_new, Hk, D) or None; rotary_cos/sin (seqlen_ro, rotary_dim / 2) or None; row b's new tokens go
    at cache_add (an int) + cache_seqlens[b] (int32 (B,), or None for 0): an int cache length needs no tensor;
    block_table int32 (B, max_pages) into a paged cache, or None for a contiguous one.
    """
    rotary = rotary_cos is not None
    heads_q_rot = q.shape[2] if rotary else 0
    seqlen_new, heads_kv = (k.shape[1], k.shape[2]) if k is not None else (0, 0)
    seqlen_q = q.shape[1] if rotary else 0
    grid = (max(seqlen_q, seqlen_new), q.shape[0], heads_q_rot + heads_kv)
    if 0 in grid:
        return []
    # Absent tensors: q stands in (never read), as do zero strides.
    k, v = (k, v) if k is not None else (q, q)
    cos, sin = (rotary_cos, rotary_sin) if rotary else (q, q)
    stride_bt, page_size = (block_table.stride(0), k_cache.shape[1]) if block_table is not None else (0, 0)
    return [KernelLaunch(
        _rotary_append, grid,
        (q, q_out, k, v, k_cache, v_cache, cos, sin, cache_seqlens if cache_seqlens is not None else q,
         block_table if block_table is not None else q,
         *_strides3(q), *_strides3(q_out), *_strides3(k), *_strides3(v), *_strides3(k_cache), *_strides3(v_cache),
         *cos.stride()[:2], *sin.stride()[:2], stride_bt, page_size,
         seqlen_q, seqlen_new, heads_q_rot, rotary_cos.shape[1] if rotary else 0, cache_add),
        dict(HEAD_DIM=q.shape[3], HEAD_DIM_PAD=_next_pow2(q.shape[3]), ROTARY=rotary,
             INTERLEAVED=interleaved, Q_LOCAL=q_local, PAGED=block_table is not None,
             HAS_CACHE_SEQLENS=cache_seqlens is not None),
        num_warps=1,
    )]


def _kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                    q_local, cache_add=0):
    """Writes k (rotated) and v into the cache in place; returns q rotated (q's shape and dtype) when rotary_cos
    is given, else an empty tensor. Arguments: see rotary_append_launches. A CUDA call is replayed from its plan
    after the first of its signature (_planned_append), as the decode step that follows it."""
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table)
    result = None
    if q.is_cuda and launch._plannable(q) and 0 <= cache_add < 2**31:  # cache_add: an i32 argument, as recorded
        result = _planned_append(tensors, interleaved, q_local, cache_add)
    if result is None:
        result = _append_launches(*tensors, interleaved, q_local, cache_add)
    return result[0] if rotary_cos is not None else q.new_empty(0)


def _append_launches(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                     q_local, cache_add):
    """_kvcache_append's launch as it runs without a plan: (rotated q,) with rotary_cos, else ()."""
    rotary = rotary_cos is not None
    q_out = launch._empty(q.shape, q) if rotary else q  # without rotary q stands in, neither read nor written
    for kernel_launch in rotary_append_launches(q, q_out, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                                block_table, interleaved, q_local, cache_add):
        kernel_launch.run()
    return (q_out,) if rotary else ()


# The append kernel's cache-length argument: a plan's per-call scalar (unspecialized, as the split-KV kernel's).
_CACHE_ADD_ARG = _rotary_append.arg_names.index("cache_add")


def _planned_append(tensors, interleaved, q_local, cache_add):
    """_append_launches' result from its plan (plans.py), or None (the caller runs the launch). The key: each of
    tensors' shape, strides, dtype and device (None for an absent one), which of them alias, interleaved and
    q_local; not the cache length cache_add, which each replay passes to the kernel (plans' scalar slot)."""
    inputs = tuple(t for t in tensors if t is not None)
    key = ("append", *(None if t is None else _signature(t) for t in tensors), plans.aliasing(inputs), interleaved,
           q_local)
    return launch._planned(key, inputs, None, lambda: _append_launches(*tensors, interleaved, q_local, cache_add),
                           slots=((_rotary_append, _CACHE_ADD_ARG),), scalars=(cache_add, ))


def _flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right,
                                softcap, alibi_slopes, max_seqlen_k, num_splits, key_start=None, seqused_add=0):
    """Forward over a KV cache: batch b attends to its first seqused_add + seqused_k[b] cached keys (seqused_k
    int32 (B,), or None for 0: an int cache length needs no tensor); out like q, lse (B, Hq, Sq).

    block_table: None (cache (B, capacity, Hk, D)) or int32 (B, max_pages) into a paged cache
    (num_pages, page_size, Hk, D), whose capacity per row is max_pages * page_size.
    max_seqlen_k: the largest key count (sizes the split heuristic); num_splits: 0 = heuristic, else
    the number of key-range splits (see uses_splitkv for when the split-KV kernel runs).
    key_start: None or int32 (B,): row b's keys are the cache tokens key_start[b] <= t < its key count.
    A decode step (fp16 / bf16, the Gluon head dims) on CUDA replays its launch plan (_planned_kvcache) after the
    first step of its signature.
    """
    if q.is_cuda and launch._plannable(q):
        result = _planned_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left,
                                  window_right, softcap, alibi_slopes, max_seqlen_k, num_splits, key_start,
                                  seqused_add)
        if result is not None:
            return result
    return _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right,
                             softcap, alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add)


def _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                      alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add):
    """_flash_attn_forward_kvcache's launchers, as they run without a plan."""
    geo = _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add)
    out = launch._empty(q.shape, q)
    lse = launch._empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse,
                        approx_tanh=launch._approx_tanh(q))
    arch, interpreter = launch._arch(q.device), launch.interpreter_active()
    if uses_splitkv(geo, num_splits):
        cfg, splits, precision = splitkv_plan(geo, max_seqlen_k, num_splits, arch, q.dtype, q.device, interpreter)
        launches = splitkv_launches(geo, q, k_cache, v_cache, out, lse, sa, cfg, splits, precision)
    else:
        launches = launch.forward_launches(geo, q, k_cache, v_cache, out, lse, None, sa, arch, interpreter)
    for kernel_launch in launches:
        kernel_launch.run()
    return out, lse


def _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add):
    geo = Geometry.of(q, k_cache)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    return replace(geo, batch=q.shape[0], seqlen_k=capacity, seqused_k=seqused_k, seqused_add=seqused_add,
                   block_table=block_table, key_start=key_start)


# Signatures of KV-cache calls (_planned_kvcache's key without the split count) -> (programs, BLOCK_N) of their
# split-KV plan, or False where the split-KV kernel does not serve them (longer query chunks: not planned).
_kvcache_tiles = {}
# The split-KV kernel's cache-length argument: a plan's per-call scalar (unspecialized: one compiled kernel for all).
_SEQUSED_ADD_ARG = _attn_fwd_splitkv.arg_names.index("seqused_add")


def _planned_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                     alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add):
    """(out, lse) of a decode step from its plan (plans.py), or None (the caller runs the launchers). The key: the
    tensors' shapes, strides, dtypes and devices (the optional ones too: length tensor, block table, ALiBi slopes,
    key_start), which of them alias, the scale, window and softcap, num_splits and the split count it comes to for
    max_seqlen_k; not the cache length seqused_add, which each replay passes to the split-KV kernel (plans' scalar
    slot). Only the split-KV kernel's calls (and its combine) are planned."""
    if not 0 <= seqused_add < 2**31:  # an i32 argument, as recorded
        return None
    optional = (seqused_k, block_table, alibi_slopes, key_start)
    inputs = (q, k_cache, v_cache) + tuple(t for t in optional if t is not None)
    signature = ("kvcache", q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(),
                 k_cache.dtype, k_cache.get_device(), v_cache.shape, v_cache.stride(), v_cache.dtype,
                 *(None if t is None else _signature(t) for t in optional), plans.aliasing(inputs),
                 softmax_scale, window_left, window_right, softcap, num_splits)
    tiles = _kvcache_tiles.get(signature)
    if tiles is None:
        geo = _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add)
        tiles = False
        if uses_splitkv(geo, num_splits):
            cfg = splitkv_plan(geo, max_seqlen_k, num_splits, launch._arch(q.device), q.dtype, q.device, False)[0]
            tiles = (splitkv_programs(geo, cfg), cfg.BLOCK_N)
        if len(_kvcache_tiles) >= plans.MAX_PLANS:  # bounded as the plans are
            _kvcache_tiles.clear()
        _kvcache_tiles[signature] = tiles
    if tiles is False:
        return None
    key = (*signature, split_count(num_splits, tiles[0], max_seqlen_k, tiles[1], q.device))
    return launch._planned(key, inputs, None,
                           lambda: _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale,
                                                     window_left, window_right, softcap, alibi_slopes, max_seqlen_k,
                                                     num_splits, key_start, seqused_add),
                           slots=((_attn_fwd_splitkv, _SEQUSED_ADD_ARG),), scalars=(seqused_add, ))


def _flash_attn_forward_varlen_paged(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     block_table, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                                     sink):
    """Varlen forward whose keys live in a paged cache (num_pages, page_size, Hk, D): sequence b's keys are
    in the pages block_table[b] lists, cu_seqlens_k gives their counts. out like q, lse (Hq, total_q)."""
    geo = Geometry(cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k_pages.shape[2], q.shape[2],
                   cu_seqlens_q, cu_seqlens_k, block_table=block_table)
    out = launch._empty(q.shape, q)
    lse = launch._empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse,
                        approx_tanh=launch._approx_tanh(q))
    for kernel_launch in launch.forward_launches(geo, q, k_pages, v_pages, out, lse, sink, sa, launch._arch(q.device),
                                                 launch.interpreter_active()):
        kernel_launch.run()
    return out, lse
