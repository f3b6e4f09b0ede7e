"""torch.library custom ops for the forward and backward, so torch.compile sees opaque ops.

Each op picks its implementation by device: Triton kernels on GPUs (and on CPU tensors when the
Triton interpreter is on, which is how CI tests the kernels), flashtile.cpu otherwise.
Autograd for `flashtile::fwd` is registered in autograd.py.

The library calls the ops through `call`: the op itself while torch.compile traces, its Python
implementation directly in eager mode. The custom-op dispatch measured ~0.3 ms of host time per call on
the H200 machine (torch 2.11), longer than a decode step or a 512-token forward on the GPU.
"""
import types
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from . import cpu
from .runtime import interpreter_active, triton_missing


_launchers = None


def _launch():
    """The launcher modules (forward: launch, backward: bwd_launch, kvcache: kvcache_launch), imported on first use
    (they import triton: only when a kernel may run); then from a global, since an import statement costs ~1 us of
    host time on every call."""
    global _launchers
    if _launchers is None:
        try:
            from . import bwd_launch, kvcache_launch, launch
        except ModuleNotFoundError as exc:
            if not triton_missing(exc):
                raise
            raise ModuleNotFoundError("flashtile's kernels (tensors on a GPU, or TRITON_INTERPRET=1) need triton, "
                                      "which is not installed: pip install triton (CPU tensors run without it)",
                                      name=exc.name) from exc

        _launchers = types.SimpleNamespace(forward=launch, backward=bwd_launch, kvcache=kvcache_launch)
    return _launchers


def _runs_triton(t):
    return not t.is_cpu or interpreter_active()


_IMPLS = {}  # custom op -> its Python implementation


def _custom_op(name, mutates_args=()):
    def register(fn):
        op = torch.library.custom_op(f"flashtile::{name}", fn, mutates_args=mutates_args, device_types=None)
        _IMPLS[op] = fn
        return op
    return register


def eager():
    """True outside any tracing: not under dynamo (torch.compile) and no dispatch mode active (AOT autograd's
    and make_fx's tracing of a registered backward run under one; torch.compiler.is_compiling does not see
    those in every torch version)."""
    return not torch.compiler.is_compiling() and _current_dispatch_mode() is None


def call(op, *args):
    """op(*args) under torch.compile; its implementation directly in eager mode (same results, no dispatch)."""
    if not eager():
        return op(*args)
    if forward_ad._current_level >= 0:  # inside forward_ad.dual_level (an int read: ~0.05 us)
        _refuse_tangents(args)
    return _IMPLS[op](*args)


def eager_call(op, *args):
    """op's implementation, for callers that have just checked eager() (each check costs ~0.5 us of host time)."""
    if forward_ad._current_level >= 0:
        _refuse_tangents(args)
    return _IMPLS[op](*args)


def refuse_func_transforms():
    """torch.func transforms (vmap, grad, jacrev, ...): the kernels read raw storage, which a batched or wrapped
    tensor does not have, and the autograd.Functions define no vmap rule; torch's own errors from deep inside
    (inplace arithmetic, BatchedTensorImpl storage, setup_context) did not say so. Eager callers only."""
    # forward_ad.dual_level holds a functorch level too: its dual tensors meet _refuse_tangents' message instead.
    if torch._C._functorch.maybe_current_level() is not None and forward_ad._current_level < 0:
        raise NotImplementedError("flashtile does not support torch.func transforms (vmap, grad, jacrev, jvp, ...): "
                                  "call it on plain tensors, e.g. loop over the batch instead of vmap, and use "
                                  "torch.autograd.grad / backward for gradients")


def _refuse_tangents(args):
    """Forward-mode AD: the kernels would drop a dual tensor's tangent (a silently zero jvp), so refuse it."""
    for a in args:
        if isinstance(a, Tensor) and forward_ad.unpack_dual(a).tangent is not None:
            raise NotImplementedError("flashtile has no forward-mode AD: an input is a dual tensor with a tangent "
                                      "(torch.autograd.forward_ad); use reverse mode (backward / torch.autograd.grad)")


@_custom_op("fwd")
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_left: int, window_right: int,
        softcap: float, alibi_slopes: Optional[Tensor], sink: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
        max_seqlen_k: int, attn_bias: Optional[Tensor], dropout_p: float = 0.0,
        rng: Optional[Tensor] = None, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    """out (q's shape), lse fp32: (B, Hq, Sq) dense, (Hq, total_q) varlen (cu_seqlens given, q (total_q, Hq, D)).

    window_left/right: -1 = unbounded (causal: right = 0). sink: fp32 (Hq,) attention-sink logits or None
    (its gradient: bwd's dsink). max_seqlen_* are plain ints, so sequence
    lengths never become part of a compiled graph's guards beyond these two numbers. attn_bias: 4-D,
    broadcastable to (B, Hq, max_q, max_k), added to the scores (varlen: positions within each sequence).
    dropout_p in [0, 1); when > 0, rng is the int64 (1,) Philox seed on q's device, drawn by the caller so
    the op itself is a pure function of its inputs and the backward regenerates the same mask.
    deterministic: not used here; saved for the backward (autograd.py), which then avoids atomics.
    """
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes, sink)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if _no_tokens(cu_seqlens_q, q, k):
        return _keyless_forward(q, sink)
    if _runs_triton(q):
        return _launch().forward._flash_attn_forward(q, k, v, *args, *varlen, attn_bias, dropout_p, rng)
    if cu_seqlens_q is not None:
        return cpu.varlen_forward(q, k, v, *args, *varlen, attn_bias, dropout_p, rng)
    return cpu.forward(q, k, v, *args, attn_bias, cpu.Dropout.of(dropout_p, rng, q, k))


def _no_tokens(cu_seqlens_q, q, k):
    """A packed varlen batch without queries or without keys (all padding): no kernel runs for it."""
    return cu_seqlens_q is not None and (q.shape[0] == 0 or k.shape[0] == 0)


def _keyless_forward(q, sink):
    """Every row sees no key: out 0, lse -inf, or the sink's logit where a sink joins the denominator (as the
    kernels give a row whose sequence has no keys). lse: varlen's (Hq, total_q)."""
    if sink is None:
        lse = q.new_full((q.shape[1], 1), float("-inf"), dtype=torch.float32)
    else:
        lse = sink.float()[:, None]
    return torch.zeros_like(q, memory_format=torch.contiguous_format), lse.expand(-1, q.shape[0]).contiguous()


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
              cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p=0.0, rng=None,
              deterministic=False):
    if cu_seqlens_q is not None:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@_custom_op("bwd")
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Optional[Tensor],
        softmax_scale: float, window_left: int, window_right: int, softcap: float,
        alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, attn_bias: Optional[Tensor],
        bias_grad: bool, dropout_p: float = 0.0,
        rng: Optional[Tensor] = None, deterministic: bool = False,
        sink: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (shapes and dtypes of q, k, v), dscores: fp32 (B, Hq, max_q, max_k) when bias_grad, else
    empty, and dsink: the fp32 (Hq,) gradient of the sink logits sink (the forward's, passed when that gradient
    is wanted), else empty. dropout_p and rng: the forward's. deterministic: no kernel that adds with atomics
    (the Gluon backward's dQ); the portable kernels are bitwise reproducible."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if _no_tokens(cu_seqlens_q, q, k):  # no score: only the sink's gradient can be nonzero (via dlse)
        shape = _scores_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k) if bias_grad else 0
        dscores = torch.zeros(shape, dtype=torch.float32, device=q.device)
        dsink = cpu.sink_grad(dout, out, lse, dlse, sink) if sink is not None else q.new_empty(0, dtype=torch.float32)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dscores, dsink
    if _runs_triton(q):
        return _launch().backward._flash_attn_backward(dout, q, k, v, out, lse, dlse, *args, *varlen, attn_bias,
                                                       bias_grad, dropout_p, rng, deterministic=deterministic,
                                                       sink=sink)
    if cu_seqlens_q is not None:
        grads = cpu.varlen_backward(dout, q, k, v, out, lse, dlse, *args, *varlen, attn_bias, bias_grad, dropout_p,
                                    rng)
    else:
        grads = cpu.backward(dout, q, k, v, out, lse, dlse, *args, attn_bias, bias_grad,
                             cpu.Dropout.of(dropout_p, rng, q, k))
    dsink = cpu.sink_grad(dout, out, lse, dlse, sink) if sink is not None else q.new_empty(0, dtype=torch.float32)
    return (*grads, dsink)


def _scores_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
    """(B, Hq, max_q, max_k): the layout of dscores and of the attention probabilities."""
    if cu_seqlens_q is not None:
        return cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k
    return q.shape[0], q.shape[2], q.shape[1], k.shape[1]


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
              cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, bias_grad, dropout_p=0.0, rng=None,
              deterministic=False, sink=None):
    dscores = (q.new_empty(_scores_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k), dtype=torch.float32)
               if bias_grad else q.new_empty(0, dtype=torch.float32))
    dsink = q.new_empty(sink.shape if sink is not None else (0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dscores, dsink


@_custom_op("attn_probs")
def attn_probs(q: Tensor, k: Tensor, lse: Tensor, softmax_scale: float, window_left: int, window_right: int,
               softcap: float, alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
               cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, attn_bias: Optional[Tensor],
               dropout_p: float, rng: Optional[Tensor]) -> Tensor:
    """The attention probabilities exp(s - lse), (B, Hq, max_q, max_k) in q's dtype, negated where dropout
    dropped them (sign bit set, -0.0 included); zero outside each sequence in varlen mode. No autograd."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if _no_tokens(cu_seqlens_q, q, k):
        return q.new_zeros(_scores_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k))
    if _runs_triton(q):
        return _launch().forward._flash_attn_probs(q, k, lse, *args, *varlen, attn_bias, dropout_p, rng)
    return cpu.attn_probs(q, k, lse, *args, *varlen, attn_bias, dropout_p, rng)


@attn_probs.register_fake
def _attn_probs_fake(q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes, cu_seqlens_q,
                     cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p, rng):
    return q.new_empty(_scores_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k))


@_custom_op("fwd_kvcache")
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqused_k: Optional[Tensor],
                block_table: Optional[Tensor], softmax_scale: float, window_left: int, window_right: int,
                softcap: float, alibi_slopes: Optional[Tensor], max_seqlen_k: int, num_splits: int,
                key_start: Optional[Tensor], seqused_add: int = 0) -> Tuple[Tensor, Tensor]:
    """Inference forward over a cache (no autograd): batch b sees its cache tokens key_start[b] <= t <
    seqused_add + seqused_k[b] (int32 (B,) each; seqused_k None = 0, so an int cache length needs no tensor;
    key_start None = 0), from k_cache[b] or, with block_table (B, max_pages), from the pages block_table[b]
    lists. max_seqlen_k: the largest key count; num_splits: key-range splits of the decode kernel,
    0 = heuristic (the CPU path ignores both)."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes)
    if _runs_triton(q):
        return _launch().kvcache._flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table, *args,
                                                             max_seqlen_k, num_splits, key_start, seqused_add)
    with torch.no_grad():  # no autograd, as the kernels (and flash-attn): no graph on the output
        return cpu.kvcache_forward(q, k_cache, v_cache, seqused_k, block_table, *args, key_start, seqused_add)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                      alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add=0):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@_custom_op("kvcache_append", mutates_args=("k_cache", "v_cache"))
def kvcache_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                   rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
                   block_table: Optional[Tensor], interleaved: bool, q_local: bool, cache_add: int = 0) -> Tensor:
    """Writes the new k (B, Sk_new, Hk, D) (rotated when rotary_cos is given) and v into k_cache/v_cache in place
    at positions p_b + i, p_b = cache_add + cache_seqlens[b] (int32 (B,), or None for 0: an int cache length
    needs no tensor), through block_table (int32 (B, max_pages)) for a paged cache; returns q (B, Sq, Hq, D)
    rotated at p_b (+ i when q_local) as a new tensor, or an empty tensor without rotary.
    rotary_cos/sin: (seqlen_ro, rotary_dim / 2). One kernel launch on the GPU."""
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved, q_local,
            cache_add)
    if _runs_triton(q):
        return _launch().kvcache._kvcache_append(*args)
    with torch.no_grad():  # a k / v that requires grad must not put a graph on the user's cache (the kernels' way)
        return cpu.kvcache_append(*args)


@kvcache_append.register_fake
def _kvcache_append_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                         q_local, cache_add=0):
    return q.new_empty(q.shape if rotary_cos is not None else (0,))


@_custom_op("fwd_varlen_paged")
def fwd_varlen_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, block_table: Tensor, softmax_scale: float,
                     window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                     sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Inference forward of packed varlen queries q (total_q, Hq, D) over a paged cache k/v_pages
    (num_pages, page_size, Hk, D): sequence b's cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys lie in the pages
    block_table[b] (int32 (B, max_pages)) lists. out like q, lse (Hq, total_q). No autograd."""
    args = (softmax_scale, window_left, window_right, softcap, alibi_slopes, sink)
    if q.shape[0] == 0:
        return _keyless_forward(q, sink)
    if _runs_triton(q):
        return _launch().kvcache._flash_attn_forward_varlen_paged(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k,
                                                                  max_seqlen_q, max_seqlen_k, block_table, *args)
    return cpu.varlen_paged_forward(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    block_table, *args)


@fwd_varlen_paged.register_fake
def _fwd_varlen_paged_fake(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                           softmax_scale, window_left, window_right, softcap, alibi_slopes, sink):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
