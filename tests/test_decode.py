"""Split-KV decoding in flash_attn_with_kvcache: every split count gives the reference's output and lse."""
import pytest
import torch

import flashtile
from flashtile import configs, kvcache_launch, launch
from utils import assert_close_rule

HEADS = [(4, 4), (8, 2), (4, 1)]
HEAD_IDS = ["mha", "gqa", "mqa"]
# 0 keys (an empty row), a partial key block, several blocks and a partial one (interpreter BLOCK_N = 16).
SEQLENS = [0, 9, 71]


def make_cache(device, batch, seqlen_q, heads_q, heads_kv, capacity, head_dim=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)  # noqa: E731
    return (make(batch, seqlen_q, heads_q, head_dim), make(batch, capacity, heads_kv, head_dim),
            make(batch, capacity, heads_kv, head_dim))


def check(out, lse, q, keys, values, lengths, **features):
    """Row b of out/lse against the float64 reference over keys[b, :lengths[b]] (tolerance rule of utils)."""
    slopes = features.pop("alibi_slopes", None)
    for b, n in enumerate(lengths):
        row_slopes = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        args = (q[b:b + 1], keys[b:b + 1, :n], values[b:b + 1, :n])
        if n == 0:  # no key: output 0, lse -inf
            assert torch.all(out[b] == 0) and torch.all(lse[b] == float("-inf"))
            continue
        ref, ref_lse = flashtile.attention_ref(*(a.double() for a in args), return_lse=True, alibi_slopes=row_slopes,
                                               **features)
        low, low_lse = flashtile.attention_ref(*args, upcast=False, return_lse=True, alibi_slopes=row_slopes,
                                               **features)
        assert_close_rule(f"row {b} out", out[b:b + 1], ref, low, q.dtype)
        finite = ref_lse > float("-inf")  # a query whose window holds no key has lse -inf
        assert torch.equal(lse[b:b + 1] == float("-inf"), ~finite), f"row {b}: lse -inf mismatch"
        assert_close_rule(f"row {b} lse", lse[b:b + 1][finite], ref_lse[finite], low_lse[finite].float(),
                          torch.float32)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 0, 64], ids=["s1", "s2", "s3", "auto", "s64"])
@pytest.mark.parametrize("heads_q,heads_kv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("seqlen_q,causal", [(1, False), (3, True)], ids=["q1", "q3-causal"])
def test_splits_match_reference(backend, num_splits, heads_q, heads_kv, seqlen_q, causal):
    """Any number of splits (64: more splits than key blocks, most of them empty) and an empty row."""
    _, device = backend
    q, k_cache, v_cache = make_cache(device, len(SEQLENS), seqlen_q, heads_q, heads_kv, capacity=80)
    cache_seqlens = torch.tensor(SEQLENS, dtype=torch.int32, device=device)
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, causal=causal,
                                                 num_splits=num_splits, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (len(SEQLENS), heads_q, seqlen_q)
    check(out, lse, q, k_cache, v_cache, SEQLENS, causal=causal)


@pytest.mark.parametrize("page_size", [1, 16, 33, 256])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["s1", "s3"])
def test_paged(backend, page_size, num_splits):
    """Pages in shuffled order, any page size; the new tokens are appended through the page table."""
    _, device = backend
    batch, pages_per_row = 3, -(-90 // page_size)
    capacity = pages_per_row * page_size
    q, k_dense, v_dense = make_cache(device, batch, 2, 8, 2, capacity)
    _, k_new, v_new = make_cache(device, batch, 2, 8, 2, 2, seed=1)
    order = torch.randperm(batch * pages_per_row, generator=torch.Generator().manual_seed(3))
    block_table = order.reshape(batch, pages_per_row).to(torch.int32).to(device)
    k_pages = torch.zeros(batch * pages_per_row, page_size, 2, 32, device=device)
    v_pages = torch.zeros_like(k_pages)
    k_pages[block_table.long()] = k_dense.reshape(batch, pages_per_row, page_size, 2, 32)
    v_pages[block_table.long()] = v_dense.reshape(batch, pages_per_row, page_size, 2, 32)
    cache_seqlens = torch.tensor([0, 40, 88], dtype=torch.int32, device=device)
    out, lse = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, cache_seqlens=cache_seqlens,
                                                 block_table=block_table, causal=True, num_splits=num_splits,
                                                 return_softmax_lse=True)
    keys = k_pages[block_table.long()].reshape(batch, capacity, 2, 32)
    values = v_pages[block_table.long()].reshape(batch, capacity, 2, 32)
    for b, start in enumerate(cache_seqlens.tolist()):
        assert torch.equal(keys[b, start:start + 2], k_new[b])
    check(out, lse, q, keys, values, [2, 42, 90], causal=True)


def paged_rows(device, lengths, page_size, capacity, heads_q=8, heads_kv=2, seed=0):
    """q and a contiguous cache (B, capacity, Hk, 32) for `lengths`, and the same cache in shuffled pages."""
    q, k_cache, v_cache = make_cache(device, len(lengths), 1, heads_q, heads_kv, capacity, seed=seed)
    k_pages, v_pages, table = paged_copy(k_cache, v_cache, page_size, torch.Generator().manual_seed(seed))
    return q, k_cache, v_cache, k_pages, v_pages, table.to(device)


# The GPU's decode tiles (64 keys) under the interpreter, where configs.INTERPRETER_DECODE has 16: pages of 16 and
# 32 put several pages in one tile (one lookup per key, shifts), 48 and 96 do not divide it (divisions), 64 and 256
# hold whole tiles (one lookup per tile). Rows end inside a page and inside a tile; leftpad shifts every tile off
# the page boundaries.
GPU_TILES = configs.TileConfig(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1)
TILE_LENGTHS = [0, 1, 63, 64, 65, 130, 200]


@pytest.mark.parametrize("leftpad", [False, True], ids=["aligned", "leftpad"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["s1", "s3"])
@pytest.mark.parametrize("page_size", [16, 32, 48, 64, 96, 256])
def test_paged_gpu_tiles(monkeypatch, page_size, num_splits, leftpad):
    monkeypatch.setattr(configs, "INTERPRETER_DECODE", GPU_TILES)
    q, k_cache, v_cache, k_pages, v_pages, table = paged_rows("cpu", TILE_LENGTHS, page_size, capacity=200)
    seqlens = torch.tensor(TILE_LENGTHS, dtype=torch.int32)
    pads = torch.tensor([min(n, 17 * i) for i, n in enumerate(TILE_LENGTHS)], dtype=torch.int32) if leftpad else None
    out, lse = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens,
                                                 cache_leftpad=pads, causal=True, num_splits=num_splits,
                                                 return_softmax_lse=True)
    if pads is None:
        check(out, lse, q, k_cache, v_cache, TILE_LENGTHS, causal=True)
        return
    for b, (n, pad) in enumerate(zip(TILE_LENGTHS, pads.tolist())):
        check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k_cache[b:b + 1, pad:], v_cache[b:b + 1, pad:], [n - pad],
              causal=True)


@pytest.mark.parametrize("page_size", [16, 64], ids=["page16", "page64"])
def test_page_lookup_variants_agree(monkeypatch, page_size):
    """The paging constexprs only change how addresses are computed: a division or a shift, page numbers read
    in the tile's iteration or a tile ahead (PAGE_PREFETCH), one lookup per key or per tile; bit for bit."""
    monkeypatch.setattr(configs, "INTERPRETER_DECODE", GPU_TILES)
    q, _, _, k_pages, v_pages, table = paged_rows("cpu", TILE_LENGTHS, page_size, capacity=200)
    seqlens = torch.tensor(TILE_LENGTHS, dtype=torch.int32)
    chosen = launch.Geometry.page_constexprs
    results = []
    for paged, shift, prefetch in [(1, -1, False), (1, page_size.bit_length() - 1, False), (None, None, True),
                                   (None, None, False)]:
        def variant(self, k, block_n, paged=paged, shift=shift, prefetch=prefetch):
            c = chosen(self, k, block_n)
            return dict(PAGED=paged or c["PAGED"], PAGE_SHIFT=c["PAGE_SHIFT"] if shift is None else shift,
                        PAGE_PREFETCH=prefetch)
        monkeypatch.setattr(launch.Geometry, "page_constexprs", variant)
        results.append(flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens,
                                                         causal=True, num_splits=3, return_softmax_lse=True))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


@pytest.mark.parametrize("leftpad", [False, True], ids=["aligned", "leftpad"])
def test_cache_batch_idx_gpu_tiles(monkeypatch, leftpad):
    """cache_batch_idx runs as pages of one cache row each: a power-of-two capacity takes the shift path (one
    lookup per tile when aligned, per key with leftpad)."""
    monkeypatch.setattr(configs, "INTERPRETER_DECODE", GPU_TILES)
    lengths = [65, 128, 3]
    q, k_cache, v_cache = make_cache("cpu", 4, 1, 8, 2, 128)
    idx = torch.tensor([2, 0, 3], dtype=torch.int32)
    pads = torch.tensor([5, 64, 0], dtype=torch.int32) if leftpad else None
    out, lse = flashtile.flash_attn_with_kvcache(q[:3], k_cache, v_cache, cache_seqlens=torch.tensor(
        lengths, dtype=torch.int32), cache_batch_idx=idx, cache_leftpad=pads, num_splits=2, return_softmax_lse=True)
    for b, (row, n) in enumerate(zip(idx.tolist(), lengths)):
        pad = 0 if pads is None else int(pads[b])
        check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k_cache[row:row + 1, pad:], v_cache[row:row + 1, pad:],
              [n - pad])


FEATURES = {
    "window": dict(window_size=(20, 0)),
    "window-both": dict(window_size=(5, 3)),
    "softcap": dict(softcap=5.0),
    "alibi": dict(alibi=(8,)),
    "alibi-batch-causal-window": dict(alibi=(3, 8), causal=True, window_size=(30, -1)),
}


@pytest.mark.parametrize("seqlen_q", [1, 4], ids=["q1", "q4"])
@pytest.mark.parametrize("features", list(FEATURES.values()), ids=list(FEATURES))
def test_features(backend, features, seqlen_q):
    _, device = backend
    features = dict(features)
    if "alibi" in features:
        shape = features.pop("alibi")
        features["alibi_slopes"] = torch.rand(*shape, generator=torch.Generator().manual_seed(4)).to(device)
    q, k_cache, v_cache = make_cache(device, 3, seqlen_q, 8, 2, capacity=80)
    lengths = [3, 50, 80]
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                 cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device),
                                                 num_splits=3, return_softmax_lse=True, **features)
    check(out, lse, q, k_cache, v_cache, lengths, **features)


@pytest.mark.parametrize("num_splits", [1, 4], ids=["s1", "s4"])
def test_half_and_padded_head_dim(num_splits):
    """fp16 through the fp32 workspace and back, with a head dim that is padded inside the kernel."""
    q, k_cache, v_cache = make_cache("cpu", 2, 1, 8, 2, 64, head_dim=40, dtype=torch.float16)
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor(
        [64, 30], dtype=torch.int32), num_splits=num_splits, return_softmax_lse=True)
    assert out.dtype == torch.float16
    check(out, lse, q, k_cache, v_cache, [64, 30])


def test_long_chunk_uses_the_forward_kernel_unless_split():
    """group_size * Sq above configs.DECODE_MAX_ROWS: the forward kernel, or the split kernel when asked;
    both with a left-padded cache (keys from token 5 on)."""
    q, k_cache, v_cache = make_cache("cpu", 1, 40, 8, 2, 48)
    geo = launch.Geometry(1, 40, 48, 8, 2, 32, seqused_k=torch.tensor([48], dtype=torch.int32))
    assert 40 * 4 > configs.DECODE_MAX_ROWS and not kvcache_launch.uses_splitkv(geo, 0)
    assert kvcache_launch.uses_splitkv(geo, 2)
    for num_splits in (0, 2):
        out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True, num_splits=num_splits,
                                                     cache_leftpad=torch.tensor([5], dtype=torch.int32),
                                                     return_softmax_lse=True)
        check(out, lse, q, k_cache[:, 5:], v_cache[:, 5:], [43], causal=True)


def test_num_splits_heuristic():
    sms = 132
    assert configs.num_splits_heuristic(64 * 4, 1024, sms) == 1  # enough programs already
    assert configs.num_splits_heuristic(8, 1, sms) == 1  # a single key block
    small = configs.num_splits_heuristic(8 * 4, 1024, sms)  # batch 8, 4 KV heads, a long cache
    assert 1 < small <= configs.MAX_SPLITS
    assert 8 * 4 * small >= 0.8 * sms * configs.SPLIT_PROGRAMS_PER_SM  # the machine is nearly filled
    assert configs.num_splits_heuristic(1, 5, sms) == 5  # bounded by the key blocks
    assert configs.num_splits_heuristic(1, 10_000, sms) <= configs.MAX_SPLITS


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_num_splits(bad):
    q, k_cache, v_cache = make_cache("cpu", 1, 1, 2, 1, 16)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=bad)


def paged_copy(k, v, page_size, gen):
    """k, v (B, L, Hk, D) copied into a paged cache (num_pages, page_size, Hk, D) in shuffled page order, and
    the int32 block_table (B, pages per row) that maps row b's tokens back; the last page is zero-padded.
    (The decode bench pages its caches without copying, see flashtile.bench.decode.paged; this test keeps
    the content of each row, so the reference can use the contiguous cache.)"""
    batch, length = k.shape[:2]
    per_row = -(-length // page_size)
    pad = per_row * page_size - length
    perm = torch.randperm(batch * per_row, generator=gen, device="cpu").to(k.device)
    table = torch.empty_like(perm)
    table[perm] = torch.arange(batch * per_row, device=k.device)  # page i of the layout lives at table[i]

    def pages(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(batch * per_row, page_size, *x.shape[2:])
        return x[perm].contiguous()  # stored page j = layout page perm[j]

    return pages(k), pages(v), table.view(batch, per_row).to(torch.int32)


def test_paged_copy_round_trips():
    k = torch.randn(2, 37, 3, 8)
    kp, vp, table = paged_copy(k, k + 1, 16, torch.Generator().manual_seed(0))
    assert kp.shape == (2 * 3, 16, 3, 8) and table.shape == (2, 3) and table.dtype == torch.int32
    back = kp[table.long()].reshape(2, 48, 3, 8)[:, :37]
    assert torch.equal(back, k) and torch.equal(vp[table.long()].reshape(2, 48, 3, 8)[:, :37], k + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["contig", "page16", "page256"])
@pytest.mark.parametrize("num_splits", [0, 1, 7], ids=["auto", "s1", "s7"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_decode(dtype, num_splits, page_size):
    """The decode bench's shape (Hq / Hk = 8, D = 128), rows of different lengths, long caches."""
    lengths = [1, 4095, 4096, 20000]
    q, k_cache, v_cache = make_cache("cuda", len(lengths), 1, 32, 4, 20000, head_dim=128, dtype=dtype)
    block_table = None
    k_in, v_in = k_cache, v_cache
    if page_size:
        k_in, v_in, block_table = paged_copy(k_cache, v_cache, page_size, torch.Generator().manual_seed(0))
    out, lse = flashtile.flash_attn_with_kvcache(q, k_in, v_in, block_table=block_table, causal=True,
                                                 cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"),
                                                 num_splits=num_splits, return_softmax_lse=True)
    check(out, lse, q, k_cache, v_cache, lengths, causal=True)


@pytest.mark.gpu
def test_gpu_decode_step_in_a_cuda_graph():
    """A paged decode step with appends and rotary captured once and replayed: each replay appends at the
    lengths cache_seqlens holds then (updated in place between replays) and equals the eager call."""
    lengths = [5, 300, 1000]
    q, k_cache, v_cache = make_cache("cuda", 3, 1, 32, 4, 2048, head_dim=128, dtype=torch.bfloat16)
    k_pages, v_pages, table = paged_copy(k_cache, v_cache, 256, torch.Generator().manual_seed(0))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    new_k, new_v = (torch.randn(3, 1, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.rand(2048, 32, device="cuda") for _ in range(2))

    def step(k_pages, v_pages):
        return flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, new_k, new_v, cos, sin, cache_seqlens=seqlens,
                                                 block_table=table, causal=True, num_splits=4)

    eager_k, eager_v = k_pages.clone(), v_pages.clone()
    want = [step(eager_k, eager_v)]
    seqlens += 1
    want.append(step(eager_k, eager_v))
    seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) on copies, as capture needs
        step(k_pages.clone(), v_pages.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(k_pages, v_pages)
    for i, expected in enumerate(want):
        graph.replay()
        assert torch.equal(out, expected)  # one split count (num_splits=4): the same kernels, the same bits
        seqlens += 1
    assert torch.equal(k_pages, eager_k) and torch.equal(v_pages, eager_v)


def test_custom_ops_opcheck(monkeypatch):
    """The inference ops' schemas and fake implementations agree with what they return (cpu.py path)."""
    from flashtile import ops

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k_cache, v_cache = make_cache("cpu", 2, 1, 4, 2, 12, head_dim=16)
    seqused, leftpad = torch.tensor([5, 12], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)
    torch.library.opcheck(ops.fwd_kvcache, (q, k_cache, v_cache, seqused, None, 0.25, -1, -1, 0.0, None, 12, 0,
                                            leftpad))
    pages = k_cache.reshape(6, 4, 2, 16)
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    torch.library.opcheck(ops.fwd_varlen_paged, (torch.randn(7, 4, 16), pages, pages, cu_q, cu_k, 4, 5, table, 0.25,
                                                 -1, -1, 0.0, None, None))
