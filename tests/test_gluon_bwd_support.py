"""Which calls the Hopper Gluon backward takes, on CPU: its support rules and refusals, the dispatch from
_flash_attn_backward (features, variant, policy, tested triton, CUDA only, deterministic), the fallback on failure."""
import pytest
import torch

import flashtile
from flashtile import bwd_launch, configs, gluon_bwd_launch, launch
from utils import make_qkv


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
    for head_dim in (64, 128, 256):
        q, k, v = make_qkv(2, 1000, 777, 4, 2, head_dim, torch.bfloat16, "cpu", requires_grad=False)
        assert _supported(q, k, v) and _supported(q, k, v, causal=True)
    q, k, v = make_qkv(1, 130, 257, 2, 1, 128, torch.float16, "cpu", requires_grad=False)
    assert _supported(q, k, v, causal=True)


@pytest.mark.usefixtures("pretend_hopper")
def test_supports_windows_softcap_alibi():
    """Sliding windows (causal + left window too), softcap and ALiBi slopes fp32 (Hq,) or (B, Hq), alone and
    together, with GQA and tails."""
    q, k, v = make_qkv(2, 1000, 777, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    for kw in (dict(window_size=(256, 0)), dict(window_size=(100, 50)), dict(window_size=(-1, 64)),
               dict(causal=True, window_size=(256, -1)), dict(softcap=30.0), dict(softcap=5.0, causal=True),
               dict(alibi_slopes=torch.rand(4)), dict(alibi_slopes=torch.rand(2, 4)),
               dict(window_size=(256, 0), softcap=30.0, alibi_slopes=torch.rand(2, 4))):
        assert _supported(q, k, v, **kw), kw


@pytest.mark.usefixtures("pretend_hopper")
def test_refuses_bad_feature_arguments():
    q, k, v = make_qkv(2, 256, 256, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(q, k, v, softcap=-1.0)
    assert not _supported(q, k, v, alibi_slopes=torch.ones(4, dtype=torch.float16))  # fp32 only
    assert not _supported(q, k, v, alibi_slopes=torch.ones(2))  # Hq slopes per batch
    assert not _supported(q, k, v, alibi_slopes=torch.ones(3, 4))  # batch 2
    assert not _supported(q, k, v, alibi_slopes=[1.0] * 4)


@pytest.mark.usefixtures("pretend_hopper")
def test_dropout_support_rule():
    """Dropout with its int64 seed at D64 / D128, dense or varlen (DROPOUT_HEAD_DIMS); not at D256 (split-D tiles),
    not without a seed, not with a bias (shared memory), not p >= 1, not above p = 0.96875 (threshold 0x7C00: the
    kernel's fp16 compare of the draws, gluon_dropout.dropout_keep_pairs / dropout_signed, holds up to there)."""
    seed = torch.zeros(1, dtype=torch.int64)
    for head_dim in (64, 128, 256):
        q, k, v = make_qkv(2, 1000, 777, 4, 2, head_dim, torch.bfloat16, "cpu", requires_grad=False)
        assert _supported(q, k, v, dropout_p=0.1, rng=seed) == (head_dim != 256)
        assert _supported(q, k, v, dropout_p=0.0, rng=None)
        assert _supported(q, k, v, dropout_p=0.96875, rng=seed) == (head_dim != 256)
        assert not _supported(q, k, v, dropout_p=0.969, rng=seed)  # threshold 0x7C08
    assert not _supported(q, k, v, dropout_p=0.1)  # no seed
    assert not _supported(q, k, v, dropout_p=0.1, rng=torch.zeros(1, dtype=torch.int32))
    q, k, v = make_qkv(2, 1000, 777, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(q, k, v, dropout_p=1.0, rng=seed)
    bias = torch.zeros(1, 4, 1000, 784, dtype=torch.bfloat16)[..., :777]
    assert _supported(q, k, v, attn_bias=bias)
    assert not _supported(q, k, v, attn_bias=bias, dropout_p=0.1, rng=seed)
    qp, kp = q.flatten(0, 1), k.flatten(0, 1)
    cu_q, cu_k = torch.tensor([0, 1000, 2000], dtype=torch.int32), torch.tensor([0, 777, 1554], dtype=torch.int32)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1000, max_seqlen_k=777)
    assert _supported(qp, kp, kp, **varlen)
    assert _supported(qp, kp, kp, dropout_p=0.1, rng=seed, **varlen)  # the kernel's VARLEN with HAS_DROPOUT
    q256, k256 = (make_qkv(2, 1000, 777, 4, 2, 256, torch.bfloat16, "cpu", requires_grad=False)[i].flatten(0, 1)
                  for i in (0, 1))
    assert _supported(q256, k256, k256, **varlen)
    assert not _supported(q256, k256, k256, dropout_p=0.1, rng=seed, **varlen)


@pytest.mark.usefixtures("pretend_hopper")
def test_supports_varlen():
    """Packed (total, H, D) tensors with int32 cu_seqlens are supported; without them, or with 4-D tensors, not."""
    q = torch.randn(700, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(900, 2, 128, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 300, 300, 700], dtype=torch.int32)
    cu_k = torch.tensor([0, 500, 630, 900], dtype=torch.int32)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=400, max_seqlen_k=500)
    assert gluon_bwd_launch.gluon_bwd_supported(q, k, k, q, q, causal=True, **varlen)
    assert not gluon_bwd_launch.gluon_bwd_supported(q, k, k, q, q, causal=True)
    assert not gluon_bwd_launch.gluon_bwd_supported(q, k, k, q, q, **dict(varlen, cu_seqlens_q=cu_q.long()))
    assert not gluon_bwd_launch.gluon_bwd_supported(q[None], k[None], k[None], q[None], q[None], **varlen)
    bias = torch.zeros(3, 4, 400, 504, dtype=torch.bfloat16)[..., :500]  # a bias stays dense-only
    assert not gluon_bwd_launch.gluon_bwd_supported(q, k, k, q, q, causal=True, attn_bias=bias, **varlen)


@pytest.mark.usefixtures("pretend_hopper")
def test_bias_layouts_the_tma_path_takes():
    """A bias without gradient whose rows TMA can read: (B, Hq, Sq, Sk), (1, Hq, ...), (B, 1, ...), expanded
    batch / heads, fp16 / bf16 (fp32 too at D64), padded rows; with ALiBi, windows, causal, softcap, GQA.
    The rest stays on the portable backward: query- or key-broadcast, a non-unit key stride, rows not 16-byte
    aligned or nested out of order, fp32 at D128, any bias at D256, another shape."""
    q, k, v = make_qkv(2, 300, 504, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    q64, k64, v64 = make_qkv(2, 300, 504, 4, 2, 64, torch.bfloat16, "cpu", requires_grad=False)
    bf16 = dict(dtype=torch.bfloat16)
    for bias in (torch.zeros(2, 4, 300, 504, **bf16), torch.zeros(1, 4, 300, 504, **bf16),
                 torch.zeros(2, 1, 300, 504, dtype=torch.float16), torch.zeros(1, 1, 300, 504, **bf16),
                 torch.zeros(1, 4, 300, 504, **bf16).expand(2, 4, 300, 504),
                 torch.zeros(2, 4, 300, 512, **bf16)[..., :504]):
        assert _supported(q, k, v, attn_bias=bias), (bias.shape, bias.stride())
        assert _supported(q64, k64, v64, attn_bias=bias.float())
        for kw in (dict(causal=True), dict(window_size=(100, 50)), dict(alibi_slopes=torch.rand(4))):
            assert _supported(q, k, v, attn_bias=bias, **kw), kw
    bias = torch.zeros(1, 4, 300, 504, **bf16)
    assert _supported(q64, k64, v64, attn_bias=bias, softcap=30.0) and _supported(q, k, v, attn_bias=bias, softcap=5.0)
    assert not _supported(q, k, v, attn_bias=bias.float())
    assert not _supported(q, k, v, attn_bias=bias, bias_grad=True)
    q256, k256, v256 = make_qkv(2, 300, 504, 4, 2, 256, torch.bfloat16, "cpu", requires_grad=False)
    assert _supported(q256, k256, v256) and not _supported(q256, k256, v256, attn_bias=bias)
    for bad in (torch.zeros(1, 4, 1, 504, **bf16),  # query-broadcast
                torch.zeros(1, 4, 300, 504, **bf16).expand(1, 4, 300, 504).transpose(2, 3).contiguous()
                .transpose(2, 3),  # key stride 300
                torch.zeros(1, 4, 300, 1, **bf16),  # key-broadcast
                torch.zeros(1, 4, 1, 504, **bf16).expand(1, 4, 300, 504),  # query stride 0
                torch.zeros(1, 4, 300, 509, **bf16)[..., :504].contiguous()[..., :500],  # wrong key count
                torch.zeros(1, 3, 300, 504, **bf16),  # heads 3 of 4
                torch.zeros(1, 300, 4, 504, **bf16).transpose(1, 2),  # heads inside rows: no TMA-safe nesting
                torch.zeros(2, 1, 4, 300, 504, **bf16)[:, 0].transpose(0, 1).contiguous().transpose(0, 1)):
        assert not _supported(q, k, v, attn_bias=bad), (bad.shape, bad.stride())
    qo, ko, vo = make_qkv(1, 33, 41, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(qo, ko, vo, attn_bias=torch.zeros(1, 4, 33, 41, **bf16))  # 82-byte rows
    assert _supported(qo, ko, vo, attn_bias=torch.zeros(1, 4, 33, 48, **bf16)[..., :41])  # padded to 96 bytes


@pytest.mark.usefixtures("pretend_hopper")
def test_refuses_what_it_cannot_do():
    q, k, v = make_qkv(1, 256, 256, 4, 2, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not _supported(q, k, v, dropout_p=0.1)
    assert not _supported(q, k, v, attn_bias=torch.zeros(1, 4, 256, 256))  # fp32 bias at D128: no shared memory
    assert not _supported(q, k, v, score_mod=lambda s: s)
    for head_dim in (96, 192):
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


def test_backward_asks_gluon_for_features_not_for_the_rest():
    """_flash_attn_backward's gate: windows, softcap, ALiBi, varlen, dropout and a bias without gradient reach
    _gluon_backward (which may refuse); a bias gradient, mods and deterministic never do."""
    ok = bwd_launch._gluon_bwd_candidate  # the bias itself is not an argument: gluon_bwd_supported decides on it
    assert ok(False, 0.0, None, False)
    assert not ok(True, 0.0, None, False)  # bias_grad: dS is written by the portable dQ kernel
    assert ok(False, 0.1, None, False)  # gluon_bwd_supported takes D64 / D128 (DROPOUT_HEAD_DIMS)
    assert not ok(False, 0.0, object(), False)
    assert not ok(False, 0.0, None, True)


def test_gluon_backward_forwards_features(monkeypatch):
    """bwd_launch._gluon_backward hands window_size / softcap / alibi_slopes (and a bias, when given) to the support
    check and the launcher, and a window whose right side is 0 takes the causal key threshold."""
    q = torch.randn(1, 2048, 2, 128)
    slopes = torch.rand(2)
    seen = []
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: seen.append(("s", kw)) or True)
    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward", lambda *a, **kw: seen.append(("g", a[7], kw)) or "grads")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    got = bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True, window_size=(256, 0), softcap=30.0,
                                     alibi_slopes=slopes)
    assert got == "grads"
    features = dict(window_size=(256, 0), softcap=30.0, alibi_slopes=slopes)
    assert seen == [("s", dict(causal=True, **features)), ("g", True, dict(features, sink=None, sink_parts=None))]
    bias = torch.zeros(1, 2, 2048, 2048)  # a bias (no gradient) goes to both as well
    seen.clear()
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False, attn_bias=bias) == "grads"
    assert seen[0][1]["attn_bias"] is bias and seen[1][2]["attn_bias"] is bias
    from flashtile import gluon_launch

    wanted = []
    monkeypatch.delenv("FLASHTILE_GLUON_BWD")
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(configs, "gluon_bwd_wanted",
                        lambda d, causal, sk, span: wanted.append((causal, span)) or False)
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True, window_size=(256, 0)) is None
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True, window_size=(-1, 0)) is None
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False, softcap=30.0) is None
    assert wanted == [(True, 257), (True, None), (False, None)]


def test_plain_calls_take_the_measured_variant(monkeypatch):
    """configs.GLUON_BWD_PLAIN's variant serves plain and causal dense calls (the causal mask as causal=True or as the
    window (-1, 0)); a window, softcap, ALiBi, a bias or varlen keep the default variant, as do other head dims."""
    seen = []
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: True)
    monkeypatch.setattr(gluon_bwd_launch, "gluon_backward", lambda *a, **kw: seen.append(a[9]) or "grads")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    q = torch.randn(1, 1024, 2, 64)
    cu = torch.tensor([0, 1024], dtype=torch.int32)
    calls = [(dict(causal=False), configs.GLUON_BWD_PLAIN[(64, False)]),
             (dict(causal=True), configs.GLUON_BWD_PLAIN[(64, True)]),
             (dict(causal=True, window_size=(-1, 0)), configs.GLUON_BWD_PLAIN[(64, True)]),
             (dict(causal=True, window_size=(256, 0)), "default"), (dict(causal=False, softcap=30.0), "default"),
             (dict(causal=False, alibi_slopes=torch.rand(2)), "default"),
             (dict(causal=False, attn_bias=torch.zeros(1, 2, 1024, 1024)), "default")]
    for kw, _ in calls:
        causal = kw.pop("causal")
        assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, causal, **kw) == "grads"
    packed = q[0]
    bwd_launch._gluon_backward(packed, packed, packed, packed, packed, None, None, 0.1, False, cu_seqlens_q=cu,
                               cu_seqlens_k=cu, max_seqlen_q=1024, max_seqlen_k=1024)
    q128 = torch.randn(1, 1024, 2, 128)
    bwd_launch._gluon_backward(q128, q128, q128, q128, q128, None, None, 0.1, False)
    assert seen == [variant for _, variant in calls] + ["default", "default"]
    assert all(v in gluon_bwd_launch.VARIANTS and 64 in gluon_bwd_launch.VARIANTS[v]
               for v in configs.GLUON_BWD_PLAIN.values())


def test_policy_follows_the_measurement(monkeypatch):
    """configs.GLUON_BWD_MIN_KEYS: D64, D128 and D256 from 512 keys (measured faster than the portable backward
    there), below unmeasured; FLASHTILE_GLUON_BWD=1 asks wherever supported, =0 never."""
    for head_dim, least in ((64, 512), (128, 512), (256, 512)):
        assert all(configs.gluon_bwd_wanted(head_dim, c, s) for c in (False, True) for s in (least, 16384))
        assert not any(configs.gluon_bwd_wanted(head_dim, c, least - 1) for c in (False, True))
    assert not configs.gluon_bwd_wanted(96, False, 16384)  # no Gluon backward there
    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and not seen
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and seen == [1]
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    monkeypatch.setattr(configs, "GLUON_BWD_MIN_KEYS", {(128, False): 0})
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None and seen == [1]


def test_wanted_needs_a_tested_triton(monkeypatch):
    from flashtile import gluon_launch

    q = torch.randn(1, 256, 2, 128)
    seen = []
    monkeypatch.setattr(configs, "GLUON_BWD_MIN_KEYS", {(128, True): 0})
    monkeypatch.setattr(gluon_bwd_launch, "gluon_bwd_supported", lambda *a, **kw: seen.append(1) or False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: False)
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True) is None and not seen
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, True) is None and seen == [1]


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
        assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None
    assert calls == [1] and gluon_bwd_launch._disabled is not None
    assert bwd_launch._gluon_backward(q, q, q, q, q, None, None, 0.1, False) is None
    assert calls == [1]  # disabled: not tried again


@pytest.mark.skipif(not launch.interpreter_active(), reason="calls the launcher on CPU tensors: interpreter only")
def test_backward_dispatch_only_for_cuda(monkeypatch):
    """_flash_attn_backward asks the Gluon path only for CUDA tensors (CPU here: never); which dense calls it asks
    for is test_backward_asks_gluon_for_features_not_for_the_rest's."""
    seen = []
    monkeypatch.setattr(bwd_launch, "_gluon_backward", lambda *a, **kw: seen.append(a[-1]) or None)
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float32, "cpu", requires_grad=False)
    out, lse = launch._flash_attn_forward(q, k, v, 0.125, -1, -1, 0.0, None, None)
    bwd_launch._flash_attn_backward(torch.ones_like(out), q, k, v, out, lse, None, 0.125, -1, -1, 0.0, None)
    assert seen == []  # CPU tensors


def test_deterministic_reaches_the_backward(monkeypatch):
    """flash_attn_func(deterministic=True) hands the flag to the backward launcher (which then never takes the Gluon
    backward, whose dQ adds with atomics); the default hands False."""
    seen = []
    real = bwd_launch._flash_attn_backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("deterministic"))
        return real(*args, **kwargs)

    monkeypatch.setattr(bwd_launch, "_flash_attn_backward", spy)
    # The launcher runs for CUDA tensors, and for CPU ones under the interpreter (the CPU tier).
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float32, "cuda" if torch.cuda.is_available() else "cpu")
    for flag in (True, False):
        flashtile.flash_attn_func(q, k, v, causal=True, deterministic=flag).sum().backward()
    assert seen == [True, False]
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flashtile.flash_attn_func(q, k, v, deterministic="yes")
