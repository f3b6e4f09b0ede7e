"""Bad input raises a clear exception naming the argument, before any kernel runs."""
import pytest
import torch

import flashtile
from flashtile import checks


def qkv(shape_q=(2, 16, 4, 32), shape_kv=(2, 16, 2, 32), dtype=torch.float16):
    return torch.randn(shape_q, dtype=dtype), torch.randn(shape_kv, dtype=dtype), torch.randn(shape_kv, dtype=dtype)


def expect(exc, match, q, k, v, **kwargs):
    with pytest.raises(exc, match=match):
        flashtile.flash_attn_func(q, k, v, **kwargs)


def test_rank():
    q, k, v = qkv()
    expect(ValueError, r"q must have 4 dimensions .*got shape \(16, 4, 32\)", q[0], k, v)
    expect(ValueError, r"k must have 4 dimensions", q, k[None], v)


def test_not_a_tensor():
    q, k, v = qkv()
    expect(TypeError, "v must be a torch.Tensor, got list", q, k, [1, 2])


def test_integer_and_float64_dtypes():
    q, k, v = qkv()
    expect(TypeError, r"q has dtype torch.int32; expected", q.int(), k, v)
    expect(TypeError, r"k has dtype torch.float64; expected", q, k.double(), v)


def test_mismatched_dtypes():
    q, k, v = qkv()
    expect(TypeError, r"v has dtype torch.float32 but q has torch.float16", q, k, v.float())


def test_mismatched_batch_and_head_dim():
    q, k, v = qkv()
    expect(ValueError, r"k has batch size 1 but q has 2", q, k[:1], v[:1])
    expect(ValueError, r"k has head dim 16 but q has 32", q, k[..., :16], v[..., :16])
    expect(ValueError, r"k and v must have the same shape", q, k, v[:, :8])


def test_head_ratio():
    q, k, v = qkv(shape_q=(2, 16, 5, 32))
    expect(ValueError, r"query heads \(5\) must be a multiple of the number of key/value heads \(2\)", q, k, v)


@pytest.mark.parametrize("head_dim", [4, 12, 264, 512])
def test_unsupported_head_dim(head_dim):
    q, k, v = qkv((1, 8, 2, head_dim), (1, 8, 2, head_dim))
    expect(ValueError, rf"head dim must be a multiple of 8 between 8 and 256, got {head_dim}", q, k, v)


def test_last_dim_stride():
    q, k, v = qkv((1, 8, 2, 32), (1, 8, 2, 32))
    qt = torch.randn(1, 8, 32, 2, dtype=torch.float16).transpose(-1, -2)
    expect(ValueError, r"q must have stride 1 in its last \(head\) dimension", qt, k, v)


def test_empty_tensors():
    q, k, v = qkv()
    expect(ValueError, r"q is empty \(shape \(2, 0, 4, 32\)\)", q[:, :0], k, v)
    expect(ValueError, r"k is empty", q, k[:, :0], v[:, :0])


def test_devices():
    q, k, v = qkv()
    meta = torch.empty(k.shape, dtype=k.dtype, device="meta")
    expect(ValueError, r"k is on meta but q is on cpu", q, meta, v)


@pytest.mark.parametrize("window,match", [
    ((-2, 0), r"window_size left must be an integer >= -1 \(-1 = unbounded\), got -2"),
    ((4, 1.5), r"window_size right must be an integer >= -1 .*got 1.5"),
    ((4,), r"window_size must be a pair \(left, right\), got \(4,\)"),
    (8, r"window_size must be a pair \(left, right\), got 8"),
], ids=["negative", "float", "one-value", "int"])
def test_bad_window(window, match):
    expect(ValueError, match, *qkv(), window_size=window)


def test_bad_softcap():
    expect(ValueError, r"softcap must be finite and >= 0 \(0 = off\), got -1.0", *qkv(), softcap=-1.0)
    expect(TypeError, "softcap must be a float, got str", *qkv(), softcap="30")


def test_bad_alibi_slopes():
    q, k, v = qkv()  # batch 2, 4 query heads
    expect(TypeError, "alibi_slopes has dtype torch.float16; expected torch.float32", q, k, v,
           alibi_slopes=torch.ones(4, dtype=torch.float16))
    expect(ValueError, r"alibi_slopes must have shape \(4,\) or \(2, 4\) \(nheads of q\), got \(2,\)", q, k, v,
           alibi_slopes=torch.ones(2))
    expect(ValueError, r"alibi_slopes must have shape .* got \(3, 4\)", q, k, v, alibi_slopes=torch.ones(3, 4))
    expect(TypeError, "alibi_slopes must be a torch.Tensor or None, got list", q, k, v, alibi_slopes=[1.0] * 4)
    expect(ValueError, "alibi_slopes is on meta but q is on cpu", q, k, v,
           alibi_slopes=torch.ones(4, device="meta"))


def test_bad_scalars():
    expect(TypeError, "softmax_scale must be a float or None, got str", *qkv(), softmax_scale="0.1")
    expect(ValueError, "softmax_scale must be finite, got nan", *qkv(), softmax_scale=float("nan"))
    expect(TypeError, "causal must be a bool, got int", *qkv(), causal=1)


def test_packed_shapes():
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\)"):
        flashtile.flash_attn_qkvpacked_func(torch.randn(2, 16, 2, 4, 32))
    with pytest.raises(ValueError, match=r"kv must have shape \(batch, seqlen_k, 2, nheads_k, headdim\)"):
        flashtile.flash_attn_kvpacked_func(torch.randn(2, 16, 4, 32), torch.randn(2, 16, 4, 32))


def test_bad_sink():
    q, k, v = qkv()  # 4 query heads
    expect(ValueError, r"sink must have shape \(4,\) \(nheads of q\), got \(2,\)", q, k, v, sink=torch.ones(2))
    expect(TypeError, "sink has dtype torch.int64; expected", q, k, v, sink=torch.ones(4, dtype=torch.long))
    expect(TypeError, "sink must be a torch.Tensor or None, got float", q, k, v, sink=1.0)
    expect(ValueError, "sink is on meta but q is on cpu", q, k, v, sink=torch.ones(4, device="meta"))


def _dense(shape=(2, 17, 4, 64), dtype=torch.float16, **kw):
    return torch.randn(shape, **kw).to(dtype)


@pytest.mark.parametrize("case", ["ok", "ok-gqa", "rank", "dtype", "mixed-dtype", "empty", "stride", "batch",
                                  "head-dim", "heads", "kv-shape", "subclass", "int-dtype", "not-tensor"])
def test_plain_qkv_ok_agrees_with_check_qkv(case):
    """The one-pass check of the plain call accepts only what check_qkv accepts; what it refuses goes to check_qkv."""
    q, k, v = _dense(), _dense(), _dense()
    if case == "ok-gqa":
        k, v = _dense((2, 9, 2, 64)), _dense((2, 9, 2, 64))
    elif case == "rank":
        q = q[0]
    elif case == "dtype":
        q, k, v = (t.to(torch.float64) for t in (q, k, v))
    elif case == "mixed-dtype":
        k = k.float()
    elif case == "empty":
        q = _dense((2, 0, 4, 64))
    elif case == "stride":
        v = _dense((2, 17, 4, 128))[..., ::2]
    elif case == "batch":
        k, v = _dense((1, 17, 4, 64)), _dense((1, 17, 4, 64))
    elif case == "head-dim":
        q, k, v = _dense((2, 17, 4, 60)), _dense((2, 17, 4, 60)), _dense((2, 17, 4, 60))
    elif case == "heads":
        k, v = _dense((2, 17, 3, 64)), _dense((2, 17, 3, 64))
    elif case == "kv-shape":
        v = _dense((2, 18, 4, 64))
    elif case == "subclass":
        q = torch.nn.Parameter(q)
    elif case == "int-dtype":
        q, k, v = (torch.zeros(2, 17, 4, 64, dtype=torch.int32) for _ in range(3))
    elif case == "not-tensor":
        q = q.numpy()
    ok = checks.plain_qkv_ok(q, k, v)
    assert ok == case.startswith("ok")
    if ok:
        checks.check_qkv(q, k, v)


def test_plain_call_reaches_the_op_as_the_checked_one(monkeypatch):
    """flash_attn_func's fast path for the plain call hands autograd.forward what the full checks would."""
    from flashtile import autograd
    seen = []
    monkeypatch.setattr(autograd, "forward", lambda *inputs: seen.append(inputs) or (inputs[0], None))
    q, k, v = _dense(), _dense(), _dense()
    for causal in (False, True):
        for scale in (None, 0.3):
            flashtile.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)  # fast path
            flashtile.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=[-1, -1])  # checked
            fast, checked = seen[-2:]
            assert len(fast) == len(checked) and all(
                a is b or (type(a) is type(b) and a == b) for a, b in zip(fast, checked)), (fast, checked)
