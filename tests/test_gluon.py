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
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(shape, head_dim, causal):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    if head_dim == 256 and batch > 1 and seqlen_k % 64:
        pytest.skip("D256 batches need seqlen_k % 64 == 0")
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


def _slopes(heads, batch=None):
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
    return slopes if batch is None else torch.stack([slopes * (1.0 + 0.1 * b) for b in range(batch)])


# (id, causal, window_size, softcap, alibi: None / "h" / "bh", sink)
FEATURES = [
    ("softcap", False, (-1, -1), 30.0, None, False),
    ("softcap-causal", True, (-1, -1), 30.0, None, False),
    ("alibi", False, (-1, -1), 0.0, "h", False),
    ("alibi-bh-causal", True, (-1, -1), 0.0, "bh", False),
    ("sink", False, (-1, -1), 0.0, None, True),
    ("sink-causal", True, (-1, -1), 0.0, None, True),
    ("window-256-0", False, (256, 0), 0.0, None, False),
    ("window-100-50", False, (100, 50), 0.0, None, False),
    ("window-300-inf", False, (300, -1), 0.0, None, False),
    ("window-0-0", False, (0, 0), 0.0, None, False),
    ("causal-window-64", True, (64, -1), 0.0, None, False),
    ("window-softcap-alibi", False, (256, 0), 30.0, "h", False),
    ("window-softcap-alibi-sink", False, (200, 100), 30.0, "bh", True),
]
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): tails, q != k, GQA, and a batch with block-aligned keys
FEATURE_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (1, 777, 999, 8, 2), (2, 512, 1024, 4, 1)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}" for b, sq, sk, hq, hk in
                                                       FEATURE_SHAPES])
@pytest.mark.parametrize("feature", FEATURES, ids=[f[0] for f in FEATURES])
def test_features_match_reference(feature, shape, head_dim):
    """Softcap, ALiBi, sinks and sliding windows (each a constexpr of the kernel) against the float64 reference."""
    _, causal, window_size, softcap, alibi, sink = feature
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap, sink=torch.randn(heads_q, device="cuda") if sink else None,
                 alibi_slopes=_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None)
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **feats)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, **feats)
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, **feats)
    assert_close_rule("out", out, ref, flashtile.attention_ref(q, k, v, causal=causal, upcast=False, **feats),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_refuses_windows_with_rows_without_keys():
    """Sq - Sk > window right: the first rows see no key (output 0, lse -inf), left to the portable kernel."""
    q, k, v = make_qkv(1, 300, 200, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    assert not gluon_launch.gluon_supported(q, k, v, window_size=(50, 50))
    assert gluon_launch.gluon_supported(q, k, v, window_size=(50, 100))
    assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.1)
    assert not gluon_launch.gluon_supported(q, k, v, attn_bias=torch.zeros(1, 1, 300, 200, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim", [128, 256], ids=["d128", "d256"])
def test_flash_attn_func_features_backward(monkeypatch, head_dim):
    """FLASHTILE_GLUON=1 routes a window + softcap + ALiBi + sink forward to the Gluon kernel; the backward (and the
    sink's gradient, computed from lse) matches the portable path's."""
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    calls = []
    original = gluon_launch.gluon_forward
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q, k, v = make_qkv(1, 1000, 1000, 4, 2, head_dim, torch.bfloat16, "cuda", requires_grad=True)
    sink = torch.randn(4, device="cuda", requires_grad=True)
    feats = dict(window_size=(256, 0), softcap=30.0, alibi_slopes=_slopes(4))
    out = flashtile.flash_attn_func(q, k, v, sink=sink, **feats)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, sink=sink, **feats)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v, sink), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=1e-2)


def test_a_failing_gluon_launch_falls_back_once(monkeypatch):
    """A Gluon launch that fails to build (e.g. an API change in an untested triton) warns once, disables the
    Gluon path for the process and lets the portable kernels answer; a supported call never takes it again."""
    from flashtile import launch

    q = torch.randn(1, 256, 2, 128, dtype=torch.bfloat16)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise TypeError("simulated Gluon API change")

    monkeypatch.setattr(gluon_launch, "_disabled", None)
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", broken)
    monkeypatch.setattr(gluon_launch, "_supported_device", lambda *tensors: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read per call by gluon_supported; no kernel runs here
    with pytest.warns(RuntimeWarning, match="Gluon forward failed"):
        assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None
    assert calls == [1] and gluon_launch._disabled is not None
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None
    assert calls == [1]  # disabled: not tried again
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None


def test_untested_triton_needs_the_opt_in(monkeypatch):
    from flashtile import launch

    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: False)
    monkeypatch.setattr(gluon_launch, "gluon_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None and not seen
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert launch._gluon_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) is None and seen == [1]
