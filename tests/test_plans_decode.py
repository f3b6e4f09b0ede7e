"""Launch plans for flash_attn_with_kvcache's decode step and its KV-cache append (plans.py): on CPU with the kernels
stubbed as in test_plans.py (whose gluon_on_cpu fixture this builds on), and on an H200 against the launchers."""
import pytest
import torch

from flashtile import fast_launch, kvcache_launch, plans
from test_plans import _normal, _stub, gluon_on_cpu  # noqa: F401  (a fixture decode_on_cpu builds on)


@pytest.fixture
def decode_on_cpu(gluon_on_cpu, monkeypatch):  # noqa: F811
    """gluon_on_cpu with the split-KV decode kernel, its combine and the KV-cache append stubbed too."""
    for name in ("_attn_fwd_splitkv", "_attn_combine", "_rotary_append"):
        _stub(monkeypatch, kvcache_launch, name, gluon_on_cpu)
    kvcache_launch._kvcache_tiles.clear()
    yield gluon_on_cpu
    kvcache_launch._kvcache_tiles.clear()


def _decode(q, k_cache, v_cache, length, seqused_k=None, block_table=None, max_seqlen_k=None, **features):
    """A decode step as flash_attn_with_kvcache makes it with an int cache length (no append)."""
    args = dict(softmax_scale=0.125, window_left=-1, window_right=0, softcap=0.0, alibi_slopes=None)
    args.update(features)
    return kvcache_launch._flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table,
                                                      args["softmax_scale"], args["window_left"], args["window_right"],
                                                      args["softcap"], args["alibi_slopes"], max_seqlen_k or length, 0,
                                                      args.get("key_start"), length)


def _cache(batch=2, capacity=4096, heads_kv=2, heads_q=8):
    q = torch.randn(batch, 1, heads_q, 128, dtype=torch.bfloat16)
    return q, torch.randn(batch, capacity, heads_kv, 128, dtype=torch.bfloat16), \
        torch.randn(batch, capacity, heads_kv, 128, dtype=torch.bfloat16)


def test_decode_step_replays_with_its_cache_length(decode_on_cpu):
    """The second decode step of a signature replays the first's launches (split-KV kernel and combine) with its own
    cache length in the split kernel's seqused_add, and only there; the third, under another split count (a much
    longer cache), records a plan of its own."""
    calls = decode_on_cpu
    q, k_cache, v_cache = _cache()
    replayed, recorded = plans.counts
    out1, lse1 = _decode(q, k_cache, v_cache, 3000)
    n = len(calls)
    assert n == 2 and plans.counts == [replayed, recorded + 1]  # split kernel + combine
    q2 = torch.randn_like(q)
    out2, lse2 = _decode(q2, k_cache, v_cache, 3001)
    assert len(calls) == 4 and plans.counts == [replayed + 1, recorded + 1]
    pos = kvcache_launch._SEQUSED_ADD_ARG
    first, second = _normal(calls[0], (q, k_cache, v_cache, out1, lse1)), _normal(calls[2], (q2, k_cache, v_cache,
                                                                                               out2, lse2))
    assert first[pos] == 3000 and second[pos] == 3001
    assert first[:pos] + first[pos + 1:] == second[:pos] + second[pos + 1:len(first)]
    assert _normal(calls[1], (out1, lse1)) == _normal(calls[3][:len(calls[1])], (out2, lse2))
    _decode(q2, k_cache, v_cache, 40)  # one key block: one split, no combine
    assert plans.counts == [replayed + 1, recorded + 2] and len(calls) == 5
    _decode(q, k_cache, v_cache, 41)
    assert plans.counts == [replayed + 2, recorded + 2] and calls[5][pos] == 41


def test_decode_plans_take_length_tensors_and_pages(decode_on_cpu):
    """A per-row length tensor and a block table are a plan's inputs: a replay passes the new ones."""
    calls = decode_on_cpu
    q, k_cache, v_cache = _cache()
    pages = k_cache.reshape(-1, 256, 2, 128)[:20], v_cache.reshape(-1, 256, 2, 128)[:20]
    replayed, recorded = plans.counts
    for step in range(2):
        lengths = torch.tensor([1000 + step, 2000], dtype=torch.int32)
        table = torch.arange(20, dtype=torch.int32).reshape(2, 10).flip(0)
        out, lse = _decode(q, *pages, 1, seqused_k=lengths, block_table=table, max_seqlen_k=2001)
        assert any(a is lengths for a in calls[-2]) and any(a is table for a in calls[-2])
    assert plans.counts == [replayed + 1, recorded + 1]


def test_decode_plans_take_alibi_and_left_padding(decode_on_cpu):
    """ALiBi slopes and a left padding (key_start) are a plan's inputs: a replay passes the new tensors, and a
    step without them (or with slopes of another shape) has a plan of its own."""
    calls = decode_on_cpu
    q, k_cache, v_cache = _cache()
    replayed, recorded = plans.counts
    for step in range(2):
        slopes, pads = torch.rand(8), torch.tensor([step, 7], dtype=torch.int32)
        _decode(q, k_cache, v_cache, 1000 + step, alibi_slopes=slopes, key_start=pads)
        assert any(a is slopes for a in calls[-2]) and any(a is pads for a in calls[-2])
        assert calls[-2][kvcache_launch._SEQUSED_ADD_ARG] == 1000 + step
    assert plans.counts == [replayed + 1, recorded + 1]
    _decode(q, k_cache, v_cache, 1000, alibi_slopes=torch.rand(8))
    _decode(q, k_cache, v_cache, 1000, alibi_slopes=torch.rand(2, 8))
    _decode(q, k_cache, v_cache, 1000)
    assert plans.counts == [replayed + 1, recorded + 4]


def test_decode_steps_that_are_not_planned(decode_on_cpu):
    """Query chunks too long for the split-KV kernel take the launchers at every call; so does a cache length past
    int32."""
    q, k_cache, v_cache = _cache()
    assert kvcache_launch._planned_kvcache(q, k_cache, v_cache, None, None, 0.125, -1, 0, 0.0, None, 2**31, 0, None,
                                           2**31) is None
    long_q = torch.randn(2, 64, 8, 128, dtype=torch.bfloat16)  # 4 * 64 packed rows > configs.DECODE_MAX_ROWS
    counts = list(plans.counts)
    for _ in range(2):
        _decode(long_q, k_cache, v_cache, 1000, alibi_slopes=torch.rand(8))
    assert plans.counts == counts
    assert kvcache_launch._planned_kvcache(long_q, k_cache, v_cache, None, None, 0.125, -1, 0, 0.0, None, 1000, 0, None,
                                           1000) is None


def _append(q, k_cache, v_cache, k, v, cos, sin, length, seqlens=None, block_table=None):
    """The append (with rotary when cos is given) as flash_attn_with_kvcache makes it for a decode step."""
    return kvcache_launch._kvcache_append(q, k_cache, v_cache, k, v, cos, sin, seqlens, block_table, True, False,
                                          length)


def test_append_replays_with_its_cache_length(decode_on_cpu):
    """The second append of a signature replays the first's launch with its own cache length in the kernel's
    cache_add and a fresh rotated q; an append without rotary (no q out) is planned too and returns an empty tensor;
    a cache length past int32 takes the launcher."""
    calls = decode_on_cpu
    q, k_cache, v_cache = _cache()
    k, v = (torch.randn(2, 1, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(8192, 32) for _ in range(2))
    replayed, recorded = plans.counts
    q_rot1 = _append(q, k_cache, v_cache, k, v, cos, sin, 3000)
    assert len(calls) == 1 and plans.counts == [replayed, recorded + 1]
    q2 = torch.randn_like(q)
    q_rot2 = _append(q2, k_cache, v_cache, k, v, cos, sin, 3001)
    assert len(calls) == 2 and plans.counts == [replayed + 1, recorded + 1]
    assert q_rot2 is not q_rot1 and q_rot2.shape == q.shape
    pos = kvcache_launch._CACHE_ADD_ARG
    first = _normal(calls[0], (q, q_rot1, k, v, k_cache, v_cache, cos, sin))
    second = _normal(calls[1], (q2, q_rot2, k, v, k_cache, v_cache, cos, sin))
    assert first[pos] == 3000 and second[pos] == 3001
    assert first[:pos] + first[pos + 1:] == second[:pos] + second[pos + 1:len(first)]
    for length in (10, 11):
        out = _append(q, k_cache, v_cache, k, v, None, None, length)
        assert out.numel() == 0 and calls[-1][pos] == length
    assert plans.counts == [replayed + 2, recorded + 2]
    _append(q, k_cache, v_cache, k, v, None, None, 2**31)
    assert plans.counts == [replayed + 2, recorded + 2] and len(calls) == 5


def test_append_plans_take_length_tensors_and_pages(decode_on_cpu):
    """A per-row length tensor and a block table are the append plan's inputs: a replay passes the new ones."""
    calls = decode_on_cpu
    q, k_cache, v_cache = _cache()
    pages = k_cache.reshape(-1, 256, 2, 128)[:20], v_cache.reshape(-1, 256, 2, 128)[:20]
    k, v = (torch.randn(2, 1, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    replayed, recorded = plans.counts
    for step in range(2):
        lengths = torch.tensor([1000 + step, 2000], dtype=torch.int32)
        table = torch.arange(20, dtype=torch.int32).reshape(2, 10).flip(0)
        _append(q, *pages, k, v, None, None, 0, seqlens=lengths, block_table=table)
        assert any(a is lengths for a in calls[-1]) and any(a is table for a in calls[-1])
    assert plans.counts == [replayed + 1, recorded + 1]


@pytest.mark.gpu
def test_gpu_replayed_decode_steps_match_the_launchers():
    """On an H200: decode steps over a growing cache (contiguous and paged, int lengths and a length tensor, ALiBi
    with a left padding) replayed from their plans give bitwise the launchers' outputs, and they did replay."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)) or not fast_launch.enabled():
        pytest.skip("needs an sm90 GPU and the fast launch path (triton 3.6, FLASHTILE_FAST_LAUNCH unset)")
    torch.manual_seed(0)
    q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(4, 8192, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pages = k_cache.view(-1, 16, 4, 128), v_cache.view(-1, 16, 4, 128)
    table = torch.randperm(4 * 512, device="cuda", dtype=torch.int32).reshape(4, 512)
    plans.clear()
    replayed = plans.counts[0]
    for length in (100, 101, 2047, 2048, 2049, 8000):
        for caches, kwargs in (((k_cache, v_cache), {}), (pages, dict(block_table=table))):
            got = _decode(q, *caches, length, **kwargs)
            want = kvcache_launch._kvcache_launches(q, *caches, None, kwargs.get("block_table"), 0.125, -1, 0, 0.0,
                                                    None, length, 0, None, length)
            for a, b in zip(got, want):
                assert torch.equal(a, b), (length, kwargs.keys())
        lengths = torch.full((4,), length, device="cuda", dtype=torch.int32)
        got = _decode(q, k_cache, v_cache, 0, seqused_k=lengths, max_seqlen_k=length)
        want = kvcache_launch._kvcache_launches(q, k_cache, v_cache, lengths, None, 0.125, -1, 0, 0.0, None, length, 0,
                                                None, 0)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), length
        for caches, table_ in (((k_cache, v_cache), None), (pages, table)):  # ALiBi and a left padding
            slopes = torch.rand(4, 32, device="cuda")
            pads = torch.tensor([0, 1, length // 2, length - 1], device="cuda", dtype=torch.int32)
            got = _decode(q, *caches, length, block_table=table_, alibi_slopes=slopes, key_start=pads)
            want = kvcache_launch._kvcache_launches(q, *caches, None, table_, 0.125, -1, 0, 0.0, slopes, length, 0,
                                                    pads, length)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (length, table_ is None)
    assert plans.counts[0] > replayed + 12


@pytest.mark.gpu
def test_gpu_replayed_appends_match_the_launcher():
    """On an H200: appends with rotary over a growing cache (contiguous and paged, int lengths and a length tensor)
    replayed from their plans write the cache and the rotated q bitwise as the launcher does, and they did replay."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)) or not fast_launch.enabled():
        pytest.skip("needs an sm90 GPU and the fast launch path (triton 3.6, FLASHTILE_FAST_LAUNCH unset)")
    torch.manual_seed(0)
    q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 1, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(8192, 64, device="cuda") for _ in range(2))
    table = torch.randperm(4 * 512, device="cuda", dtype=torch.int32).reshape(4, 512)
    plans.clear()
    replayed = plans.counts[0]
    for length in (100, 101, 2047, 2048, 8000):
        for paged, seqlens in ((False, None), (True, None), (False, torch.full((4,), length, device="cuda",
                                                                               dtype=torch.int32))):
            add = 0 if seqlens is not None else length
            results = []
            for run in (lambda *a: kvcache_launch._kvcache_append(*a, True, False, add),
                        lambda *a: kvcache_launch._append_launches(*a, True, False, add)[0]):
                caches = [torch.zeros(4, 8192, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
                if paged:
                    caches = [c.view(-1, 16, 4, 128) for c in caches]
                q_rot = run(q, *caches, k, v, cos, sin, seqlens, table if paged else None)
                results.append((q_rot, *caches))
            assert all(torch.equal(a, b) for a, b in zip(*results)), (length, paged, seqlens is not None)
    assert plans.counts[0] > replayed + 8
