"""The Hopper Gluon forward's host side on CPU (no kernel runs): the import guard, the fallback and the opt-in,
descriptors, and the one-tile and persistent kernels' launch arguments."""
from dataclasses import replace

import pytest
import torch

from flashtile import gluon_launch, gluon_variants


def test_unsupported_without_hopper():
    """Importing never fails; CPU tensors (and the interpreter) never take the Gluon path."""
    q = torch.randn(1, 8, 2, 64)
    assert not gluon_launch.gluon_supported(q, q, q)


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


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_o_via_smem_only_for_dense_two_consumer_launches(monkeypatch):
    """The one-tile kernel's O through shared memory (O_VIA_SMEM): dense launches of two consumers at the head dims
    configs.GLUON_FWD_SMEM_EPILOGUE lists, plain, causal, with score features, a window, a sink, a bias or dropout
    under the plain causal mask; other dropout launches (no mask, a window), varlen, three consumers and other head
    dims keep the kernel they had (no O_VIA_SMEM constexpr). (Block-sparse launches: the same rule in
    gluon_launch_args, not built here.)"""
    from flashtile import configs
    q = torch.empty(2, 1000, 4, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1000)
    config = gluon_variants.VARIANTS["default"][128]

    def constexprs(q=q, out=out, lse=lse, config=config, **kw):
        return gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, kw.pop("causal", False), config, **kw)[2]

    assert constexprs()["O_VIA_SMEM"] and constexprs(causal=True)["O_VIA_SMEM"]
    rng = torch.zeros(1, dtype=torch.int64)
    for kw in (dict(window_size=(100, 0)), dict(softcap=30.0), dict(alibi_slopes=torch.ones(4)),
               dict(sink=torch.zeros(4)), dict(dropout_p=0.1, rng=rng, causal=True),
               dict(attn_bias=torch.zeros(1, 4, 1000, 1000, dtype=torch.bfloat16)),
               dict(softcap=30.0, alibi_slopes=torch.ones(4), causal=True)):
        assert constexprs(**kw)["O_VIA_SMEM"], kw
    assert "O_VIA_SMEM" not in constexprs(dropout_p=0.1, rng=rng)  # measured slower (configs.py)
    assert "O_VIA_SMEM" not in constexprs(dropout_p=0.1, rng=rng, window_size=(100, 0))
    packed, cu = q.view(2000, 4, 128), torch.tensor([0, 1000, 2000], dtype=torch.int32)
    assert "O_VIA_SMEM" not in constexprs(q=packed, out=packed, lse=torch.empty(4, 2000), cu_seqlens_q=cu,
                                          cu_seqlens_k=cu, max_seqlen_q=1000, max_seqlen_k=1000)
    q64 = torch.empty(2, 1000, 4, 64, dtype=torch.bfloat16)
    assert "O_VIA_SMEM" not in constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["d64-3wg"][64])
    assert 64 not in configs.GLUON_FWD_SMEM_EPILOGUE  # unmeasured at D64 (configs.py)
    assert "O_VIA_SMEM" not in constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["default"][64])
    monkeypatch.setattr(configs, "GLUON_FWD_SMEM_EPILOGUE", frozenset({64}))
    assert constexprs(q=q64, out=q64, config=gluon_variants.VARIANTS["default"][64])["O_VIA_SMEM"]
    assert "O_VIA_SMEM" not in constexprs()  # D128 out of the set
    # The persistent kernel's own O_VIA_SMEM (one shared tile where O is not stored by TMA;
    # test_persistent_launch_args) follows the same set.
    monkeypatch.setattr(configs, "GLUON_FWD_SMEM_EPILOGUE", frozenset({64, 256}))
    for variant in ("persistent", "persistent-tma"):
        assert "O_VIA_SMEM" not in gluon_launch.persistent_launch_args(
            q, q, q, out, lse, 0.125, True, gluon_variants.VARIANTS[variant][128], sm_count=132)[2]


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper is None, reason="no Gluon in this triton")
def test_unchecked_descriptors_match_the_checked_ones():
    """gluon_launch.tma_descriptor skips TensorDescriptor's dataclass checks for host time: on the descriptors the
    forward and backward build (dense, ragged, GQA, packed qkv strides, the backward's 3-D and row views) the
    checked constructor accepts the same fields, and every field agrees."""
    from dataclasses import fields

    from flashtile import gluon_bwd_launch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    qkv = torch.empty(2, 1000, 3, 4, 128, dtype=torch.bfloat16)
    dense = torch.empty(3, 256, 4, 64, dtype=torch.float16)
    rows = torch.empty(2, 4, 1024)
    built = [gluon_launch._descriptor(dense, 64), gluon_launch._descriptor(qkv[:, :, 1], 128),
             gluon_launch._descriptor(qkv[:, :, 2], 128, ragged=True),
             gluon_launch._descriptor(torch.empty(700, 2, 256, dtype=torch.bfloat16), 64, ragged=True),
             gluon_bwd_launch._descriptor(dense, 64), gluon_bwd_launch._row_descriptor(rows, 64)]
    for desc in built:
        checked = TensorDescriptor(*(getattr(desc, f.name) for f in fields(TensorDescriptor)))
        assert all(getattr(desc, f.name) == getattr(checked, f.name) for f in fields(TensorDescriptor)
                   if f.name != "base") and desc.base is checked.base


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper_persistent is None, reason="no Gluon in this triton")
@pytest.mark.parametrize("variant", ["persistent", "persistent-tma"])
def test_persistent_launch_takes_causal_from_the_window(monkeypatch, variant):
    """launch.py says causal as window_size=(-1, 0) with causal=False: the persistent launch must still run its
    causal path (IS_CAUSAL), the only mask it has. The kernel is replaced by a recorder (no GPU here)."""
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs)

    original = gluon_launch.persistent_launch_args
    monkeypatch.setattr(gluon_launch, "_attn_fwd_hopper_persistent", Recorder())
    monkeypatch.setattr(gluon_launch, "persistent_launch_args",
                        lambda *args: original(*args, sm_count=132))
    q = torch.empty(2, 512, 4, 128, dtype=torch.bfloat16)
    for window, causal, expect in (((-1, 0), False, True), ((-1, -1), True, True), ((-1, -1), False, False)):
        seen.clear()
        gluon_launch.gluon_forward(q, q, q, causal=causal, variant=variant, window_size=window)
        assert seen["IS_CAUSAL"] == expect, (window, causal)


@pytest.mark.skipif(gluon_launch._attn_fwd_hopper_persistent is None, reason="no Gluon in this triton")
def test_persistent_launch_args():
    """The persistent variant: grid min(tiles, SMs, max_ctas), the tile counts the kernel walks, and which launches
    it takes (plain / causal dense; features, varlen and D256 through ragged descriptors run the one-tile kernel)."""
    config = gluon_variants.VARIANTS["persistent"][128]
    q = torch.empty(32, 512, 16, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(32, 16, 512)
    grid, args, constexprs, options = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, True, config,
                                                                          sm_count=132)
    n_m, n_bh, n_tiles, schedule = args[-4:]
    assert (n_m, n_bh, n_tiles) == (4, 32 * 16, 4 * 32 * 16) and grid == (132, )
    assert constexprs["IS_CAUSAL"] and not constexprs["RAGGED"] and constexprs["STAGES"] == config.stages
    assert not constexprs["O_TMA"] and args[3] is out and schedule is lse  # no list: the grid's stride
    assert options == dict(num_warps=4, maxnreg=config.maxnreg)
    small = torch.empty(1, 130, 2, 128, dtype=torch.bfloat16)
    grid, *_ = gluon_launch.persistent_launch_args(small, small, small, torch.empty_like(small),
                                                   torch.empty(1, 2, 130), 0.125, False, config, sm_count=132)
    assert grid == (4, )  # 2 query tiles x 2 heads
    grid, *_ = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False,
                                                   gluon_variants.VARIANTS["persistent-7cta"][128], sm_count=132)
    assert grid == (7, )
    kr = torch.empty(32, 1000, 16, 128, dtype=torch.bfloat16)
    _, args, constexprs, _ = gluon_launch.persistent_launch_args(q, kr, kr, out, lse, 0.125, False, config,
                                                                 sm_count=132)
    assert constexprs["RAGGED"] and len(args[0].shape) == 4
    # O by TMA where no [64, D] box reaches into the next sequence: batch 1 or Sq % 64 == 0.
    tma_config = gluon_variants.VARIANTS["persistent-tma"][128]
    for qt, o_tma in ((q, True), (small, True), (torch.empty(2, 130, 2, 128, dtype=torch.bfloat16), False)):
        _, args, constexprs, _ = gluon_launch.persistent_launch_args(qt, qt, qt, torch.empty_like(qt),
                                                                     torch.empty(qt.shape[0], qt.shape[2], qt.shape[1]),
                                                                     0.125, False, tma_config, sm_count=132)
        assert constexprs["O_TMA"] == o_tma and (args[3].block_shape == [64, 128] if o_tma else args[3] is args[4])
        # Without the TMA store, O leaves through one shared tile (configs.GLUON_FWD_SMEM_EPILOGUE's head dims).
        assert constexprs.get("O_VIA_SMEM", False) == (not o_tma)
    assert gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False, config, sm_count=132)[2]["O_VIA_SMEM"]
    # Q double-buffered: Q_BUFFERS=2 (the kernel's default, 1, is left out of the single-buffered launch's set).
    assert "Q_BUFFERS" not in constexprs
    q2 = gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False,
                                             gluon_variants.VARIANTS["persistent-tma-q2"][128], sm_count=132)[2]
    assert q2["Q_BUFFERS"] == 2 and q2["O_TMA"]
    with pytest.raises(ValueError, match="q_buffers"):
        replace(gluon_variants.VARIANTS["default"][128], q_buffers=2)  # the one-tile kernel has one Q tile
    # The deferred epilogue: where O leaves by TMA, not where it goes through the one shared tile (O_VIA_SMEM).
    deferred = gluon_variants.VARIANTS["persistent-tma-q2-de"][128]
    assert gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, False, deferred,
                                               sm_count=132)[2]["DEFER_EPILOGUE"]
    ragged = torch.empty(2, 130, 2, 128, dtype=torch.bfloat16)
    constexprs = gluon_launch.persistent_launch_args(ragged, ragged, ragged, torch.empty_like(ragged),
                                                     torch.empty(2, 2, 130), 0.125, False, deferred, sm_count=132)[2]
    assert constexprs["O_VIA_SMEM"] and "DEFER_EPILOGUE" not in constexprs
    with pytest.raises(ValueError, match="defer_epilogue"):
        replace(gluon_variants.VARIANTS["default"][128], defer_epilogue=True)
    base, lazy = (gluon_launch.gluon_launch_args(q, q, q, out, lse, 0.125, True, gluon_variants.VARIANTS[name][128])[2]
                  for name in ("default", "default-lr"))  # the one-tile kernel's lazy rescale (session 30)
    assert lazy == {**base, "LAZY_RESCALE": True} and "LAZY_RESCALE" not in base
    # Served: D256's default and d64-3wg rescale lazily (ALiBi through the wgmma there too, since session 32); a D64
    # call that d64-3wg cannot take (dropout, ALiBi with softcap) gets the two-consumer default, which does not.
    for name, dim in (("default", 256), ("d64-3wg", 64)):
        t = torch.empty(1, 256, 2, dim, dtype=torch.bfloat16)
        assert gluon_launch.gluon_launch_args(t, t, t, torch.empty_like(t), torch.empty(1, 2, 256), 0.125, True,
                                              gluon_variants.VARIANTS[name][dim])[2]["LAZY_RESCALE"]
    assert gluon_variants.takes_config("d64-3wg", 64, alibi_slopes=torch.ones(2)).lazy_rescale
    assert not gluon_variants.takes_config("d64-3wg", 64, alibi_slopes=torch.ones(2), softcap=30.0).lazy_rescale
    assert not gluon_variants.takes_config("d64-3wg", 64, dropout_p=0.1).lazy_rescale
    base, lazy = (gluon_launch.persistent_launch_args(q, q, q, out, lse, 0.125, True,
                                                      gluon_variants.VARIANTS[name][128], sm_count=132)[2]
                  for name in ("persistent", "persistent-lr"))
    assert lazy == {**base, "LAZY_RESCALE": True} and "LAZY_RESCALE" not in base
    assert gluon_launch.takes_persistent(config, q, q) and gluon_launch.takes_persistent(config, q, q, causal=True)
    assert not gluon_launch.takes_persistent(gluon_variants.VARIANTS["default"][128], q, q)
    assert not gluon_launch.takes_persistent(config, q, q, window_size=(64, 0))
    assert not gluon_launch.takes_persistent(config, q, q, softcap=30.0)
    assert not gluon_launch.takes_persistent(config, q, q, alibi_slopes=torch.zeros(16))
    assert not gluon_launch.takes_persistent(config, q, q, sink=torch.zeros(16))
    assert not gluon_launch.takes_persistent(config, q, q, cu_seqlens_q=torch.zeros(2, dtype=torch.int32))
    d256 = gluon_variants.VARIANTS["persistent"][256]
    q256, k256 = torch.empty(2, 512, 2, 256), torch.empty(2, 1000, 2, 256)
    assert gluon_launch.takes_persistent(d256, q256, q256) and not gluon_launch.takes_persistent(d256, q256, k256)
