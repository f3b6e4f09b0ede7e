"""The public API, drop-in compatible with the flash-attn package: validate, normalize, call the ops."""
import torch

from . import autograd, checks, ops


def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               deterministic, return_attn_probs, sink=None, varlen=None, attn_bias=None, shared_cu_seqlens=False):
    """Shared by every entry point. varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) or None.
    shared_cu_seqlens: varlen's offsets and max are the qkvpacked call's one cu_seqlens and max_seqlen."""
    if (varlen is None and attn_bias is None and alibi_slopes is None and sink is None and return_attn_probs is False
            and type(causal) is bool and type(deterministic) is bool and type(dropout_p) is float and dropout_p == 0
            and type(softcap) is float and softcap == 0 and type(window_size) is tuple and window_size == (-1, -1)
            and checks.plain_qkv_ok(q, k, v)):
        # The plain call (host time): the checks below would accept it and normalize it to these arguments.
        scale = checks.softmax_scale_or_default(softmax_scale, q.shape[3])
        return autograd.forward(q, k, v, scale, -1, 0 if causal else -1, 0.0, None, None, None, None, 0, 0, None, 0.0,
                                None, deterministic)[0]
    if _head_dim_to_pad(q, k, v):
        return _with_padded_head_dim(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                     deterministic, return_attn_probs, sink, varlen, attn_bias, shared_cu_seqlens)
    checks.check_qkv(q, k, v, varlen=varlen is not None)
    heads = q.shape[-2]
    if varlen is not None:
        varlen = checks.check_cu_seqlens(*varlen, q, k, shared=shared_cu_seqlens)
        batch = varlen[0].numel() - 1
        attn_bias = checks.attn_bias(attn_bias, q, (batch, heads, varlen[2], varlen[3]), varlen=True)
    else:
        batch = q.shape[0]
        varlen = (None, None, 0, 0)
        attn_bias = checks.attn_bias(attn_bias, q, (batch, heads, q.shape[1], k.shape[1]))
    dropout_p = checks.dropout_p(dropout_p)
    checks.flag("causal", causal)
    scale = checks.softmax_scale_or_default(softmax_scale, q.shape[-1])
    window_left, window_right = checks.window(window_size, causal)
    softcap = checks.softcap_value(softcap)
    alibi_slopes = checks.alibi(alibi_slopes, q, batch, heads)
    # The Philox seed comes from torch's generator of q's device (torch.manual_seed reproduces a run) as a
    # device tensor: no host sync, and CUDA graphs and torch.compile see an ordinary random op.
    rng = torch.randint(2**63 - 1, (1,), dtype=torch.int64, device=q.device) if dropout_p > 0 else None
    # deterministic=True keeps the backward off the Hopper Gluon kernel, whose dQ is a sum of fp32 reduce-adds in
    # no fixed order; the portable kernels use none, so they are bitwise reproducible.
    checks.flag("deterministic", deterministic)
    checks.flag("return_attn_probs", return_attn_probs)
    out, lse = autograd.forward(q, k, v, scale, window_left, window_right, softcap, alibi_slopes,
                                checks.sink_logits(sink, q, heads), *varlen, attn_bias, dropout_p, rng, deterministic)
    if not return_attn_probs:
        return out
    # As flash-attn: the attention matrix only with dropout (S_dmask), else None.
    probs = None
    if dropout_p > 0:
        probs = ops.call(ops.attn_probs, q.detach(), k.detach(), lse.detach(), scale, window_left, window_right,
                         softcap, alibi_slopes, *varlen, None if attn_bias is None else attn_bias.detach(),
                         dropout_p, rng)
    return out, lse, probs


def _head_dim_to_pad(q, k, v):
    """True for q, k, v of one head dim below the largest that is not a multiple of 8 (the kernels' unit)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in (q, k, v)):
        return False
    d = q.shape[-1]
    return 0 < d < checks.MAX_HEAD_DIM and d % 8 != 0 and k.shape[-1] == d and v.shape[-1] == d


def _with_padded_head_dim(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          deterministic, return_attn_probs, sink, varlen, attn_bias, shared_cu_seqlens):
    """As flash-attn: q, k, v zero-padded to the next multiple of 8 (zero columns add nothing to q.k, and the
    output's extra columns are sliced off; the gradients flow back through the pad), softmax_scale from the
    unpadded head dim."""
    d = q.shape[-1]
    scale = checks.softmax_scale_or_default(softmax_scale, d)
    q, k, v = (torch.nn.functional.pad(t, (0, -d % 8)) for t in (q, k, v))
    result = _attention(q, k, v, dropout_p, scale, causal, window_size, softcap, alibi_slopes, deterministic,
                        return_attn_probs, sink, varlen, attn_bias, shared_cu_seqlens)
    if return_attn_probs:
        return result[0][..., :d], *result[1:]
    return result[..., :d]


def _paged_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                            causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, sink,
                            attn_bias=None):
    """flash_attn_varlen_func over a paged cache k, v (num_pages, page_size, Hk, D): forward only."""
    checks.check_tensor("q", q, 3, "(total_tokens, heads, headdim)", no_tokens_ok=True)
    # (q[None] as a batch of one; without tokens, one token stands in: check_qkv refuses empty tensors)
    checks.check_qkv(q[None] if q.shape[0] else q.new_empty(1, 1, *q.shape[1:]), k, v, same_batch=False,
                     kv_layout="(num_pages, page_size, heads, headdim) with block_table")
    block_table = checks.block_table(block_table, None, k.device)
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = checks.check_cu_seqlens(
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k, key_capacity=block_table.shape[1] * k.shape[1])
    batch = cu_seqlens_q.numel() - 1
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table must have {batch} rows (one per sequence of cu_seqlens), got "
                         f"{block_table.shape[0]}")
    if not torch.compiler.is_compiling() and not checks.capturing(cu_seqlens_k):  # (read back by check_cu_seqlens)
        offsets = checks.read_back(cu_seqlens_k)
        checks.block_table_pages(block_table, k.shape[0], k.shape[1], [b - a for a, b in zip(offsets, offsets[1:])])
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sink)):
        raise NotImplementedError("flash_attn_varlen_func with block_table (paged KV) is inference only: no "
                                  "backward; call it under torch.no_grad() or with tensors (q, k, v, sink) that do "
                                  "not require grad")
    if checks.dropout_p(dropout_p) != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: dropout is not supported with block_table (paged KV, "
                                  "inference only; use dropout_p=0.0)")
    if attn_bias is not None:
        raise NotImplementedError("attn_bias is not supported with block_table (paged KV)")
    checks.flag("causal", causal)
    checks.flag("return_attn_probs", return_attn_probs)
    heads = q.shape[1]
    window_left, window_right = checks.window(window_size, causal)
    out, lse = ops.call(ops.fwd_varlen_paged, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        block_table, checks.softmax_scale_or_default(softmax_scale, q.shape[-1]), window_left,
                        window_right, checks.softcap_value(softcap), checks.alibi(alibi_slopes, q, batch, heads),
                        checks.sink_logits(sink, q, heads))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, sink=None,
                    attn_bias=None):
    """Exact attention softmax(q k^T * softmax_scale) v without materializing the score matrix.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), with nheads a
    multiple of nheads_k (MQA/GQA: query head h uses key/value head h // (nheads // nheads_k)).
    dtype float16, bfloat16 or float32; headdim up to 256 (zero-padded to a multiple of 8 where it is not one, as
    flash-attn does); last-dim stride 1.
    causal: query i sees keys j <= i + seqlen_k - seqlen_q (bottom-right aligned); a query that sees
    no key gets output 0 and lse -inf. softmax_scale defaults to 1 / sqrt(headdim).
    Returns out (batch, seqlen_q, nheads, headdim) in q's dtype; with return_attn_probs=True returns
    (out, softmax_lse (batch, nheads, seqlen_q) float32, S_dmask). Differentiable in q, k, v (and lse).
    dropout_p in [0, 1): each attention probability is dropped with probability dropout_p (rounded to a
    multiple of 1/32768 in [1/32768, 32767/32768]: the draws are 15 bits) and the kept ones scaled by
    1 / (1 - dropout_p): out = (softmax(s) * keep / (1 - dropout_p)) v. The mask comes from
    a counter-based RNG (Philox) seeded by one draw from torch's generator of q's device, so
    torch.manual_seed reproduces a run; the backward regenerates it instead of storing it. softmax_lse is
    that of the undropped softmax. S_dmask, as flash-attn, is None unless dropout_p > 0; then it is the
    (batch, nheads, seqlen_q, seqlen_k) matrix of probabilities softmax(s) in q's dtype with the dropped
    ones negated (sign bit set, -0.0 included): keep = ~torch.signbit(S_dmask), P = S_dmask.abs(). It
    costs O(seqlen_q * seqlen_k) memory: for testing at small sizes. (flash-attn pads its S_dmask to
    multiples of 128 and stores unnormalized values; this one is exact and unpadded.)
    window_size=(left, right): query i sees keys i + Sk - Sq - left <= j <= i + Sk - Sq + right, -1 meaning
    unbounded on that side (causal=True sets right = 0). softcap > 0 replaces each score s by
    softcap * tanh(s / softcap). alibi_slopes (nheads,) or (batch, nheads) fp32 adds
    -slope * |i + Sk - Sq - j| to the scores. sink (nheads,): a learnable per-head logit that joins every
    row's softmax denominator without a value (attention sinks, as in gpt-oss); it receives a gradient,
    and softmax_lse includes it. attn_bias: fp16/bf16/fp32, broadcastable to (batch, nheads, seqlen_q,
    seqlen_k) (any dim may be 1), added to the scores after softcap and ALiBi; it gets a gradient when it
    requires one (computed as a full fp32 (batch, nheads, seqlen_q, seqlen_k) buffer, then summed over
    broadcast dims).
    """
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, sink, attn_bias=attn_bias)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                             sink=None, attn_bias=None):
    """flash_attn_func with kv packed as (batch, seqlen_k, 2, nheads_k, headdim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv must have shape (batch, seqlen_k, 2, nheads_k, headdim), got {shape}")
    return _attention(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs, sink, attn_bias=attn_bias)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              sink=None, attn_bias=None):
    """flash_attn_func with q, k, v packed as (batch, seqlen, 3, nheads, headdim)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        shape = tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {shape}")
    return _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, deterministic, return_attn_probs, sink, attn_bias=attn_bias)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, sink=None,
                           attn_bias=None):
    """flash_attn_func on variable-length sequences packed along the token axis.

    q: (total_q, nheads, headdim), k/v: (total_k, nheads_k, headdim); sequence b holds tokens
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] (int32, shape (batch + 1,)), likewise for keys; sequences of
    length 0 are allowed. max_seqlen_q/k: ints at least the longest sequence. Causal and windows are
    bottom-right aligned per sequence; alibi_slopes may be (batch, nheads). Without dropout the result
    equals running each sequence alone. softmax_lse, when returned, is (nheads, total_q).
    attn_bias and S_dmask use the padded per-sequence layout (batch, nheads, max_seqlen_q, max_seqlen_k):
    element (b, h, i, j) is query i and key j of sequence b (positions within the sequence). attn_bias may
    broadcast along any of those dims; S_dmask is zero past each sequence's lengths. The dropout mask of
    a sequence is the one a dense batch padded to (max_seqlen_q, max_seqlen_k) would draw.
    block_table (int32 (batch, max_pages)): k and v are a paged cache (num_pages, page_size, nheads_k,
    headdim) of any page size, sequence b's keys are its first cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens in
    the pages block_table[b] lists (token t in page block_table[b, t // page_size], slot t % page_size); entries
    past those pages are never read (a table padded there with -1 is fine, as in flash-attn).
    Inference only: with a block_table, q, k, v and sink must not require grad, and dropout and attn_bias are not
    supported.
    """
    if block_table is not None:
        checks.flag("deterministic", deterministic)  # checked as the other paths do (a forward has nothing to vary)
        return _paged_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                       softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                                       block_table, sink, attn_bias)
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, sink, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                      attn_bias)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, sink=None,
                                    attn_bias=None):
    """flash_attn_varlen_func with kv packed as (total_k, 2, nheads_k, headdim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or kv.shape[1] != 2:
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv must have shape (total_k, 2, nheads_k, headdim), got {shape}")
    return _attention(q, kv[:, 0], kv[:, 1], dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs, sink, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                      attn_bias)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, sink=None, attn_bias=None):
    """flash_attn_varlen_func with q, k, v packed as (total, 3, nheads, headdim) and shared cu_seqlens."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 4 or qkv.shape[1] != 3:
        shape = tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__
        raise ValueError(f"qkv must have shape (total, 3, nheads, headdim), got {shape}")
    return _attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs, sink,
                      (cu_seqlens, cu_seqlens, max_seqlen, max_seqlen), attn_bias, shared_cu_seqlens=True)
