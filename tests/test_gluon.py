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
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (2, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (2, 777, 999, 8, 1, torch.bfloat16), (3, 1, 1, 2, 1, torch.bfloat16),
          (2, 1000, 1000, 4, 2, torch.float16)]


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
