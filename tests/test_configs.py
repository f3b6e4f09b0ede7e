"""Tile-configuration lookup (configs.py): which table serves which call. Pure Python, no kernels run."""
import torch

from flashtile import configs, launch

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
    """The Gluon forward is wanted only where it measured faster (configs.GLUON_FWD_MIN_KEYS)."""
    assert configs.gluon_fwd_wanted(128, False, 512)
    assert not configs.gluon_fwd_wanted(128, True, 512) and configs.gluon_fwd_wanted(128, True, 1024)
    assert not configs.gluon_fwd_wanted(64, False, 2048) and configs.gluon_fwd_wanted(64, False, 4096)
    assert configs.gluon_fwd_wanted(256, False, 4096) and not configs.gluon_fwd_wanted(256, True, 2048)
    assert not configs.gluon_fwd_wanted(128, False, 8192, window_span=257)  # narrow windows: the 64x64 tiles
    assert configs.gluon_fwd_wanted(128, False, 8192, window_span=1025)
