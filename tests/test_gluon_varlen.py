"""Varlen in the Hopper Gluon forward: the support rule, launch arguments, ragged descriptors and dispatch on CPU,
then packed sequences against the float64 reference and flash_attn_varlen_func's routing on sm90 (GPU tier)."""
import pytest
import torch

import flashtile
from flashtile import gluon_launch, gluon_variants
from gluon_fwd_utils import ON_HOPPER, _cu, _packed
from utils import assert_varlen_matches_each_sequence, record_calls


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_varlen_support_rule(as_if_hopper):
    lens_q, lens_k = [5, 0, 130, 1], [7, 3, 0, 1]
    q, k, v = _packed(lens_q, lens_k, 4, 2, 128)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=130, max_seqlen_k=7)
    assert gluon_launch.gluon_supported(q, k, v, **varlen)
    assert gluon_launch.gluon_supported(q, k, v, causal=True, **varlen)  # rows without keys: handled in the kernel
    assert gluon_launch.gluon_supported(q, k, v, window_size=(8, 0), softcap=5.0, sink=torch.zeros(4), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, **varlen)  # no seed
    assert gluon_launch.gluon_supported(q, k, v, dropout_p=0.1, rng=torch.zeros(1, dtype=torch.int64), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, block_table=torch.zeros(4, 1, dtype=torch.int32), **varlen)
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, cu_seqlens_q=cu_q.long()))
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, cu_seqlens_k=_cu(lens_k[:3])))
    assert not gluon_launch.gluon_supported(q, k, v, **dict(varlen, max_seqlen_q=0))
    assert not gluon_launch.gluon_supported(q, k[:0], v[:0], **dict(varlen, cu_seqlens_k=_cu([0] * 4), max_seqlen_k=0))
    q96, k96, v96 = _packed(lens_q, lens_k, 4, 2, 96)
    assert not gluon_launch.gluon_supported(q96, k96, v96, **varlen)
    assert not gluon_launch.gluon_supported(q[None], k[None], v[None], **varlen)  # dense tensors with cu_seqlens
    # Dense batches whose key blocks would span two sequences are served now (ragged descriptors).
    qd, kd = torch.zeros(2, 1000, 4, 128, dtype=torch.bfloat16), torch.zeros(2, 1000, 2, 128, dtype=torch.bfloat16)
    assert gluon_launch.gluon_supported(qd, kd, kd)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_varlen_launch_args():
    """Varlen: ragged 4-D descriptors, the grid over max_seqlen_q, packed out / (Hq, total) lse without batch
    strides; dense batches ragged only when a key block can span two sequences."""
    lens_q, lens_k = [300, 0, 1, 129], [1000, 5, 1, 0]
    q, k, v = _packed(lens_q, lens_k, 8, 2, 64)
    out, lse = torch.empty_like(q), torch.empty(8, q.shape[0])
    config = gluon_variants.VARIANTS["default"][64]
    grid, args, constexprs, _ = gluon_launch.gluon_launch_args(
        q, k, v, out, lse, 0.125, True, config, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k),
        max_seqlen_q=300, max_seqlen_k=1000)
    assert constexprs["VARLEN"] and constexprs["RAGGED"] and constexprs["IS_CAUSAL"]
    assert grid == (3, 4 * 8)
    q_desc, k_desc = args[0], args[1]
    assert q_desc.shape[2:] == [2**30, 8 * 64] and q_desc.block_shape == [1, 1, 64, 64]
    assert k_desc.strides == [2**34 - 2 * 64, 2 * 64, 2 * 64, 1] and k_desc.block_shape == [1, 1, config.block_n, 64]
    assert args[7:12] == (0, out.stride(0), out.stride(1), 0, lse.stride(0))  # out / lse strides: no batch
    # cu_seqlens_q / _k, then the bias arguments (placeholder, 0 rows per batch / head) and softmax_scale, then
    # the fourteen block-sparse arguments: None (constexprs) in a dense launch, then dropout's seed (the lse
    # placeholder), scale and threshold.
    assert args[-3] is lse and args[-2:] == (1.0, 0)
    assert args[-17:-3] == (None,) * 14
    args = args[:-17]
    assert args[-6].dtype == torch.int32 and args[-5].dtype == torch.int32 and args[-3:] == (0, 0, 0.125)
    for seqlen_k, ragged in ((1024, False), (1000, True)):
        qd = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16)
        kd = torch.empty(2, seqlen_k, 2, 64, dtype=torch.bfloat16)
        _, args, constexprs, _ = gluon_launch.gluon_launch_args(qd, kd, kd, torch.empty_like(qd),
                                                                torch.empty(2, 4, 1000), 0.125, False, config)
        assert constexprs["RAGGED"] == ragged and not constexprs["VARLEN"]
        assert len(args[0].shape) == (4 if ragged else 2)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_ragged_descriptor_addresses_one_sequence():
    """What the TMA unit computes for a ragged box (kernels/gluon_fwd_common._tma_load's coordinates): the element
    offset sum(coord * stride) modulo 2**64 lands on row end - n + r of the packed tensor, and rows r >= n are out of
    bounds (zero-filled), whatever lies after the sequence."""
    t = torch.empty(1000, 3, 4, 64, dtype=torch.bfloat16)[:, 1]  # a packed-qkv view: row stride 3 * 4 * 64
    rows, row_stride = t.shape[0], t.stride(0)
    desc = gluon_launch.ragged_descriptor(t, rows, row_stride, 4 * 64, 128, 64, gluon_launch._gl.bfloat16)
    billion = gluon_launch.RAGGED_ROWS
    for start, n in ((0, 1), (17, 300), (999, 1), (500, 500)):
        for r in (0, n - 1, n, n + 127):
            coords = (billion, start + n, billion - n + r, 64)  # outermost first, as the kernel passes them
            in_bounds = all(0 <= c < dim for c, dim in zip(coords, desc.shape))
            offset = sum(c * s for c, s in zip(coords, desc.strides)) % 2**64
            assert in_bounds == (r < n)
            if in_bounds:
                assert offset == (start + r) * row_stride + 64


def test_varlen_dispatch(monkeypatch, as_if_hopper):
    """launch._gluon_forward hands cu_seqlens / max_seqlen to the Gluon forward and asks configs.py with
    max_seqlen_k as the key count (D64 causal: from 4096 keys; varlen is not plain, GLUON_FWD_MIN_KEYS_PLAIN)."""
    from flashtile import launch

    calls = []
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper", object())  # past the import check
    monkeypatch.setattr(gluon_launch, "gluon_forward", lambda *a, **kw: calls.append(kw) or ("out", "lse"))
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    lens = [3000, 1, 5000]
    q, k, v = _packed(lens, lens, 4, 4, 64)
    cu = _cu(lens)
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 5000, 5000) == ("out", "lse")
    assert calls[0]["cu_seqlens_q"] is cu and calls[0]["max_seqlen_k"] == 5000
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 3000, 3000) is None
    assert len(calls) == 1
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 3000, 3000) == ("out", "lse")
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert launch._gluon_forward(q, k, v, 0.1, -1, 0, 0.0, None, None, cu, cu, 5000, 5000) is None
    assert len(calls) == 2


# (id, sequence lengths q, sequence lengths k, heads_q, heads_kv): empty and single-token sequences, lengths off
# the 128 / 64 blocks, Sq > Sk (causal: rows without keys), GQA / MQA.
VARLEN_CASES = [
    ("mixed", [1, 17, 0, 300, 129, 64], [5, 1, 9, 300, 200, 0], 4, 2),
    ("equal-1000", [1000, 1000], [1000, 1000], 4, 4),
    ("q-gt-k", [257, 130, 1], [130, 257, 1], 8, 1),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=["d64", "d128", "d256"])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_varlen_matches_each_sequence_alone(monkeypatch, case, head_dim, causal):
    monkeypatch.setenv("FLASHTILE_POISON_OUTPUTS", "1")
    _, lens_q, lens_k, heads_q, heads_kv = case
    q, k, v = _packed(lens_q, lens_k, heads_q, heads_kv, head_dim, device="cuda")
    cu_q, cu_k = _cu(lens_q, "cuda"), _cu(lens_k, "cuda")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    assert gluon_launch.gluon_supported(q, k, v, causal=causal, **varlen)
    out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, **varlen)
    assert lse.shape == (heads_q, q.shape[0])
    assert_varlen_matches_each_sequence(out, lse, q, k, v, lens_q, lens_k, cu_q, cu_k, causal)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_varlen_func_takes_it_by_default(monkeypatch, causal):
    """flash_attn_varlen_func routes to the Gluon kernel where configs.py wants it (D128 from 1K keys) and the
    varlen backward runs on its out / lse."""
    calls = record_calls(monkeypatch, gluon_launch, "gluon_forward")
    lens = [1500, 1, 700, 1024]
    q, k, v = (t.requires_grad_() for t in _packed(lens, lens, 4, 2, 128, device="cuda"))
    cu = _cu(lens, "cuda")
    out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    assert calls
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    out_portable = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    assert len(calls) == 1
    grads_portable = torch.autograd.grad(out_portable, (q, k, v), dout)
    torch.testing.assert_close(out, out_portable, atol=2e-2, rtol=0)
    for g, gp in zip(grads, grads_portable):
        torch.testing.assert_close(g, gp, atol=5e-2, rtol=0)
