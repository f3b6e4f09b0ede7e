"""Bad input raises a clear exception naming the argument, before any kernel runs."""
import os

import numpy as np
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


@pytest.mark.parametrize("head_dim", [257, 264, 512])
def test_unsupported_head_dim(head_dim):
    """Past 256 (below it, dims that are not a multiple of 8 are padded: test_attention.py)."""
    q, k, v = qkv((1, 8, 2, head_dim), (1, 8, 2, head_dim))
    expect(ValueError, rf"head dim must be a multiple of 8 between 8 and 256, got {head_dim}", q, k, v)


def test_kvcache_head_dim_not_padded():
    """flash_attn_with_kvcache appends into the cache in place, so its head dim is not padded: refused."""
    q, cache = torch.randn(1, 1, 2, 12), torch.zeros(1, 8, 2, 12)
    with pytest.raises(ValueError, match="head dim must be a multiple of 8"):
        flashtile.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=4)


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
    expect(TypeError, "causal must be a bool, got numpy.bool", *qkv(), causal=np.bool_(True))


@pytest.mark.parametrize("value", ["no", None, 0, 1])
def test_bad_return_flags(value):
    """Every bool argument is checked as causal is: a truthy string or a falsy None is not silently taken."""
    q, k, v = qkv()
    expect(TypeError, "return_attn_probs must be a bool", q, k, v, return_attn_probs=value)
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    with pytest.raises(TypeError, match="return_attn_probs must be a bool"):
        flashtile.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 16, 16,
                                         return_attn_probs=value)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        flashtile.attention(q, k, v, return_lse=value)
    cache = torch.zeros(q.shape[0], 16, *k.shape[2:], dtype=q.dtype)
    for name in ("rotary_interleaved", "return_softmax_lse"):
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            flashtile.flash_attn_with_kvcache(q[:, :1], cache, cache.clone(), cache_seqlens=4, **{name: value})


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


# Findings of session 45's bad-input review: each was silently wrong or a raw error before.

def test_window_sides_past_int32_are_unbounded():
    """A side >= 2^31 - 1 reaches past any sequence: -1 (a 64-bit side gave wrong results or an OverflowError)."""
    assert checks.window((2**63, 2**64), False) == (-1, -1)
    assert checks.window((2**31 - 1, 5), False) == (-1, 5)
    assert checks.window((2**31 - 2, 2**70), True) == (2**31 - 2, 0)
    q, k, v = (torch.randn(1, n, 1, 16) for n in (4, 6, 6))
    for huge, plain in (((0, 2**63), (0, -1)), ((2**63, 0), (-1, 0))):
        torch.testing.assert_close(flashtile.flash_attn_func(q, k, v, window_size=huge),
                                   flashtile.flash_attn_func(q, k, v, window_size=plain), rtol=0, atol=0)


def test_max_seqlen_integers():
    """numpy integers are taken as ints; a negative one is a ValueError."""
    np = pytest.importorskip("numpy")
    q, k, v = (torch.randn(6, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    want = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3)
    for n in (np.int64(3), np.int32(3)):
        torch.testing.assert_close(flashtile.flash_attn_varlen_func(q, k, v, cu, cu, n, n), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="max_seqlen_q must be >= 0"):
        flashtile.flash_attn_varlen_func(q, k, v, cu, cu, -1, 3)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int, got float"):
        flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3.0)


def test_paged_varlen_arguments():
    q = torch.randn(4, 2, 16)
    pages = torch.randn(3, 4, 2, 16)
    cu_q, cu_k = torch.tensor([0, 2, 4], dtype=torch.int32), torch.tensor([0, 3, 8], dtype=torch.int32)
    table = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32)

    def call(**kwargs):
        return flashtile.flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 2, 5, block_table=table, **kwargs)
    with pytest.raises(NotImplementedError, match="inference only"):  # its gradient would be lost
        call(sink=torch.zeros(2, requires_grad=True))
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        call(deterministic="yes")
    with pytest.raises(TypeError, match="dropout_p must be a float"):
        call(dropout_p="0")
    call(sink=torch.zeros(2))


def test_kvcache_puts_no_graph_on_the_cache():
    """k / v that require grad (decoding without torch.no_grad()): the cache is written as plain data and the output
    has no graph, on every backend (as flash-attn: no autograd)."""
    cache_k, cache_v = torch.zeros(1, 8, 1, 16), torch.zeros(1, 8, 1, 16)
    for step in range(2):
        q, k, v = (torch.randn(1, 1, 1, 16, requires_grad=True) for _ in range(3))
        out = flashtile.flash_attn_with_kvcache(q, cache_k, cache_v, k, v, cache_seqlens=step, causal=True,
                                                window_size=(2**63, 0))
        assert not out.requires_grad and not cache_k.requires_grad and not cache_v.requires_grad
        assert cache_k.grad_fn is None and torch.equal(cache_k[0, step], k[0, 0].detach())


def _op_call(q, k, v, causal):
    """torch.ops.flashtile.fwd itself (the op the README documents): its registered autograd, not the eager path's."""
    return torch.ops.flashtile.fwd(q, k, v, q.shape[-1] ** -0.5, -1, 0 if causal else -1, 0.0, None, None, None, None,
                                   0, 0, None, 0.0, None, False)[0]


def _flop_counted_call(q, k, v, causal):
    """flash_attn_func under a dispatch mode, which routes it through the op."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        return flashtile.flash_attn_func(q, k, v, causal=causal)


@pytest.mark.parametrize("entry", ["flash_attn_func", "attention", "op", "flop_counter"])
def test_second_order_gradients_are_refused(backend, entry):
    """create_graph=True: the gradients are the usual ones, and differentiating them raises a clear error on every
    backend (the kernels' backward records no graph; the CPU path's graph through its blockwise algorithm was
    untested), as flash-attn has no double backward. Also through the op itself, whose registered backward had
    no refusal (the CPU path silently recorded second-order gradients)."""
    _, device = backend
    call = {"op": _op_call, "flop_counter": _flop_counted_call}.get(entry) or getattr(flashtile, entry)
    q, k, v = (torch.randn(1, 16, 2, 16, device=device, requires_grad=True) for _ in range(3))
    first = torch.autograd.grad(call(q, k, v, causal=True).square().sum(), (q, k, v))
    assert not any(g.requires_grad for g in first)
    second = torch.autograd.grad(call(q, k, v, causal=True).square().sum(), (q, k, v), create_graph=True)
    for g, g1 in zip(second, first):
        torch.testing.assert_close(g.detach(), g1)  # not bitwise: the GPU backward may add dq atomically
    with pytest.raises(RuntimeError, match="second-order gradients"):
        sum(g.square().sum() for g in second).backward()
    # A grad call to the inputs themselves (as a Hessian-vector product makes) must meet the refusal too, not find
    # the gradients unconnected to q, k, v and return nothing or zeros.
    second = torch.autograd.grad(call(q, k, v, causal=True).square().sum(), (q, k, v), create_graph=True)
    for wrt in (q, k, v):
        with pytest.raises(RuntimeError, match="second-order gradients"):
            torch.autograd.grad(second[0].square().sum(), wrt, retain_graph=True, materialize_grads=True)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
@pytest.mark.parametrize("entry", ["flash_attn_func", "attention"])
def test_func_transforms_are_refused(backend, entry, transform):
    """torch.func's vmap / grad: a clear refusal on every backend, not torch's errors from inside the kernels'
    launch (BatchedTensorImpl storage) or the autograd.Function (setup_context)."""
    _, device = backend
    call = getattr(flashtile, entry)
    q, k, v = (torch.randn(1, 8, 2, 16, device=device) for _ in range(3))
    if transform == "vmap":  # over a stack of 3 q's, each (1, 8, 2, 16)
        fn, q = torch.func.vmap(lambda q: call(q, k, v)), torch.stack([q] * 3)
    else:
        fn = torch.func.grad(lambda q: call(q, k, v).sum())
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        fn(q)


def test_forward_mode_ad_is_refused(backend):
    """A dual tensor (torch.autograd.forward_ad, torch.func.jvp): the kernels would drop its tangent (a silent zero
    jvp), so every entry point refuses it, on every backend alike (where an autograd.Function is applied, PyTorch's
    own refusal comes first)."""
    import torch.autograd.forward_ad as fwad

    _, device = backend
    q, k, v = (torch.randn(1, 8, 2, 16, device=device) for _ in range(3))
    cache = torch.zeros(1, 16, 2, 16, device=device)
    with fwad.dual_level():
        dual = fwad.make_dual(q, torch.randn_like(q))
        for call in (lambda: flashtile.flash_attn_func(dual, k, v),
                     lambda: flashtile.flash_attn_func(q, k, fwad.make_dual(v, torch.randn_like(v)), causal=True),
                     lambda: flashtile.flash_attn_with_kvcache(dual[:, :1], cache, cache),
                     lambda: flashtile.attention(dual, k, v)):
            with pytest.raises((NotImplementedError, RuntimeError), match="no forward-mode AD|implement the jvp"):
                call()
        assert fwad.unpack_dual(flashtile.flash_attn_func(q, k, v)).tangent is None  # plain tensors still run
    with pytest.raises(NotImplementedError, match="no forward-mode AD"):
        torch.func.jvp(lambda x: flashtile.flash_attn_func(x, k, v), (q,), (torch.randn_like(q),))


NO_TRITON = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import torch, flashtile
q, k, v = (torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3))
flashtile.flash_attn_func(q, k, v, causal=True, dropout_p=0.1).sum().backward()
cu = torch.tensor([0, 16], dtype=torch.int32)
flashtile.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 16, 16)
cache = torch.zeros(1, 32, 2, 16)
flashtile.flash_attn_with_kvcache(q[:, :1].detach(), cache, cache.clone(), k[:, :2].detach(), v[:, :2].detach(),
                                  cache_seqlens=3)
assert "triton" not in sys.modules
try:
    from flashtile import attention
except ImportError as exc:
    assert "needs triton" in str(exc), exc
else:
    raise AssertionError("flashtile.attention imported without triton")
"""


def test_cpu_path_without_triton():
    """pip installs triton on Linux only: elsewhere the flash_attn_* API must import and run on CPU tensors, and the
    programmable API say that it needs triton (a fresh interpreter, with triton's import blocked)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_qkvpacked_varlen_names_its_arguments():
    qkv = torch.randn(5, 3, 2, 16)
    with pytest.raises(TypeError, match="cu_seqlens must be a torch.Tensor, got list"):
        flashtile.flash_attn_varlen_qkvpacked_func(qkv, [0, 5], 5)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"max_seqlen=4 is smaller than the longest sequence in cu_seqlens \(5\)"):
        flashtile.flash_attn_varlen_qkvpacked_func(qkv, cu, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens must end at the number of tokens \(5\), got 4"):
        flashtile.flash_attn_varlen_qkvpacked_func(qkv, torch.tensor([0, 4], dtype=torch.int32), 5)


def test_attention_mask_mod_must_be_the_block_masks():
    """The kernels skip the mask in the block mask's full blocks, so a different mask_mod would hold only elsewhere."""
    q, k, v = (torch.randn(1, 32, 1, 16) for _ in range(3))

    def everything(b, h, q_idx, kv_idx):
        return q_idx >= 0
    block_mask = flashtile.create_block_mask(everything, 1, 1, 32, 32, block_size=(16, 16), device="cpu")
    with pytest.raises(ValueError, match="is not the mask block_mask was built from"):
        flashtile.attention(q, k, v, mask_mod=flashtile.causal_mask, block_mask=block_mask)
    causal = flashtile.create_block_mask(flashtile.causal_mask, 1, 1, 32, 32, block_size=(16, 16), device="cpu")
    torch.testing.assert_close(flashtile.attention(q, k, v, mask_mod=flashtile.causal_mask, block_mask=causal),
                               flashtile.attention(q, k, v, block_mask=causal), rtol=0, atol=0)
    ids = torch.arange(32) // 10
    docs = flashtile.create_block_mask(flashtile.document_mask(ids), 1, 1, 32, 32, block_size=(16, 16), device="cpu")
    flashtile.attention(q, k, v, mask_mod=flashtile.document_mask(ids), block_mask=docs)  # the same ids: the same mask


def test_document_ids_must_cover_the_inputs():
    """The kernels read doc_ids at every query / key position (and batch row) unchecked."""
    q, k, v = (torch.randn(2, 32, 1, 16) for _ in range(3))
    with pytest.raises(ValueError, match="doc_ids covers 16 positions but the inputs have 32 queries"):
        flashtile.attention(q, k, v, mask_mod=flashtile.document_mask(torch.zeros(16, dtype=torch.long)))
    short = flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(torch.zeros(16, dtype=torch.long)))
    with pytest.raises(ValueError, match="covers 16 positions"):
        flashtile.attention(q, k, v, mask_mod=short)
    with pytest.raises(ValueError, match="doc_ids has 1 rows but the inputs have batch 2"):
        flashtile.attention(q, k, v, mask_mod=flashtile.document_mask(torch.zeros(1, 32, dtype=torch.long)))
    flashtile.attention(q, k, v, mask_mod=flashtile.document_mask(torch.zeros(2, 32, dtype=torch.long)))


def test_padding_helpers():
    x, mask = torch.randn(2, 4, 3), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    with pytest.raises(TypeError, match="attention_mask must be a torch.Tensor, got list"):
        flashtile.unpad_input(x, mask.tolist())
    with pytest.raises(ValueError, match="batch 0"):
        flashtile.unpad_input(x[:0], mask[:0])
    with pytest.raises(ValueError, match="hidden_states must have at least 2 dimensions"):
        flashtile.unpad_input(torch.randn(5), mask[0])
    u, indices, *_ = flashtile.unpad_input(x, mask)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, batch \* seqlen\) = \[0, 8\), got \[0, 10\]"):
        flashtile.pad_input(u, torch.tensor([0, 1, 4, 5, 10]), 2, 4)
    with pytest.raises(ValueError, match="indices has 5 entries but hidden_states has 4 rows"):
        flashtile.pad_input(u[:-1], indices, 2, 4)
    with pytest.raises(ValueError, match="indices must be a 1-D int64 or int32 tensor"):
        flashtile.pad_input(u, indices.float(), 2, 4)
    with pytest.raises(ValueError, match="seqlen must be an int >= 0"):
        flashtile.pad_input(u, indices, 2, 4.0)
    torch.testing.assert_close(flashtile.pad_input(u, indices, 2, 4), x * mask[..., None])
    torch.testing.assert_close(flashtile.pad_input(u, indices.int(), 2, 4), x * mask[..., None])
