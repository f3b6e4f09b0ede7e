"""torch.library custom ops for the forward and backward, so torch.compile sees opaque ops.

Each op picks its implementation by device: Triton kernels on GPUs (and on CPU tensors when the
Triton interpreter is on, which is how CI tests the kernels), flashtile.cpu otherwise.
Autograd for `flashtile::fwd` is registered in autograd.py.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import cpu


def _interpreter_active():
    from .launch import interpreter_active  # imports triton: only when a kernel may run

    return interpreter_active()


def _runs_triton(t):
    return t.device.type != "cpu" or _interpreter_active()


@torch.library.custom_op("flashtile::fwd", mutates_args=(), device_types=None)
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_left: int, window_right: int,
        softcap: float, alibi_slopes: Optional[Tensor], sink: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
        max_seqlen_k: int, attn_bias: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """out (q's shape), lse fp32: (B, Hq, Sq) dense, (Hq, total_q) varlen (cu_seqlens given, q (total_q, Hq, D)).

    window_left/right: -1 = unbounded (causal: right = 0). sink: fp32 (Hq,) attention-sink logits or None;
    the backward needs no kernel change for it (autograd.py). max_seqlen_* are plain ints, so sequence
    lengths never become part of a compiled graph's guards beyond these two numbers. attn_bias: 4-D,
    broadcastable to (B, Hq, Sq, Sk), added to the scores (dense inputs only).
    """
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes, sink)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if _runs_triton(q):
        from .launch import _flash_attn_forward

        return _flash_attn_forward(q, k, v, *args, *varlen, attn_bias)
    if cu_seqlens_q is not None:
        return cpu.varlen_forward(q, k, v, *args, *varlen)
    return cpu.forward(q, k, v, *args, attn_bias)


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
              cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias):
    if cu_seqlens_q is not None:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashtile::bwd", mutates_args=(), device_types=None)
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Optional[Tensor],
        softmax_scale: float, window_left: int, window_right: int, softcap: float,
        alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, attn_bias: Optional[Tensor],
        bias_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (shapes and dtypes of q, k, v) and dscores: fp32 (B, Hq, Sq, Sk) when bias_grad, else empty."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if _runs_triton(q):
        from .launch import _flash_attn_backward

        return _flash_attn_backward(dout, q, k, v, out, lse, dlse, *args, *varlen, attn_bias, bias_grad)
    if cu_seqlens_q is not None:
        return (*cpu.varlen_backward(dout, q, k, v, out, lse, dlse, *args, *varlen), q.new_empty(0))
    return cpu.backward(dout, q, k, v, out, lse, dlse, *args, attn_bias, bias_grad)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
              cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, bias_grad):
    dscores = (q.new_empty((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), dtype=torch.float32) if bias_grad
               else q.new_empty(0, dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dscores


@torch.library.custom_op("flashtile::fwd_kvcache", mutates_args=(), device_types=None)
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqused_k: Tensor, block_table: Optional[Tensor],
                softmax_scale: float, window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[Tensor], max_seqlen_k: int, num_splits: int,
                key_start: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Inference forward over a cache (no autograd): batch b sees its cache tokens key_start[b] <= t <
    seqused_k[b] (int32 (B,) each; key_start None = 0), from k_cache[b] or, with block_table (B, max_pages),
    from the pages block_table[b] lists. max_seqlen_k: max(seqused_k); num_splits: key-range splits of the
    decode kernel, 0 = heuristic (the CPU path ignores both)."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes)
    if _runs_triton(q):
        from .launch import _flash_attn_forward_kvcache

        return _flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table, *args, max_seqlen_k,
                                           num_splits, key_start)
    return cpu.kvcache_forward(q, k_cache, v_cache, seqused_k, block_table, *args, key_start)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                      alibi_slopes, max_seqlen_k, num_splits, key_start):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("flashtile::fwd_varlen_paged", mutates_args=(), device_types=None)
def fwd_varlen_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, block_table: Tensor, softmax_scale: float,
                     window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                     sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Inference forward of packed varlen queries q (total_q, Hq, D) over a paged cache k/v_pages
    (num_pages, page_size, Hk, D): sequence b's cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys lie in the pages
    block_table[b] (int32 (B, max_pages)) lists. out like q, lse (Hq, total_q). No autograd."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes, sink)
    if _runs_triton(q):
        from .launch import _flash_attn_forward_varlen_paged

        return _flash_attn_forward_varlen_paged(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                max_seqlen_k, block_table, *args)
    return cpu.varlen_paged_forward(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    block_table, *args)


@fwd_varlen_paged.register_fake
def _fwd_varlen_paged_fake(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                           softmax_scale, window_left, window_right, softcap, alibi_slopes, sink):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
