"""The public API, drop-in compatible with the flash-attn package: validate, normalize, call the ops."""
import math
import numbers

import torch

from . import autograd  # noqa: F401  (registers autograd for flashtile::fwd)
from . import ops

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _check_tensor(name, t, rank, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; expected torch.float16, torch.bfloat16 or torch.float32")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every dimension must be at least 1")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last (head) dimension, got strides {t.stride()}; "
                         f"call .contiguous() first")


def _check_qkv(q, k, v):
    """Validate q (B, Sq, Hq, D), k and v (B, Sk, Hk, D) against each other."""
    layout = "(batch, seqlen, heads, headdim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4, layout)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; q, k and v must be on one device")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k has batch size {k.shape[0]} but q has {q.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"k has head dim {k.shape[3]} but q has {q.shape[3]}; they must be equal")
    heads_q, heads_kv = q.shape[2], k.shape[2]
    if heads_q % heads_kv != 0:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number of "
                         f"key/value heads ({heads_kv}) for MQA/GQA")
    head_dim = q.shape[3]
    if head_dim % 8 != 0 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 between 8 and {MAX_HEAD_DIM}, got {head_dim}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q is on {q.device}; flashtile runs on CUDA GPUs and on the CPU")


def _softmax_scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _window(window_size, causal):
    """(left, right) with -1 for unbounded; causal forces right = 0, as flash-attn does."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    for name, side in (("left", left), ("right", right)):
        if isinstance(side, bool) or not isinstance(side, numbers.Integral) or side < -1:
            raise ValueError(f"window_size {name} must be an integer >= -1 (-1 = unbounded), got {side!r}")
    return int(left), 0 if causal else int(right)


def _softcap(softcap):
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be finite and >= 0 (0 = off), got {softcap}")
    return float(softcap)


def _alibi(alibi_slopes, q):
    """None, or fp32 slopes of shape (nheads,) or (batch, nheads) on q's device, contiguous."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes has dtype {alibi_slopes.dtype}; expected torch.float32")
    batch, heads = q.shape[0], q.shape[2]
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (nheads of q), "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
    return alibi_slopes.contiguous()


def _sink(sink, q):
    """None, or the (nheads,) sink logits as fp32 on q's device (autograd casts the gradient back)."""
    if sink is None:
        return None
    if not isinstance(sink, torch.Tensor):
        raise TypeError(f"sink must be a torch.Tensor or None, got {type(sink).__name__}")
    if sink.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"sink has dtype {sink.dtype}; expected torch.float16, torch.bfloat16 or torch.float32")
    if tuple(sink.shape) != (q.shape[2],):
        raise ValueError(f"sink must have shape ({q.shape[2]},) (nheads of q), got {tuple(sink.shape)}")
    if sink.device != q.device:
        raise ValueError(f"sink is on {sink.device} but q is on {q.device}")
    return sink.float().contiguous()


def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               deterministic, return_attn_probs, sink=None):
    _check_qkv(q, k, v)
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: dropout is not supported yet (only dropout_p=0.0)")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = _softmax_scale(softmax_scale, q.shape[-1])
    window_left, window_right = _window(window_size, causal)
    # deterministic needs nothing: the backward uses no atomics, so it is always deterministic.
    out, lse = ops.fwd(q, k, v, scale, window_left, window_right, _softcap(softcap), _alibi(alibi_slopes, q),
                       _sink(sink, q))
    if return_attn_probs:
        return out, lse, None
    return out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, sink=None):
    """Exact attention softmax(q k^T * softmax_scale) v without materializing the score matrix.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with nheads a
    multiple of nheads_k (MQA/GQA: query head h uses key/value head h // (nheads // nheads_k)).
    dtype float16, bfloat16 or float32; headdim a multiple of 8 up to 256; last-dim stride 1.
    causal: query i sees keys j <= i + seqlen_k - seqlen_q (bottom-right aligned); a query that sees
    no key gets output 0 and lse -inf. softmax_scale defaults to 1 / sqrt(headdim).
    Returns out (batch, seqlen_q, nheads, headdim) in q's dtype; with return_attn_probs=True returns
    (out, softmax_lse (batch, nheads, seqlen_q) float32, None). Differentiable in q, k, v (and lse).
    window_size=(left, right): query i sees keys i + Sk - Sq - left <= j <= i + Sk - Sq + right, -1 meaning
    unbounded on that side (causal=True sets right = 0). softcap > 0 replaces each score s by
    softcap * tanh(s / softcap). alibi_slopes (nheads,) or (batch, nheads) fp32 adds
    -slope * |i + Sk - Sq - j| to the scores. sink (nheads,): a learnable per-head logit that joins every
    row's softmax denominator without a value (attention sinks, as in gpt-oss); it receives a gradient,
    and softmax_lse includes it. dropout_p other than 0 raises NotImplementedError.
    """
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, sink)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                             sink=None):
    """flash_attn_func with kv packed as (batch, seqlen_k, 2, nheads_k, headdim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim), got {shape}")
    return _attention(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs, sink)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              sink=None):
    """flash_attn_func with q, k, v packed as (batch, seqlen, 3, nheads, headdim)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        shape = tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {shape}")
    return _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, deterministic, return_attn_probs, sink)
