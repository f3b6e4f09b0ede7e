"""Plain PyTorch attention: the single reference for tests and benchmarks.

It materializes the (Sq, Sk) score matrix, so it is only for checking and for the
"standard attention" baseline, never for long sequences.
"""
import math

import torch


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, return_lse=False, window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, sink=None, attn_bias=None, dropout_p=0.0, dropout_mask=None,
                  score_mod=None, mask_mod=None):
    """Standard attention softmax(Q K^T * scale) V with the flash-attn layout and semantics.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hk, D) with Hq a multiple of Hk (query head h uses
    key/value head h // (Hq // Hk)). upcast=True computes in float64 (the reference);
    upcast=False computes in the inputs' dtype (the plain low-precision PyTorch computation).
    window_size, softcap, alibi_slopes, attn_bias and sink as in flash_attn_func (scores: softcap, ALiBi,
    bias, masks; the sink joins the softmax as one extra column without a value).
    dropout_mask: boolean, broadcastable to (B, Hq, Sq, Sk), True where kept (e.g. recovered from
    flash_attn_func's returned attention probabilities, ~signbit); the probabilities are then
    P * dropout_mask / (1 - dropout_p). lse stays that of the undropped softmax.
    score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) as flashtile.attention takes them,
    called on tensors (their PyTorch form: a flashtile Mod, or a vectorized function) over the whole
    (B, H, Sq, Sk) grid after the bias.
    Rows that see no key give output 0 and lse -inf.
    Returns out (B, Sq, Hq, D) in q's dtype (float64 when upcast), and lse (B, Hq, Sq) when return_lse.
    """
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    hq, hk = q.shape[2], k.shape[2]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=2)
        v = v.repeat_interleave(hq // hk, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # [B, H, Sq, Sk]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    rows = torch.arange(seqlen_q, device=q.device).unsqueeze(1) + (seqlen_k - seqlen_q)  # shifted to keys
    cols = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype).expand(q.shape[0], q.shape[2])[:, :, None, None]  # [B, H, 1, 1]
        scores = scores - slopes * (rows - cols).abs().to(dtype)
    if attn_bias is not None:
        scores = scores + attn_bias.to(dtype)
    grid = (torch.arange(q.shape[0], device=q.device).view(-1, 1, 1, 1),
            torch.arange(q.shape[2], device=q.device).view(1, -1, 1, 1),
            torch.arange(seqlen_q, device=q.device).view(1, 1, -1, 1),
            torch.arange(seqlen_k, device=q.device).view(1, 1, 1, -1))
    if score_mod is not None:
        scores = score_mod(scores, *grid).to(dtype)
    left, right = window_size
    if causal:
        right = 0
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if right >= 0:
        visible &= cols <= rows + right
    if left >= 0:
        visible &= cols >= rows - left
    if mask_mod is not None:
        visible = visible & torch.as_tensor(mask_mod(*grid), dtype=torch.bool, device=q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        sink_col = sink.to(dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)  # [B, H, Sq, 1]
        scores = torch.cat([scores, sink_col], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no visible key: 0, not NaN
    if sink is not None:
        probs = probs[..., :-1]
    if dropout_mask is not None:
        probs = probs * dropout_mask.to(dtype) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    if return_lse:
        lse = torch.logsumexp(scores if upcast else scores.float(), dim=-1)  # [B, H, Sq]
        return out, lse
    return out


def standard_attention(q, k, v, causal=False, softmax_scale=None, **features):
    """The FlashAttention paper's baseline: materialized softmax(Q K^T) V in the inputs' dtype.

    ``features``: window_size, softcap, alibi_slopes, passed to attention_ref.
    """
    return attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=False, **features)
