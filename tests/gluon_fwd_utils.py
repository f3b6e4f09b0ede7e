"""Inputs and checks shared by the Hopper Gluon forward's test files (test_gluon_*.py): the sm90 gate, packed varlen
inputs, the feature cases' inputs and reference check, philox's keep mask, keys that move the row max."""
import torch

import flashtile
from flashtile import gluon_launch, philox
from utils import alibi_slopes, assert_close_rule, make_qkv


ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _cu(seqlens, device="cpu"):
    return torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _packed(seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda total, heads: torch.randn(total, heads, head_dim, generator=gen).to(device, dtype)  # noqa: E731
    return make(sum(seqlens_q), heads_q), make(sum(seqlens_k), heads_kv), make(sum(seqlens_k), heads_kv)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): tails, q != k, GQA, and a batch with block-aligned keys
FEATURE_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (1, 777, 999, 8, 2), (2, 512, 1024, 4, 1),
                  (2, 300, 1000, 4, 2)]  # the last: key blocks span sequences (ragged descriptors)


def sink_logits(heads):
    """Sink logits for the feature tests: N(0, 1) per head, but head 0's is -inf (its sink turned off), so a row that a
    window or a -inf bias hides from a whole key block keeps m = -inf there, as without a sink (the kernels' guard)."""
    sink = torch.randn(heads, device="cuda")
    sink[0] = float("-inf")
    return sink


def _feature_inputs(feature, shape, head_dim):
    """(causal, q, k, v, gluon_forward's feature keywords) of a FEATURES entry at a FEATURE_SHAPES shape, bf16 CUDA."""
    _, causal, window_size, softcap, alibi, sink = feature
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap, sink=sink_logits(heads_q) if sink else None,
                 alibi_slopes=alibi_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None)
    return causal, q, k, v, feats


def _check_gluon_forward(q, k, v, causal, feats):
    """The Gluon forward takes these features and its out / lse (natural log) match the float64 reference
    (DESIGN.md's rule; lse within 2e-3)."""
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, **feats)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, **feats)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False, **feats),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


def _dropout_keep(seed, batch, heads_q, seqlen_q, seqlen_k, p, device="cuda"):
    """(B, Hq, Sq, Sk) keep mask of philox's draws (the portable kernels' and the CPU path's)."""
    bh = torch.arange(batch * heads_q, device=device).view(batch, heads_q, 1, 1)
    rows = torch.arange(seqlen_q, device=device).view(1, 1, -1, 1)
    cols = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    return philox.dropout_keep_mask(seed, bh, rows, cols, seqlen_q, seqlen_k, p)


def _growing_keys(k):
    """k scaled up along the sequence (x 1 + position / 32): most rows' max moves in most key blocks."""
    return k * (1 + torch.arange(k.shape[1], device=k.device) / 32).to(k.dtype)[None, :, None, None]
