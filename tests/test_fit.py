"""fit.py: a launch the GPU refuses for its shared memory runs again with one stage, then halved tiles.

GPUs with less shared memory than configs.py's tables assume (sm86 / sm89: 99 KB, sm75: 64 KB) are not here; the
refusal is simulated where triton raises it (the launch), and the kernels then run on the smaller tiles through the
interpreter (or the GPU) against the reference.
"""
import dataclasses

import pytest
import torch
from triton.runtime.errors import OutOfResources

import flashtile
from flashtile import bwd_launch, configs, fast_launch, fit, kvcache_launch, launch
from test_attention import references
from utils import assert_close_rule, make_qkv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def fresh_fits():
    fit._fits.clear()
    yield
    fit._fits.clear()


def test_smaller_variants_take_one_stage_then_halve_the_largest_tile():
    kwargs = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    variants = list(fit.smaller_variants(kwargs, ("BLOCK_N",)))
    assert [(v["num_stages"], v["BLOCK_M"], v["BLOCK_N"]) for v in variants] == [
        (1, 128, 64), (1, 128, 32), (1, 128, 16)]
    assert kwargs["num_stages"] == 3  # the launch's own arguments are left alone
    both = [(v["BLOCK_M"], v["BLOCK_N"]) for v in fit.smaller_variants(kwargs, ("BLOCK_N", "BLOCK_M"))]
    assert both == [(128, 64), (64, 64), (64, 32), (32, 32), (32, 16), (16, 16)]  # the loop tile first of equals
    assert [v["num_stages"] for v in fit.smaller_variants(kwargs, ())] == [1]
    assert list(fit.smaller_variants(dict(kwargs, num_stages=1, BLOCK_N=16), ("BLOCK_N",))) == []


def test_grid_follows_the_grid_tile():
    kl = launch.KernelLaunch(object(), (8, 6), (), dict(BLOCK_M=128, BLOCK_N=64), 4, 2, shrink=("BLOCK_N",),
                             grid_tile=("BLOCK_M", 0, 1000))
    assert fit.tiles(kl) == ("BLOCK_N", "BLOCK_M")
    assert fit.grid_for(kl, dict(BLOCK_M=128)) == (8, 6)
    assert fit.grid_for(kl, dict(BLOCK_M=32)) == (32, 6)
    assert fit.grid_for(dataclasses.replace(kl, grid_tile=()), dict(BLOCK_M=32)) == (8, 6)


class FakeGPU:
    """fast_launch.launch on a GPU with `limit` bytes of shared memory, a launch needing
    BLOCK_M * BLOCK_N * num_stages * 16 bytes (a stand-in for what triton measures at load time)."""

    def __init__(self, limit, resource="shared memory"):
        self.limit, self.resource, self.calls = limit, resource, []

    def __call__(self, kernel, grid, args, kwargs):
        self.calls.append(dict(kwargs))
        need = kwargs["BLOCK_M"] * kwargs["BLOCK_N"] * kwargs["num_stages"] * 16
        if need > self.limit:
            raise OutOfResources(need, self.limit, self.resource)


def _launch(**constexprs):
    tensor = torch.zeros(1)
    return launch.KernelLaunch(object(), (1,), (tensor,), dict(BLOCK_M=64, BLOCK_N=64, **constexprs), 4, 2,
                               shrink=("BLOCK_N",))


def test_refused_launch_runs_smaller_and_the_fit_is_remembered(monkeypatch):
    gpu = FakeGPU(limit=64 * 32 * 16)
    monkeypatch.setattr(fast_launch, "launch", gpu)
    kl = _launch()
    kl.run()
    assert [(c["num_stages"], c["BLOCK_N"]) for c in gpu.calls] == [(2, 64), (1, 64), (1, 32)]
    gpu.calls.clear()
    kl.run()  # straight to what loaded
    assert [(c["num_stages"], c["BLOCK_N"]) for c in gpu.calls] == [(1, 32)]
    gpu.calls.clear()
    _launch(IS_CAUSAL=True).run()  # another signature tries its own tiles first
    assert len(gpu.calls) == 3


def test_fits_are_remembered_per_dtype(monkeypatch):
    """fp16 and fp32 launches can share every constexpr while their tiles need different shared memory: a fit found
    for one is not forced on the other."""

    def sized(kernel, grid, args, kwargs):  # FakeGPU's need, times the tensors' element size / 2
        calls.append((args[0].dtype, kwargs["num_stages"], kwargs["BLOCK_N"]))
        need = kwargs["BLOCK_M"] * kwargs["BLOCK_N"] * kwargs["num_stages"] * 8 * args[0].element_size()
        if need > 64 * 32 * 16:
            raise OutOfResources(need, 64 * 32 * 16, "shared memory")

    calls = []
    monkeypatch.setattr(fast_launch, "launch", sized)
    half = _launch()
    single = dataclasses.replace(half, args=(torch.zeros(1, dtype=torch.float32),))
    half = dataclasses.replace(half, args=(torch.zeros(1, dtype=torch.float16),))
    half.run()
    single.run()
    assert calls == [(torch.float16, 2, 64), (torch.float16, 1, 64), (torch.float16, 1, 32),
                     (torch.float32, 2, 64), (torch.float32, 1, 64), (torch.float32, 1, 32), (torch.float32, 1, 16)]
    calls.clear()
    half.run()
    single.run()
    assert calls == [(torch.float16, 1, 32), (torch.float32, 1, 16)]


def test_launch_that_fits_nowhere_raises_and_other_refusals_are_not_retried(monkeypatch):
    gpu = FakeGPU(limit=100)
    monkeypatch.setattr(fast_launch, "launch", gpu)
    with pytest.raises(OutOfResources):
        _launch().run()
    assert [(c["num_stages"], c["BLOCK_N"]) for c in gpu.calls] == [(2, 64), (1, 64), (1, 32), (1, 16)]
    assert not fit._fits
    gpu = FakeGPU(limit=100, resource="registers")
    monkeypatch.setattr(fast_launch, "launch", gpu)
    with pytest.raises(OutOfResources, match="registers"):
        _launch().run()
    assert len(gpu.calls) == 1


def _same_argument(a, b):
    """The same input, or a buffer the launcher allocated alike (the split-KV workspace), or an equal scalar."""
    if isinstance(a, torch.Tensor):
        return a is b or (isinstance(b, torch.Tensor)
                          and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype))
    return type(a) is type(b) and a == b


def _smaller(kl):
    """kl's loop tile halved and grid tile quartered."""
    return {**{name: kl.constexprs[name] // 2 for name in kl.shrink},
            **{name: kl.constexprs[name] // 4 for name in kl.grid_tile[:1]}}


def _assert_halving_changes_only_tiles(monkeypatch, build):
    """The launches build() makes with the loop tiles halved and the grid tiles quartered (as configs.py would give
    them) equal, but for those constexprs and the grid fit.grid_for computes, what fit.py would run in place of the
    original launches: the same kernels, arguments and other constexprs."""
    before = build()
    fwd_cfg, bwd_cfg, decode_cfg = configs.fwd_config, configs.bwd_config, configs.decode_config

    def half(tile, name):
        return dataclasses.replace(tile, **{name: getattr(tile, name) // 2})

    def quarter(tile, name):
        return dataclasses.replace(tile, **{name: getattr(tile, name) // 4})

    def smaller_bwd(*a, **kw):
        cfg = bwd_cfg(*a, **kw)
        return dataclasses.replace(cfg, dkdv=quarter(half(cfg.dkdv, "BLOCK_M"), "BLOCK_N"),
                                   dq=quarter(half(cfg.dq, "BLOCK_N"), "BLOCK_M"))

    with monkeypatch.context() as patch:
        patch.setattr(configs, "fwd_config", lambda *a, **kw: quarter(half(fwd_cfg(*a, **kw), "BLOCK_N"), "BLOCK_M"))
        patch.setattr(configs, "decode_config", lambda *a, **kw: half(decode_cfg(*a, **kw), "BLOCK_N"))
        patch.setattr(configs, "bwd_config", smaller_bwd)
        after = build()
    for old, new in zip(before, after, strict=True):
        smaller = {**old.constexprs, **_smaller(old)}
        # PAGED: fit.py keeps the launch's. 1 (a page lookup per key) is right for any tile; 2 (whole key tiles per
        # page) stays right for half tiles. The launcher may pick 2 for the smaller tile where fit.py keeps 1: slower.
        if "PAGED" in old.constexprs:
            assert old.constexprs["PAGED"] != 2 or new.constexprs["PAGED"] == 2
            smaller["PAGED"] = new.constexprs["PAGED"]
        assert new.kernel is old.kernel and new.constexprs == smaller, old.kernel
        assert new.grid == fit.grid_for(old, smaller), old.kernel
        assert len(new.args) == len(old.args) and all(map(_same_argument, old.args, new.args)), old.kernel
    return before


def test_shrunk_tiles_change_no_grid_or_argument(monkeypatch):
    """Dense forward, probabilities, backward and split-KV decoding: the launchers' shrink and grid_tile name tiles
    that fit.py can halve on its own."""
    q = torch.zeros(2, 300, 4, 128)
    k = torch.zeros(2, 500, 2, 128)
    lse = torch.zeros(2, 4, 300)
    geo = launch.Geometry.of(q, k)
    sa = launch.ScoreArgs.make(geo, 0.1, -1, 0, 0.0, None, lse)
    arch = (8, 6)

    def build():
        fwd = launch.forward_launches(geo, q, k, k, q, lse, None, sa, arch, interpreter=False)
        probs = launch.probs_launches(geo, q, k, lse, torch.zeros(2, 4, 300, 500), sa, arch, interpreter=False)
        bwd = bwd_launch.backward_launches(geo, q, q, k, k, q, lse, lse, lse, q, k, k, None, 0.1, sa, arch,
                                           interpreter=False)
        q1, lse1 = torch.zeros(2, 1, 8, 128), torch.zeros(2, 8, 1)
        geo1 = dataclasses.replace(launch.Geometry.of(q1, k), seqused_k=torch.tensor([50, 9], dtype=torch.int32))
        sa1 = launch.ScoreArgs.make(geo1, 0.1, -1, -1, 0.0, None, lse1)
        cfg, splits, precision = kvcache_launch.splitkv_plan(geo1, 500, 3, arch, q.dtype, q.device, interpreter=False)
        split = kvcache_launch.splitkv_launches(geo1, q1, k, k, q1, lse1, sa1, cfg, splits, precision)
        return fwd + probs + bwd + split

    before = _assert_halving_changes_only_tiles(monkeypatch, build)
    assert [fit.tiles(kl) for kl in before] == [("BLOCK_N", "BLOCK_M"), ("BLOCK_N", "BLOCK_M"), (),
                                                ("BLOCK_M", "BLOCK_N"), ("BLOCK_N", "BLOCK_M"), ("BLOCK_N",), ()]


@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["contiguous", "page16", "page256"])
def test_shrunk_tiles_change_nothing_else_varlen_and_paged(monkeypatch, page_size):
    """Packed varlen batches (forward and backward; the grid spans the longest sequence) and paged keys (forward and
    split-KV decoding): a page holding whole key tiles holds whole half tiles, so the paging constexprs stay."""
    q, k = torch.zeros(64, 4, 64), torch.zeros(512, 2, 64)
    geo = launch.Geometry.of(q, k, torch.tensor([0, 30, 64], dtype=torch.int32),
                             torch.tensor([0, 200, 512], dtype=torch.int32), 34, 312)
    lse = torch.zeros(4, 64)
    sa = launch.ScoreArgs.make(geo, 0.1, -1, 0, 0.0, None, lse)
    arch = (8, 6)
    if page_size:
        k = k.reshape(512 // page_size, page_size, 2, 64)
        geo = dataclasses.replace(geo, block_table=torch.zeros(2, 512 // page_size, dtype=torch.int32))

    def build():
        launches = launch.forward_launches(geo, q, k, k, q, lse, None, sa, arch, interpreter=False)
        if not page_size:
            launches += bwd_launch.backward_launches(geo, q, q, k, k, q, lse, lse, lse, q, k, k, None, 0.1, sa, arch,
                                                     interpreter=False)
        else:
            q1, lse1 = torch.zeros(2, 1, 8, 64), torch.zeros(2, 8, 1)
            geo1 = dataclasses.replace(launch.Geometry.of(q1, k), batch=2, seqlen_k=512, block_table=geo.block_table,
                                       seqused_k=torch.tensor([300, 9], dtype=torch.int32))
            sa1 = launch.ScoreArgs.make(geo1, 0.1, -1, -1, 0.0, None, lse1)
            cfg, splits, precision = kvcache_launch.splitkv_plan(geo1, 300, 2, arch, q.dtype, q.device,
                                                                 interpreter=False)
            launches += kvcache_launch.splitkv_launches(geo1, q1, k, k, q1, lse1, sa1, cfg, splits, precision)
        return launches

    before = _assert_halving_changes_only_tiles(monkeypatch, build)
    if page_size == 256:
        assert before[0].constexprs["PAGED"] == 2  # whole key tiles per page, before and after halving


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_on_the_fallback_tiles_matches_the_reference(monkeypatch, causal):
    """Forward and backward where every launch with a tile above 16 is refused (the interpreter's tiles are 32 wide):
    the forward, dQ and dK/dV kernels run 16 x 16 tiles on grids recomputed for them."""
    real = fast_launch.launch
    refused = []

    def small_gpu(kernel, grid, args, kwargs):
        main = kernel in (launch._attn_fwd, bwd_launch._attn_bwd_dkdv, bwd_launch._attn_bwd_dq)
        if main and (kwargs["BLOCK_M"] > 16 or kwargs["BLOCK_N"] > 16):
            refused.append(kernel)
            raise OutOfResources(1 << 20, 1 << 16, "shared memory")
        return real(kernel, grid, args, kwargs)

    monkeypatch.setattr(fast_launch, "launch", small_gpu)
    monkeypatch.setattr(configs, "INTERPRETER_FWD", configs.TileConfig(32, 32, 4, 1))
    monkeypatch.setattr(configs, "INTERPRETER_BWD", configs._bwd(32, 32, 32, 32, 4, 1))
    dtype = torch.float32
    q, k, v = make_qkv(2, 70, 90, 4, 2, 64, dtype, DEVICE)
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert {launch._attn_fwd, bwd_launch._attn_bwd_dkdv, bwd_launch._attn_bwd_dq} <= set(refused)
    ref64, ref_lowp = references(q, k, v, dout, causal, None)
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), ref64, ref_lowp):
        assert_close_rule(name, got, r64, rlow, dtype)


def test_dropout_mask_does_not_depend_on_the_fallback_tiles(monkeypatch):
    """The dropout draws are per element: refused tiles (16 x 16 in place of the interpreter's 32 x 32, or smaller
    than configured on a GPU) drop the same entries, which return_attn_probs shows as negative probabilities."""
    monkeypatch.setattr(configs, "INTERPRETER_FWD", configs.TileConfig(32, 32, 4, 1))
    q, k, v = make_qkv(1, 50, 70, 2, 2, 32, torch.float32, DEVICE, requires_grad=False)

    def run():
        torch.manual_seed(7)
        return flashtile.flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)

    out, _, probs = run()
    real = fast_launch.launch

    def small_gpu(kernel, grid, args, kwargs):
        if kernel in (launch._attn_fwd, launch._attn_probs) and (kwargs["BLOCK_M"] > 16 or kwargs["BLOCK_N"] > 16):
            raise OutOfResources(1 << 20, 1 << 16, "shared memory")
        return real(kernel, grid, args, kwargs)

    monkeypatch.setattr(fast_launch, "launch", small_gpu)
    out_small, _, probs_small = run()
    assert fit._fits  # both kernels ran on fitted tiles
    assert torch.equal(probs_small < 0, probs < 0) and (probs < 0).any()
    torch.testing.assert_close(out_small, out)
