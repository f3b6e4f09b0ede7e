"""The GPU tier: a bigger matrix with bf16 and long sequences. Run on a CUDA machine: pytest -m gpu."""
import pytest
import torch

import flashtile
from flashtile import launch
from test_attention import HEAD_DIMS, run_and_check
from test_decode import check, make_cache
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
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256], ids=["d32", "d64", "d128", "d256"])
def test_fp32_fma_dots(monkeypatch, head_dim, causal):
    """fp32 with FMA dots ("ieee": their own tiles, configs._IEEE_*), what GPUs without TF32 and ROCm run; the H200
    runs tf32x3 dots (launch._dot_precision), so the rest of the tier no longer reaches these kernels."""
    used = []

    def fma_dots(dtype, arch):
        used.append(dtype)
        return "ieee" if dtype == torch.float32 else "tf32"

    monkeypatch.setattr(launch, "_dot_precision", fma_dots)
    run_and_check(2, 777, 999, 8, 2, head_dim, causal, torch.float32, "cuda")
    assert torch.float32 in used
    lengths = [1, 999, 4096]  # decode: one query token per row, the split-KV kernel
    q, k_cache, v_cache = make_cache("cuda", len(lengths), 1, 8, 2, 4096, head_dim=head_dim)
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, causal=causal, return_softmax_lse=True,
                                                 cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"))
    check(out, lse, q, k_cache, v_cache, lengths, causal=causal)


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


def test_deterministic_plain_backward():
    """deterministic=True on a shape the Gluon backward would serve (D128 bf16, plain): the portable kernels run
    instead (the Gluon dQ adds with atomics), so 100 backward passes are bitwise identical."""
    q, k, v = make_qkv(2, 1024, 1024, 4, 4, 128, torch.bfloat16, "cuda")
    out = flashtile.flash_attn_func(q, k, v, deterministic=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(100):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def _dropout_check(q, k, v, dtype, causal, p, **features):
    """out, dq, dk, dv against the float64 reference with the mask recovered from S_dmask's sign bits."""
    torch.manual_seed(0)
    out, _, s_dmask = flashtile.flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True,
                                                **features)
    keep = ~torch.signbit(s_dmask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = flashtile.attention_ref(*leaves, causal=causal, upcast=upcast, dropout_p=p, dropout_mask=keep, **features)
        results.append((o.detach(), *torch.autograd.grad(o, leaves, dout.to(o.dtype))))
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, *grads), *results):
        assert_close_rule(name, got, r64, rlow, dtype)
    return keep


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dropout_matrix(dtype, head_dim, causal):
    q, k, v = make_qkv(2, 777, 999, 8, 2, head_dim, dtype, "cuda")
    keep = _dropout_check(q, k, v, dtype, causal, 0.17, window_size=(300, -1))
    # The drop rate among visible entries (bottom-right aligned window, causal or not); entries outside
    # the window are returned as +0 and count as kept.
    rows = torch.arange(777, device="cuda")[:, None] + (999 - 777)
    cols = torch.arange(999, device="cuda")[None, :]
    visible = (cols >= rows - 300) & ((cols <= rows) if causal else True)
    dropped = 1 - keep[:, :, visible].double().mean().item()
    assert abs(dropped - 0.17) < 0.005


def test_dropout_mask_equals_cpu_philox():
    """The GPU kernels' mask is bit for bit the one flashtile.philox computes on the CPU from the same seed."""
    from flashtile import philox

    q, k, v = make_qkv(2, 300, 500, 4, 2, 64, torch.bfloat16, "cuda", requires_grad=False)
    torch.manual_seed(3)
    _, _, s_dmask = flashtile.flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)
    torch.manual_seed(3)
    seed = torch.randint(2**63 - 1, (1,), dtype=torch.int64, device="cuda").item()  # the draw flashtile makes
    B, H, Sq, Sk = s_dmask.shape
    keep = philox.dropout_keep_mask(seed, torch.arange(B * H).reshape(B, H, 1, 1), torch.arange(Sq)[:, None],
                                    torch.arange(Sk), Sq, Sk, 0.3)
    assert torch.equal(keep, ~torch.signbit(s_dmask.cpu()))


def test_dropout_varlen_and_determinism():
    """varlen with dropout and bias: 20 backward passes are bitwise identical, and reseeding reproduces all."""
    seqlens = torch.tensor([0, 1, 700, 333, 1024], dtype=torch.int32)
    cu = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0)).cuda()
    total, max_len = int(seqlens.sum()), int(seqlens.max())
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(total, 8, 128, generator=gen).cuda().bfloat16().requires_grad_() for _ in range(3))
    bias = torch.randn(8, max_len, max_len, generator=gen).cuda().bfloat16().requires_grad_()

    def forward():
        torch.manual_seed(1)
        return flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, dropout_p=0.1, causal=True,
                                                attn_bias=bias)

    def grads(out):
        return torch.autograd.grad(out, (q, k, v, bias), torch.ones_like(out), retain_graph=True)

    out = forward()
    first = grads(out)
    for _ in range(20):
        assert all(torch.equal(a, b) for a, b in zip(first, grads(out)))
    out2 = forward()
    assert torch.equal(out, out2) and all(torch.equal(a, b) for a, b in zip(first, grads(out2)))
