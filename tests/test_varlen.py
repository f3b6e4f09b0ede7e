"""Variable-length batches: packed tokens with cu_seqlens equal each sequence run alone."""
import pytest
import torch

import flashtile
from utils import assert_close_rule, count_read_backs, strided

SEQLENS_Q = [1, 17, 0, 64, 100, 33]
SEQLENS_K = [5, 1, 9, 64, 30, 0]


def cu(seqlens, device):
    return torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def packed(seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda total, heads: torch.randn(total, heads, head_dim, generator=gen).to(device, dtype)  # noqa: E731
    q = make(sum(seqlens_q), heads_q).requires_grad_()
    k, v = (make(sum(seqlens_k), heads_kv).requires_grad_() for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("features", [{}, dict(window_size=(8, 4)), dict(softcap=10.0, alibi=True)],
                         ids=["plain", "window", "softcap-alibi"])
def test_varlen_equals_each_sequence_alone(backend, causal, features):
    _, device = backend
    dtype = torch.float32
    features = dict(features)
    slopes = None
    if features.pop("alibi", False):
        slopes = torch.rand(len(SEQLENS_Q), 4, generator=torch.Generator().manual_seed(3)).to(device)
        features["alibi_slopes"] = slopes
    q, k, v = packed(SEQLENS_Q, SEQLENS_K, 4, 2, 32, dtype, device)
    cu_q, cu_k = cu(SEQLENS_Q, device), cu(SEQLENS_K, device)
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(SEQLENS_Q), max(SEQLENS_K),
                                                   causal=causal, return_attn_probs=True, **features)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    for b, (sq, sk) in enumerate(zip(SEQLENS_Q, SEQLENS_K)):
        if sq == 0:
            continue
        qs, ks = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
        if sk == 0:  # no key at all: output 0, lse -inf, no gradient
            assert torch.all(out[qs] == 0) and torch.all(lse[:, qs] == float("-inf"))
            assert torch.all(grads[0][qs] == 0)
            continue
        leaves = [x.detach()[s][None].clone().requires_grad_() for x, s in ((q, qs), (k, ks), (v, ks))]
        seq_features = dict(features, alibi_slopes=slopes[b]) if slopes is not None else features
        ref = flashtile.attention_ref(*leaves, causal=causal, **seq_features)
        ref_grads = torch.autograd.grad(ref, leaves, dout[qs][None].double())
        low = flashtile.attention_ref(*leaves, causal=causal, upcast=False, **seq_features)
        low_grads = torch.autograd.grad(low, leaves, dout[qs][None])
        got = (out[qs], grads[0][qs], grads[1][ks], grads[2][ks])
        for name, g, r, lo in zip(("out", "dq", "dk", "dv"), got, (ref, *ref_grads), (low, *low_grads)):
            assert_close_rule(f"sequence {b} {name}", g[None] if g.dim() == 3 else g, r, lo, dtype)


def test_varlen_matches_dense_batch(backend):
    """Equal-length sequences packed give exactly the dense batched result."""
    _, device = backend
    q, k, v = packed([40] * 3, [50] * 3, 2, 1, 16, torch.float16, device, seed=5)
    out = flashtile.flash_attn_varlen_func(q, k, v, cu([40] * 3, device), cu([50] * 3, device), 40, 50,
                                           causal=True)
    dense = flashtile.flash_attn_func(q.reshape(3, 40, 2, 16), k.reshape(3, 50, 1, 16), v.reshape(3, 50, 1, 16),
                                      causal=True)
    torch.testing.assert_close(out.reshape(3, 40, 2, 16), dense, rtol=0, atol=0)


def test_strided_cu_seqlens_give_the_contiguous_result(backend):
    """cu_seqlens (and a paged call's block table) given as views with a strided last dim: the kernels index them as
    ptr + b, so forward and backward must equal the contiguous call's bit for bit."""
    _, device = backend
    runs = []
    for view in (lambda t: t, strided):
        q, k, v = packed(SEQLENS_Q, SEQLENS_K, 2, 1, 16, torch.float32, device, seed=2)
        cu_q, cu_k = view(cu(SEQLENS_Q, device)), view(cu(SEQLENS_K, device))
        out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(SEQLENS_Q), max(SEQLENS_K), causal=True)
        out.backward(torch.ones_like(out))
        k_pages, table = paginate(k.detach(), SEQLENS_K, 16)
        v_pages, _ = paginate(v.detach(), SEQLENS_K, 16)
        paged = flashtile.flash_attn_varlen_func(q.detach(), k_pages, v_pages, cu_q, cu_k, max(SEQLENS_Q),
                                                 max(SEQLENS_K), causal=True, block_table=view(table))
        runs.append((out, q.grad, k.grad, v.grad, paged))
    for want, got in zip(*runs):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_varlen_packed_variants(backend):
    _, device = backend
    gen = torch.Generator().manual_seed(9)
    seqlens = [7, 20, 13]
    qkv = torch.randn(sum(seqlens), 3, 2, 16, generator=gen).to(device).requires_grad_()
    c = cu(seqlens, device)
    out = flashtile.flash_attn_varlen_qkvpacked_func(qkv, c, max(seqlens), causal=True)
    want = flashtile.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], c, c, max(seqlens), max(seqlens),
                                            causal=True)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape
    kv = qkv.detach()[:, 1:]
    out = flashtile.flash_attn_varlen_kvpacked_func(qkv.detach()[:, 0], kv, c, c, max(seqlens), max(seqlens))
    want = flashtile.flash_attn_varlen_func(qkv.detach()[:, 0], kv[:, 0], kv[:, 1], c, c, max(seqlens),
                                            max(seqlens))
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_unpad_pad_round_trip(backend):
    """unpad_input -> varlen attention -> pad_input equals masking padded keys/queries by hand."""
    _, device = backend
    gen = torch.Generator().manual_seed(4)
    batch, seqlen, heads, head_dim = 3, 24, 2, 16
    lengths = torch.tensor([24, 10, 1])
    mask = torch.arange(seqlen)[None, :] < lengths[:, None]
    x = torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(device)
    x_unpad, indices, cu_seqlens, max_len, seqlens = flashtile.unpad_input(x, mask.to(device))
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 24, 34, 35] and max_len == 24
    assert seqlens.tolist() == [24, 10, 1]
    padded_back = flashtile.pad_input(x_unpad, indices, batch, seqlen)
    torch.testing.assert_close(padded_back, x * mask[..., None, None].to(device))
    out = flashtile.flash_attn_varlen_func(x_unpad, x_unpad, x_unpad, cu_seqlens, cu_seqlens, max_len, max_len)
    padded = flashtile.pad_input(out, indices, batch, seqlen)
    for b, n in enumerate(lengths.tolist()):
        alone = flashtile.flash_attn_func(x[b:b + 1, :n], x[b:b + 1, :n], x[b:b + 1, :n])
        torch.testing.assert_close(padded[b:b + 1, :n], alone)
        assert torch.all(padded[b, n:] == 0)


@pytest.mark.parametrize("seqlens_q,seqlens_k", [([0, 0], [0, 0]), ([0, 0], [4, 3]), ([3, 2], [0, 0])],
                         ids=["nothing", "no-queries", "no-keys"])
def test_batches_without_tokens(backend, seqlens_q, seqlens_k):
    """A packed batch with no query or no key token at all (an all-padding chunk), as flash-attn: out 0, lse -inf (or
    the sink's logit), zero gradients; each row equals the same sequence's row in a batch where another sequence has
    tokens. The sink's gradient comes through lse alone (d lse / d sink = 1 where the sink is the whole softmax)."""
    _, device = backend
    q, k, v = packed(seqlens_q, seqlens_k, 4, 2, 16, torch.float32, device)
    sink = torch.randn(4, generator=torch.Generator().manual_seed(6)).to(device).requires_grad_()
    bias = torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(7)).to(device).requires_grad_()
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    out, lse, probs = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                       causal=True, sink=sink, attn_bias=bias, dropout_p=0.2,
                                                       return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    assert probs.shape == (2, 4, max(seqlens_q), max(seqlens_k)) and torch.all(probs == 0)
    assert torch.all(out == 0) and torch.equal(lse, sink.detach()[:, None].expand(lse.shape))
    (out.sum() + lse.sum()).backward()
    for name, t in (("q", q), ("k", k), ("v", v), ("attn_bias", bias)):
        assert t.grad.shape == t.shape and torch.all(t.grad == 0), name
    torch.testing.assert_close(sink.grad, torch.full_like(sink, q.shape[0]), rtol=0, atol=0)
    no_sink = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                               return_attn_probs=True)[1]
    assert torch.all(no_sink == float("-inf"))
    if q.shape[0]:  # the same rows where the second sequence has keys: the kernels' keyless rows
        k2, v2 = (x.detach()[:1].new_ones(5, 2, 16) for x in (q, q))
        out2, lse2, _ = flashtile.flash_attn_varlen_func(q.detach(), k2, v2, cu_q, cu([0, 5], device),
                                                         max(seqlens_q), 5, causal=True, sink=sink.detach(),
                                                         return_attn_probs=True)
        rows = slice(0, seqlens_q[0])
        torch.testing.assert_close(out2[rows], out.detach()[rows], rtol=0, atol=0)
        # (the kernels take the sink through log2 units and back: an ulp off the logit)
        torch.testing.assert_close(lse2[:, rows], lse.detach()[:, rows], rtol=1e-6, atol=0)


def test_all_padding_round_trip(backend):
    """unpad_input of an all-padding mask, attention, pad_input: zeros, and a zero gradient for the inputs."""
    _, device = backend
    x = torch.randn(2, 6, 2, 16, generator=torch.Generator().manual_seed(8)).to(device).requires_grad_()
    x_unpad, indices, cu_seqlens, max_len, _ = flashtile.unpad_input(x, torch.zeros(2, 6, dtype=torch.bool,
                                                                                    device=device))
    assert x_unpad.shape == (0, 2, 16) and cu_seqlens.tolist() == [0, 0, 0] and max_len == 0
    out = flashtile.flash_attn_varlen_func(x_unpad, x_unpad, x_unpad, cu_seqlens, cu_seqlens, max_len, max_len,
                                           causal=True)
    padded = flashtile.pad_input(out, indices, 2, 6)
    assert padded.shape == x.shape and torch.all(padded == 0)
    padded.sum().backward()
    assert torch.all(x.grad == 0)


def _args(device="cpu"):
    q, k, v = packed([3, 5], [4, 4], 2, 2, 16, torch.float32, device)
    return q.detach(), k.detach(), v.detach(), cu([3, 5], device), cu([4, 4], device)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long()), TypeError,
     "cu_seqlens_q has dtype torch.int64; expected torch.int32"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 6, 8], dtype=torch.int32)), ValueError,
     r"max_seqlen_q=5 is smaller than the longest sequence in cu_seqlens_q \(6\)"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0, 5, 3, 8], dtype=torch.int32)), ValueError,
     "cu_seqlens_q and cu_seqlens_k must have the same length"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0, 6, 5], dtype=torch.int32)), ValueError,
     r"cu_seqlens_k must be non-decreasing, got \[0, 6, 5\]"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0, 4, 7], dtype=torch.int32)), ValueError,
     r"cu_seqlens_k must end at the number of tokens \(8\), got 7"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([1, 4, 8], dtype=torch.int32)), ValueError,
     "cu_seqlens_q must start at 0, got 1"),
    (lambda a: a.update(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0, got -1"),
    (lambda a: a.update(q=a["q"][None]), ValueError, r"q must have 3 dimensions \(total_tokens, heads, headdim\)"),
], ids=["int64", "max-too-small", "lengths-differ", "decreasing", "wrong-total", "nonzero-start", "negative-max",
        "rank"])
def test_varlen_bad_input(mutate, exc, match):
    q, k, v, cu_q, cu_k = _args()
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=4)
    mutate(args)
    with pytest.raises(exc, match=match):
        flashtile.flash_attn_varlen_func(**args)


def test_cu_seqlens_read_back_once_per_version(monkeypatch):
    """The offsets are read to the host once per cu_seqlens tensor (the layers of a model share one); an
    in-place change through torch is seen (and checked) on the next call."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, cu_q, cu_k = _args()
    reads = count_read_backs(monkeypatch, "_VALUES")
    for _ in range(3):
        flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4)
    assert len(reads) == 2 and reads[0] is cu_q and reads[1] is cu_k
    cu_k[-1] -= 1
    with pytest.raises(ValueError, match=r"cu_seqlens_k must end at the number of tokens \(8\), got 7"):
        flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4)


def test_varlen_under_inference_mode(monkeypatch):
    """Offsets made under torch.inference_mode (no version counter) are read back on every call, so an untracked
    in-place change is still checked; the result equals the call outside inference mode."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, cu_q, cu_k = _args()
    want = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4)
    with torch.inference_mode():
        cu_q_inf, cu_k_inf = cu_q.clone(), cu_k.clone()
        got = flashtile.flash_attn_varlen_func(q, k, v, cu_q_inf, cu_k_inf, 5, 4)
        cu_k_inf[-1] -= 1
        with pytest.raises(ValueError, match=r"cu_seqlens_k must end at the number of tokens \(8\), got 7"):
            flashtile.flash_attn_varlen_func(q, k, v, cu_q_inf, cu_k_inf, 5, 4)
    assert torch.equal(got, want)


def test_varlen_under_torch_compile(monkeypatch):
    """The varlen path traces with fullgraph=True too (offset checks are skipped while tracing)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = packed([5, 9], [7, 3], 2, 1, 16, torch.float32, "cpu")
    cu_q, cu_k = cu([5, 9], "cpu"), cu([7, 3], "cpu")

    def layer(q, k, v):
        return flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 7, causal=True).square().sum()

    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(q, k, v)
    want = layer(q, k, v)
    torch.testing.assert_close(got, want)
    for g, w in zip(torch.autograd.grad(got, (q, k, v)), torch.autograd.grad(want, (q, k, v))):
        torch.testing.assert_close(g, w)


VARLEN_BIAS_SHAPES = {"full": (6, 4, 100, 64), "per-head": (4, 100, 64), "shared-rows": (6, 1, 1, 64),
                      "padded-max": (6, 4, 110, 70)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(VARLEN_BIAS_SHAPES), ids=list(VARLEN_BIAS_SHAPES))
def test_varlen_attn_bias(backend, shape, causal):
    """attn_bias with varlen: broadcastable to (batch, nheads, max_seqlen_q, max_seqlen_k), element
    (b, h, i, j) biasing query i and key j of sequence b; equals each sequence run with its slice."""
    _, device = backend
    dtype = torch.float32
    max_q, max_k = VARLEN_BIAS_SHAPES[shape][-2:] if shape == "padded-max" else (max(SEQLENS_Q), max(SEQLENS_K))
    q, k, v = packed(SEQLENS_Q, SEQLENS_K, 4, 2, 32, dtype, device)
    cu_q, cu_k = cu(SEQLENS_Q, device), cu(SEQLENS_K, device)
    bias = torch.randn(VARLEN_BIAS_SHAPES[shape], generator=torch.Generator().manual_seed(6)).to(device)
    bias.requires_grad_()
    out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, attn_bias=bias,
                                           window_size=(30, -1))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)

    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, bias)]
        bias4 = leaves[3].reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        outs = []
        for b, (lq, lk) in enumerate(zip(SEQLENS_Q, SEQLENS_K)):
            qs, ks = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
            seq_bias = bias4[b:b + 1] if bias4.shape[0] > 1 else bias4
            if lk == 0:  # no key: output 0
                outs.append(torch.zeros(lq, 4, 32, dtype=torch.float64 if upcast else dtype, device=device))
                continue
            outs.append(flashtile.attention_ref(leaves[0][qs][None], leaves[1][ks][None], leaves[2][ks][None],
                                                causal=causal, upcast=upcast, window_size=(30, -1),
                                                attn_bias=seq_bias[:, :, :lq, :lk])[0])
        ref = torch.cat(outs)
        # allow_unused: with the biggest sequences shorter than max, some bias entries get no gradient.
        ref_grads = torch.autograd.grad(ref, leaves, dout.to(ref.dtype), allow_unused=True)
        results.append((ref.detach(), *(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, ref_grads))))
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv", "dbias"), (out, *grads), *results):
        assert got.shape == r64.shape
        assert_close_rule(name, got, r64, rlow, dtype)


def test_varlen_bad_attn_bias():
    q, k, v, cu_q, cu_k = _args()
    with pytest.raises(ValueError, match=r"attn_bias of shape \(2, 2, 4, 4\) does not broadcast to \(2, 2, 5, 4\) "
                                         r"\(batch, nheads, max_seqlen_q, max_seqlen_k\)"):
        flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4, attn_bias=torch.zeros(2, 2, 4, 4))


def paginate(k, seqlens_k, page_size, seed=0):
    """Packed keys (total_k, H, D) as a paged cache: sequence b's tokens in shuffled pages, and the block table."""
    pages_per_seq = max(-(-n // page_size) for n in seqlens_k) + 1  # one spare page: tables may over-allocate
    num_pages = len(seqlens_k) * pages_per_seq
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(k.device)
    table = order.reshape(len(seqlens_k), pages_per_seq).to(torch.int32)
    pages = torch.randn(num_pages, page_size, *k.shape[1:], generator=torch.Generator().manual_seed(seed + 1))
    pages = pages.to(k.device, k.dtype)  # garbage past each sequence's end must not leak in
    start = 0
    for b, n in enumerate(seqlens_k):
        slots = torch.arange(n, device=k.device)
        pages[table[b, slots // page_size].long(), slots % page_size] = k[start:start + n]
        start += n
    return pages, table


@pytest.mark.parametrize("page_size", [1, 16, 7, 64])  # 64: whole key tiles per page (one lookup per tile)
@pytest.mark.parametrize("features", [dict(causal=True), dict(window_size=(8, 4), softcap=10.0),
                                      dict(alibi=True, sink=True)], ids=["causal", "window-softcap", "alibi-sink"])
def test_varlen_paged_equals_packed(backend, page_size, features):
    """block_table: the same result as the packed keys (inference only)."""
    _, device = backend
    features = dict(features)
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(len(SEQLENS_Q), 4, generator=torch.Generator().manual_seed(3)).to(device)
    if features.pop("sink", False):
        features["sink"] = torch.randn(4, generator=torch.Generator().manual_seed(5)).to(device)
    q, k, v = (x.detach() for x in packed(SEQLENS_Q, SEQLENS_K, 4, 2, 32, torch.float32, device))
    cu_q, cu_k = cu(SEQLENS_Q, device), cu(SEQLENS_K, device)
    k_pages, table = paginate(k, SEQLENS_K, page_size)
    v_pages, _ = paginate(v, SEQLENS_K, page_size)
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(SEQLENS_Q), max(SEQLENS_K),
                                                   block_table=table, return_attn_probs=True, **features)
    want, want_lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(SEQLENS_Q), max(SEQLENS_K),
                                                         return_attn_probs=True, **features)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_varlen_paged_without_queries(backend):
    """A paged call whose batch has no query token: empty outputs, nothing launched."""
    _, device = backend
    q = torch.randn(0, 4, 32, device=device)
    k_pages, table = paginate(torch.randn(9, 2, 32, device=device), [4, 5], 16)
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k_pages, k_pages, cu([0, 0], device), cu([4, 5], device), 0, 5,
                                                   block_table=table, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, 0)


def test_varlen_paged_table_padded_past_the_pages_in_use(backend):
    """As flash-attn, entries of block_table past the pages a sequence's keys lie in are never read: padded there with
    -1 (or any value), the result is the unpadded table's; an entry out of range in a page in use is refused."""
    _, device = backend
    page_size = 7
    q, k, v = (x.detach() for x in packed(SEQLENS_Q, SEQLENS_K, 4, 2, 32, torch.float32, device))
    cu_q, cu_k = cu(SEQLENS_Q, device), cu(SEQLENS_K, device)
    (k_pages, table), (v_pages, _) = paginate(k, SEQLENS_K, page_size), paginate(v, SEQLENS_K, page_size)
    padded = table.clone()
    for row, n in enumerate(SEQLENS_K):
        padded[row, -(-n // page_size):] = (-1, -(2 ** 31), 10 ** 6)[row % 3]
    args = (cu_q, cu_k, max(SEQLENS_Q), max(SEQLENS_K))
    want = flashtile.flash_attn_varlen_func(q, k_pages, v_pages, *args, block_table=table, causal=True)
    got = flashtile.flash_attn_varlen_func(q, k_pages, v_pages, *args, block_table=padded, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    row = max(range(len(SEQLENS_K)), key=SEQLENS_K.__getitem__)
    padded[row, 0] = -1
    with pytest.raises(ValueError, match=r"block_table entries must index the cache's \d+ pages, got values in \[-1,"):
        flashtile.flash_attn_varlen_func(q, k_pages, v_pages, *args, block_table=padded, causal=True)


def test_varlen_paged_bad_input():
    q, k, v, cu_q, cu_k = _args()
    pages = torch.zeros(4, 4, 2, 16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="block_table .paged KV. is inference only"):
        flashtile.flash_attn_varlen_func(q.requires_grad_(), pages, pages, cu_q, cu_k, 5, 4, block_table=table)
    q = q.detach()
    with pytest.raises(ValueError, match=r"cu_seqlens_k has a sequence of 9 keys but block_table holds 8"):
        flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, torch.tensor([0, 0, 9], dtype=torch.int32), 5, 9,
                                         block_table=table)
    with pytest.raises(ValueError, match=r"block_table must have 2 rows \(one per sequence of cu_seqlens\), got 1"):
        flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 5, 4, block_table=table[:1])
    with pytest.raises(ValueError, match=r"block_table entries must index the cache's 4 pages"):  # row 1's page 4
        flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 5, 4, block_table=table + 2)
    with pytest.raises(ValueError, match=r"k must have 4 dimensions \(num_pages, page_size, heads, headdim\) with "
                                         r"block_table, got shape \(8, 2, 16\)"):
        flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4, block_table=table)
    with pytest.raises(NotImplementedError, match=r"dropout_p=0.1: dropout is not supported with block_table"):
        flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 5, 4, dropout_p=0.1, block_table=table)
    with pytest.raises(NotImplementedError, match=r"attn_bias is not supported with block_table"):
        flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 5, 4, block_table=table,
                                         attn_bias=torch.zeros(1, 1, 5, 4))


def test_backward_row_buffers_are_aligned_and_disjoint():
    """The varlen backward's Delta / Lse2 rows (launch.Geometry.row_buffer_shape, kernels/common._row_base):
    each sequence starts at a multiple of 16, no two overlap, and a query tile past the last row stays inside."""
    from flashtile import launch

    for lengths in ([0, 1, 15, 16, 17, 300, 5], [33] * 9, [1], [0, 0, 0]):
        cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        q = torch.empty(int(cu[-1]), 2, 8)
        geo = launch.Geometry.of(q, q, cu, cu, max(lengths), max(lengths))
        heads, width = geo.row_buffer_shape(q)
        assert heads == 2 and width % 16 == 0
        starts = [16 * (b + int(cu[b]) // 16) for b in range(len(lengths))]
        ends = [s + n for s, n in zip(starts, lengths)]
        assert all(s % 16 == 0 for s in starts)
        assert all(e <= s for e, s in zip(ends, starts[1:]))
        assert max(ends) + launch.ROW_PAD <= width
