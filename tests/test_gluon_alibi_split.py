"""A torch model of the Gluon forward's ALiBi key loop (kernels/gluon_fwd_consumer.py, gluon_fwd_common.py; kept in
step with the kernel by hand; the kernel itself needs an sm90 GPU): per 64-row warpgroup, the unmasked key blocks
wholly left of every row's diagonal, those a diagonal crosses and those wholly right of it (_consumer_partition's
bounds), the one-sided blocks' bias as a column vector with the row term added to the running max only
(_feature_scores / _alibi_row_shift's ALIBI_SIDE), in float32 as the kernel computes it. Out and lse must match the
float64 reference, and the split must cover every key block exactly once; a wrong side (a mutation) must fail."""
import math

import pytest
import torch

from flashtile.reference import attention_ref

WG_M, LOG2E = 64, 1.4426950408889634


def model_forward(q, k, v, slope, causal, block_n=128, flip_side=False, split=True):
    """q (Sq, D), k / v (Sk, D) fp32, one head; the kernel's tile / warpgroup / block structure (no window).
    split=False: every block on the |.| path (the kernel before the split). Returns out (Sq, D), lse (Sq,)
    natural log, and the blocks each warpgroup visited."""
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    qk_scale = q.shape[1] ** -0.5 * LOG2E
    alibi_log2 = torch.tensor(slope * LOG2E, dtype=torch.float32)
    off = seqlen_k - seqlen_q
    out = torch.zeros_like(q)
    lse = torch.zeros(seqlen_q)
    visits = []
    cols_f = torch.arange(block_n, dtype=torch.float32)
    alibi_cols = alibi_log2 * cols_f  # [BLOCK_N]
    for start_m in range(0, seqlen_q, 2 * WG_M):
        if causal:  # _attn_fwd_hopper's bounds (key_lo 0)
            n_blocks = -(-min(seqlen_k, start_m + 2 * WG_M + off) // block_n)
            n_full = min(start_m + off + 1, seqlen_k) // block_n
        else:
            n_blocks = -(-seqlen_k // block_n)
            n_full = seqlen_k // block_n
        for wg in range(2):
            row0 = start_m + wg * WG_M
            rows = torch.arange(row0, row0 + WG_M)
            m_i = torch.full((WG_M,), -math.inf)
            l_i = torch.zeros(WG_M)
            acc = torch.zeros(WG_M, q.shape[1])
            qw = torch.zeros(WG_M, q.shape[1])
            valid = rows < seqlen_q
            qw[valid] = q[rows[valid]]
            if causal:
                left_end = right_start = n_full
            else:
                diag_lo = row0 + off  # key_lo 0
                left_end = min(max(max(diag_lo + 1, 0) // block_n, 1), n_full)
                right_start = min(max(-(-max(diag_lo + WG_M - 1, 0) // block_n), left_end), n_full)
            classes = [(0, True)] + [(j, None) for j in range(1, left_end)] + [(j, False) for j in
                                                                                range(left_end, right_start)]
            classes += [(j, None) for j in range(right_start, n_full)] + [(j, True) for j in
                                                                          range(max(n_full, 1), n_blocks)]
            visits.append([j for j, _ in classes])
            for j, masked in classes:
                key0 = j * block_n
                keys = torch.arange(key0, key0 + block_n)
                kb = torch.zeros(block_n, q.shape[1])
                vb = torch.zeros(block_n, q.shape[1])
                inb = keys < seqlen_k
                kb[inb], vb[inb] = k[keys[inb]], v[keys[inb]]
                raw = qw @ kb.T  # [WG_M, BLOCK_N]
                if masked is None and split:  # one-sided block: ALIBI_SIDE
                    side = 1 if j < left_end else -1
                    if flip_side:
                        side = -side
                    s = raw * qk_scale + side * alibi_cols[None, :]
                    base = torch.tensor(float(key0 - row0 - off), dtype=torch.float32)
                    shift = (base - torch.arange(WG_M, dtype=torch.float32)) * (side * alibi_log2)
                    m_new = torch.maximum(m_i, s.max(dim=1).values + shift)
                    p = torch.exp2(s - (m_new - shift)[:, None])
                else:  # the |.| path, masked or not
                    s = raw * qk_scale
                    dist = ((rows + off).float()[:, None] - keys.float()[None, :]).abs()
                    s = s - alibi_log2 * dist
                    if masked:
                        visible = inb[None, :].expand(WG_M, block_n)
                        if causal:
                            visible = visible & (keys[None, :] <= (rows + off)[:, None])
                        s = torch.where(visible, s, -math.inf)
                    m_new = torch.maximum(m_i, s.max(dim=1).values)
                    p = torch.exp2(s - m_new[:, None])
                alpha = torch.exp2(m_i - m_new)
                l_i = l_i * alpha + p.sum(dim=1)
                acc = acc * alpha[:, None] + p @ vb
                m_i = m_new
            out[rows[valid]] = (acc / l_i[:, None])[valid]
            lse[rows[valid]] = ((m_i + torch.log2(l_i)) / LOG2E)[valid]
    return out, lse, visits


# (seqlen_q, seqlen_k, block_n): q == k, q < k, q > k (the first rows' diagonals left of key 0), tails
SHAPES = [(1000, 1000, 128), (300, 1000, 128), (1000, 300, 128), (130, 257, 64), (64, 900, 128), (513, 129, 128)]


def _ref(q, k, v, slope, causal):
    out, lse = attention_ref(q[None, :, None].double(), k[None, :, None].double(), v[None, :, None].double(),
                             causal=causal, return_lse=True, alibi_slopes=torch.tensor([slope], dtype=torch.float64))
    return out[0, :, 0], lse[0, 0]


@pytest.mark.parametrize("slope", [2.0 ** -8, 0.25, 4.0], ids=["slope-2^-8", "slope-0.25", "slope-4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"q{sq}-k{sk}-bn{bn}" for sq, sk, bn in SHAPES])
def test_split_matches_reference(shape, causal, slope):
    """The split's fp32 error against float64 is at most 2x the |.| path's (the kernel before) plus a floor."""
    seqlen_q, seqlen_k, block_n = shape
    if causal and seqlen_q > seqlen_k:
        pytest.skip("causal q > k: rows without keys (the host refuses Gluon)")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, 32, generator=gen) for s in (seqlen_q, seqlen_k, seqlen_k))
    out, lse, visits = model_forward(q, k, v, slope, causal, block_n)
    n_blocks = -(-seqlen_k // block_n)
    for seen in visits:  # each key block once, in order (causal: a prefix)
        assert seen == list(range(len(seen))) and (causal or len(seen) == n_blocks)
    out_abs, lse_abs, _ = model_forward(q, k, v, slope, causal, block_n, split=False)
    ref, lse_ref = _ref(q, k, v, slope, causal)
    for got, base, want in ((out, out_abs, ref), (lse, lse_abs, lse_ref)):
        assert torch.isfinite(got).all()
        err, err_abs = (got.double() - want).abs().max().item(), (base.double() - want).abs().max().item()
        assert err <= 2 * err_abs + 1e-5, (err, err_abs)


def test_wrong_side_fails():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, 32, generator=gen) for s in (1000, 1000, 1000))
    _, lse, _ = model_forward(q, k, v, 2.0 ** -6, False, flip_side=True)
    assert (lse.double() - _ref(q, k, v, 2.0 ** -6, False)[1]).abs().max() > 1e-2
