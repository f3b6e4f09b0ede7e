"""The GPU tier: a bigger matrix with bf16 and long sequences. Run on a CUDA machine: pytest -m gpu."""
import pytest
import torch

import flashtile
from test_attention import HEAD_DIMS, run_and_check
from utils import assert_close_rule, make_qkv

pytestmark = pytest.mark.gpu

GPU_SEQLENS = [(1, 1), (1, 300), (17, 1), (113, 203), (255, 256), (256, 64), (1000, 1000), (1024, 4096)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", GPU_SEQLENS, ids=[f"q{a}-k{b}" for a, b in GPU_SEQLENS])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"d{d}" for d in HEAD_DIMS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_matrix(dtype, head_dim, seqlen_q, seqlen_k, causal):
    run_and_check(2, seqlen_q, seqlen_k, 4, 2, head_dim, causal, dtype, "cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads_q,heads_kv", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_heads_dtypes(dtype, heads_q, heads_kv, causal):
    run_and_check(2, 777, 999, heads_q, heads_kv, 128, causal, dtype, "cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [4096, 8192])
def test_long_sequences_and_memory(seqlen, causal):
    """bf16, B=4, H=16, D=128: matches the reference (checked on two heads) and extra memory stays O(N)."""
    batch, heads, head_dim, dtype = 4, 16, 128, torch.bfloat16
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, head_dim, dtype, "cuda")
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    extra_gb = (torch.cuda.max_memory_allocated() - base) / 2**30
    # out, dq, dk, dv are 4 x 128 MiB; lse and delta are tiny. Anything quadratic would be >= 8 GiB.
    assert extra_gb < 1.0, f"peak extra memory {extra_gb:.2f} GiB"

    for head in (0, heads - 1):
        sl = (slice(0, 1), slice(None), slice(head, head + 1))
        leaves = [x.detach()[sl].clone().requires_grad_() for x in (q, k, v)]
        results = []
        for upcast in (True, False):
            o = flashtile.attention_ref(*leaves, causal=causal, upcast=upcast)
            g = torch.autograd.grad(o, leaves, dout[sl].to(o.dtype))
            results.append((o.detach(), *g))
        for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), *results):
            assert_close_rule(f"{name}[head {head}]", got[sl], r64, rlow, dtype)


def test_deterministic_backward():
    """100 backward passes give bitwise identical dq, dk, dv and bias / sink gradients (no atomics anywhere)."""
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, 64, torch.bfloat16, "cuda")
    bias = torch.randn(8, 1000, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sink = torch.zeros(8, device="cuda", requires_grad=True)
    out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True, attn_bias=bias, sink=sink)
    dout = torch.randn_like(out)
    leaves = (q, k, v, bias, sink)
    first = torch.autograd.grad(out, leaves, dout, retain_graph=True)
    for _ in range(100):
        again = torch.autograd.grad(out, leaves, dout, retain_graph=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
