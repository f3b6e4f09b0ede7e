"""Split-KV decoding with the combine fused into the split-KV kernel (configs.DECODE_FUSED_COMBINE): the last program
of each tile to finish merges the tile's splits, so a decode step is one launch. Same output and lse as the two
kernels (up to a few ulps: the splits are merged one at a time, not 16 at a time), the reference's, and the arrival
counters are zero again after every call."""
import pytest
import torch

import flashtile
from conftest import DEVICE
from flashtile import configs, launch
from test_decode import SEQLENS, check, make_cache, paged_copy
from test_kvcache_seqlens import _DeviceWork, _inputs


@pytest.fixture(autouse=True)
def _own_counters(monkeypatch):
    """Each test starts without counters, so a failing one leaves none behind."""
    monkeypatch.setattr(launch, "_counters", {})
    monkeypatch.setattr(launch, "_retired_counters", [])


def _both_paths(monkeypatch, q, k_cache, v_cache, **kwargs):
    """(out, lse) of the two-kernel path, then of the fused one."""
    results = []
    for fused in (False, True):
        monkeypatch.setattr(configs, "DECODE_FUSED_COMBINE", fused)
        results.append(flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **kwargs))
    return results


def _check_fused(two_kernels, fused):
    """The fused path's out / lse against the two kernels' (a few fp32 ulps; -inf in the same places), and every
    counter back at zero."""
    for name, want, got in zip(("out", "lse"), two_kernels, fused):
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)
    assert launch._counters, "the fused path used no counters"
    assert all(torch.all(c == 0) for c in launch._counters.values())


@pytest.mark.parametrize("num_splits", [2, 3, 5], ids=["s2", "s3", "s5"])
@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
def test_fused_matches_two_kernels(monkeypatch, num_splits, heads_q, heads_kv):
    """Rows of 0, 9 and 71 keys (16-key blocks): empty splits, and a row no split sees."""
    q, k_cache, v_cache = make_cache(DEVICE, len(SEQLENS), 1, heads_q, heads_kv, capacity=80)
    cache_seqlens = torch.tensor(SEQLENS, dtype=torch.int32, device=DEVICE)
    two_kernels, fused = _both_paths(monkeypatch, q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                     num_splits=num_splits)
    _check_fused(two_kernels, fused)
    check(*fused, q, k_cache, v_cache, SEQLENS)


def test_fused_paged_causal(monkeypatch):
    """Pages of 16 in shuffled order; causal MQA with 5 queries: 20 packed rows, two row blocks (two tiles per
    batch row, each with its own counter)."""
    q, k_cache, v_cache = make_cache(DEVICE, len(SEQLENS), 5, 4, 1, capacity=80)
    k_pages, v_pages, table = paged_copy(k_cache, v_cache, 16, torch.Generator().manual_seed(1))
    cache_seqlens = torch.tensor(SEQLENS, dtype=torch.int32, device=DEVICE)
    two_kernels, fused = _both_paths(monkeypatch, q, k_pages, v_pages, cache_seqlens=cache_seqlens,
                                     block_table=table.to(DEVICE), causal=True, num_splits=3)
    _check_fused(two_kernels, fused)
    check(*fused, q, k_cache, v_cache, SEQLENS, causal=True)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_one_launch_per_decode_step(monkeypatch, paged):
    """As test_kvcache_seqlens.test_launches_per_decode_step with two splits: the split-KV kernel alone, nothing
    else (the counters are allocated and zeroed by the first call on a stream, then reused)."""
    monkeypatch.setattr(configs, "DECODE_FUSED_COMBINE", True)
    q, k_cache, v_cache, table, _, _, _, _ = _inputs(DEVICE, paged)

    def step():
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=10, block_table=table,
                                                 num_splits=2)
    step()
    checks_only = _DeviceWork(monkeypatch)  # what a block table's range check runs (test_launches_per_decode_step)
    if table is not None:
        with checks_only:
            flashtile.checks.block_table(table, q.shape[0], k_cache.shape[0], k_cache.device)
    rec = _DeviceWork(monkeypatch)
    with rec:
        step()
    assert rec.work == checks_only.work + ["_attn_fwd_splitkv"]


def test_counters_grow_and_keep_the_old_buffer():
    """A call needing more tiles gets a larger zeroed buffer; the old one stays allocated (a CUDA graph captured
    with it still counts there); a smaller call reuses the buffer."""
    q = torch.zeros(1, device=DEVICE)
    small = launch._split_counters(q, 3)
    assert small.dtype == torch.int32 and small.numel() >= 3 and torch.all(small == 0)
    assert launch._split_counters(q, 2) is small
    large = launch._split_counters(q, 100)
    assert large.numel() >= 100 and torch.all(large == 0) and launch._retired_counters == [small]
    assert launch._split_counters(q, 3) is large
