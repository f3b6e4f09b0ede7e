"""Blockwise PyTorch FlashAttention for CPU tensors: the same algorithm as the kernels.

Forward keeps a running max, denominator and fp32 accumulator per query block while streaming key
blocks; backward recomputes P block by block from lse. Extra memory is O(block_m * block_n) per
(batch, head), never (Sq, Sk). Computation runs in fp32 whatever the input dtype. Dropout masks come
from the kernels' own Philox counters (flashtile.philox), so both backends drop the same elements.
"""
import functools

import torch

from . import philox

BLOCK_M = 256
BLOCK_N = 256


def _no_autocast(fn):
    """fn with CPU autocast off: under torch.autocast("cpu") the matmuls here would run in bf16 and the fp32
    accumulation (and lse) would be silently wrong, unlike the kernels, which autocast does not touch."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return fn(*args, **kwargs)
    return run


def _split_heads(q, k, v):
    """q -> [B, Hk, G, Sq, D]; k, v -> [B, Hk, 1, Sk, D], all fp32 (G = Hq // Hk query heads per group)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    group = heads_q // heads_kv
    qg = q.float().reshape(batch, seqlen_q, heads_kv, group, head_dim).permute(0, 2, 3, 1, 4)
    kg = k.float().permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    return qg, kg, vg


def _grouped(shape, heads_kv, zeros=False):
    """(t, view): a new contiguous fp32 tensor t of (B, S, Hq, D) shape (zero-filled with zeros, else uninitialized) and
    its [B, Hk, G, S, D] view, to write through. The ops' outputs are contiguous tensors of their own, as the kernels'
    and the fake implementations' (torch.compile checks their strides), whatever q's layout."""
    batch, seqlen, heads_q, head_dim = shape
    t = torch.zeros(shape, dtype=torch.float32) if zeros else torch.empty(shape, dtype=torch.float32)
    return t, t.view(batch, seqlen, heads_kv, heads_q // heads_kv, head_dim).permute(0, 2, 3, 1, 4)


class Mods:
    """Programmable attention's mods for the CPU path (flashtile.flex Mods, called in their PyTorch form on
    tensors): score(s, b, h, q_idx, kv_idx), its derivative grad (same arguments), mask(b, h, q_idx, kv_idx)."""

    def __init__(self, score=None, grad=None, mask=None):
        self.score, self.grad, self.mask = score, grad, mask


def mask_values(result, name="mask_mod"):
    """A mask_mod's result (its PyTorch form's) as a bool tensor. Anything but booleans is refused, as the kernels
    refuse it (Triton's type error), rather than read as nonzero = visible here only."""
    result = torch.as_tensor(result)
    if result.dtype != torch.bool:
        raise TypeError(f"{name} must return booleans (a comparison such as q_idx >= kv_idx; `x != 0` of a number), "
                        f"got {result.dtype}")
    return result


class _Scores:
    """Scores of one (query block, key block) tile, in the kernels' fixed order: softcap, ALiBi, masks.

    window_left / window_right: -1 for unbounded (causal is right = 0). alibi_slopes: (Hq,) or (B, Hq).
    attn_bias: 4-D, broadcastable to (B, Hq, Sq, Sk). mods: Mods or None; then __call__ also returns g,
    the score_mod's derivative (the backward's chain rule), else None.
    """

    def __init__(self, q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias=None,
                 mods=None):
        self.seqlen_q, self.seqlen_k = q.shape[1], k.shape[1]
        self.diag = self.seqlen_k - self.seqlen_q
        self.scale = softmax_scale
        self.left, self.right = window_left, window_right
        self.softcap = softcap
        self.slopes = None
        if alibi_slopes is not None:
            batch, heads_kv = q.shape[0], k.shape[2]
            slopes = alibi_slopes.float().expand(batch, q.shape[2])
            self.slopes = slopes.reshape(batch, heads_kv, -1, 1, 1)  # [B, Hk, G, 1, 1]
        self.bias = None
        if attn_bias is not None:  # a view: broadcast dims keep stride 0
            full = attn_bias.expand(q.shape[0], q.shape[2], self.seqlen_q, self.seqlen_k)
            group = q.shape[2] // k.shape[2]
            self.bias = full.reshape(q.shape[0], k.shape[2], group, self.seqlen_q, self.seqlen_k)  # [B, Hk, G, Sq, Sk]
        self.mods = mods
        if mods is not None:  # batch and query-head indices in the [B, Hk, G, bm, bn] layout
            self.b = torch.arange(q.shape[0]).view(-1, 1, 1, 1, 1)
            self.h = torch.arange(q.shape[2]).view(1, k.shape[2], -1, 1, 1)

    def key_blocks(self, m0, m1):
        """Key blocks (n0, n1) that rows [m0, m1) may see: blocks outside the window are skipped (a mask_mod is
        evaluated on every block here: no block-sparse skipping on the CPU)."""
        lo = max(0, m0 + self.diag - self.left) // BLOCK_N * BLOCK_N if self.left >= 0 else 0
        hi = min(self.seqlen_k, m1 + self.diag + self.right) if self.right >= 0 else self.seqlen_k
        for n0 in range(lo, hi, BLOCK_N):
            yield n0, min(hi, n0 + BLOCK_N)

    def __call__(self, qb, kb, m0, m1, n0, n1):
        """(s, t): s [B, Hk, G, bm, bn] natural-log scores, -inf where masked; t = tanh(...) under softcap.
        s is a new tensor that aliases nothing, so callers may overwrite it (in-place steps: each pass over a
        [bm, bn] tile is a large part of this path's time)."""
        s = torch.matmul(qb, kb.transpose(-1, -2)).mul_(self.scale)
        t = None
        if self.softcap > 0:
            t = s.div_(self.softcap).tanh_()
            s = t * self.softcap
        rows = torch.arange(m0, m1).unsqueeze(1) + self.diag  # [bm, 1], shifted to the key axis
        cols = torch.arange(n0, n1).unsqueeze(0)  # [1, bn]
        if self.slopes is not None:
            s.sub_(self.slopes * (rows - cols).abs())
        if self.bias is not None:
            s.add_(self.bias[..., m0:m1, n0:n1])
        g = None
        mods = self.mods
        q_idx = torch.arange(m0, m1).unsqueeze(1)  # [bm, 1], unshifted positions for the mods
        if mods is not None and mods.score is not None:
            if mods.grad is not None:
                g = torch.as_tensor(mods.grad(s, self.b, self.h, q_idx, cols), dtype=s.dtype)
            # A new tensor, as promised, of the scores' shape: a mod may return a constant or ignore the score
            new = torch.as_tensor(mods.score(s, self.b, self.h, q_idx, cols), dtype=s.dtype)
            s = new.broadcast_to(s.shape).clone()
        visible = None
        if self.right >= 0:
            visible = cols <= rows + self.right
        if self.left >= 0:
            within = cols >= rows - self.left
            visible = within if visible is None else visible & within
        if mods is not None and mods.mask is not None:
            allowed = mask_values(mods.mask(self.b, self.h, q_idx, cols))
            visible = allowed if visible is None else visible & allowed
        if visible is not None and not visible.all():
            s.masked_fill_(~visible, float("-inf"))
        return (s, t) if mods is None else (s, t, g)


class Dropout:
    """Dropout's keep mask, tile by tile: element (b, h, i, j) of a (B, Hq, max_q, max_k) layout is kept when
    philox.dropout_bits(seed, b * Hq + h, i, j, max_q, max_k) >= philox.dropout_threshold(p), as
    kernels/common._dropout_keep (computed per tile with philox.dropout_bits_block).

    first_batch: the batch index of this call's first row (a varlen sequence runs as a batch of one).
    """

    def __init__(self, p, seed, first_batch, batch, heads_kv, heads_q, max_q, max_k):
        self.threshold = philox.dropout_threshold(p)
        self.scale = 1.0 / (1.0 - p)
        self.seed = seed
        self.max_q, self.max_k = max_q, max_k
        bh = torch.arange(first_batch, first_batch + batch)[:, None] * heads_q + torch.arange(heads_q)
        self.bh = bh.reshape(batch, heads_kv, -1, 1, 1)  # [B, Hk, G, 1, 1]

    @staticmethod
    def of(p, rng, q, k, first_batch=0, max_q=None, max_k=None):
        """None when p == 0; q (B, Sq, Hq, D), k (B, Sk, Hk, D); max_q / max_k default to Sq / Sk."""
        if p == 0:
            return None
        return Dropout(p, int(rng.item()), first_batch, q.shape[0], k.shape[2], q.shape[2],
                       q.shape[1] if max_q is None else max_q, k.shape[1] if max_k is None else max_k)

    def keep(self, m0, m1, n0, n1):
        """Boolean [B, Hk, G, m1 - m0, n1 - n0]."""
        rows = torch.arange(m0, m1)[:, None]
        return philox.dropout_bits_block(self.seed, self.bh, rows, n0, n1, self.max_q, self.max_k) >= self.threshold


@_no_autocast
def forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink, attn_bias=None,
            dropout=None, mods=None):
    """out (B, Sq, Hq, D) in q's dtype and lse (B, Hq, Sq) fp32, as the Triton forward.

    sink: (Hq,) logits that join each row's denominator without a value, or None. dropout: a Dropout or
    None; lse stays that of the undropped softmax. mods: Mods or None.
    """
    seqlen_q = q.shape[1]
    scores = _Scores(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias, mods)
    qg, kg, vg = _split_heads(q, k, v)
    out_t, out = _grouped(q.shape, k.shape[2])  # out: [B, Hk, G, Sq, D]
    lse_t = torch.empty(q.shape[0], q.shape[2], seqlen_q, dtype=torch.float32)
    lse = lse_t.view(qg.shape[:-1])  # [B, Hk, G, Sq]
    for m0 in range(0, seqlen_q, BLOCK_M):
        m1 = min(seqlen_q, m0 + BLOCK_M)
        qb = qg[..., m0:m1, :]
        if sink is None:
            m_i = torch.full(qb.shape[:-1], float("-inf"), dtype=torch.float32)
            l_i = torch.zeros(qb.shape[:-1], dtype=torch.float32)
        else:  # the online softmax starts from the sink: max = sink, denominator exp(0) = 1
            m_i = sink.float().reshape(1, k.shape[2], -1, 1).expand(qb.shape[:-1]).clone()
            l_i = torch.ones(qb.shape[:-1], dtype=torch.float32)
        acc = torch.zeros(qb.shape, dtype=torch.float32)
        for n0, n1 in scores.key_blocks(m0, m1):
            s = scores(qb, kg[..., n0:n1, :], m0, m1, n0, n1)[0]  # [B, Hk, G, bm, bn], ours to overwrite
            m_new = torch.maximum(m_i, s.amax(-1))
            m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
            p = s.sub_(m_sub.unsqueeze(-1)).exp_()
            alpha = torch.exp(m_i - m_sub)
            l_i = l_i.mul_(alpha).add_(p.sum(-1))
            if dropout is not None:
                p.masked_fill_(~dropout.keep(m0, m1, n0, n1), 0.0)
            acc = acc.mul_(alpha.unsqueeze(-1)).add_(p @ vg[..., n0:n1, :])
            m_i = m_new
        empty = l_i == 0
        out[..., m0:m1, :] = acc / torch.where(empty, 1.0, l_i).unsqueeze(-1)
        lse[..., m0:m1] = torch.where(empty, float("-inf"), m_i + torch.log(torch.where(empty, 1.0, l_i)))
    if dropout is not None:
        out_t.mul_(dropout.scale)
    return out_t.to(q.dtype), lse_t


def _group_sum(x):
    """[B, Hk, G, ...] summed over the query heads of a group: a view when G == 1 (no copy)."""
    return x.squeeze(2) if x.shape[2] == 1 else x.sum(2)


@_no_autocast
def backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
             attn_bias=None, bias_grad=False, dropout=None, mods=None):
    """dq, dk, dv (dtypes of q, k, v) and dscores (fp32 (B, Hq, Sq, Sk) when bias_grad, else empty);
    dlse (B, Hq, Sq) or None is the gradient flowing into lse; dropout: the forward's Dropout or None.
    mods: Mods or None."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    scores = _Scores(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias, mods)
    qg, kg, vg = _split_heads(q, k, v)
    dog = _split_heads(dout, k, v)[0]  # [B, Hk, G, Sq, D]
    group_shape = qg.shape[:-1]
    delta = (dout.float() * out.float()).sum(-1)  # [B, Sq, Hq]
    delta = delta.permute(0, 2, 1).reshape(group_shape)
    if dlse is not None:
        delta = delta - dlse.float().reshape(group_shape)  # d lse_i / d s_ij = P_ij
    lse = lse.reshape(group_shape)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)  # rows with no visible key: P = 0
    dq_t, dq = _grouped(q.shape, k.shape[2], zeros=True)
    dk = torch.zeros(kg.shape[0], kg.shape[1], seqlen_k, kg.shape[-1], dtype=torch.float32)  # [B, Hk, Sk, D]
    dv = torch.zeros_like(dk)
    dscores = torch.zeros(*qg.shape[:-1], seqlen_k, dtype=torch.float32) if bias_grad else (  # [B, Hk, G, Sq, Sk]
        torch.zeros(0, dtype=torch.float32))
    for m0 in range(0, seqlen_q, BLOCK_M):
        m1 = min(seqlen_q, m0 + BLOCK_M)
        qb, dob = qg[..., m0:m1, :], dog[..., m0:m1, :]
        lse_b, delta_b = lse[..., m0:m1].unsqueeze(-1), delta[..., m0:m1].unsqueeze(-1)
        for n0, n1 in scores.key_blocks(m0, m1):
            kb, vb = kg[..., n0:n1, :], vg[..., n0:n1, :]
            s, t, *g = scores(qb, kb, m0, m1, n0, n1)  # [B, Hk, G, bm, bn], rounded as in forward; ours
            p = s.sub_(lse_b).exp_()
            dp = dob @ vb.transpose(-1, -2)
            p_dropped = p
            if dropout is not None:  # dV sees the dropped, rescaled P; dP is masked and scaled alike
                keep = dropout.keep(m0, m1, n0, n1)
                p_dropped = p.masked_fill(~keep, 0.0).mul_(dropout.scale)
                dp.masked_fill_(~keep, 0.0).mul_(dropout.scale)
            dv[..., n0:n1, :] += _group_sum(p_dropped.transpose(-1, -2) @ dob)
            ds = dp.sub_(delta_b).mul_(p)
            if bias_grad:
                dscores[..., m0:m1, n0:n1] = ds
            if g and g[0] is not None:
                ds = torch.where(p > 0, ds * g[0], 0.0)  # the score_mod's derivative, never read where P = 0
            if t is not None:
                ds.mul_(1 - t * t)  # d softcap*tanh(x/softcap) / dx
            dq[..., m0:m1, :].add_(ds @ kb, alpha=softmax_scale)
            dk[..., n0:n1, :].add_(_group_sum(ds.transpose(-1, -2) @ qb), alpha=softmax_scale)
    dk = dk.transpose(1, 2).contiguous().to(k.dtype)
    dv = dv.transpose(1, 2).contiguous().to(v.dtype)
    if bias_grad:
        dscores = dscores.reshape(q.shape[0], q.shape[2], seqlen_q, seqlen_k)
    return dq_t.to(q.dtype), dk, dv, dscores


def _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias):
    """(b, query slice, key slice, that sequence's ALiBi slopes and bias) for each sequence of a varlen batch.

    attn_bias: 4-D, broadcastable to (B, Hq, max_q, max_k), indexed by positions within each sequence.
    """
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cu_q) - 1):
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        bias = None
        if attn_bias is not None:
            row = attn_bias[b:b + 1] if attn_bias.shape[0] > 1 else attn_bias
            bias = row[:, :, :cu_q[b + 1] - cu_q[b], :cu_k[b + 1] - cu_k[b]]
        yield b, slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1]), slopes, bias


def _sequence_dropout(dropout_p, rng, b, q, k, sq, max_seqlen_q, max_seqlen_k):
    """Sequence b's Dropout: its counters sit at batch b of the (B, Hq, max_q, max_k) layout."""
    return Dropout.of(dropout_p, rng, q[None, sq], k[None], b, max_seqlen_q, max_seqlen_k)


@_no_autocast
def varlen_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias=None, dropout_p=0.0, rng=None):
    """Packed q (total_q, Hq, D), k/v (total_k, Hk, D): each sequence alone; out like q, lse (Hq, total_q)."""
    out = torch.zeros(q.shape, dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
    for b, sq, sk, slopes, bias in _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias):
        if sq.stop == sq.start:
            continue
        dropout = _sequence_dropout(dropout_p, rng, b, q, k, sq, max_seqlen_q, max_seqlen_k)
        o, lse_seq = forward(q[None, sq], k[None, sk], v[None, sk], softmax_scale, window_left, window_right,
                             softcap, slopes, sink, bias, dropout)
        out[sq], lse[:, sq] = o[0], lse_seq[0]
    return out, lse


def sink_grad(dout, out, lse, dlse, sink):
    """d loss / d sink_h = -sum over batch and rows of P_sink * (delta - dlse), P_sink = exp(sink - lse).

    The sink carries no value, so dS of the real keys is unchanged; only this O(B * H * Sq) reduction is added
    (the GPU path takes its pieces from the backward's preprocess). Dense lse (B, Hq, Sq) and varlen (Hq, total).
    """
    delta = (dout.float() * out.float()).sum(-1).movedim(-1, -2)  # lse's layout
    if dlse is not None:
        delta = delta - dlse
    # A row that sees no key with a -inf sink has lse = -inf: its P_sink is 0, not exp(-inf - -inf) = NaN.
    p_sink = torch.exp(sink[:, None] - lse).masked_fill(lse == float("-inf"), 0.0)
    return -(p_sink * delta).sum(-1).reshape(-1, sink.shape[0]).sum(0)


@_no_autocast
def varlen_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias=None, bias_grad=False,
                    dropout_p=0.0, rng=None):
    """dq, dk, dv of the packed layout, each sequence alone, and dscores: fp32 (B, Hq, max_q, max_k) when
    bias_grad (zero outside each sequence), else empty."""
    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype) for t in (q, k, v))  # contiguous, as _grouped says
    batch = cu_seqlens_q.numel() - 1
    dscores = (torch.zeros(batch, q.shape[1], max_seqlen_q, max_seqlen_k, dtype=torch.float32) if bias_grad
               else torch.zeros(0, dtype=torch.float32))
    for b, sq, sk, slopes, bias in _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias):
        if sq.stop == sq.start or sk.stop == sk.start:
            continue
        dropout = _sequence_dropout(dropout_p, rng, b, q, k, sq, max_seqlen_q, max_seqlen_k)
        *grads, ds = backward(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], out[None, sq], lse[None, :, sq],
                              None if dlse is None else dlse[None, :, sq], softmax_scale, window_left, window_right,
                              softcap, slopes, bias, bias_grad, dropout)
        dq[sq], dk[sk], dv[sk] = (g[0] for g in grads)
        if bias_grad:
            dscores[b, :, :ds.shape[2], :ds.shape[3]] = ds[0]
    return dq, dk, dv, dscores


@_no_autocast
def attn_probs(q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes, cu_seqlens_q,
               cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p, rng):
    """The attention probabilities (B, Hq, max_q, max_k) in q's dtype, negated where dropout dropped them,
    as the Triton _attn_probs kernel. Materializes (Sq, Sk) per call: for tests at small sizes."""
    if cu_seqlens_q is None:
        return _dense_probs(q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias,
                            Dropout.of(dropout_p, rng, q, k))
    probs = torch.zeros(cu_seqlens_q.numel() - 1, q.shape[1], max_seqlen_q, max_seqlen_k, dtype=q.dtype)
    for b, sq, sk, slopes, bias in _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias):
        if sq.stop == sq.start or sk.stop == sk.start:
            continue
        dropout = _sequence_dropout(dropout_p, rng, b, q, k, sq, max_seqlen_q, max_seqlen_k)
        p = _dense_probs(q[None, sq], k[None, sk], lse[None, :, sq], softmax_scale, window_left, window_right, softcap,
                         slopes, bias, dropout)
        probs[b, :, :p.shape[2], :p.shape[3]] = p[0]
    return probs


def _dense_probs(q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias, dropout):
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    scores = _Scores(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, attn_bias)
    qg, kg, _ = _split_heads(q, k, k)
    s, _ = scores(qg, kg, 0, seqlen_q, 0, seqlen_k)  # [B, Hk, G, Sq, Sk]
    lse = lse.reshape(qg.shape[:-1]).unsqueeze(-1)
    p = torch.exp(s - torch.where(lse == float("-inf"), float("inf"), lse))
    if dropout is not None:
        p = torch.where(dropout.keep(0, seqlen_q, 0, seqlen_k), p, -p)
    return p.reshape(q.shape[0], q.shape[2], seqlen_q, seqlen_k).to(q.dtype)


@_no_autocast
def kvcache_forward(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                    alibi_slopes, key_start=None, seqused_add=0):
    """Batch row b attends to its cached keys key_start[b] <= t < seqused_add + seqused_k[b] (seqused_k None: 0;
    key_start None: from 0), gathered page by page when block_table is given; out like q, lse (B, Hq, Sq)."""
    out = torch.empty(q.shape, dtype=q.dtype)  # contiguous, as _grouped says
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    starts = key_start.tolist() if key_start is not None else [0] * q.shape[0]
    counts = seqused_k.tolist() if seqused_k is not None else [0] * q.shape[0]
    for b, used in enumerate(n + seqused_add for n in counts):
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        if block_table is not None:  # the pages row b's keys lie in, concatenated (entries past them: never read)
            pages = block_table[b, :-(-used // k_cache.shape[1])].long()
            keys = k_cache[pages].flatten(0, 1)[None, starts[b]:used]
            values = v_cache[pages].flatten(0, 1)[None, starts[b]:used]
        else:
            keys, values = k_cache[b:b + 1, starts[b]:used], v_cache[b:b + 1, starts[b]:used]
        out[b:b + 1], lse[b:b + 1] = forward(q[b:b + 1], keys, values, softmax_scale, window_left, window_right,
                                             softcap, slopes, None)
    return out, lse


def _gather_pages(pages, block_table, lengths):
    """Packed (sum(lengths), H, D) keys or values: sequence b's first lengths[b] tokens from the pages they lie in
    (block_table's entries past those are never read)."""
    page_size = pages.shape[1]
    return torch.cat([pages[block_table[b, :-(-n // page_size)].long()].flatten(0, 1)[:n]
                      for b, n in enumerate(lengths)])


@_no_autocast
def varlen_paged_forward(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                         softmax_scale, window_left, window_right, softcap, alibi_slopes, sink):
    """varlen_forward with each sequence's keys gathered from a paged cache (num_pages, page_size, Hk, D)."""
    lengths = cu_seqlens_k.diff().tolist()
    k, v = _gather_pages(k_pages, block_table, lengths), _gather_pages(v_pages, block_table, lengths)
    return varlen_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def apply_rotary(x, cos, sin, positions, interleaved):
    """Rotary embedding of x (B, S, H, D) at integer positions (B, S): the first 2 * cos.shape[1] channels
    rotate in pairs, (2i, 2i + 1) when interleaved (GPT-J) or (i, i + rotary_dim / 2) otherwise (GPT-NeoX);
    cos, sin: (seqlen_ro, rotary_dim / 2). Computed in fp32, returned in x's dtype."""
    half = cos.shape[1]
    c = cos[positions].unsqueeze(2).float()  # [B, S, 1, rotary_dim / 2]
    s = sin[positions].unsqueeze(2).float()
    xr = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rotated.to(x.dtype), x[..., 2 * half:]], dim=-1)


@_no_autocast
def kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                   q_local, cache_add=0):
    """What the rotary-append kernel does (see kvcache_launch.rotary_append_launches), in PyTorch ops: returns q rotated
    (a new tensor) or an empty tensor without rotary, and writes k (rotated) and v into the cache in place."""
    used = cache_add + (cache_seqlens.long()[:, None] if cache_seqlens is not None  # [B, 1]
                        else torch.zeros(q.shape[0], 1, dtype=torch.long, device=q.device))
    q_out = q.new_empty(0)
    if rotary_cos is not None:
        steps = torch.arange(q.shape[1], device=q.device) if q_local else torch.zeros(
            q.shape[1], dtype=torch.long, device=q.device)
        q_out = apply_rotary(q, rotary_cos, rotary_sin, used + steps, interleaved)
    if k is not None:
        positions = used + torch.arange(k.shape[1], device=k.device)  # [B, Sk_new]
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions)
        if rotary_cos is not None:
            k = apply_rotary(k, rotary_cos, rotary_sin, positions, interleaved)
        if block_table is not None:  # (row, position) -> (page, slot)
            page_size = k_cache.shape[1]
            rows, positions = block_table[rows, positions // page_size].long(), positions % page_size
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
    return q_out
