"""Inference over a KV cache, as flash-attn's flash_attn_with_kvcache: append new keys in place, then attend."""
import numbers

import torch

from . import checks, ops


def _cache_seqlens(cache_seqlens, batch, device):
    """(the tensor or None, the int added to it, the lengths as a list) from an int or a tensor. An int stays a
    kernel scalar: no tensor to fill (a kernel and a CUDA-graph node per decode step) and no sync. Only a tensor
    is read back (one device sync; none while capturing or tracing: the list is then None)."""
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        n = int(cache_seqlens)
        return None, n, [n] * batch
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor of shape ({batch},), got "
                        f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)}")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"cache_seqlens must have shape ({batch},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but k_cache is on {device}")
    unread = checks.capturing(cache_seqlens) or torch.compiler.is_compiling()
    return checks.unit_stride(cache_seqlens), 0, None if unread else cache_seqlens.tolist()


def _row_tensor(name, t, batch, device):
    """An int32 (batch,) tensor on the cache's device, returned as a list of ints: one sync the first time the tensor
    is seen and after it changes through torch (checks.read_back: the layers of a step and the steps of a batch that
    share one cache_leftpad read it once; an inference-mode tensor on every call); None while a CUDA graph is
    captured or torch.compile traces (no values to read there)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (batch,):
        raise TypeError(f"{name} must be an int32 tensor of shape ({batch},), got "
                        f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but k_cache is on {device}")
    return None if checks.capturing(t) or torch.compiler.is_compiling() else checks.read_back(t)


def _num_splits(num_splits):
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 = chosen by a heuristic), got {num_splits!r}")
    return int(num_splits)


def _no_tokens(k, v):
    """Whether k, v are an append of no tokens: tensors of (B, 0, Hk, D)."""
    return all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] == 0 for t in (k, v))


def _check_rotary(rotary_cos, rotary_sin, q, last_position):
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together or both be None")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor (seqlen_ro, rotary_dim / 2), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
        if t.device != q.device or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor on {q.device}, got {t.dtype} on {t.device}")
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must have one shape, got {tuple(rotary_cos.shape)} and "
                         f"{tuple(rotary_sin.shape)}")
    if 2 * rotary_cos.shape[1] > q.shape[-1]:
        raise ValueError(f"rotary dim 2 * {rotary_cos.shape[1]} exceeds the head dim {q.shape[-1]}")
    if last_position >= rotary_cos.shape[0]:
        raise ValueError(f"rotary_cos has {rotary_cos.shape[0]} positions but position {last_position} is needed")


def _plain_step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, interleaved):
    """(out, lse) of the common decode step (host time: it skips the checks and normalization below, which would
    accept it and normalize it to these arguments): a contiguous or paged (block_table) cache whose q / k_cache /
    v_cache passed checks.plain_qkv_ok, an int cache length, an optional append of k, v (no rotary), no other
    feature. A block table gets the full path's checks (checks.block_table, block_table_pages: their errors). None
    where the call needs the full path (k, v that plain_qkv_ok does not take with q or that do not match the cache, or
    a length outside the cache: the full path raises the error)."""
    new_tokens = 0
    if k is not None or v is not None:
        if (k is None or v is None or not checks.plain_qkv_ok(q, k, v) or k.shape[2:] != k_cache.shape[2:]
                or 0 in k_cache.stride() or 0 in v_cache.stride()):  # the full path checks an expanded cache
            return None
        new_tokens = k.shape[1]
    capacity = k_cache.shape[1]
    if block_table is not None:
        block_table = checks.block_table(block_table, q.shape[0], k_cache.device)
        capacity *= block_table.shape[1]
    if not 0 <= cache_seqlens <= capacity - new_tokens:
        return None
    if block_table is not None:
        checks.block_table_pages(block_table, k_cache.shape[0], k_cache.shape[1], cache_seqlens + new_tokens)
    scale = checks.softmax_scale_or_default(softmax_scale, q.shape[3])
    if new_tokens:
        ops.call(ops.kvcache_append, q, k_cache, v_cache, k, v, None, None, None, block_table, interleaved, causal,
                 cache_seqlens)
    length = cache_seqlens + new_tokens
    return ops.call(ops.fwd_kvcache, q, k_cache, v_cache, None, block_table, scale, -1, 0 if causal else -1, 0.0,
                    None, length, 0, None, length)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q (B, Sq, Hq, D) over a cache k_cache/v_cache (B, capacity, Hk, D) (no autograd).

    cache_seqlens (int or int32 (B,)): tokens already in each row of the cache (default: the whole cache).
    With k, v (B, Sk_new, Hk, D) the new tokens are first written into the cache in place at
    cache_seqlens[b] (all checks happen before anything is written; Sk_new = 0 appends nothing, and an expanded
    cache, one memory location for several entries, is refused), then batch row b attends to its
    first cache_seqlens[b] + Sk_new keys. Causal and windows are bottom-right aligned on that length, as
    flash-attn. Returns out (B, Sq, Hq, D), and softmax_lse (B, Hq, Sq) when return_softmax_lse.
    rotary_cos, rotary_sin (seqlen_ro, rotary_dim / 2): rotary embedding of the new k at positions
    cache_seqlens[b] + i, and of q at the same positions when causal or windowed, else at cache_seqlens[b]
    (every query at the position of the first new token), as flash-attn; rotary_interleaved picks the
    pairing (see cpu.apply_rotary). On the GPU one kernel rotates q and the new k and appends k and v
    (flashtile::kvcache_append); the attention is a second launch.
    block_table (int32 (B, max_pages)): a paged cache k_cache/v_cache (num_pages, page_size, Hk, D), any
    page size; row b's token t lives in page block_table[b, t // page_size] at slot t % page_size. Entries past the
    pages of the row's keys are never read (a table padded there with -1 is fine, as in flash-attn).
    num_splits: for few queries per KV head (group_size * Sq <= 128, decoding) a split-KV kernel packs the
    query heads of each KV head into one tile and splits the key range over num_splits programs whose
    partial results a second kernel combines; 0 picks the count from the batch, heads and cache length
    (configs.num_splits_heuristic). It changes speed, not results (up to rounding).
    cache_batch_idx (int32 (B,)): batch row b uses cache row cache_batch_idx[b] of a contiguous cache
    (B_cache, capacity, Hk, D), for appends too (with repeated indices, which row's append lands is
    unspecified, as in flash-attn); not with block_table (reorder the table's rows instead).
    cache_leftpad (int32 (B,)): row b's keys start at cache token cache_leftpad[b] (0 <= cache_leftpad[b] <=
    cache_seqlens[b]); earlier tokens are ignored. Rotary positions stay cache positions, and causal, window
    and ALiBi distances do not depend on the padding (they are measured from the last key).
    CUDA graphs: the call can be captured (an int cache_seqlens needs no host sync and no device tensor: it is a
    kernel argument, so a step is the kernels alone). While capturing (and while torch.compile traces), the
    contents of tensor arguments (cache_seqlens, block_table, cache_batch_idx, cache_leftpad) cannot be read
    back, so their range checks are skipped and the cache capacity stands in for the longest row.
    """
    if (type(cache_seqlens) is int and rotary_cos is None and rotary_sin is None and cache_batch_idx is None
            and cache_leftpad is None and alibi_slopes is None and type(causal) is bool and type(softcap) is float
            and softcap == 0 and type(window_size) is tuple and window_size == (-1, -1) and type(num_splits) is int
            and num_splits == 0 and type(rotary_interleaved) is bool and type(return_softmax_lse) is bool
            and checks.plain_qkv_ok(q, k_cache, v_cache, same_batch=block_table is None)):
        step = _plain_step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
                           rotary_interleaved)
        if step is not None:
            return step if return_softmax_lse else step[0]
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("cache_batch_idx cannot be combined with block_table (reorder the block table's rows "
                         "instead)")
    checks.check_qkv(q, k_cache, v_cache, same_batch=block_table is None and cache_batch_idx is None,
                     names=("k_cache", "v_cache"), kv_layout=None if block_table is None else
                     "(num_pages, page_size, heads, headdim) with block_table")
    batch, capacity = q.shape[0], k_cache.shape[1]
    if cache_batch_idx is not None:
        indices = _row_tensor("cache_batch_idx", cache_batch_idx, batch, k_cache.device)
        if indices is not None and (min(indices) < 0 or max(indices) >= k_cache.shape[0]):
            raise ValueError(f"cache_batch_idx entries must index the cache's {k_cache.shape[0]} rows, got "
                             f"{indices}")
    if block_table is not None:
        block_table = checks.block_table(block_table, batch, k_cache.device)
        capacity = block_table.shape[1] * k_cache.shape[1]
    if cache_seqlens is None:
        cache_seqlens = capacity
    used, used_add, used_list = _cache_seqlens(cache_seqlens, batch, k_cache.device)
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new tokens to append) or both be None")
    if k is not None:
        empty = _no_tokens(k, v)  # checked as one token each (check_qkv refuses empty tensors)
        checks.check_qkv(q, *((t.new_empty(t.shape[0], 1, *t.shape[2:]) for t in (k, v)) if empty else (k, v)))
        if k.shape[2:] != k_cache.shape[2:]:
            raise ValueError(f"k has (heads, headdim) {tuple(k.shape[2:])} but k_cache has {tuple(k_cache.shape[2:])}")
        if empty:
            k = v = None  # as flash-attn: an append of no tokens (a chunked loop's empty chunk) appends nothing
        else:
            checks.writable_cache("k_cache", k_cache)
            checks.writable_cache("v_cache", v_cache)
    new_tokens = k.shape[1] if k is not None else 0  # the attention's key count adds them in the kernel
    if used_list is None:  # capture / tracing with tensor cache_seqlens: unchecked, the capacity bounds the keys
        used_list, lengths = [0], [capacity]
    else:
        lengths = [n + new_tokens for n in used_list]
    if min(used_list) < 0:
        raise ValueError(f"cache_seqlens must be >= 0 in every row, got {used_list}")
    if max(lengths) > capacity:  # the cache must not be written or read past its end
        raise ValueError(f"cache_seqlens + new tokens must lie in [0, {capacity}] (the cache's capacity), got "
                         f"{lengths}")
    if block_table is not None:  # (skipped while capturing / tracing, as used_list)
        checks.block_table_pages(block_table, k_cache.shape[0], k_cache.shape[1], lengths)
    if cache_leftpad is not None:
        pads = _row_tensor("cache_leftpad", cache_leftpad, batch, k_cache.device)
        if pads is not None and any(not 0 <= pad <= n for pad, n in zip(pads, used_list)):
            raise ValueError(f"cache_leftpad must lie in [0, cache_seqlens[b]] in every row, got {pads} with "
                             f"cache_seqlens {used_list}")
        cache_leftpad = checks.unit_stride(cache_leftpad)
    checks.flag("causal", causal)
    checks.flag("rotary_interleaved", rotary_interleaved)
    checks.flag("return_softmax_lse", return_softmax_lse)
    scale = checks.softmax_scale_or_default(softmax_scale, q.shape[-1])
    window_left, window_right = checks.window(window_size, causal)
    slopes = checks.alibi(alibi_slopes, q, batch, q.shape[2])
    softcap = checks.softcap_value(softcap)
    splits = _num_splits(num_splits)
    local = window_left >= 0 or window_right >= 0  # causal included (right = 0)
    if rotary_cos is not None or rotary_sin is not None:
        span = max(q.shape[1] if local else 1, k.shape[1] if k is not None else 0)
        _check_rotary(rotary_cos, rotary_sin, q, max(used_list) + span - 1)
    if cache_batch_idx is not None:  # the cache as pages of one row each, for the append and the attention
        block_table = cache_batch_idx[:, None]
    if rotary_cos is not None or k is not None:
        q_rot = ops.call(ops.kvcache_append, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, used, block_table,
                         rotary_interleaved, local, used_add)
        q = q_rot if rotary_cos is not None else q
    out, lse = ops.call(ops.fwd_kvcache, q, k_cache, v_cache, used, block_table, scale, window_left, window_right,
                        softcap, slopes, max(lengths), splits, cache_leftpad, used_add + new_tokens)
    return (out, lse) if return_softmax_lse else out
