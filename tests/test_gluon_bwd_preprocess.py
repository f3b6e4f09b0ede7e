"""The Hopper Gluon backward's preprocess and dQ buffer, on the GPU or the interpreter on CPU: ROWS_IN_ACC's fold, the
sink parts, the zeroed and tiled dQ buffer, and the dQ conversion's scale."""
import pytest
import torch

from flashtile import bwd_launch, gluon_bwd_launch, launch
from conftest import DEVICE
from gluon_bwd_utils import _sink_grad_from_rows


@pytest.mark.parametrize("head_dim, dropout_p", [(64, 0.2), (128, 0.2), (64, 0.0)])
def test_dq_conversion_scale_with_dropout(monkeypatch, head_dim, dropout_p):
    """At head dims up to gluon_bwd_step.DROPOUT_ONCE_MAX_HEAD_DIM the dK/dV kernel leaves dropout's 1 / (1 - p) out of
    dQ, and the dQ conversion must multiply it back in; elsewhere the conversion takes the softmax scale alone (the
    kernel's and the launcher's rules agree: dropout_scaled_once reads the kernel's constant)."""
    from flashtile.kernels.gluon_bwd_step import DROPOUT_ONCE_MAX_HEAD_DIM
    once = dropout_p > 0 and head_dim <= DROPOUT_ONCE_MAX_HEAD_DIM.value
    assert gluon_bwd_launch.dropout_scaled_once(head_dim, dropout_p) == once
    assert DROPOUT_ONCE_MAX_HEAD_DIM.value == 64  # measured (gluon_bwd's comment): D64 only
    scales = []

    class Convert:
        def run(self):
            pass

    def capture(dq_accum, dq, scale, tile=None):
        scales.append(scale)
        return Convert()

    monkeypatch.setattr(gluon_bwd_launch, "dkdv_launch_args", lambda *args, **kwargs: (None, None, {}, {}))
    monkeypatch.setattr(gluon_bwd_launch.fast_launch, "launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(gluon_bwd_launch.bwd_launch, "dq_convert_launch", capture)
    gen = torch.Generator().manual_seed(0)
    q, out, dout = (torch.randn(1, 40, 2, head_dim, generator=gen).to(DEVICE) for _ in range(3))
    lse = torch.randn(1, 2, 40, generator=gen).to(DEVICE)
    rng = torch.tensor([5], device=DEVICE) if dropout_p else None
    gluon_bwd_launch.gluon_backward(dout, q, q, q, out, lse, 0.125, False, dropout_p=dropout_p, rng=rng)
    assert scales == [pytest.approx(0.125 / (1 - dropout_p) if once else 0.125, rel=1e-12)]


def test_rows_in_acc_algebra():
    """The fold ROWS_IN_ACC makes, in fp32 on the CPU: a wgmma starting from -lse2 / qk_scale then scaled by qk_scale
    gives exp2(S qk_scale - lse2) (to fp32 rounding at lse2's magnitude), one starting from -delta gives dP - delta;
    for the filled rows (lse2 = +inf, delta = 0, Q = dO = 0 so S = dP = 0) P and dS are exactly 0, never NaN (the
    -inf starting value times qk_scale > 0 is -inf, exp2(-inf) = 0, 0 * (0 - 0) = 0), as for rows that see no key
    (lse2 = +inf, any finite S and dP)."""
    gen = torch.Generator().manual_seed(5)
    qk_scale = 64 ** -0.5 * 1.4426950408889634
    s = torch.randn(64, 128, generator=gen) * 20  # [keys, rows] = S^T
    dp = torch.randn(64, 128, generator=gen)
    lse2 = (s * qk_scale).logsumexp(0) * 1.4426950408889634 + torch.rand(128, generator=gen)
    delta = torch.randn(128, generator=gen)
    lse2[96:], delta[96:] = float("inf"), 0.0  # the launcher's fill past seqlen_q
    s[:, 96:112], dp[:, 96:112] = 0.0, 0.0  # zero-filled Q / dO rows past seqlen_q
    # rows 112..127: lse2 = +inf with finite S / dP (rows that see no key)
    acc_s = (lse2 * (-1.0 / qk_scale))[None, :] + s  # the host's fold, then the wgmma's fp32 sum from it
    acc_dp = (-delta)[None, :] + dp
    p = torch.exp2(acc_s * qk_scale)
    ds = p * acc_dp
    p_ref = torch.exp2(s.double() * qk_scale - lse2.double())
    ds_ref = p_ref * (dp.double() - delta.double())
    assert not p.isnan().any() and not ds.isnan().any()
    assert torch.all(p[:, 96:] == 0) and torch.all(ds[:, 96:] == 0)
    assert torch.allclose(p.double(), p_ref, rtol=1e-4, atol=1e-7)
    assert torch.allclose(ds.double(), ds_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tile_m, tile_n", [(64, 64), (64, 32), (128, 32), (128, 64), (64, 128)])
def test_dq_tiled_offsets(tile_m, tile_n):
    """bwd_launch.dq_tiled_offsets (the tiled dQ buffer's map, kernels/bwd._dq_tiled_rows' twin) is a permutation in
    which every [tile_m, tile_n] tile of a head is tile_m * tile_n contiguous floats at the offset the dK/dV kernel's
    reduce-add targets, laid out as the kernel's reshape / permute of the wgmma accumulator puts it in shared memory
    (kernels/gluon_bwd_step._bwd_step)."""
    batch, rows, heads, head_dim = 2, 2 * tile_m, 3, 2 * tile_n
    offs = bwd_launch.dq_tiled_offsets(batch, rows, heads, head_dim, tile_m, tile_n)
    assert torch.equal(offs.flatten().sort().values, torch.arange(offs.numel()))
    # The tile's elements in the kernel's order: [tile_m, tile_n] -> [rep, w, h, i, j, t, e] -> (rep, j, w, i, t, h, e).
    index = torch.arange(tile_m * tile_n).view(tile_m, tile_n)
    order = index.view(tile_m // 64, 4, 2, 8, tile_n // 8, 4, 2).permute(0, 4, 1, 3, 5, 2, 6).flatten()
    stride_m = heads * head_dim
    for b, m, h, half in ((0, 0, 0, 0), (1, tile_m, 2, 1), (1, 0, 1, 1)):
        tile = offs[b, m:m + tile_m, h, half * tile_n:(half + 1) * tile_n].flatten()
        start = b * rows * stride_m + m * stride_m + tile_m * (h * head_dim + half * tile_n)
        assert torch.equal(tile[order], start + torch.arange(tile_m * tile_n))  # the kernel's reduce-add row * 32


def test_dq_tiled_preprocess_and_conversion():
    """With a tiled dQ buffer (bwd_launch.dq_tiled_offsets) the preprocess zeroes the places of the 64-row blocks that
    hold real query rows (the rest of the last one only ever receives adds of zeros) and leaves the others alone, and
    the conversion reads each element from its place; on the GPU, or the interpreter on CPU."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    heads, seqlen, rows_pad = 2, 70, 256
    # The tiles the launches use (gluon_bwd_launch.dq_tile): D128 (64, 64), D64 (64, 64), d64-bm128 (128, 64),
    # d64-bm128-split (128, 32), D256 (64, 128) (two column tiles per head).
    tiles = [(d, gluon_bwd_launch.dq_tile(gluon_bwd_launch.VARIANTS[v][d], d, False))
             for v, d in (("default", 128), ("default", 64), ("d64-bm128", 64), ("d64-bm128-split", 64),
                          ("default", 256))]
    assert [t for _, t in tiles] == [(64, 64), (64, 64), (128, 64), (128, 32), (64, 128)]
    for head_dim, tile in tiles:
        out, dout = torch.randn(2, 2, seqlen, heads, head_dim, device=dev).unbind(0)
        lse = torch.randn(2, heads, seqlen, device=dev)
        geo = launch.Geometry.of(out, out)
        acc = torch.full((2, rows_pad, heads, head_dim), float("nan"), device=dev)
        rows = torch.full(geo.row_buffer_shape(out), float("nan"), device=dev)
        bwd_launch.preprocess_launch(geo, out, dout, lse, None, rows, rows.clone(), dq_accum=acc, dq_tile=tile).run()
        offs = bwd_launch.dq_tiled_offsets(2, rows_pad, heads, head_dim, *tile).to(dev)
        flat = acc.flatten()
        assert torch.equal(flat[offs[:, :128]], torch.zeros(2, 128, heads, head_dim, device=dev))
        assert flat[offs[:, 128:]].isnan().all()
        want = torch.randn(2, rows_pad, heads, head_dim, device=dev)
        flat[offs] = want
        dq = torch.empty(2, seqlen, heads, head_dim, device=dev, dtype=torch.float16)
        bwd_launch.dq_convert_launch(acc, dq, 0.5, tile=tile).run()
        torch.testing.assert_close(dq, (want[:, :seqlen] * 0.5).half(), rtol=0, atol=0)


@pytest.mark.parametrize("seqlen", [130, 200])
def test_preprocess_sink_parts_with_folded_rows(seqlen):
    """With ROWS_IN_ACC's fold (the D64 128-row variants, which plain / causal calls with a sink run) the preprocess
    covers rows_pad = seqlen rounded up to 128 rows: at 130 keys one 64-row program more than bwd_launch.sink_parts has
    columns for. Each program's sink piece lands in its own (batch, head) row of parts, so the sink gradient is
    -sum exp(sink - lse) * delta over the real rows (before the fix, pieces were written at the grid's stride: into
    the next head's row and past the buffer). On the GPU, or the interpreter on CPU."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, head_dim = 2, 3, 64
    rows_pad = -(-seqlen // 128) * 128
    out, dout = torch.randn(2, batch, seqlen, heads, head_dim, device=dev).unbind(0)
    lse = torch.randn(batch, heads, seqlen, device=dev) + 3.0
    sink = torch.randn(heads, device=dev)
    geo = launch.Geometry.of(out, out)
    delta = torch.full((batch, heads, rows_pad), float("nan"), device=dev)
    lse2 = torch.full((batch, heads, rows_pad), float("nan"), device=dev)
    shape = bwd_launch.sink_parts(geo, out).shape  # (B * H, ceil(seqlen / 64))
    assert shape == (batch * heads, -(-seqlen // 64))
    buf = torch.full((shape[0] * shape[1] + 64, ), 7.0, device=dev)  # parts, then a tail that must stay 7.0
    buf[:shape[0] * shape[1]] = 0.0
    view = buf[:shape[0] * shape[1]].view(shape)
    bwd_launch.preprocess_launch(geo, out, dout, lse, None, delta, lse2, sink, view, fold=(rows_pad, 0.125)).run()
    assert torch.all(buf[shape[0] * shape[1]:] == 7.0)
    torch.testing.assert_close(bwd_launch.sink_grad(view, heads).double(), _sink_grad_from_rows(out, dout, lse, sink),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("varlen", [False, True])
def test_preprocess_zeroes_dq_accum(varlen):
    """The preprocess zeroes the Gluon backward's fp32 dQ buffer (ZERO_DQ, no memset launch): every row of a real
    query, in the dense (B, Sq_pad, Hq, D) and the varlen (total_q + 64, Hq, D) layouts, from NaN; it leaves the
    padding rows alone and still writes delta and lse2. On the GPU, or the interpreter on CPU."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    heads, head_dim = 2, 40
    if varlen:
        lens = [70, 0, 5]
        total = sum(lens)
        cu = torch.tensor([0, 70, 70, 75], dtype=torch.int32, device=dev)
        out, dout = torch.randn(2, total, heads, head_dim, device=dev).unbind(0)
        lse = torch.randn(heads, total, device=dev)
        geo = launch.Geometry.of(out, out, cu, cu, 70, 70)
        acc = torch.full((total + 64, heads, head_dim), float("nan"), device=dev)
        real = acc[:total]
        pad = acc[total:]
    else:
        out, dout = torch.randn(2, 2, 70, heads, head_dim, device=dev).unbind(0)
        lse = torch.randn(2, heads, 70, device=dev)
        geo = launch.Geometry.of(out, out)
        acc = torch.full((2, 128, heads, head_dim), float("nan"), device=dev)
        real = acc[:, :70]
        pad = acc[:, 70:]
    delta = torch.full(geo.row_buffer_shape(out), float("nan"), device=dev)
    lse2 = torch.full(geo.row_buffer_shape(out), float("nan"), device=dev)
    bwd_launch.preprocess_launch(geo, out, dout, lse, None, delta, lse2, dq_accum=acc).run()
    assert torch.equal(real, torch.zeros_like(real)) and pad.isnan().all()
    rowsum = (out * dout).sum(-1)  # (..., tokens, heads)
    if varlen:
        got = torch.cat([delta[:, 16 * (b + int(cu[b]) // 16):][:, :n] for b, n in enumerate(lens)], dim=1)
        assert lse2.isfinite().sum() == heads * total
        assert torch.allclose(got, rowsum.T, atol=1e-5)
    else:
        assert torch.allclose(delta[..., :70], rowsum.transpose(1, 2), atol=1e-5)
