"""The Hopper Gluon forward (gluon_launch.py): GPU tier on sm90 only; on CPU just the import guard."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch
from utils import assert_close_rule, make_qkv

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_unsupported_without_hopper():
    """Importing never fails; CPU tensors (and the interpreter) never take the Gluon path."""
    q = torch.randn(1, 8, 2, 64)
    assert not gluon_launch.gluon_supported(q, q, q)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype)
# Batches > 1 need seqlen_k % 128 == 0 (gluon_supported); the tails are covered with one sequence.
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (1, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (1, 777, 999, 8, 1, torch.bfloat16), (1, 1, 1, 2, 1, torch.bfloat16),
          (1, 1000, 1000, 4, 2, torch.float16), (3, 256, 512, 4, 2, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(shape, head_dim, causal):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda", requires_grad=False)
    assert gluon_launch.gluon_supported(q, k, v, causal=causal)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False), dtype)
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_refuses_rows_without_keys():
    q, k, v = make_qkv(1, 257, 130, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    assert not gluon_launch.gluon_supported(q, k, v, causal=True)
    assert gluon_launch.gluon_supported(q, k, v, causal=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_refuses_key_blocks_spanning_two_sequences():
    """A key block past one sequence's end would read the next one's values (masked, but 0 * inf = NaN)."""
    q, k, v = make_qkv(2, 1000, 1000, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    assert not gluon_launch.gluon_supported(q, k, v)
    assert gluon_launch.gluon_supported(q[:1], k[:1], v[:1])


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_func_takes_it_by_default(monkeypatch, causal):
    """flash_attn_func routes the plain forward to the Gluon kernel where configs.py wants it (D128 from 1K
    keys) unless FLASHTILE_GLUON=0, and the backward runs on its out / lse."""
    calls = []
    original = gluon_launch.gluon_forward
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q, k, v = make_qkv(2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=0)
