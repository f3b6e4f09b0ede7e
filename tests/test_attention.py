"""Forward and backward against the float64 reference, through the Triton kernels and the CPU path."""
import pytest
import torch

import flashtile
from flashtile import bwd_launch, configs
from conftest import DEVICE
from utils import assert_close_rule, make_qkv, references

FAST_DTYPES = [torch.float16, torch.float32]  # the interpreter has no bf16 arithmetic


def run_and_check(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, device,
                  softmax_scale=None, **features):
    """Forward, gradients and lse against the float64 reference; features go to both (window_size, ...)."""
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                            return_attn_probs=True, **features)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device=device)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    ref64, ref_lowp = references(q, k, v, dout, causal, softmax_scale, **features)
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), ref64, ref_lowp):
        assert got.shape == r64.shape
        assert_close_rule(name, got, r64, rlow, dtype)
    _check_lse(q, k, lse, causal, softmax_scale, **features)


def _check_lse(q, k, lse, causal, softmax_scale, **features):
    _, lse_ref = flashtile.attention_ref(q.detach(), k.detach(), k.detach(), causal=causal,
                                         softmax_scale=softmax_scale, return_lse=True, **features)
    empty = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "lse must be -inf exactly for rows that see no key"
    torch.testing.assert_close(lse[~empty].double(), lse_ref[~empty].double(), atol=2e-3, rtol=1e-4)


SEQLEN_PAIRS = [(1, 1), (1, 17), (17, 1), (17, 17), (64, 64), (113, 203), (128, 128), (255, 256), (256, 64),
                (1000, 1000)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLEN_PAIRS, ids=[f"q{a}-k{b}" for a, b in SEQLEN_PAIRS])
def test_seqlens(backend, seqlen_q, seqlen_k, causal):
    _, device = backend
    run_and_check(1, seqlen_q, seqlen_k, 2, 2, 32, causal, torch.float16, device)


HEAD_DIMS = [8, 40, 64, 72, 96, 128, 160, 192, 256]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"d{d}" for d in HEAD_DIMS])
def test_head_dims(backend, head_dim, causal):
    _, device = backend
    run_and_check(1, 67, 45, 2, 1, head_dim, causal, torch.float16, device)


@pytest.mark.parametrize("head_dim", [1, 12, 36])
def test_head_dims_padded_to_a_multiple_of_8(backend, head_dim):
    """Head dims that are not a multiple of 8 are zero-padded, as flash-attn does: out keeps q's head dim, the
    default scale is 1 / sqrt(head_dim) of the unpadded one, and gradients come back in the unpadded shapes; the
    varlen and packed entry points too."""
    _, device = backend
    run_and_check(1, 33, 20, 2, 1, head_dim, True, torch.float16, device, window_size=(8, -1))
    q, k, v = make_qkv(1, 20, 20, 2, 2, head_dim, torch.float32, device)
    qkv = torch.stack([q, k, v], dim=2).detach().requires_grad_()
    packed = flashtile.flash_attn_qkvpacked_func(qkv, causal=True)
    want = flashtile.attention_ref(*qkv.detach().double().unbind(2), causal=True)
    assert packed.shape == q.shape
    torch.testing.assert_close(packed.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.autograd.grad(packed.sum(), qkv)[0].shape == qkv.shape
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=device)
    out = flashtile.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 13, 13, causal=True)
    for b, (lo, hi) in enumerate(((0, 7), (7, 20))):
        alone = flashtile.attention_ref(*(t[:, lo:hi].detach().double() for t in (q, k, v)), causal=True)
        torch.testing.assert_close(out[lo:hi].double(), alone[0], atol=1e-5, rtol=1e-5)


HEADS = [(4, 4), (4, 2), (6, 1)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads_q,heads_kv", HEADS, ids=["mha", "gqa", "mqa"])
def test_heads(backend, heads_q, heads_kv, causal):
    _, device = backend
    run_and_check(2, 70, 90, heads_q, heads_kv, 64, causal, torch.float16, device)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", FAST_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_dtypes_and_scale(backend, dtype, causal):
    _, device = backend
    run_and_check(2, 97, 131, 4, 2, 48, causal, dtype, device, softmax_scale=0.3)


def test_bf16_cpu_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    run_and_check(1, 50, 70, 2, 1, 64, True, torch.bfloat16, "cpu")


def test_noncontiguous_inputs(backend):
    """Strided views (e.g. slices of a fused projection) with a unit last stride are read in place."""
    _, device = backend
    gen = torch.Generator().manual_seed(3)
    fused = torch.randn(2, 75, 3 * 4, 40, generator=gen).to(device=device, dtype=torch.float16)
    q, k, v = [x.detach().requires_grad_() for x in fused.split(4, dim=2)]
    assert not q.is_contiguous()
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn(out.shape, generator=gen).to(device=device, dtype=torch.float16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref64, ref_lowp = references(q, k, v, dout, True)
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, *grads), ref64, ref_lowp):
        assert_close_rule(name, got, r64, rlow, torch.float16)


def test_transposed_dout(backend):
    """A gradient with a non-unit last stride reaches the backward correctly."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 40, 2, 2, 32, torch.float32, device)
    out = flashtile.flash_attn_func(q, k, v)
    dout = torch.randn(1, 40, 32, 2, device=device).transpose(-1, -2)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref64, ref_lowp = references(q, k, v, dout, False)
    for name, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64[1:], ref_lowp[1:]):
        assert_close_rule(name, got, r64, rlow, torch.float32)


def test_lse_gradient(backend):
    """Gradients flowing into the returned lse are exact too (dS gains P * dlse)."""
    _, device = backend
    q, k, v = make_qkv(1, 33, 47, 2, 1, 16, torch.float32, device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    w = torch.randn(lse.shape, device=device)
    loss = out.sum() + (lse * w).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out_r, lse_r = flashtile.attention_ref(*leaves, causal=True, return_lse=True)
    ref = torch.autograd.grad(out_r.sum() + (lse_r * w.double()).sum(), leaves)
    for got, r in zip(grads, ref):
        torch.testing.assert_close(got.double(), r, atol=1e-4, rtol=1e-4)


def test_autocast_and_default_dtype_change_nothing(backend):
    """fp32 inputs under torch.autocast(bf16) or after torch.set_default_dtype(float64): the same bits as without, and
    lse stays fp32 (the CPU path's matmuls were cast down by autocast, its buffers took the default dtype)."""
    _, device = backend
    q, k, v = make_qkv(2, 33, 47, 4, 2, 16, torch.float32, device)
    sink = torch.randn(4, device=device, requires_grad=True)
    cu_q, cu_k = (torch.tensor([0, n, 2 * n], dtype=torch.int32, device=device) for n in (33, 47))
    cache = torch.zeros(2, 64, 2, 16, device=device)

    def run():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, sink=sink, return_attn_probs=True)
        grads = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v, sink))
        varlen = flashtile.flash_attn_varlen_func(q.reshape(-1, 4, 16), k.reshape(-1, 2, 16), v.reshape(-1, 2, 16),
                                                  cu_q, cu_k, 33, 47, return_attn_probs=True)[:2]
        decode = flashtile.flash_attn_with_kvcache(q[:, :1].detach(), cache.clone(), cache.clone(), k[:, :5].detach(),
                                                   v[:, :5].detach(), cache_seqlens=3, return_softmax_lse=True)
        return out, lse, *grads, *varlen, *decode

    want = run()
    assert all(t.dtype == torch.float32 for t in want)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        under_autocast = run()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with_float64_default = run()
    finally:
        torch.set_default_dtype(default)
    for got in (under_autocast, with_float64_default):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_empty_rows_give_zero(backend):
    """Causal with Sq > Sk: the first Sq - Sk rows see no key, so out is 0, lse is -inf and grads are finite."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 8, 2, 2, 16, torch.float32, device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[:, :32] == 0)
    assert torch.all(lse[:, :, :32] == float("-inf"))
    assert torch.all(torch.isfinite(lse[:, :, 32:]))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][:, :32] == 0)


def test_packed_variants(backend):
    _, device = backend
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 50, 3, 2, 32, generator=gen).to(device).requires_grad_()
    q, k, v = qkv.unbind(2)
    out = flashtile.flash_attn_qkvpacked_func(qkv, causal=True)
    assert_close_rule("qkvpacked", out, flashtile.attention_ref(q, k, v, causal=True),
                      flashtile.attention_ref(q, k, v, causal=True, upcast=False), torch.float32)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()

    qq = torch.randn(2, 30, 4, 32, generator=gen).to(device)
    kv = torch.randn(2, 50, 2, 2, 32, generator=gen).to(device)
    out = flashtile.flash_attn_kvpacked_func(qq, kv)
    ref = flashtile.attention_ref(qq, kv[:, :, 0], kv[:, :, 1])
    assert_close_rule("kvpacked", out, ref, flashtile.attention_ref(qq, kv[:, :, 0], kv[:, :, 1], upcast=False),
                      torch.float32)



def test_packed_variants_pass_attn_bias(backend):
    """Every packed entry point forwards attn_bias (and its gradient) like the unpacked one."""
    _, device = backend
    gen = torch.Generator().manual_seed(6)
    qkv = torch.randn(2, 20, 3, 2, 16, generator=gen).to(device)
    bias = torch.randn(1, 2, 20, 20, generator=gen).to(device).requires_grad_()
    q, k, v = qkv.unbind(2)
    want = flashtile.flash_attn_func(q, k, v, attn_bias=bias)
    (want_grad,) = torch.autograd.grad(want.sum(), bias)
    for out in (flashtile.flash_attn_qkvpacked_func(qkv, attn_bias=bias),
                flashtile.flash_attn_kvpacked_func(q, qkv[:, :, 1:], attn_bias=bias)):
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), bias)[0], want_grad, rtol=0, atol=0)
    flat, c = qkv.reshape(40, 3, 2, 16), torch.tensor([0, 20, 40], dtype=torch.int32, device=device)
    for out in (flashtile.flash_attn_varlen_qkvpacked_func(flat, c, 20, attn_bias=bias),
                flashtile.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], c, c, 20, 20, attn_bias=bias)):
        torch.testing.assert_close(out.reshape(2, 20, 2, 16), want, rtol=0, atol=0)

def test_custom_op_matches_api(backend):
    """torch.ops.flashtile.fwd is differentiable on its own (autograd registered on the op)."""
    _, device = backend
    q, k, v = make_qkv(1, 20, 20, 2, 2, 16, torch.float32, device)
    out, lse = torch.ops.flashtile.fwd(q, k, v, 0.25, -1, 0, 0.0, None, None, None, None, 0, 0, None)  # causal
    assert torch.equal(out, flashtile.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True))
    assert torch.autograd.grad(out.sum(), q)[0].shape == q.shape


def test_eager_calls_skip_the_op_dispatch(backend, monkeypatch):
    """In eager mode the API calls the ops' implementations directly (ops.call), with the same autograd:
    gradients through the API equal those through torch.ops.flashtile.fwd (the registered autograd)."""
    from flashtile import ops

    _, device = backend
    q, k, v = make_qkv(1, 20, 30, 2, 1, 16, torch.float32, device)
    calls = []
    for op in (ops.fwd, ops.bwd):
        impl = ops._IMPLS[op]
        monkeypatch.setitem(ops._IMPLS, op, lambda *a, impl=impl, name=op._name: calls.append(name) or impl(*a))
    out = flashtile.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True)
    got = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert calls == ["fwd", "bwd"]
    ref, _ = torch.ops.flashtile.fwd(q, k, v, 0.25, -1, 0, 0.0, None, None, None, None, 0, 0, None)
    for a, b in zip(got, torch.autograd.grad(ref, (q, k, v), torch.ones_like(ref))):
        assert torch.equal(a, b)


def test_autograd_watches_every_float_tensor_input():
    """autograd.forward reads requires_grad only at _FLOAT_TENSOR_INPUTS (host time): they must be every tensor
    parameter of flashtile::fwd but the integer ones (cu_seqlens, the dropout seed), or a gradient would be lost."""
    import inspect

    from flashtile import autograd, ops

    params = list(inspect.signature(ops._IMPLS[ops.fwd]).parameters.values())
    tensors = {i for i, p in enumerate(params) if "Tensor" in str(p.annotation)}
    integer = {i for i, p in enumerate(params) if p.name in ("cu_seqlens_q", "cu_seqlens_k", "rng")}
    assert len(integer) == 3 and tensors - integer == set(autograd._FLOAT_TENSOR_INPUTS)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_torch_compile_fullgraph(monkeypatch, layout):
    """flash_attn_func inside torch.compile(fullgraph=True): no graph break, same values, gradients; also for a q
    whose (seqlen, heads) dims are transposed in memory (the CPU path once returned q's layout where the fake
    implementations promise contiguous outputs: inductor's stride check failed)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the compile test does not need the slow interpreter

    def layer(q, k, v):
        if layout == "transposed":
            q = q.transpose(1, 2)  # made (B, H, S, D), viewed as (B, S, H, D)
        return flashtile.flash_attn_func(q * 2, k, v, causal=True).float().square().sum()

    q, k, v = make_qkv(1, 64, 64, 2, 1, 32, torch.float32, "cpu")
    if layout == "transposed":
        q = q.detach().transpose(1, 2).contiguous().requires_grad_()
    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v))
    want = layer(q, k, v)
    want_grads = torch.autograd.grad(want, (q, k, v))
    torch.testing.assert_close(got, want)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


def test_torch_compile_dynamic_shapes(monkeypatch):
    """torch.compile(fullgraph=True, dynamic=True) traces the checked calls too: float arguments left at their
    defaults become symbolic floats there, which math.isfinite could not take (checks._finite)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = make_qkv(2, 8, 8, 4, 2, 16, torch.float32, "cpu", requires_grad=False)
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    calls = [lambda q, k, v: flashtile.flash_attn_func(q, k, v, window_size=(4, 0)),
             lambda q, k, v: flashtile.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu,
                                                              cu, 11, 11, softmax_scale=0.3)]
    for call in calls:
        torch._dynamo.reset()
        got = torch.compile(call, fullgraph=True, dynamic=True, backend="aot_eager")(q, k, v)
        torch.testing.assert_close(got, call(q, k, v), rtol=0, atol=0)


def test_outputs_are_contiguous_whatever_the_input_layout(backend):
    """out, lse and the gradients are contiguous tensors of their own for inputs laid out otherwise (as the fake
    implementations say they are), on every path: dense, varlen and KV cache."""
    _, device = backend
    q, k, v = make_qkv(2, 24, 24, 4, 2, 16, torch.float32, device, requires_grad=False)
    q = q.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # (B, S, H, D) with H outermost
    k, v = k.requires_grad_(), v.requires_grad_()
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for t in (out, lse, *grads):
        assert t.is_contiguous() and t._base is None
    qp = q.detach()[0].transpose(0, 1).contiguous().transpose(0, 1)  # packed (total, H, D), H outermost
    cu = torch.tensor([0, 10, 24], dtype=torch.int32, device=device)
    out, lse, _ = flashtile.flash_attn_varlen_func(qp, k.detach()[0], v.detach()[0], cu, cu, 14, 14,
                                                   return_attn_probs=True)
    assert out.is_contiguous() and lse.is_contiguous()
    out, lse = flashtile.flash_attn_with_kvcache(q.detach(), k.detach(), v.detach(), cache_seqlens=20,
                                                 return_softmax_lse=True)
    assert out.is_contiguous() and lse.is_contiguous()


@pytest.mark.skipif(DEVICE != "cpu", reason="checks the CPU path's memory")
def test_cpu_path_memory_is_linear(monkeypatch):
    """The CPU path never builds an (Sq, Sk) matrix: 4K tokens run in far less than 4K^2 floats."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    import flashtile.cpu as cpu_impl

    seen = []
    real_exp = torch.exp

    def spy_exp(x, *args, **kwargs):
        seen.append(x.numel())
        return real_exp(x, *args, **kwargs)

    monkeypatch.setattr(cpu_impl.torch, "exp", spy_exp)
    q, k, v = make_qkv(1, 4096, 4096, 1, 1, 16, torch.float32, "cpu")
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    torch.autograd.grad(out.sum(), (q, k, v))
    assert max(seen) <= cpu_impl.BLOCK_M * cpu_impl.BLOCK_N


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal): the D256 dK/dV variants (configs.
# D256_BWD_VARIANTS) forced on. Two batches with ragged lengths: a descriptor tile running past a sequence reads
# the next batch's rows, which must be discarded; GQA runs the group loop; D200 pads to 256, where the launcher
# builds no descriptor and the default loads run. "dv-dk" runs the dK/dV kernel twice (PART 1 then 2).
D256_VARIANT_CASES = [(2, 45, 70, 4, 2, 256, True), (2, 33, 40, 2, 2, 256, False), (1, 17, 40, 2, 1, 200, True),
                      (1, 70, 33, 3, 1, 256, True), (1, 50, 50, 2, 1, 200, False)]  # q > k causal, MQA; D200 full


@pytest.mark.parametrize("variant", sorted(configs.D256_BWD_VARIANTS))
@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,heads_q,heads_kv,head_dim,causal", D256_VARIANT_CASES,
                         ids=[f"b{c[0]}-q{c[1]}-k{c[2]}-h{c[3]}x{c[4]}-d{c[5]}-{'causal' if c[6] else 'full'}"
                              for c in D256_VARIANT_CASES])
def test_d256_bwd_variants(monkeypatch, variant, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal):
    monkeypatch.setattr(configs, "D256_BWD", variant)
    built = []
    make = bwd_launch._dkdv_descriptors
    monkeypatch.setattr(bwd_launch, "_dkdv_descriptors", lambda *a: built.append(make(*a)) or built[-1])
    run_and_check(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, torch.float16, DEVICE)
    chosen = configs.D256_BWD_VARIANTS[variant][0]
    if chosen.dkdv_variant == "desc":
        # One descriptor pair per dK/dV launch: two where dV and dK run apart ("dv-dk").
        assert len(built) == (2 if chosen.dkdv_split == "dv-dk" else 1)
        assert all((d is not None) == (head_dim == 256) for d in built)
    else:
        assert not built  # the pointer tiles build no descriptor


@pytest.mark.parametrize("used", ["out", "lse"])
def test_unused_output_gets_no_materialized_gradient(used, backend):
    """The forward's autograd Function leaves an unused output's gradient None (no zero-filled dlse per backward);
    the backward gives what an explicit zero gradient gives."""
    _, device = backend
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 33, 2, 16, device=device, requires_grad=True) for _ in range(3))

    def grads(explicit_zero):
        out, lse, _ = flashtile.flash_attn_func(q, k, v, return_attn_probs=True)
        loss = out.sum() if used == "out" else lse.sum()
        if explicit_zero:
            loss = loss + (lse if used == "out" else out).sum() * 0
        return torch.autograd.grad(loss, (q, k, v))

    for a, b in zip(grads(False), grads(True)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)
