"""The Hopper Gluon backward (gluon_bwd_launch.py): dispatch, refusal and fallback on CPU; GPU tier on sm90."""
import pytest
import torch

import flashtile
from flashtile import configs, gluon_bwd_launch, launch
from utils import assert_close_rule, make_qkv, references

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_unsupported_without_hopper():
    """Importing never fails; CPU tensors (and the interpreter) never take the Gluon backward."""
    q = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)
    assert not gluon_bwd_launch.gluon_bwd_supported(q, q, q, q, q)


@pytest.fixture
def pretend_hopper(monkeypatch):
    """gluon_bwd_supported's checks on CPU tensors, as if on an sm90 GPU with the kernel importable."""
    monkeypatch.setattr(gluon_bwd_launch, "_disabled", None)
    monkeypatch.setattr(gluon_bwd_launch, "_attn_bwd_dkdv_hopper", object())
    monkeypatch.setattr(gluon_bwd_launch, "_supported_device", lambda *tensors: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read per call; no kernel runs here


def _supported(q, k, v, **kw):
    return gluon_bwd_launch.gluon_bwd_supported(q, k, v, q, q, **kw)


@pytest.mark.usefixtures("pretend_hopper")
def test_supports_plain_causal_gqa_and_tails():
    for head_dim in (64, 128):
        q, k, v = make_qkv(2, 1000, 777, 4, 2, head_dim, torch.bfloat16, "cpu", requires_grad=False)
        assert _supported(q, k, v) and _supported(q, k, v, causal=True)
    q, k, v = make_qkv(1, 130, 257, 2, 1, 128, torch.float16, "cpu", requires_grad=False)
    assert _supported(q, k, v, causal=True)


@pytest.mark.usefixtures("pretend_hopper")
def test_refuses_what_it_cannot_do():
    q, k, v = make_qkv(1, 256, 256, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(q, k, v, dropout_p=0.1)
    assert not _supported(q, k, v, window_size=(64, 0))
    assert not _supported(q, k, v, softcap=30.0)
    assert not _supported(q, k, v, alibi_slopes=torch.ones(4))
    assert not _supported(q, k, v, attn_bias=torch.zeros(1, 4, 256, 256))
    assert not _supported(q, k, v, score_mod=lambda s: s)
    for head_dim in (96, 256):
        q2, k2, v2 = make_qkv(1, 256, 256, 4, 2, head_dim, torch.bfloat16, "cpu", requires_grad=False)
        assert not _supported(q2, k2, v2)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    assert not _supported(q32, k32, v32)
    q3, k3, v3 = make_qkv(1, 256, 256, 3, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(q3, k3, v3)  # heads_q % heads_kv != 0
    # Heads not adjacent (a (B, H, S, D) tensor transposed): no 3-D (B, S, H * D) TMA view.
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not gluon_bwd_launch.gluon_bwd_supported(qt, k, v, q, q)
    assert not gluon_bwd_launch.gluon_bwd_supported(q, k, v, q, qt)  # dout too


def test_policy_follows_the_measurement(monkeypatch):
    """configs.GLUON_BWD_MIN_KEYS: D128 from 1K keys (measured faster than the portable backward there), never D64
    (measured slower); FLASHTILE_GLUON_BWD=1 asks wherever supported, =0 never."""
    assert all(configs.gluon_bwd_wanted(128, c, s) for c in (False, True) for s in (1024, 16384))
    assert not any(configs.gluon_bwd_wanted(128, c, 512) for c in (False, True))
    assert not any(configs.gluon_bwd_wanted(64, c, 16384) for c in (False, True))
    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and not seen
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and seen == [1]
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    monkeypatch.setattr(configs, "GLUON_BWD_MIN_KEYS", {(128, False): 0})
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and seen == [1]


def test_wanted_needs_a_tested_triton(monkeypatch):
    from flashtile import gluon_launch

    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(configs, "GLUON_BWD_MIN_KEYS", {(128, True): 0})
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: False)
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True) is None and not seen
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True) is None and seen == [1]


@pytest.mark.usefixtures("pretend_hopper")
def test_a_failing_gluon_backward_falls_back_once(monkeypatch):
    """A Gluon backward that fails to build warns once, disables itself for the process, and returns None so the
    portable kernels answer; a supported call never takes it again."""
    q = torch.randn(1, 256, 2, 128, dtype=torch.bfloat16)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise TypeError("simulated Gluon API change")

    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward", broken)
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    with pytest.warns(RuntimeWarning, match="Gluon backward failed"):
        assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None
    assert calls == [1] and gluon_bwd_launch._disabled is not None
    assert launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None
    assert calls == [1]  # disabled: not tried again


@pytest.mark.skipif(not launch.interpreter_active(), reason="calls the launcher on CPU tensors: interpreter only")
def test_backward_dispatch_only_for_plain_and_causal(monkeypatch):
    """_flash_attn_backward asks the Gluon path only for dense plain / causal calls on CUDA tensors (CPU here:
    never), and passes causal = (window_right == 0)."""
    seen = []
    monkeypatch.setattr(launch, "_gluon_backward", lambda *a: seen.append(a[-1]) or None)
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float32, "cpu", requires_grad=False)
    out, lse = launch._flash_attn_forward(q, k, v, 0.125, -1, -1, 0.0, None, None)
    launch._flash_attn_backward(torch.ones_like(out), q, k, v, out, lse, None, 0.125, -1, -1, 0.0, None)
    assert seen == []  # CPU tensors


def test_deterministic_reaches_the_backward(monkeypatch):
    """flash_attn_func(deterministic=True) hands the flag to the backward launcher (which then never takes the Gluon
    backward, whose dQ adds with atomics); the default hands False."""
    seen = []
    real = launch._flash_attn_backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("deterministic"))
        return real(*args, **kwargs)

    monkeypatch.setattr(launch, "_flash_attn_backward", spy)
    # The launcher runs for CUDA tensors, and for CPU ones under the interpreter (the CPU tier).
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float32, "cuda" if torch.cuda.is_available() else "cpu")
    for flag in (True, False):
        flashtile.flash_attn_func(q, k, v, causal=True, deterministic=flag).sum().backward()
    assert seen == [True, False]
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashtile.flash_attn_func(q, k, v, deterministic="yes")


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype): tails, q != k (both ways), GQA / MQA, batches with tails
SHAPES = [(2, 1024, 1024, 4, 4, torch.bfloat16), (1, 1000, 1000, 4, 2, torch.bfloat16),
          (1, 130, 257, 2, 2, torch.bfloat16), (1, 257, 130, 2, 2, torch.bfloat16), (1, 777, 999, 8, 1, torch.bfloat16),
          (3, 1000, 1000, 4, 2, torch.bfloat16), (1, 1, 1, 2, 1, torch.bfloat16), (2, 1000, 1000, 4, 2, torch.float16)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"b{b}-q{sq}-k{sk}-h{hq}/{hk}-{str(dt)[6:]}"
                                               for b, sq, sk, hq, hk, dt in SHAPES])
def test_matches_reference(monkeypatch, shape, head_dim, causal):
    """FLASHTILE_GLUON_BWD=1: flash_attn_func's gradients from the Gluon backward against the float64 reference."""
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    calls = []
    original = gluon_bwd_launch.gluon_backward
    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, "cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device="cuda")
    grads = torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    assert calls
    ref64, reflow = references(q, k, v, dout, causal)
    for name, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64[1:], reflow[1:]):
        assert_close_rule(name, got, r64, rlow, dtype)
