"""Blockwise PyTorch FlashAttention for CPU tensors: the same algorithm as the kernels.

Forward keeps a running max, denominator and fp32 accumulator per query block while streaming key
blocks; backward recomputes P block by block from lse. Extra memory is O(block_m * block_n) per
(batch, head), never (Sq, Sk). Computation runs in fp32 whatever the input dtype.
"""
import torch

BLOCK_M = 256
BLOCK_N = 256


def _split_heads(q, k, v):
    """q -> [B, Hk, G, Sq, D]; k, v -> [B, Hk, 1, Sk, D], all fp32 (G = Hq // Hk query heads per group)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    group = heads_q // heads_kv
    qg = q.float().reshape(batch, seqlen_q, heads_kv, group, head_dim).permute(0, 2, 3, 1, 4)
    kg = k.float().permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    return qg, kg, vg


def _merge_heads(x):
    """[B, Hk, G, S, D] -> [B, S, Hk * G, D]."""
    batch, heads_kv, group, seqlen, head_dim = x.shape
    return x.permute(0, 3, 1, 2, 4).reshape(batch, seqlen, heads_kv * group, head_dim)


def _key_blocks(m0, m1, seqlen_q, seqlen_k, causal):
    """Key blocks (n0, n1, needs_mask) seen by query rows [m0, m1); causal skips blocks above the diagonal."""
    diag = seqlen_k - seqlen_q
    hi = min(seqlen_k, max(0, m1 + diag)) if causal else seqlen_k
    for n0 in range(0, hi, BLOCK_N):
        n1 = min(hi, n0 + BLOCK_N)
        yield n0, n1, causal and n1 - 1 > m0 + diag


def _causal_mask(m0, m1, n0, n1, seqlen_q, seqlen_k):
    rows = torch.arange(m0, m1).unsqueeze(1)
    cols = torch.arange(n0, n1).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)  # [bm, bn]


def forward(q, k, v, softmax_scale, causal):
    """out (B, Sq, Hq, D) in q's dtype and lse (B, Hq, Sq) fp32, as the Triton forward."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qg, kg, vg = _split_heads(q, k, v)
    out = torch.empty_like(qg)  # [B, Hk, G, Sq, D]
    lse = torch.empty(qg.shape[:-1], dtype=torch.float32)  # [B, Hk, G, Sq]
    for m0 in range(0, seqlen_q, BLOCK_M):
        m1 = min(seqlen_q, m0 + BLOCK_M)
        qb = qg[..., m0:m1, :] * softmax_scale
        m_i = torch.full(qb.shape[:-1], float("-inf"))
        l_i = torch.zeros(qb.shape[:-1])
        acc = torch.zeros(qb.shape)
        for n0, n1, needs_mask in _key_blocks(m0, m1, seqlen_q, seqlen_k, causal):
            s = qb @ kg[..., n0:n1, :].transpose(-1, -2)  # [B, Hk, G, bm, bn]
            if needs_mask:
                s = s.masked_fill(~_causal_mask(m0, m1, n0, n1, seqlen_q, seqlen_k), float("-inf"))
            m_new = torch.maximum(m_i, s.amax(-1))
            m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
            p = torch.exp(s - m_sub.unsqueeze(-1))
            alpha = torch.exp(m_i - m_sub)
            l_i = l_i * alpha + p.sum(-1)
            acc = acc * alpha.unsqueeze(-1) + p @ vg[..., n0:n1, :]
            m_i = m_new
        empty = l_i == 0
        out[..., m0:m1, :] = acc / torch.where(empty, 1.0, l_i).unsqueeze(-1)
        lse[..., m0:m1] = torch.where(empty, float("-inf"), m_i + torch.log(torch.where(empty, 1.0, l_i)))
    batch, heads_q = q.shape[0], q.shape[2]
    return _merge_heads(out).to(q.dtype), lse.reshape(batch, heads_q, seqlen_q)


def backward(dout, q, k, v, out, lse, dlse, softmax_scale, causal):
    """dq, dk, dv (dtypes of q, k, v); dlse (B, Hq, Sq) or None is the gradient flowing into lse."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qg, kg, vg = _split_heads(q, k, v)
    dog = _split_heads(dout, k, v)[0]  # [B, Hk, G, Sq, D]
    group_shape = qg.shape[:-1]
    delta = (dout.float() * out.float()).sum(-1)  # [B, Sq, Hq]
    delta = delta.permute(0, 2, 1).reshape(group_shape)
    if dlse is not None:
        delta = delta - dlse.float().reshape(group_shape)  # d lse_i / d s_ij = P_ij
    lse = lse.reshape(group_shape)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)  # rows with no visible key: P = 0
    dq = torch.zeros_like(qg)
    dk = torch.zeros(kg.shape[0], kg.shape[1], seqlen_k, kg.shape[-1])  # [B, Hk, Sk, D]
    dv = torch.zeros_like(dk)
    for m0 in range(0, seqlen_q, BLOCK_M):
        m1 = min(seqlen_q, m0 + BLOCK_M)
        qb, dob = qg[..., m0:m1, :], dog[..., m0:m1, :]
        lse_b, delta_b = lse[..., m0:m1].unsqueeze(-1), delta[..., m0:m1].unsqueeze(-1)
        for n0, n1, needs_mask in _key_blocks(m0, m1, seqlen_q, seqlen_k, causal):
            kb, vb = kg[..., n0:n1, :], vg[..., n0:n1, :]
            s = (qb * softmax_scale) @ kb.transpose(-1, -2)  # [B, Hk, G, bm, bn], rounded as in forward so P matches lse
            if needs_mask:
                s = s.masked_fill(~_causal_mask(m0, m1, n0, n1, seqlen_q, seqlen_k), float("-inf"))
            p = torch.exp(s - lse_b)
            dv[..., n0:n1, :] += (p.transpose(-1, -2) @ dob).sum(2)
            ds = p * (dob @ vb.transpose(-1, -2) - delta_b)
            dq[..., m0:m1, :] += (ds @ kb) * softmax_scale
            dk[..., n0:n1, :] += (ds.transpose(-1, -2) @ qb).sum(2) * softmax_scale
    dk = dk.transpose(1, 2).contiguous().to(k.dtype)
    dv = dv.transpose(1, 2).contiguous().to(v.dtype)
    return _merge_heads(dq).to(q.dtype), dk, dv
