"""Tile-configuration lookup (configs.py): which table serves which call. Pure Python, no kernels run."""
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtile import bwd_launch, configs, gluon_variants, kvcache_launch, launch

SM90 = (9, 0)


def test_short_rows_take_the_short_forward_tiles():
    long_cfg = configs.fwd_config(SM90, 128, False, torch.bfloat16, keys_per_row=4096)
    short_cfg = configs.fwd_config(SM90, 128, False, torch.bfloat16, keys_per_row=configs.SHORT_KEYS)
    assert long_cfg == configs._SM90_FWD[128]
    assert short_cfg == configs._SM90_FWD_SHORT[128] != long_cfg
    assert configs.fwd_config(SM90, 128, False, torch.bfloat16) == long_cfg  # unknown: the default
    # Other GPUs and fp32 keep their tables.
    assert configs.fwd_config((8, 0), 128, False, torch.bfloat16, keys_per_row=64) == configs._GENERIC_FWD[128]
    assert configs.fwd_config(SM90, 128, False, torch.float32, keys_per_row=64) == configs._GENERIC_FP32_FWD[128]


@pytest.fixture
def matmul():
    """torch.backends.cuda.matmul, its allow_tf32 restored after the test (monkeypatch cannot set this flag: it is a
    property of a backend module object)."""
    before = torch.backends.cuda.matmul.allow_tf32
    yield torch.backends.cuda.matmul
    torch.backends.cuda.matmul.allow_tf32 = before


def test_fp32_dot_precision_follows_tf32_and_the_gpu(monkeypatch, matmul):
    """fp32 with TF32 off: tf32x3 dots (fp32-level error) where TF32 runs several times the FP32 rate (A100, H100 /
    H200, B200), FMA dots ("ieee") on other GPUs, ROCm and CPU tensors (no arch); TF32 on: TF32 dots; 16-bit inputs
    ignore the precision."""
    matmul.allow_tf32 = False
    archs = (SM90, (8, 0), (10, 0), (8, 6), (8, 9), (12, 0), (7, 5), None)
    assert [launch._dot_precision(torch.float32, arch) for arch in archs] == [
        "tf32x3", "tf32x3", "tf32x3", "ieee", "ieee", "ieee", "ieee", "ieee"]
    assert launch._dot_precision(torch.bfloat16, SM90) == "tf32"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert launch._dot_precision(torch.float32, (9, 4)) == "ieee"
    monkeypatch.undo()
    matmul.allow_tf32 = True
    assert launch._dot_precision(torch.float32, SM90) == launch._dot_precision(torch.float32, None) == "tf32"


NEW_API_PROBE = """
import sys, torch
from flashtile import launch
exec(sys.argv[1])
print(launch._dot_precision(torch.float32, (9, 0)))
"""


@pytest.mark.parametrize("setting,expected", [
    ("torch.backends.cuda.matmul.fp32_precision = 'tf32'", "tf32"),
    ("torch.backends.cuda.matmul.fp32_precision = 'ieee'", "tf32x3"),
    ("torch.backends.fp32_precision = 'tf32'", "tf32"),
    ("torch.backends.fp32_precision = 'tf32'; torch.backends.cuda.matmul.fp32_precision = 'ieee'", "tf32x3"),
    ("torch.set_float32_matmul_precision('high')", "tf32"),
    ("torch.backends.cuda.matmul.allow_tf32 = True", "tf32"),
    ("pass", "tf32x3"),
], ids=["matmul-tf32", "matmul-ieee", "global-tf32", "global-tf32-matmul-ieee", "matmul-precision-high", "legacy",
        "default"])
def test_fp32_dot_precision_reads_pytorchs_new_tf32_api(setting, expected):
    """PyTorch 2.9+'s fp32_precision settings (reading the legacy allow_tf32 after them raises in torch 2.13): each in
    a fresh interpreter, as the settings are process-wide."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this PyTorch has only allow_tf32")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                         os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", NEW_API_PROBE, setting], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == expected


def test_fp32_launchers_take_the_tiles_of_their_precision(monkeypatch, matmul):
    """Each fp32 launcher picks its tiles by the precision it passes its kernel (DOT_PRECISION): tf32x3 dots their
    own tiles (configs._TF32X3_*), FMA dots theirs (configs._IEEE_*), TF32 on the tensor-core tables."""
    for arch in (SM90, (8, 0)):
        assert configs.fwd_config(arch, 128, False, torch.float32, precision="ieee") == configs._IEEE_FWD[128]
        assert configs.bwd_config(arch, 128, True, torch.float32, precision="ieee") == configs._IEEE_BWD[128]
        assert configs.fwd_config(arch, 128, False, torch.float32, precision="tf32x3") == configs._TF32X3_FWD[128]
        assert configs.bwd_config(arch, 128, True, torch.float32, precision="tf32x3") == configs._TF32X3_BWD[128]
    assert configs.fwd_config(SM90, 128, False, torch.float32, interpreter=True,
                              precision="ieee") == configs.INTERPRETER_FWD
    q = torch.zeros(1, 256, 2, 128)
    lse = torch.zeros(1, 2, 256)
    geo = launch.Geometry.of(q, q)
    sa = launch.ScoreArgs.make(geo, 0.1, -1, -1, 0.0, None, lse)
    q1 = torch.zeros(1, 1, 8, 256)  # one decode token of 8 query heads on one KV head, D256
    k1 = torch.zeros(1, 64, 1, 256)
    lse1 = torch.zeros(1, 8, 1)
    geo1 = dataclasses.replace(launch.Geometry.of(q1, k1), seqused_k=torch.tensor([50], dtype=torch.int32))
    sa1 = launch.ScoreArgs.make(geo1, 0.1, -1, -1, 0.0, None, lse1)

    def launched(arch):
        """(BLOCK_M, BLOCK_N, DOT_PRECISION) of the forward, the dQ kernel, the probabilities kernel (D128) and the
        split-KV kernel (D256)."""
        fwd = launch.forward_launches(geo, q, q, q, q, lse, None, sa, arch, interpreter=False)[0]
        dq = bwd_launch.backward_launches(geo, q, q, q, q, q, lse, lse, lse, q, q, q, None, 0.1, sa, arch,
                                          interpreter=False)[-1]
        probs = launch.probs_launches(geo, q, q, lse, torch.zeros(1, 2, 256, 256), sa, arch, interpreter=False)[0]
        cfg, splits, precision = kvcache_launch.splitkv_plan(geo1, 4096, 0, arch, torch.float32, torch.device("cpu"),
                                                             interpreter=False)
        split = kvcache_launch.splitkv_launches(geo1, q1, k1, k1, q1, lse1, sa1, cfg, splits, precision)[0]
        return [(kl.constexprs["BLOCK_M"], kl.constexprs["BLOCK_N"], kl.constexprs["DOT_PRECISION"])
                for kl in (fwd, dq, probs, split)]

    def expected(fwd, dq, decode_block_n, precision):
        return [(fwd.BLOCK_M, fwd.BLOCK_N, precision), (dq.BLOCK_M, dq.BLOCK_N, precision),
                (fwd.BLOCK_M, fwd.BLOCK_N, precision), (16, decode_block_n, precision)]

    matmul.allow_tf32 = False
    assert launched(SM90) == expected(configs._TF32X3_FWD[128], configs._TF32X3_BWD[128].dq,
                                      configs._TF32X3_DECODE[256][0], "tf32x3")
    assert launched((7, 5)) == expected(configs._IEEE_FWD[128], configs._IEEE_BWD[128].dq,
                                        configs._IEEE_DECODE[256][0], "ieee")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert launched((9, 4)) == launched((7, 5))
    monkeypatch.undo()
    matmul.allow_tf32 = True
    assert launched(SM90) == expected(configs._GENERIC_FP32_FWD[128], configs._GENERIC_BWD[128].dq,
                                      configs._GENERIC_DECODE[256][0], "tf32")
    # The forward and dQ tiles differ between the three settings, and the decode tiles between FMA and tensor-core
    # dots, so a launcher that ignored the precision would fail the cases above.
    for table in ("FWD", "BWD"):
        tiles = [getattr(configs, name)[128] for name in (f"_IEEE_{table}", f"_TF32X3_{table}")] + [
            configs._GENERIC_FP32_FWD[128] if table == "FWD" else configs._GENERIC_BWD[128]]
        if table == "BWD":
            tiles = [t.dq for t in tiles]
        assert len(set(tiles)) == 3, tiles
    assert configs._IEEE_DECODE[256] != configs._GENERIC_DECODE[256]
    assert configs._IEEE_DECODE[256] != configs._TF32X3_DECODE[256]


def test_rocm_builds_take_the_portable_kernels_on_generic_tiles(monkeypatch, matmul):
    """A ROCm build of torch (torch.version.hip set): no NVIDIA capability (MI200's gfx90a reports (9, 0), which must
    pick neither Hopper's tables nor the Gluon kernels); DOT_PRECISION "ieee" for every dtype and TF32 setting (ROCm's
    triton takes "tf32" on gfx942 alone, MI200 refuses it even for 16-bit operands, which ignore it), with fp16 / bf16
    on the generic tensor-core tiles and fp32 on the FMA ones; bf16 GQA without fp32's per-head dK / dV sums; no fast
    launch path (ROCm's triton specializes tensors on their 2 GB span, which its key does not hold); dropout's keep
    mask as a factor in the dK/dV kernel (its booleans did not compile for gfx942 / gfx90a / gfx950 at D64)."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert launch._arch.__wrapped__(torch.device("cuda", 0)) is None  # before any CUDA call: no GPU needed
    for tf32 in (False, True):
        matmul.allow_tf32 = tf32
        assert {launch._dot_precision(dtype, None) for dtype in (torch.float16, torch.bfloat16, torch.float32)} == {
            "ieee"}
    matmul.allow_tf32 = False
    q = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16)  # two query heads per KV head
    lse = torch.zeros(1, 4, 256)
    geo = launch.Geometry.of(q, k)
    sa = launch.ScoreArgs.make(geo, 0.1, -1, -1, 0.0, None, lse)
    fwd = launch.forward_launches(geo, q, k, k, q, lse, None, sa, None, interpreter=False)[0]
    generic = configs._GENERIC_FWD[128]
    assert (fwd.constexprs["BLOCK_M"], fwd.constexprs["BLOCK_N"], fwd.constexprs["DOT_PRECISION"]) == (
        generic.BLOCK_M, generic.BLOCK_N, "ieee")
    rows = torch.zeros(geo.row_buffer_shape(q))
    bwd = bwd_launch.backward_launches(geo, q, q, k, k, q, lse, rows, rows, q, k, k, None, 0.1, sa, None,
                                       interpreter=False)
    dkdv, dq = [kl for kl in bwd if kl.kernel.fn.__name__ == "_attn_bwd_dkdv"][0], bwd[-1]
    assert not dkdv.constexprs["SPLIT_GROUP_SUM"] and dkdv.constexprs["DOT_PRECISION"] == "ieee"
    assert not dkdv.constexprs["DROPOUT_FACTOR"]  # no dropout: nothing to apply
    sa_drop = launch.ScoreArgs.make(geo, 0.1, -1, -1, 0.0, None, lse, None, 0.1, torch.zeros(1, dtype=torch.int64))
    dkdv_drop = bwd_launch.backward_launches(geo, q, q, k, k, q, lse, rows, rows, q, k, k, None, 0.1, sa_drop, None,
                                             interpreter=False)[1]
    assert dkdv_drop.constexprs["HAS_DROPOUT"] and dkdv_drop.constexprs["DROPOUT_FACTOR"]  # ROCm triton 3.9's D64
    assert (dq.constexprs["BLOCK_M"], dq.constexprs["BLOCK_N"]) == (configs._GENERIC_BWD[128].dq.BLOCK_M,
                                                                    configs._GENERIC_BWD[128].dq.BLOCK_N)
    q32 = q.float()
    fwd32 = launch.forward_launches(launch.Geometry.of(q32, q32), q32, q32, q32, q32, lse, None, sa, None,
                                    interpreter=False)[0]
    assert (fwd32.constexprs["BLOCK_M"], fwd32.constexprs["BLOCK_N"]) == (configs._IEEE_FWD[128].BLOCK_M,
                                                                          configs._IEEE_FWD[128].BLOCK_N)
    from flashtile import fast_launch, gluon_launch
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(fast_launch, "_on", None)
    assert not fast_launch.enabled()
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(fast_launch, "_on", None)
    assert fast_launch.enabled() == (os.environ.get("FLASHTILE_FAST_LAUNCH", "1") != "0")


def test_keys_per_row_counts_the_window_span():
    q = torch.zeros(1, 8192, 2, 128)
    geo = launch.Geometry.of(q, q)

    def keys(left, right):
        return launch.ScoreArgs.make(geo, 0.1, left, right, 0.0, None, q).keys_per_row(geo.seqlen_k)

    assert keys(-1, -1) == 8192
    assert keys(-1, 0) == 8192  # causal: the last row sees every key
    assert keys(256, 0) == 257
    assert keys(100, 50) == 151


def test_local_backward_has_its_own_table():
    for head_dim in (64, 128, 256):
        assert configs.bwd_config(SM90, head_dim, False, torch.bfloat16) == configs._SM90_BWD[head_dim]
        assert configs.bwd_config(SM90, head_dim, True, torch.bfloat16) == configs._SM90_BWD_LOCAL[head_dim]
    assert configs.bwd_config(SM90, 128, True, torch.float32) == configs._GENERIC_BWD[128]


def test_gluon_forward_policy():
    """The Gluon forward is wanted only where it measured faster (configs.GLUON_FWD_MIN_KEYS), and short rows take
    the persistent grid where it measured faster (configs.GLUON_FWD_PERSISTENT), long D64 rows three consumer
    warpgroups (configs.GLUON_FWD_LONG)."""
    assert configs.gluon_fwd_wanted(128, False, 256)
    assert not configs.gluon_fwd_wanted(128, True, 256) and configs.gluon_fwd_wanted(128, True, 512)
    assert not configs.gluon_fwd_wanted(64, False, 256) and configs.gluon_fwd_wanted(64, False, 512)
    assert not configs.gluon_fwd_wanted(64, True, 2048) and configs.gluon_fwd_wanted(64, True, 4096)
    # Plain dense calls (the persistent grid's): D64 causal from 512 keys (since session 27).
    assert not configs.gluon_fwd_wanted(64, True, 511, plain=True)
    assert configs.gluon_fwd_wanted(64, True, 512, plain=True)
    assert all(configs.gluon_fwd_wanted(d, c, 512, plain=True) == configs.gluon_fwd_wanted(d, c, 512)
               for d, c in configs.GLUON_FWD_MIN_KEYS if (d, c) != (64, True))
    assert configs.gluon_fwd_wanted(256, True, 512) and not configs.gluon_fwd_wanted(256, False, 256)
    assert not configs.gluon_fwd_wanted(128, False, 8192, window_span=257)  # narrow windows: the 64x64 tiles
    assert configs.gluon_fwd_wanted(128, False, 8192, window_span=1025)
    assert configs.gluon_fwd_variant(128, False, 4096, plain=True) == "persistent-tma-q2"
    assert configs.gluon_fwd_variant(128, False, 4097, plain=True) == "default"
    # Causal short rows: the persistent grid's tiles heavy first by groups of heads, listed by the host (schedN) or
    # dealt by the grid's stride (lptN).
    assert configs.gluon_fwd_variant(128, True, 4096, plain=True) == "persistent-tma-q2-de-sched4"  # session 28
    assert configs.gluon_fwd_variant(128, True, 4097, plain=True) == "persistent-tma-sched4"
    assert configs.gluon_fwd_variant(128, True, 16384, plain=True) == "persistent-tma-sched4"
    assert configs.gluon_fwd_variant(128, True, 16385, plain=True) == "default"
    # D256: the lazy rescale since session 29
    assert configs.gluon_fwd_variant(256, False, 2048, plain=True) == "persistent-lr"
    assert configs.gluon_fwd_variant(256, False, 16384, plain=True) == "persistent-lr"  # to 16K since session 28
    assert configs.gluon_fwd_variant(256, False, 16385, plain=True) == "default"
    assert configs.gluon_fwd_variant(256, True, 512, plain=True) == "persistent-sched4-lr"  # from 0 since session 20
    assert configs.gluon_fwd_variant(256, True, 4096, plain=True) == "persistent-sched4-lr"
    assert configs.gluon_fwd_variant(256, True, 16384, plain=True) == "persistent-sched4-lr"
    assert configs.gluon_fwd_variant(256, True, 16385, plain=True) == "default"
    assert configs.gluon_fwd_variant(64, True, 512, plain=True) == "persistent-tma-q2-de-sched4"
    # Calls with features or varlen run the one-tile kernel: the default's config, not a persistent variant's
    # (whose tile order would reach the one-tile kernel unmeasured).
    assert all(configs.gluon_fwd_variant(d, c, 1024) == "default" for d, c in configs.GLUON_FWD_PERSISTENT)
    for (head_dim, _), ranges in configs.GLUON_FWD_PERSISTENT.items():
        for (variant, least, most), after in zip(ranges, ranges[1:] + ((None, math.inf, None), )):
            assert gluon_variants.VARIANTS[variant][head_dim].persistent and 0 <= least < most < after[1]
    # D64 plain rows: the persistent grid of two consumers to 1K keys, of three (192-row tiles, the lazy rescale) to
    # 16K; longer ones and the features' from 2K keys three consumers in the one-tile kernel (configs.GLUON_FWD_LONG).
    assert configs.gluon_fwd_variant(64, False, 1024, plain=True) == "persistent-tma-q2-de"
    assert configs.gluon_fwd_variant(64, False, 1025, plain=True) == "persistent-3wg-tma-q2-lr"
    assert configs.gluon_fwd_variant(64, False, 16384, plain=True) == "persistent-3wg-tma-q2-lr"
    assert configs.gluon_fwd_variant(64, False, 16385, plain=True) == "d64-3wg"
    assert configs.gluon_fwd_variant(64, False, 2048) == "default"
    assert configs.gluon_fwd_variant(64, False, 2049) == "d64-3wg"
    assert configs.gluon_fwd_variant(64, True, 4096, plain=True) == "persistent-tma-q2-de-sched4"
    assert configs.gluon_fwd_variant(64, True, 4097, plain=True) == "default"
    assert configs.gluon_fwd_variant(64, True, 8192) == "d64-3wg"
    assert configs.gluon_fwd_variant(128, False, 16384, plain=True) == "default"
    for (head_dim, _), (variant, _) in configs.GLUON_FWD_LONG.items():
        assert gluon_variants.VARIANTS[variant][head_dim].consumers == 3


def test_gluon_backward_policy():
    """The Gluon backward: from 512 keys at D64 / D128 / D256, not for windows narrower than GLUON_BWD_MIN_WINDOW
    keys."""
    assert configs.gluon_bwd_wanted(128, False, 512) and not configs.gluon_bwd_wanted(128, False, 511)
    assert configs.gluon_bwd_wanted(64, True, 512) and not configs.gluon_bwd_wanted(64, True, 511)
    assert configs.gluon_bwd_wanted(64, False, 16384) and not configs.gluon_bwd_wanted(32, False, 16384)
    assert not configs.gluon_bwd_wanted(128, True, 8192, window_span=257)
    assert configs.gluon_bwd_wanted(128, True, 8192, window_span=1025)


def test_d256_dv_dk_split_launches_dv_then_dk(monkeypatch):
    """D256 on sm90 (the "dv-dk" default since session 7): two dK/dV launches (PART 1: dV, PART 2: dK) at the
    variant's own tiles, then dQ; FLASHTILE_D256_BWD=desc: one launch with both accumulators (PART 0)."""
    q = torch.empty(1, 4096, 8, 256, dtype=torch.bfloat16)
    lse = torch.empty(1, 8, 4096)
    geo = launch.Geometry.of(q, q)

    def dkdv_launches(causal):
        sa = launch.ScoreArgs.make(geo, 0.1, -1, 0 if causal else -1, 0.0, None, lse)
        launches = bwd_launch.backward_launches(geo, q, q, q, q, q, lse, lse, lse, q, q, q, None, 0.1, sa, SM90, False)
        assert launches[-1].kernel.__name__ == "_attn_bwd_dq"
        return [(kl.constexprs["PART"], kl.constexprs["BLOCK_M"], kl.constexprs["BLOCK_N"], kl.num_stages)
                for kl in launches[1:-1]]

    monkeypatch.setattr(configs, "D256_BWD", "desc")
    assert dkdv_launches(False) == [(0, 64, 64, 2)]
    for variant in ("", "dv-dk"):
        monkeypatch.setattr(configs, "D256_BWD", variant)
        for causal in (False, True):
            cfg = configs.D256_BWD_VARIANTS["dv-dk"][int(causal)]
            assert configs.bwd_config(SM90, 256, causal, torch.bfloat16) == cfg
            assert dkdv_launches(causal) == [(1, cfg.dkdv.BLOCK_M, cfg.dkdv.BLOCK_N, cfg.dkdv.num_stages),
                                             (2, cfg.dk.BLOCK_M, cfg.dk.BLOCK_N, cfg.dk.num_stages)]
    assert configs.bwd_config(SM90, 128, False, torch.bfloat16) == configs._SM90_BWD[128]  # D256 only
