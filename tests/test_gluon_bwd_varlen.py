"""The Hopper Gluon backward over packed (varlen) sequences on sm90 (GPU tier): each sequence against the float64
reference, plain and with features, and with dropout against the portable backward."""
import pytest
import torch

import flashtile
from flashtile import bwd_launch, gluon_bwd_launch, launch
from gluon_bwd_utils import ON_HOPPER, _alibi
from utils import assert_close_rule, record_calls, references


# Packed sequences (seqlen_q, seqlen_k): an empty query side, one row, q < k and q > k, tails, a whole tile.
VARLEN_LENGTHS = [(300, 500), (0, 130), (1000, 1000), (1, 64), (777, 999), (257, 130)]
VARLEN_FEATURES = [("plain", {}), ("window-256-0", dict(window_size=(256, 0))), ("softcap-30", dict(softcap=30.0)),
                   ("alibi-bh", dict(alibi_slopes="bh"))]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim,feature", [(64, VARLEN_FEATURES[0]), (256, VARLEN_FEATURES[0])]
                         + [(128, f) for f in VARLEN_FEATURES], ids=lambda x: x[0] if isinstance(x, tuple) else x)
def test_varlen_matches_each_sequence(monkeypatch, head_dim, feature, causal):
    """FLASHTILE_GLUON_BWD=1 with flash_attn_varlen_func: the Gluon backward over packed sequences (GQA), each
    sequence's dq / dk / dv against the float64 reference of that sequence alone; NaN-poisoned buffers."""
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = []
    original = gluon_bwd_launch.gluon_backward
    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward",
                        lambda *a, **kw: calls.append(kw.get("cu_seqlens_q") is not None) or original(*a, **kw))
    dtype, heads_q, heads_kv = torch.bfloat16, 4, 2
    _, kw = feature
    lens_q, lens_k = [s for s, _ in VARLEN_LENGTHS], [s for _, s in VARLEN_LENGTHS]
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(sum(lens_q), heads_q, head_dim, generator=gen).to(dtype=dtype, device="cuda").requires_grad_()
    k = torch.randn(sum(lens_k), heads_kv, head_dim, generator=gen).to(dtype=dtype, device="cuda").requires_grad_()
    v = torch.randn(sum(lens_k), heads_kv, head_dim, generator=gen).to(dtype=dtype, device="cuda").requires_grad_()
    dout = torch.randn(q.shape, generator=gen).to(dtype=dtype, device="cuda")
    kw = dict(kw, alibi_slopes=_alibi(kw.get("alibi_slopes"), len(lens_q), heads_q))
    out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert calls == [True]
    for b, (sq, sk) in enumerate(VARLEN_LENGTHS):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b]) + sq), slice(int(cu_k[b]), int(cu_k[b]) + sk)
        if sq == 0:
            assert torch.all(dk[keys] == 0) and torch.all(dv[keys] == 0)
            continue
        slopes = kw["alibi_slopes"][b] if kw["alibi_slopes"] is not None else None
        ref64, reflow = references(q[None, rows].detach(), k[None, keys].detach(), v[None, keys].detach(),
                                   dout[None, rows], causal, **dict(kw, alibi_slopes=slopes))
        for name, got, r64, rlow in zip(("dq", "dk", "dv"), (dq[rows], dk[keys], dv[keys]), ref64[1:], reflow[1:]):
            assert_close_rule(f"{name} (sequence {b})", got[None], r64, rlow, dtype)


def _varlen_dropout_inputs(head_dim, seed):
    """VARLEN_LENGTHS' sequences as packed bf16 CUDA inputs (4 query heads, 2 KV heads), drawn in the order q, k, v,
    dout from a generator seeded with seed: (lens_q, lens_k, cu_q, cu_k, q, k, v, dout)."""
    lens_q, lens_k = [s for s, _ in VARLEN_LENGTHS], [s for _, s in VARLEN_LENGTHS]
    cu_q, cu_k = (torch.tensor([0] + lens).cumsum(0).to(device="cuda", dtype=torch.int32) for lens in (lens_q, lens_k))
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(sum(n), h, head_dim, generator=gen).to(dtype=torch.bfloat16, device="cuda")
               for n, h in ((lens_q, 4), (lens_k, 2), (lens_k, 2)))
    dout = torch.randn(q.shape, generator=gen).to(dtype=torch.bfloat16, device="cuda")
    return lens_q, lens_k, cu_q, cu_k, q, k, v, dout


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
def test_varlen_dropout_matches_portable(head_dim, causal):
    """The kernel's VARLEN with HAS_DROPOUT: each sequence's draws are those of its positions in the (B, Hq,
    max_seqlen_q, max_seqlen_k) layout, so the gradients equal the portable backward's from the same forward."""
    p = 0.2
    lens_q, lens_k, cu_q, cu_k, q, k, v, dout = _varlen_dropout_inputs(head_dim, 5)
    rng = torch.tensor([987654321], dtype=torch.int64, device="cuda")
    varlen = (cu_q, cu_k, max(lens_q), max(lens_k))
    scale, right = head_dim ** -0.5, 0 if causal else -1
    out, lse = launch._portable_forward(q, k, v, scale, -1, right, 0.0, None, None, *varlen, dropout_p=p, rng=rng)
    assert gluon_bwd_launch.gluon_bwd_supported(q, k, v, out, dout, causal, dropout_p=p, rng=rng,
                                                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                                                max_seqlen_k=max(lens_k))
    grads = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal, cu_seqlens_q=cu_q,
                                            cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                            dropout_p=p, rng=rng)
    portable = bwd_launch._portable_backward(dout, q, k, v, out, lse, None, scale, -1, right, 0.0, None, *varlen,
                                             dropout_p=p, rng=rng)[:3]
    for name, got, want in zip(("dq", "dk", "dv"), grads, portable):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=1e-2, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_dropout_call_takes_gluon(monkeypatch, causal):
    """flash_attn_varlen_func with dropout: the backward reaches the Gluon kernel (FLASHTILE_GLUON_BWD=1) and its
    gradients equal the portable backward's (FLASHTILE_GLUON_BWD=0) from the same seed, so the same mask."""
    p = 0.2
    lens_q, lens_k, cu_q, cu_k, q, k, v, dout = _varlen_dropout_inputs(128, 6)
    calls = record_calls(monkeypatch, gluon_bwd_launch, "gluon_backward")
    grads = {}
    for gluon in ("1", "0"):
        monkeypatch.setenv("FLASHTILE_GLUON_BWD", gluon)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(3)
        out = flashtile.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=p,
                                               causal=causal)
        grads[gluon] = torch.autograd.grad(out, leaves, dout)
        assert len(calls) == 1 and calls[0]["dropout_p"] == p  # the Gluon call only
        assert gluon_bwd_launch._disabled is None  # it ran: a failed launch would have fallen back to portable
    for name, got, want in zip(("dq", "dk", "dv"), grads["1"], grads["0"]):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=1e-2, msg=name)
