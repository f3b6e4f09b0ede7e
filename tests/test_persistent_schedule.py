"""The host's tile lists for the persistent Gluon forward (persistent_schedule.py): every tile listed once, in the
heavy-first order by groups of heads, balanced as list scheduling promises. CPU only; the GPU check that a listed
launch gives the static order's results bit for bit is tests/test_gluon_grid_order.py."""
import pytest
import torch

from flashtile import persistent_schedule as ps


def test_heavy_first_order():
    # 2 ranks x 3 heads by groups of 2: the group's longest tiles (pid_m 1) first, then the short last group.
    assert ps.heavy_first_tiles(2, 3, 2) == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (0, 2)]
    assert ps.heavy_first_tiles(2, 3, 3) == [(1, 0), (1, 1), (1, 2), (0, 0), (0, 1), (0, 2)]


def test_causal_blocks_bottom_right():
    assert [ps.causal_blocks(m, 512, 512, 128, 128) for m in range(4)] == [1, 2, 3, 4]
    assert [ps.causal_blocks(m, 512, 512, 128, 64) for m in range(4)] == [2, 4, 6, 8]
    assert ps.causal_blocks(0, 333, 1000, 128, 128) == 7  # rows see keys up to 128 + 667
    assert ps.causal_blocks(0, 1000, 300, 128, 128) == 0  # the first rows see no key


def test_list_schedule_gives_each_item_to_the_first_free():
    assert ps.list_schedule([4, 3, 2, 2, 1], 2) == [[0, 3], [1, 2, 4]]  # frees at 4 / 3, then 4 / 5, 6 / 5
    assert ps.list_schedule([], 3) == [[], [], []]


@pytest.mark.parametrize("n_m,n_bh,ctas,group,sq,sk,bn", [
    (8, 256, 132, 8, 1024, 1024, 128), (16, 128, 132, 4, 2048, 2048, 128), (4, 512, 132, 8, 512, 512, 64),
    (3, 15, 7, 8, 333, 1000, 128), (8, 20, 132, 20, 1000, 1000, 128)])
def test_table_lists_every_tile_once_and_balances(n_m, n_bh, ctas, group, sq, sk, bn):
    table = ps.schedule_table(n_m, n_bh, ctas, group, sq, sk, 128, bn)
    offsets, listed = table[:ctas + 1], table[ctas + 1:]
    assert offsets[0] == 0 and offsets[-1] == len(listed) == n_m * n_bh
    assert all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert sorted(listed) == list(range(n_m * n_bh))
    cost = [ps.causal_blocks(m, sq, sk, 128, bn) + ps.TILE_OVERHEAD for m in range(n_m)]
    loads = [sum(cost[t // n_bh] for t in listed[a:b]) for a, b in zip(offsets, offsets[1:])]
    # List scheduling's bound: the last CTA to finish started its last tile when every CTA was busy.
    assert max(loads) <= sum(loads) / ctas + max(cost)
    # Each CTA runs its tiles in the heavy-first order's sequence.
    rank = {m * n_bh + bh: i for i, (m, bh) in enumerate(ps.heavy_first_tiles(n_m, n_bh, group))}
    for a, b in zip(offsets, offsets[1:]):
        assert [rank[t] for t in listed[a:b]] == sorted(rank[t] for t in listed[a:b])


def test_lists_are_kept_per_shape_and_device():
    args = (torch.device("cpu"), 4, 6, 5, 2, 512, 512, 128, 128)
    first = ps.persistent_schedule(*args)
    assert first.dtype == torch.int32 and ps.persistent_schedule(*args) is first
    assert first.tolist() == ps.schedule_table(*args[1:])
    assert ps.persistent_schedule(torch.device("cpu"), 4, 6, 5, 3, 512, 512, 128, 128) is not first


def test_capture_without_a_kept_list_takes_the_stride(monkeypatch):
    """Under a CUDA graph capture a new list would need a host-to-device copy: None (the caller launches the grid's
    stride order), and nothing is kept."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    kept = dict(ps._kept)
    assert ps.persistent_schedule(torch.device("cuda", 0), 4, 6, 5, 2, 512, 512, 128, 128) is None
    assert ps._kept == kept


ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _capture(fn):
    """(graph, out) of fn() captured on a side stream, as torch.cuda.graph does."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_gpu_listed_launch_in_a_cuda_graph():
    """flash_attn_func's causal D128 forward at 1K keys (the persistent grid with its tiles listed,
    configs.GLUON_FWD_PERSISTENT) captured after an eager call and replayed on new inputs equals the eager call."""
    import flashtile
    q, k, v = (torch.randn(3, 1024, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flashtile.flash_attn_func(q, k, v, causal=True)  # compiles, builds and keeps the list
    kept = len(ps._kept)
    graph, out = _capture(lambda: flashtile.flash_attn_func(q, k, v, causal=True))
    assert len(ps._kept) == kept
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        assert torch.equal(out, flashtile.flash_attn_func(q, k, v, causal=True))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU")
def test_gpu_capture_before_any_list_takes_the_stride():
    """A shape first seen under capture: no list is built there (the stride order runs, the same bits) and no plan is
    kept, so the next eager call builds the list and is planned with it."""
    import flashtile
    from flashtile import gluon_launch, plans
    q, k, v = (torch.randn(5, 1024, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # Compile the stride-order kernel the capture falls back to (the same constexprs) on another shape.
    small = torch.randn(1, 1024, 4, 128, device="cuda", dtype=torch.bfloat16)
    gluon_launch.gluon_forward(small, small, small, causal=True, variant="persistent-tma-lpt4")
    flashtile.flash_attn_func(small, small, small, causal=True)  # and the listed kernel
    kept, recorded = len(ps._kept), plans.counts[1]
    graph, out = _capture(lambda: flashtile.flash_attn_func(q, k, v, causal=True))
    assert len(ps._kept) == kept and plans.counts[1] == recorded
    graph.replay()
    want = flashtile.flash_attn_func(q, k, v, causal=True)
    assert len(ps._kept) == kept + 1 and plans.counts[1] == recorded + 1
    assert torch.equal(out, want)
