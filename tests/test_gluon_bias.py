"""An additive bias in the Hopper Gluon forward: which layouts it reads by TMA, its launch arguments and dispatch on
CPU, then on sm90 (GPU tier) against the float64 reference, rows a bias masks out, and flash_attn_func's routing."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants
from gluon_fwd_utils import ON_HOPPER, _check_gluon_forward, _cu, _packed, sink_logits
from utils import alibi_slopes, assert_close_rule, make_qkv, record_calls


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_bias_support_rule(as_if_hopper):
    """fp16 / bf16 biases (B or 1, Hq or 1, Sq, Sk) with a contiguous last dim and 16-byte row strides go to Gluon
    (size-1 and expanded batch / head dims read the first one's rows); fp32, a broadcast query or key dim, a
    strided last dim, unaligned rows, dropout and biases on another device are refused (the portable kernel)."""
    batch, seqlen_q, seqlen_k, heads_q = 2, 300, 1000, 4
    q = torch.zeros(batch, seqlen_q, heads_q, 128, dtype=torch.bfloat16)
    k = torch.zeros(batch, seqlen_k, 2, 128, dtype=torch.bfloat16)

    def ok(bias, **kw):
        return gluon_launch.gluon_supported(q, k, k, attn_bias=bias, **kw)

    bf16 = dict(dtype=torch.bfloat16)
    for shape in ((1, heads_q, seqlen_q, seqlen_k), (batch, 1, seqlen_q, seqlen_k),
                  (batch, heads_q, seqlen_q, seqlen_k), (1, 1, seqlen_q, seqlen_k)):
        assert ok(torch.zeros(shape, **bf16)), shape
        assert ok(torch.zeros(shape, **bf16), causal=True, softcap=30.0, window_size=(64, 0)), shape
    assert ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, dtype=torch.float16))  # fp16 bias, bf16 q
    assert ok(torch.zeros(1, 1, seqlen_q, seqlen_k, **bf16).expand(batch, heads_q, -1, -1))  # stride-0 dims
    assert ok(torch.zeros(batch, heads_q, seqlen_q, 1008, **bf16)[..., :seqlen_k])  # padded rows
    assert ok(torch.zeros(heads_q, batch, seqlen_q, seqlen_k, **bf16).transpose(0, 1))  # heads outermost
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k))  # fp32: no room for its ring
    assert not ok(torch.zeros(1, heads_q, 1, seqlen_k, **bf16))  # Sq broadcast
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, **bf16)[:, :, :1].expand(-1, -1, seqlen_q, -1))
    assert not ok(torch.zeros(1, heads_q, seqlen_q, 1, **bf16))  # Sk broadcast
    assert not ok(torch.zeros(1, heads_q, seqlen_k, seqlen_q, **bf16).transpose(2, 3))  # last dim not contiguous
    assert not ok(torch.zeros(1, heads_q, seqlen_q, 1004, **bf16)[..., :seqlen_k])  # row stride 2008 B
    n = heads_q * seqlen_q * seqlen_k
    assert not ok(torch.zeros(n + 8, **bf16)[1:n + 1].view(1, heads_q, seqlen_q, seqlen_k))  # base 2 B off
    assert ok(torch.zeros(1, heads_q, seqlen_q + 1, seqlen_k, **bf16)[:, :, :seqlen_q])  # heads 301 rows apart
    head_stride = seqlen_q * seqlen_k + 8  # not a whole number of rows
    assert not ok(torch.zeros(heads_q * head_stride, **bf16).as_strided((1, heads_q, seqlen_q, seqlen_k),
                                                                        (0, head_stride, seqlen_k, 1)))
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, **bf16), dropout_p=0.1)
    assert not ok(torch.zeros(1, heads_q, seqlen_q, seqlen_k, device="meta", **bf16))
    # Varlen: (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k), positions within each sequence.
    lens_q, lens_k = [5, 0, 130, 1], [7, 3, 0, 1000]
    qv, kv, vv = _packed(lens_q, lens_k, 4, 2, 128)
    varlen = dict(cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k), max_seqlen_q=130, max_seqlen_k=1000)
    assert gluon_launch.gluon_supported(qv, kv, vv, attn_bias=torch.zeros(4, 4, 130, 1000, **bf16), **varlen)
    assert not gluon_launch.gluon_supported(qv, kv, vv, attn_bias=torch.zeros(4, 4, 1, 1000, **bf16), **varlen)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_bias_launch_args():
    """The bias's 2-D TMA view: (rows, Sk) at its row stride, boxes [128, BLOCK_N], and the rows one batch / head
    steps (0 along broadcast dims); HAS_BIAS on, and the persistent kernel not taken."""
    config = gluon_variants.VARIANTS["default"][128]
    q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 1000, 2, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 300)
    padded = torch.empty(2, 4, 300, 1008, dtype=torch.bfloat16)[..., :1000]
    for bias, rows, steps in ((padded, 2 * 4 * 300, (1200, 300)),
                              (torch.empty(1, 4, 300, 1000, dtype=torch.float16), 4 * 300, (0, 300)),
                              (torch.empty(2, 1, 300, 1000, dtype=torch.bfloat16), 2 * 300, (300, 0)),
                              (torch.empty(1, 1, 300, 1000, dtype=torch.bfloat16).expand(2, 4, -1, -1), 300, (0, 0))):
        _, args, constexprs, _ = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, False, config,
                                                                attn_bias=bias)
        args = args[:-17]  # the block-sparse arguments (None) and dropout's three last
        desc = args[-4]
        assert constexprs["HAS_BIAS"] and args[-3:-1] == steps and args[-1] == 0.125
        assert desc.shape == [rows, 1000] and desc.strides == [bias.stride(2), 1]
        assert desc.block_shape == [128, config.block_n] and desc.base is bias
    _, args, constexprs, _ = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.125, False, config)
    assert not constexprs["HAS_BIAS"] and args[-21] is lse
    persistent = gluon_variants.VARIANTS["persistent"][128]
    assert gluon_launch.takes_persistent(persistent, q, q)
    assert not gluon_launch.takes_persistent(persistent, q, q, attn_bias=torch.empty(1, 4, 300, 300))


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_batch_fast_order_only_for_a_bias_the_batch_shares():
    """GluonConfig.batch_fast_bias sets BATCH_FAST where the bias steps 0 rows per batch row (a (1, H, Sq, Sk) bias,
    or one expanded along the batch) and the batch has more than one row; not for a per-batch bias, batch 1, no bias,
    or a config without it."""
    fast_config, by_head = gluon_variants.VARIANTS["default"][128], gluon_variants.VARIANTS["default-bias-by-head"][128]
    q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 300)
    shared = torch.empty(1, 4, 300, 304, dtype=torch.bfloat16)[..., :300]
    per_batch = torch.empty(2, 1, 300, 304, dtype=torch.bfloat16)[..., :300]

    def fast(config, bias, q=q, out=out, lse=lse, causal=False):
        return gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.1, causal, config, attn_bias=bias)[2].get(
            "BATCH_FAST", False)

    assert fast(fast_config, shared) and fast(fast_config, shared, causal=True)
    assert fast(fast_config, shared[:, :1].expand(2, 4, -1, -1))
    assert not fast(fast_config, per_batch) and not fast(fast_config, None) and not fast(by_head, shared)
    assert not fast(fast_config, shared, q[:1], out[:1], lse[:1])


def test_bias_dispatch(monkeypatch, as_if_hopper):
    """launch._flash_attn_forward hands a bias the Gluon forward reads to it (FLASHTILE_GLUON=1 here), and keeps
    refused layouts (fp32) and dropout on the portable kernels."""
    from flashtile import launch

    calls = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(kw) or ("out", "lse"))
    monkeypatch.setattr(launch, "forward_launches", lambda *a, **kw: calls.append("portable") or [])
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    q = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    bias = torch.zeros(1, 2, 256, 256, dtype=torch.bfloat16)
    assert launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None, attn_bias=bias) == ("out", "lse")
    assert calls[-1]["attn_bias"] is bias
    launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None, attn_bias=bias.float())
    assert calls[-1] == "portable"
    assert launch._flash_attn_forward(q, q, q, 0.1, -1, -1, 0.0, None, None) == ("out", "lse")
    assert "attn_bias" not in calls[-1]


# (id, bias shape as (batch or 1, heads or 1), bias dtype, causal, window_size, softcap, alibi, sink)
BIAS_CASES = [
    ("h", (1, "h"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("b", ("b", 1), torch.bfloat16, True, (-1, -1), 0.0, None, False),
    ("bh", ("b", "h"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("bh-fp16-bias", ("b", "h"), torch.float16, True, (-1, -1), 0.0, None, False),
    ("expanded", ("B", "H"), torch.bfloat16, False, (-1, -1), 0.0, None, False),
    ("h-softcap-alibi", (1, "h"), torch.bfloat16, False, (-1, -1), 30.0, "h", False),
    ("bh-window-sink", ("b", "h"), torch.bfloat16, False, (200, 100), 0.0, None, True),
    ("h-causal-alibi-softcap-sink", (1, "h"), torch.bfloat16, True, (-1, -1), 30.0, "bh", True),
]


def _bias(batch, heads, seqlen_q, seqlen_k, layout, dtype, seed=3):
    """A bias N(0, 2) of layout (batch or 1, heads or 1) ("B", "H": one (1, 1) bias expanded, stride 0), rows padded
    to a multiple of 8 keys, on cuda."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    padded = -(-seqlen_k // 8) * 8  # 16-byte rows, as TMA needs
    if layout == ("B", "H"):
        return (2 * torch.randn(1, 1, seqlen_q, padded, generator=gen, device="cuda")).to(dtype)[..., :seqlen_k].expand(
            batch, heads, -1, -1)
    b, h = batch if layout[0] == "b" else 1, heads if layout[1] == "h" else 1
    return (2 * torch.randn(b, h, seqlen_q, padded, generator=gen, device="cuda")).to(dtype)[..., :seqlen_k]


# Every case at D128 on three shapes (tails and q != k; GQA; a ragged batch), two at D64 / D256: each feature
# combination and head dim is another compile, and the GPU tier is near its time limit (perf-log).
BIAS_SHAPES = [(1, 1000, 1000, 4, 2), (1, 130, 257, 2, 2), (2, 300, 1000, 4, 2)]
BIAS_MATRIX = [(c, s, 128) for c in BIAS_CASES for s in BIAS_SHAPES] + [
    (c, BIAS_SHAPES[0], d) for c in (BIAS_CASES[1], BIAS_CASES[5]) for d in (64, 256)]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("case,shape,head_dim", BIAS_MATRIX, ids=[
    f"{c[0]}-b{b}-q{sq}-k{sk}-h{hq}/{hk}-d{d}" for c, (b, sq, sk, hq, hk), d in BIAS_MATRIX])
def test_bias_matches_reference(monkeypatch, case, shape, head_dim):
    """An additive bias (HAS_BIAS: TMA-loaded ring beside K / V), alone and with causal, windows, softcap, ALiBi
    and sinks, against the float64 reference; outputs NaN-poisoned. Rows of a tile past Sq read the next head's
    bias rows and are never stored."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, layout, bias_dtype, causal, window_size, softcap, alibi, sink = case
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    if (causal or window_size[1] >= 0) and seqlen_q - seqlen_k > (0 if causal else window_size[1]):
        pytest.skip("rows without keys: the portable kernel's")
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, "cuda",
                       requires_grad=False)
    feats = dict(window_size=window_size, softcap=softcap,
                 sink=sink_logits(heads_q) if sink else None,
                 alibi_slopes=alibi_slopes(heads_q, batch if alibi == "bh" else None) if alibi else None,
                 attn_bias=_bias(batch, heads_q, seqlen_q, seqlen_k, layout, bias_dtype))
    _check_gluon_forward(q, k, v, causal, feats)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("variant,head_dim", [("default", 128), ("default-lr", 128), ("default", 256)],
                         ids=["d128", "d128-lazy", "d256-lazy"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("with_sink", [False, True], ids=["no-sink", "sink"])
def test_bias_rows_without_keys_and_the_next_heads_rows(monkeypatch, with_sink, causal, variant, head_dim):
    """A bias of -inf on every key of some rows (a mask as a bias): those rows get 0 and lse -inf, as the portable
    kernel writes them, also where the rows of a tile past Sq read them (head 1's first rows, read by head 0's last
    tile); NaN in the storage's key columns past Sk (row padding) is never read (TMA zero-fills past the view). With
    the lazy rescale (D256's default, "default-lr") a row's max stays -inf until it sees a key. Rows 100-139 of head 0
    see no key in the first blocks, then keys: with a sink of -inf on head 0 (its sink turned off) their max is -inf
    there as without a sink (session 51: that gave NaN); head 1's finite sink gives its rows without keys lse = sink."""
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    q, k, v = make_qkv(1, 300, 1000, 2, 2, head_dim, torch.bfloat16, "cuda", requires_grad=False)
    storage = torch.randn(1, 2, 300, 1008, device="cuda").to(torch.bfloat16)
    storage[..., 1000:] = float("nan")  # past Sk
    bias = storage[..., :1000]
    bias[0, 0, 10] = float("-inf")  # row 10 of head 0 sees no key
    bias[0, 0, 100:140, :400] = float("-inf")  # rows that see no key in the first blocks
    bias[0, 1, :45] = float("-inf")  # head 1's first rows: what the tile rows past Sq of head 0 read
    bias[0, 1, 200, 500:] = float("-inf")  # a row that sees only the first 500 keys
    sink = torch.tensor([float("-inf"), 0.3], device="cuda") if with_sink else None
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, attn_bias=bias, sink=sink)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, attn_bias=bias, sink=sink, variant=variant)
    clean = bias.contiguous()
    ref, lse_ref = flashtile.attention_ref(q, k, v, causal=causal, return_lse=True, attn_bias=clean, sink=sink)
    assert torch.all(out[0, 10, 0] == 0) and lse[0, 0, 10] == float("-inf")
    assert torch.all(out[0, :45, 1] == 0)
    assert torch.all(lse[0, 1, :45] == (0.3 if with_sink else float("-inf")))
    lse_ref = torch.where(torch.isnan(lse_ref), float("-inf"), lse_ref)
    assert_close_rule("out", out, ref.nan_to_num(0.0),
                      flashtile.attention_ref(q, k, v, causal=causal, upcast=False, attn_bias=clean,
                                              sink=sink).nan_to_num(0.0),
                      torch.bfloat16)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("head_dim,causal,layout", [(128, False, (1, "h")), (128, True, (1, "h")),
                                                     (64, False, ("B", "H")), (256, True, (1, "h"))])
def test_batch_fast_order_gives_the_same_bits(head_dim, causal, layout):
    """BATCH_FAST only renumbers the programs: with a bias the batch shares, "default" writes the same bits as the
    grid by head ("default-bias-by-head"; "default" is checked against the reference above), dense (D128 causal:
    with LPT_HEADS's groups) and varlen (a padded (1, H, max_q, max_k) bias), batch 3 with a tail tile."""
    batch, seqlen_q, seqlen_k, heads = 3, 300, 1000, 4
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, 2, head_dim, torch.bfloat16, "cuda", requires_grad=False)
    bias = _bias(batch, heads, seqlen_q, seqlen_k, layout, torch.bfloat16)
    runs = [gluon_launch.gluon_forward(q, k, v, causal=causal, attn_bias=bias, variant=variant)
            for variant in ("default-bias-by-head", "default")]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    seqlens_q, seqlens_k = [300, 0, 129], [1000, 5, 700]
    pq, pk, pv = _packed(seqlens_q, seqlens_k, heads, 2, head_dim, device="cuda")
    cu_q, cu_k = _cu(seqlens_q, "cuda"), _cu(seqlens_k, "cuda")
    runs = [gluon_launch.gluon_forward(pq, pk, pv, causal=causal, attn_bias=bias, variant=variant,
                                       cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=300, max_seqlen_k=1000)
            for variant in ("default-bias-by-head", "default")]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_flash_attn_func_bias_takes_gluon(monkeypatch):
    """flash_attn_func routes a bf16 bias to the Gluon forward (D128 1K: configs.py wants it) and the portable
    backward (dq, dk, dv, dbias) runs on its out / lse; an fp32 bias stays on the portable forward."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    q, k, v = make_qkv(2, 1024, 1024, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    bias = _bias(2, 4, 1024, 1024, (1, "h"), torch.bfloat16).requires_grad_()
    out = flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v, bias), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=1e-2)
    monkeypatch.delenv("FLASHTILE_GLUON")
    flashtile.flash_attn_func(q, k, v, causal=True, attn_bias=bias.detach().float())
    assert len(calls) == 1
