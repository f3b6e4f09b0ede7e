"""KV-cache append with fused rotary embedding: one launch before the attention kernel of a decoding step.

`_rotary_append` runs one program per (token, batch row, head). Programs with head < heads_q_rot rotate a
query head into a new tensor; the rest write one new key head (rotated) and its value head into the cache
at the row's position, contiguous or through a page table. Channel j of a rotated head is
x[j] * cos[f] -+ x[partner] * sin[f] in fp32 ("-" for the first of a pair), with (partner, f):
interleaved (GPT-J) pairs (2i, 2i + 1) share frequency i; GPT-NeoX pairs (i, i + rotary_dim / 2) too.
Channels from rotary_dim on are copied unchanged.
"""
import triton
import triton.language as tl


@triton.jit
def _rotate_head(src, dst, cos_row, sin_row, stride_cos_f, stride_sin_f, rotary_half, offs_d,
                 HEAD_DIM: tl.constexpr, ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Copy one head vector src -> dst (HEAD_DIM channels), rotating its first 2 * rotary_half channels."""
    mask_d = offs_d < HEAD_DIM
    x = tl.load(src + offs_d, mask=mask_d, other=0.0)  # [HEAD_DIM_PAD]
    if ROTARY:
        rot = offs_d < 2 * rotary_half
        if INTERLEAVED:
            first = (offs_d % 2) == 0
            partner = offs_d ^ 1
            freq = offs_d // 2
        else:
            first = offs_d < rotary_half
            partner = tl.where(first, offs_d + rotary_half, offs_d - rotary_half)
            freq = tl.where(first, offs_d, offs_d - rotary_half)
        x_pair = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
        c = tl.load(cos_row + freq * stride_cos_f, mask=rot, other=1.0).to(tl.float32)
        s = tl.load(sin_row + freq * stride_sin_f, mask=rot, other=0.0).to(tl.float32)
        # The same products and one rounding per sum as the PyTorch path (a - b == a + (-b) exactly).
        y = x.to(tl.float32) * c + tl.where(first, -x_pair, x_pair) * s
        # tl.where, not y for every channel: the pass-through channels stay bit-identical (-0.0 included).
        x = tl.where(rot, y.to(x.dtype), x)
    tl.store(dst + offs_d, x, mask=mask_d)


@triton.jit(do_not_specialize=["cache_add"])  # a decode step's cache length: one compile as the cache grows
def _rotary_append(Q, QOut, K, V, KCache, VCache, Cos, Sin, CacheSeqlens, BlockTable,
                   stride_qb, stride_qm, stride_qh,
                   stride_ob, stride_om, stride_oh,
                   stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh,
                   stride_kcb, stride_kcn, stride_kch,
                   stride_vcb, stride_vcn, stride_vch,
                   stride_cos_p, stride_cos_f, stride_sin_p, stride_sin_f, stride_bt_b, page_size,
                   seqlen_q, seqlen_new, heads_q_rot, rotary_half, cache_add,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, ROTARY: tl.constexpr,
                   INTERLEAVED: tl.constexpr, Q_LOCAL: tl.constexpr, PAGED: tl.constexpr,
                   HAS_CACHE_SEQLENS: tl.constexpr):
    """Grid (max token count, B, heads_q_rot + Hk). Q, QOut: (B, Sq, Hq, D); K, V: (B, Sk_new, Hk, D); new token i
    of row b lands at cache position cache_len + i, where cache_len = cache_add (+ CacheSeqlens[b] when
    HAS_CACHE_SEQLENS: an int cache length needs no device tensor): in KCache/VCache (B, capacity, Hk, D), or when
    PAGED in page BlockTable[b, pos // page_size] at slot pos % page_size of (num_pages, page_size, Hk, D).
    Positions into Cos/Sin (seqlen_ro, rotary_dim / 2): cache_len + i for keys and, with Q_LOCAL
    (causal or windowed), for queries; else cache_len for every query.
    """
    tok = tl.program_id(0)
    off_b = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    cache_len = cache_add
    if HAS_CACHE_SEQLENS:
        cache_len += tl.load(CacheSeqlens + off_b)
    if head < heads_q_rot:
        if tok < seqlen_q:
            pos = cache_len
            if Q_LOCAL:
                pos += tok
            h = head.to(tl.int64)
            src = Q + off_b * stride_qb + tok.to(tl.int64) * stride_qm + h * stride_qh
            dst = QOut + off_b * stride_ob + tok.to(tl.int64) * stride_om + h * stride_oh
            _rotate_head(src, dst, Cos + pos.to(tl.int64) * stride_cos_p, Sin + pos.to(tl.int64) * stride_sin_p,
                         stride_cos_f, stride_sin_f, rotary_half, offs_d, HEAD_DIM, ROTARY, INTERLEAVED)
    elif tok < seqlen_new:
        pos = cache_len + tok
        h = (head - heads_q_rot).to(tl.int64)
        if PAGED:
            page = tl.load(BlockTable + off_b * stride_bt_b + pos // page_size).to(tl.int64)
            slot = (pos % page_size).to(tl.int64)
        else:
            page = off_b
            slot = pos.to(tl.int64)
        k_src = K + off_b * stride_kb + tok.to(tl.int64) * stride_kn + h * stride_kh
        _rotate_head(k_src, KCache + page * stride_kcb + slot * stride_kcn + h * stride_kch,
                     Cos + pos.to(tl.int64) * stride_cos_p, Sin + pos.to(tl.int64) * stride_sin_p,
                     stride_cos_f, stride_sin_f, rotary_half, offs_d, HEAD_DIM, ROTARY, INTERLEAVED)
        v_src = V + off_b * stride_vb + tok.to(tl.int64) * stride_vn + h * stride_vh
        _rotate_head(v_src, VCache + page * stride_vcb + slot * stride_vcn + h * stride_vch, Cos, Sin,
                     stride_cos_f, stride_sin_f, 0, offs_d, HEAD_DIM, False, INTERLEAVED)
