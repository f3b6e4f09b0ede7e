"""Sliding windows, softcap and ALiBi, alone and combined with causal and GQA, forward and backward."""
import pytest
import torch

import flashtile
from test_attention import run_and_check
from utils import assert_close_rule, check_rows_from_4, make_qkv

WINDOWS = [(16, 0), (8, 8), (0, 0), (40, -1), (-1, 5), (3, 70)]
SEQLENS = [(97, 97), (50, 130), (130, 50)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS, ids=[f"q{a}-k{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{a}_{b}" for a, b in WINDOWS])
def test_window(backend, window, seqlen_q, seqlen_k):
    _, device = backend
    run_and_check(1, seqlen_q, seqlen_k, 2, 1, 32, False, torch.float16, device, window_size=window)


@pytest.mark.parametrize("window", [(16, 4), (-1, 3)], ids=["w16_4", "w-1_3"])
def test_window_with_causal(backend, window):
    """causal=True forces the right side to 0, as flash-attn does."""
    _, device = backend
    run_and_check(1, 90, 120, 2, 2, 32, True, torch.float16, device, window_size=window)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap", [0.5, 30.0], ids=["cap0.5", "cap30"])
def test_softcap(backend, softcap, causal):
    _, device = backend
    run_and_check(2, 70, 90, 4, 2, 64, causal, torch.float32, device, softmax_scale=0.5, softcap=softcap)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes-h", "slopes-bh"])
def test_alibi(backend, per_batch, causal):
    _, device = backend
    gen = torch.Generator().manual_seed(7)
    slopes = torch.rand((2, 4) if per_batch else (4,), generator=gen).to(device)
    run_and_check(2, 65, 80, 4, 2, 40, causal, torch.float16, device, alibi_slopes=slopes)


def test_everything_together(backend):
    _, device = backend
    slopes = torch.tensor([0.5, 0.25, 0.125], device=device)
    run_and_check(2, 77, 100, 3, 1, 48, True, torch.float32, device, window_size=(20, 10), softcap=5.0,
                  alibi_slopes=slopes)


def test_window_rows_without_keys(backend):
    """A window that leaves rows without keys gives 0 output, -inf lse and finite gradients."""
    _, device = backend
    q, k, v = make_qkv(1, 64, 16, 2, 2, 16, torch.float32, device)
    # With Sq - Sk = 48 and right = 0, rows i < 48 see nothing.
    out, lse, _ = flashtile.flash_attn_func(q, k, v, window_size=(4, 0), return_attn_probs=True)
    assert torch.all(out[:, :48] == 0) and torch.all(lse[:, :, :48] == float("-inf"))
    assert torch.isfinite(lse[:, :, 48:]).all()
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), (q, k, v)))


def test_window_skips_blocks(monkeypatch):
    """Work scales with the window: the CPU path visits only key blocks inside it."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    import flashtile.cpu as cpu_impl

    visited = []
    real = cpu_impl._Scores.__call__

    def spy(self, qb, kb, m0, m1, n0, n1):
        visited.append(n1 - n0)
        return real(self, qb, kb, m0, m1, n0, n1)

    monkeypatch.setattr(cpu_impl._Scores, "__call__", spy)
    q, k, v = make_qkv(1, 2048, 2048, 1, 1, 16, torch.float32, "cpu", requires_grad=False)
    flashtile.flash_attn_func(q, k, v, window_size=(100, 0))
    # 8 query blocks of 256 rows; a window of 100 keys reaches at most 2 key blocks each.
    assert sum(visited) <= 8 * 2 * cpu_impl.BLOCK_N


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sink(backend, causal):
    """Attention sinks: forward, lse and the gradients of q, k, v and the sink logits themselves."""
    _, device = backend
    dtype = torch.float32
    q, k, v = make_qkv(2, 45, 70, 4, 2, 32, dtype, device)
    sink = torch.tensor([0.5, -1.0, 2.0, 8.0], device=device, requires_grad=True)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, sink=sink, return_attn_probs=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sink)]
        ref, ref_lse = flashtile.attention_ref(*leaves[:3], causal=causal, upcast=upcast, sink=leaves[3],
                                               return_lse=True)
        results.append((ref.detach(), *torch.autograd.grad(ref, leaves, dout.to(ref.dtype)), ref_lse))
    ref64, ref_lowp = results
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv", "dsink"), (out, *grads), ref64, ref_lowp):
        assert_close_rule(name, got, r64, rlow, dtype)
    torch.testing.assert_close(lse.double(), ref64[-1], atol=1e-5, rtol=1e-5)


def test_sink_grad_with_lse_and_varlen(backend):
    """The sink gradient through lse as well as out (dlse folds into the preprocess's delta), over several row
    blocks of the preprocess, against the float64 reference; varlen (an empty sequence included) equals the sum
    of each sequence run alone."""
    _, device = backend
    q, k, v = make_qkv(2, 150, 90, 4, 2, 32, torch.float32, device)
    sink = torch.tensor([0.5, -1.0, 2.0, 3.0], device=device, requires_grad=True)
    gen = torch.Generator().manual_seed(3)
    dout = torch.randn(q.shape, generator=gen).to(device)
    dlse = torch.randn(2, 4, 150, generator=gen).to(device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, sink=sink, return_attn_probs=True)
    (dsink,) = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), (sink,))
    sink64 = sink.detach().double().requires_grad_()
    ref, ref_lse = flashtile.attention_ref(q.double(), k.double(), v.double(), causal=True, sink=sink64,
                                           return_lse=True)
    (want,) = torch.autograd.grad((ref * dout.double()).sum() + (ref_lse * dlse.double()).sum(), (sink64,))
    torch.testing.assert_close(dsink.double(), want, atol=1e-4, rtol=1e-4)

    lens_q, lens_k = [70, 0, 130], [50, 20, 90]
    cu_q = torch.tensor([0, 70, 70, 200], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 50, 70, 160], dtype=torch.int32, device=device)
    qp, kp, vp = (torch.randn(n, h, 32, generator=gen).to(device) for n, h in ((200, 4), (160, 2), (160, 2)))
    doutp = torch.randn(qp.shape, generator=gen).to(device)
    out, lse, _ = flashtile.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 130, 90, causal=True, sink=sink,
                                                   return_attn_probs=True)
    (dsink,) = torch.autograd.grad((out * doutp).sum() + lse.sum(), (sink,))
    want = torch.zeros_like(dsink)
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        rows, keys = slice(cu_q[b], cu_q[b] + sq), slice(cu_k[b], cu_k[b] + sk)
        o, lse_b, _ = flashtile.flash_attn_func(qp[None, rows], kp[None, keys], vp[None, keys], causal=True, sink=sink,
                                                return_attn_probs=True)
        want += torch.autograd.grad((o * doutp[None, rows]).sum() + lse_b.sum(), (sink,))[0]
    torch.testing.assert_close(dsink, want, atol=1e-4, rtol=1e-4)


def test_sink_on_rows_without_keys(backend):
    """A row that sees no key attends only to the sink: output 0, lse = sink, finite gradients."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 8, 2, 2, 16, torch.float32, device)
    sink = torch.tensor([1.5, -0.5], device=device, requires_grad=True)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, sink=sink, return_attn_probs=True)
    assert torch.all(out[:, :32] == 0)
    torch.testing.assert_close(lse[0, :, :32], sink.detach()[:, None].expand(2, 32))
    grads = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v, sink))
    assert all(torch.isfinite(g).all() for g in grads)


def test_minus_inf_sink_on_rows_without_keys(backend):
    """A sink of -inf turns a head's sink off: rows that see no key get out 0 and lse -inf as without a sink, and
    the sink gradients are finite (0 for the -inf head; exp(sink - lse) took NaN there)."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 8, 2, 2, 16, torch.float32, device)
    sink = torch.tensor([float("-inf"), 0.5], device=device, requires_grad=True)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, sink=sink, return_attn_probs=True)
    plain, plain_lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    torch.testing.assert_close(out[:, :, 0], plain[:, :, 0])
    torch.testing.assert_close(lse[:, 0], plain_lse[:, 0])
    assert torch.all(lse[0, 0, :32] == float("-inf"))
    for loss in (out.sum(), out.sum() + lse[:, 1].sum()):
        dsink = torch.autograd.grad(loss, sink, retain_graph=True)[0]
        assert dsink[0] == 0 and torch.isfinite(dsink[1])


BIAS_SHAPES = {"full": (2, 4, 45, 70), "per-head": (4, 45, 70), "batch-1": (1, 4, 45, 70), "rows-1": (2, 4, 1, 70),
               "shared": (45, 70)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
def test_attn_bias(backend, shape, causal):
    """Additive bias of any broadcastable shape: forward and the gradients of q, k, v and the bias."""
    _, device = backend
    dtype = torch.float32
    q, k, v = make_qkv(2, 45, 70, 4, 2, 32, dtype, device)
    bias = torch.randn(BIAS_SHAPES[shape], generator=torch.Generator().manual_seed(6)).to(device).requires_grad_()
    out = flashtile.flash_attn_func(q, k, v, causal=causal, attn_bias=bias, window_size=(30, -1))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, bias)]
        ref = flashtile.attention_ref(*leaves[:3], causal=causal, upcast=upcast, attn_bias=leaves[3],
                                      window_size=(30, -1))
        results.append((ref.detach(), *torch.autograd.grad(ref, leaves, dout.to(ref.dtype))))
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv", "dbias"), (out, *grads), *results):
        assert got.shape == r64.shape
        assert_close_rule(name, got, r64, rlow, dtype)


def test_minus_inf_bias_hides_whole_blocks(backend):
    """A bias of -inf (a mask given as a bias) on keys 0-95 of every row and on every key of rows 0-3: key blocks
    without masks hide whole rows too, whose running max stays -inf (the portable kernel took NaN there: exp2 of
    -inf - -inf). Rows 0-3 get 0 and lse -inf; the rest and every gradient match the reference."""
    _, device = backend
    q, k, v = make_qkv(1, 48, 128, 2, 1, 16, torch.float32, device)
    bias = torch.zeros(1, 2, 48, 128)
    bias[..., :96] = float("-inf")
    bias[..., :4, :] = float("-inf")
    bias = bias.to(device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, attn_bias=bias, return_attn_probs=True)
    assert torch.all(out[:, :4] == 0) and torch.all(lse[..., :4] == float("-inf"))
    assert torch.isfinite(lse[..., 4:]).all()
    check_rows_from_4(out, q, k, v, bias)


def test_attn_bias_without_grad_and_half(backend):
    _, device = backend
    q, k, v = make_qkv(1, 33, 40, 2, 2, 16, torch.float16, device)
    bias = torch.randn(1, 2, 33, 40, generator=torch.Generator().manual_seed(8)).to(device, torch.float16)
    run_and_check(1, 33, 40, 2, 2, 16, True, torch.float16, device, attn_bias=bias)


def test_scalar_attn_bias(backend):
    """A 0-d attn_bias broadcasts like a (1, 1, 1, 1) one (with a sink it shifts the scores against the sink's
    logit): the same outputs and gradients, the bias's gradient 0-d too."""
    _, device = backend
    q, k, v = make_qkv(1, 20, 30, 2, 1, 16, torch.float32, device)
    sink = torch.randn(2, generator=torch.Generator().manual_seed(3)).to(device)
    runs = []
    for shape in ((), (1, 1, 1, 1)):
        bias = torch.full(shape, 0.75, device=device, requires_grad=True)
        out = flashtile.flash_attn_func(q, k, v, causal=True, sink=sink, attn_bias=bias, deterministic=True)
        runs.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v, bias))))
    assert runs[0][-1].shape == ()
    for got, want in zip(*runs):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=0, atol=0)
    assert runs[0][-1].abs() > 0  # the sink makes the constant matter


def test_bad_attn_bias():
    q, k, v = make_qkv(2, 8, 12, 4, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"attn_bias of shape \(3, 8, 12\) does not broadcast to \(2, 4, 8, 12\)"):
        flashtile.flash_attn_func(q, k, v, attn_bias=torch.zeros(3, 8, 12))
    with pytest.raises(TypeError, match="attn_bias has dtype torch.int64"):
        flashtile.flash_attn_func(q, k, v, attn_bias=torch.zeros(8, 12, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_bias must have at most 4 dimensions"):
        flashtile.flash_attn_func(q, k, v, attn_bias=torch.zeros(1, 2, 4, 8, 12))
    with pytest.raises(ValueError, match="attn_bias is on meta but q is on cpu"):
        flashtile.flash_attn_func(q, k, v, attn_bias=torch.zeros(8, 12, device="meta"))
