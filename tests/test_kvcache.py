"""flash_attn_with_kvcache: in-place append, then attention over each row's used cache prefix."""
import pytest
import torch

import flashtile
from utils import assert_close_rule, count_read_backs, strided


def cache_inputs(device, batch=3, capacity=80, heads_q=4, heads_kv=2, head_dim=32, seqlen_q=5, new=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    q = make(batch, seqlen_q, heads_q, head_dim)
    k_cache, v_cache = make(batch, capacity, heads_kv, head_dim), make(batch, capacity, heads_kv, head_dim)
    k_new, v_new = make(batch, new, heads_kv, head_dim), make(batch, new, heads_kv, head_dim)
    return q, k_cache, v_cache, k_new, v_new


def check_against_reference(out, q, k_cache, v_cache, lengths, **features):
    slopes = features.pop("alibi_slopes", None)
    for b, n in enumerate(lengths):
        args = (q[b:b + 1].double(), k_cache[b:b + 1, :n].double(), v_cache[b:b + 1, :n].double())
        row_slopes = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        ref = flashtile.attention_ref(*args, alibi_slopes=row_slopes, **features)
        low = flashtile.attention_ref(*(a.float() for a in args), upcast=False, alibi_slopes=row_slopes, **features)
        assert_close_rule(f"row {b}", out[b:b + 1], ref, low, torch.float32)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q", [1, 5], ids=["decode", "chunk"])
def test_append_then_attend(backend, causal, seqlen_q):
    _, device = backend
    q, k_cache, v_cache, k_new, v_new = cache_inputs(device, seqlen_q=seqlen_q)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    cache_seqlens = torch.tensor([0, 17, 75], dtype=torch.int32, device=device)
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                                 causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (3, 4, seqlen_q)
    for b, start in enumerate(cache_seqlens.tolist()):  # new tokens written in place, nothing else touched
        assert torch.equal(k_cache[b, start:start + 5], k_new[b]) and torch.equal(v_cache[b, start:start + 5], v_new[b])
        assert torch.equal(k_cache[b, :start], before_k[b, :start])
        assert torch.equal(k_cache[b, start + 5:], before_k[b, start + 5:])
        assert torch.equal(v_cache[b, :start], before_v[b, :start])
        assert torch.equal(v_cache[b, start + 5:], before_v[b, start + 5:])
    check_against_reference(out, q, k_cache, v_cache, [5, 22, 80], causal=causal)


def test_features_without_append(backend):
    _, device = backend
    q, k_cache, v_cache, _, _ = cache_inputs(device, seqlen_q=3)
    slopes = torch.rand(3, 4, generator=torch.Generator().manual_seed(1)).to(device)
    features = dict(causal=True, window_size=(10, -1), softcap=8.0, alibi_slopes=slopes)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=33, **features)
    check_against_reference(out, q, k_cache, v_cache, [33] * 3, **features)


def test_refusals_leave_the_cache_untouched():
    q, k_cache, v_cache, k_new, v_new = cache_inputs("cpu")
    before = k_cache.clone()
    with pytest.raises(ValueError, match=r"cache_seqlens \+ new tokens must lie in \[0, 80\]"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=78)
    assert torch.equal(k_cache, before)
    with pytest.raises(ValueError, match="k_cache has batch size 2 but q has 3"):  # the cache's name, not the new k's
        flashtile.flash_attn_with_kvcache(q, k_cache[:2], v_cache[:2], cache_seqlens=2)
    with pytest.raises(ValueError, match=r"cache_seqlens must be >= 0 in every row, got \[-1, 2, 2\]"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                          cache_seqlens=torch.tensor([-1, 2, 2], dtype=torch.int32))
    assert torch.equal(k_cache, before)
    with pytest.raises(TypeError, match="cache_seqlens must be an int or an int32 tensor"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \(3,\)"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="k and v must be given together"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, None)
    with pytest.raises(ValueError, match=r"cache_leftpad must lie in \[0, cache_seqlens\[b\]\] in every row"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=10,
                                          cache_leftpad=torch.tensor([0, 11, 0], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"cache_leftpad must be an int32 tensor of shape \(3,\)"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=10,
                                          cache_leftpad=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"cache_batch_idx entries must index the cache's 3 rows, got \[0, 3, 1\]"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=10,
                                          cache_batch_idx=torch.tensor([0, 3, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"cache_batch_idx must be an int32 tensor of shape \(3,\)"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_batch_idx=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="cache_batch_idx cannot be combined with block_table"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=torch.zeros(3, dtype=torch.int32),
                                          block_table=torch.zeros(3, 1, dtype=torch.int32))
    assert torch.equal(k_cache, before)
    # One cache row broadcast to the batch: each row's append would land in the shared memory (both call paths).
    shared_k, shared_v = k_cache[:1].clone(), v_cache[:1].clone()
    shared_before = shared_k.clone()
    for extra in ({}, dict(cache_seqlens=torch.tensor([2, 3, 4], dtype=torch.int32))):
        with pytest.raises(ValueError, match=r"k_cache is expanded \(stride 0 in dim 0 of size 3\)"):
            flashtile.flash_attn_with_kvcache(q, shared_k.expand(3, -1, -1, -1), shared_v.expand(3, -1, -1, -1),
                                              k_new, v_new, **{"cache_seqlens": 2, **extra})
    assert torch.equal(shared_k, shared_before)
    out = flashtile.flash_attn_with_kvcache(q, shared_k.expand(3, -1, -1, -1), shared_v.expand(3, -1, -1, -1),
                                            cache_seqlens=2)  # reading an expanded cache is fine
    assert out.shape == q.shape


def test_append_of_no_tokens(backend):
    """k, v of zero new tokens (a chunked loop's empty chunk) append nothing, as flash-attn: the call equals one
    without k, v (rotary still turns q), the cache is untouched; their shapes are still checked."""
    _, device = backend
    q, k_cache, v_cache, k_new, v_new = cache_inputs(device)
    cos, sin = (torch.rand(40, 8, generator=torch.Generator().manual_seed(3)).to(device) for _ in range(2))
    before = k_cache.clone(), v_cache.clone()
    for extra in ({}, dict(rotary_cos=cos, rotary_sin=sin, causal=True)):
        got = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new[:, :0], v_new[:, :0], cache_seqlens=9,
                                                **extra)
        want = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=9, **extra)
        assert torch.equal(got, want)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    with pytest.raises(ValueError, match=r"k has \(heads, headdim\) \(1, 32\) but k_cache has \(2, 32\)"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new[:, :0, :1], v_new[:, :0, :1], cache_seqlens=9)
    with pytest.raises(TypeError, match="k has dtype torch.float16"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new[:, :0].half(), v_new[:, :0], cache_seqlens=9)


def rotate_reference(x, cos, sin, positions, interleaved):
    """Rotary embedding written as complex multiplication, independent of cpu.apply_rotary."""
    half = cos.shape[1]
    xr = x[..., :2 * half].double()
    if interleaved:
        pairs = torch.complex(xr[..., 0::2], xr[..., 1::2])
    else:
        pairs = torch.complex(xr[..., :half], xr[..., half:])
    angle = torch.polar(torch.ones_like(cos.double()), torch.atan2(sin.double(), cos.double()))[positions][:, :, None]
    turned = pairs * angle
    if interleaved:
        rotated = torch.stack([turned.real, turned.imag], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([turned.real, turned.imag], dim=-1)
    return torch.cat([rotated, x[..., 2 * half:].double()], dim=-1).to(x.dtype)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_rotary(backend, interleaved, causal):
    """q and the new k are rotated at their cache positions (q at one position when not causal)."""
    _, device = backend
    q, k_cache, v_cache, k_new, v_new = cache_inputs(device, seqlen_q=4, new=4)
    angles = torch.arange(100)[:, None].float() * (0.5 ** torch.arange(12))[None, :]  # rotary dim 24 of 32
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    cache_seqlens = torch.tensor([3, 40, 60], dtype=torch.int32, device=device)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    positions = cache_seqlens[:, None].long() + torch.arange(4, device=device)
    q_positions = positions if causal else cache_seqlens[:, None].long().expand(3, 4)
    for b, start in enumerate(cache_seqlens.tolist()):
        expect_k[b, start:start + 4] = rotate_reference(k_new, cos, sin, positions, interleaved)[b]
        expect_v[b, start:start + 4] = v_new[b]
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=cache_seqlens, causal=causal,
                                            rotary_interleaved=interleaved)
    torch.testing.assert_close(k_cache, expect_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(v_cache, expect_v)
    q_rot = rotate_reference(q, cos, sin, q_positions, interleaved)
    check_against_reference(out, q_rot, k_cache, v_cache, [7, 44, 64], causal=causal)


def test_bad_rotary():
    q, k_cache, v_cache, k_new, v_new = cache_inputs("cpu")
    cos = torch.ones(10, 8)
    with pytest.raises(ValueError, match="rotary_cos and rotary_sin must be given together"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=cos)
    with pytest.raises(ValueError, match=r"rotary_cos has 10 positions but position 21 is needed"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=cos,
                                          cache_seqlens=17)
    with pytest.raises(ValueError, match=r"rotary dim 2 \* 20 exceeds the head dim 32"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=torch.ones(90, 20),
                                          rotary_sin=torch.ones(90, 20), cache_seqlens=0)


def shuffled_pages(k_dense, v_dense, page_size):
    """The contiguous caches cut into pages stored in a shuffled order: (k_pages, v_pages, block_table)."""
    batch, capacity = k_dense.shape[:2]
    max_pages = capacity // page_size
    order = torch.randperm(batch * max_pages, generator=torch.Generator().manual_seed(3))
    block_table = order.reshape(batch, max_pages).to(torch.int32).to(k_dense.device)
    k_pages = torch.empty(batch * max_pages, page_size, *k_dense.shape[2:], device=k_dense.device)
    v_pages = torch.empty_like(k_pages)
    k_pages[block_table.long()] = k_dense.reshape(batch, max_pages, page_size, *k_dense.shape[2:])
    v_pages[block_table.long()] = v_dense.reshape(batch, max_pages, page_size, *v_dense.shape[2:])
    return k_pages, v_pages, block_table


@pytest.mark.parametrize("page_size", [16, 7], ids=["page16", "page7"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_paged_cache(backend, page_size, causal):
    """A paged cache (pages in a shuffled order, any page size) gives what the same contiguous cache gives."""
    _, device = backend
    q, k_dense, v_dense, k_new, v_new = cache_inputs(device, capacity=8 * page_size, seqlen_q=4, new=4)
    batch, capacity = k_dense.shape[:2]
    k_pages, v_pages, block_table = shuffled_pages(k_dense, v_dense, page_size)
    cache_seqlens = torch.tensor([0, page_size + 3, capacity - 4], dtype=torch.int32, device=device)
    want = flashtile.flash_attn_with_kvcache(q, k_dense, v_dense, k_new, v_new, cache_seqlens=cache_seqlens,
                                             causal=causal)
    got = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, cache_seqlens=cache_seqlens,
                                            causal=causal, block_table=block_table)
    torch.testing.assert_close(got, want)
    gathered = k_pages[block_table.long()].reshape(batch, capacity, *k_dense.shape[2:])
    assert torch.equal(gathered, k_dense)  # the appended tokens landed in the right pages and slots


@pytest.mark.parametrize("int_length", [False, True], ids=["tensor-lengths", "int-length"])
def test_block_table_padded_past_the_pages_in_use(backend, int_length):
    """As flash-attn, a block table's entries past the pages a row's keys lie in are never read: a table padded there
    with -1 (or any value) gives what the unpadded table gives, appends included; an entry out of range in a page in
    use is refused, and the caches are left untouched. The int length takes the common decode step's path."""
    _, device = backend
    page_size = 16
    q, k_dense, v_dense, k_new, v_new = cache_inputs(device, capacity=8 * page_size, seqlen_q=4, new=4)
    k_pages, v_pages, table = shuffled_pages(k_dense, v_dense, page_size)
    lengths = [20] * 3 if int_length else [0, page_size + 3, 50]  # cache tokens before the append of 4
    cache_seqlens = 20 if int_length else torch.tensor(lengths, dtype=torch.int32, device=device)
    padded = table.clone()
    for row, (n, pad) in enumerate(zip(lengths, (-1, -(2 ** 31), 1000))):
        padded[row, -(-(n + 4) // page_size):] = pad  # the pages past those the appended keys reach
    caches = [(k_pages.clone(), v_pages.clone()) for _ in range(2)]
    want = flashtile.flash_attn_with_kvcache(q, *caches[0], k_new, v_new, cache_seqlens=cache_seqlens,
                                             block_table=table, causal=True)
    got = flashtile.flash_attn_with_kvcache(q, *caches[1], k_new, v_new, cache_seqlens=cache_seqlens,
                                            block_table=padded, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(caches[0], caches[1]))
    padded[1, 1] = -1  # row 1 reads its second page
    before = [t.clone() for t in caches[1]]
    with pytest.raises(ValueError, match=r"block_table entries must index the cache's 24 pages, got values in "
                                         r"\[-1, \d+\] \(in the pages the keys lie in\)"):
        flashtile.flash_attn_with_kvcache(q, *caches[1], k_new, v_new, cache_seqlens=cache_seqlens,
                                          block_table=padded, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(before, caches[1]))


def test_bad_block_table():
    q, _, _, _, _ = cache_inputs("cpu")
    pages = torch.zeros(6, 16, 2, 32)
    with pytest.raises(ValueError, match=r"block_table entries must index the cache's 6 pages, got values in \[0, 6\]"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20,  # two pages per row: [4, 6] read
                                          block_table=torch.tensor([[0, 1], [2, 3], [4, 6]], dtype=torch.int32))
    with pytest.raises(TypeError, match="block_table must be an int32 tensor"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=0, block_table=torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"k_cache must have 4 dimensions \(num_pages, page_size, heads, headdim\) "
                                         r"with block_table, got shape \(96, 2, 32\)"):
        flashtile.flash_attn_with_kvcache(q, pages.flatten(0, 1), pages.flatten(0, 1), cache_seqlens=0,
                                          block_table=torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table must have 3 rows"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=0,
                                          block_table=torch.zeros(2, 2, dtype=torch.int32))


def test_block_table_bounds_read_once_per_version(monkeypatch):
    """A block table's bounds are read to the host (one sync) once per table while it is unchanged (the layers of a
    decode step share one); an in-place change through torch, a cache with fewer pages, or rows that come to use more
    pages are checked again. Cache lengths of 20 use both pages of each row (page size 16)."""
    q, _, _, _, _ = cache_inputs("cpu")
    pages = torch.zeros(6, 16, 2, 32)
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    reads = count_read_backs(monkeypatch, "_TABLE_MAX", lambda tensor, value: value[1])  # the tables that passed
    for _ in range(3):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20, block_table=table)
    assert reads == [5]
    table[2, 1] = 6  # through torch: the version moves
    with pytest.raises(ValueError, match=r"must index the cache's 6 pages, got values in \[0, 6\]"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20, block_table=table)
    table[2, 1] = 1
    flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20, block_table=table)
    assert reads == [5, 4]
    with pytest.raises(ValueError, match=r"must index the cache's 4 pages, got values in \[0, 4\]"):
        flashtile.flash_attn_with_kvcache(q, pages[:4], pages[:4], cache_seqlens=20, block_table=table)
    # The same memory seen with another shape (a view swapped in through .data: no version change) is read again.
    wide = torch.tensor([[0, 1, 6], [2, 3, 6], [4, 1, 6]], dtype=torch.int32)
    table = wide[:, :2]
    flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20, block_table=table)
    table.data = wide
    with pytest.raises(ValueError, match=r"must index the cache's 6 pages, got values in \[0, 6\]"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=40, block_table=table)
    # Entries past the pages in use are not read: a table passes, then is read again once the rows reach them.
    table = torch.tensor([[0, 6], [2, 6], [4, 6]], dtype=torch.int32)
    reads.clear()
    flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=16, block_table=table)
    flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=10, block_table=table)
    assert reads == [4]
    with pytest.raises(ValueError, match=r"must index the cache's 6 pages, got values in \[0, 6\]"):
        flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=17, block_table=table)


def test_leftpad_and_batch_index_read_once_per_version(monkeypatch):
    """cache_leftpad and cache_batch_idx are read back (one device sync) once per tensor and version: the layers and
    steps that share them pay one sync, and an in-place change through torch is checked again."""
    q, k_cache, v_cache, _, _ = cache_inputs("cpu")
    pads = torch.tensor([0, 3, 9], dtype=torch.int32)
    idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    reads = count_read_backs(monkeypatch, "_VALUES")
    for step in range(3):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=10 + step, cache_leftpad=pads,
                                          cache_batch_idx=idx)
    assert len(reads) == 2 and reads[0] is idx and reads[1] is pads
    pads[1] = 20  # through torch: read and checked again
    with pytest.raises(ValueError, match=r"cache_leftpad must lie in \[0, cache_seqlens\[b\]\] in every row"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=12, cache_leftpad=pads,
                                          cache_batch_idx=idx)
    idx[0] = 3
    with pytest.raises(ValueError, match=r"cache_batch_idx entries must index the cache's 3 rows"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=30, cache_leftpad=pads,
                                          cache_batch_idx=idx)
    # one read per new version; values are kept even where they fail, as every call checks the kept values
    assert len(reads) == 4 and reads[2] is pads and reads[3] is idx
    with pytest.raises(ValueError, match=r"cache_batch_idx entries must index the cache's 3 rows"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=30, cache_batch_idx=idx)
    assert len(reads) == 4


def test_inference_mode_tensors_are_checked_every_call():
    """Tensors made under torch.inference_mode have no version counter: their contents are read back on every
    call (the read-back caches key on the version; session 36 found varlen raising on such cu_seqlens)."""
    q, _, _, _, _ = cache_inputs("cpu")
    pages = torch.randn(6, 16, 2, 32)
    with torch.inference_mode():
        table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
        lens = torch.tensor([5, 20, 31], dtype=torch.int32)
        want = flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=lens, block_table=table)
        table[2, 1] = 6  # an untracked in-place write: still seen
        with pytest.raises(ValueError, match=r"must index the cache's 6 pages, got values in \[0, 6\]"):
            flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=lens, block_table=table)
        table[2, 1] = 5
        got = flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=lens, block_table=table)
        _, k_cache, v_cache, _, _ = cache_inputs("cpu")
        pads, idx = torch.tensor([0, 3, 9], dtype=torch.int32), torch.tensor([2, 0, 1], dtype=torch.int32)
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, cache_leftpad=pads,
                                          cache_batch_idx=idx)
        pads[1] = 21
        with pytest.raises(ValueError, match=r"cache_leftpad must lie in \[0, cache_seqlens\[b\]\] in every row"):
            flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, cache_leftpad=pads,
                                              cache_batch_idx=idx)
        idx[0] = 3
        with pytest.raises(ValueError, match=r"cache_batch_idx entries must index the cache's 3 rows"):
            flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, cache_batch_idx=idx)
    assert torch.equal(got, want)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_strided_row_tensors_give_the_contiguous_result(backend, paged):
    """cache_seqlens, cache_leftpad, cache_batch_idx and a block table given as views with a strided last dim (sliced
    out of wider tensors): the kernels index them as ptr + b, so they must read what the contiguous copies give."""
    _, device = backend
    q, k_dense, v_dense, k_new, v_new = cache_inputs(device, capacity=64, seqlen_q=1, new=2)
    lens = torch.tensor([3, 30, 50], dtype=torch.int32, device=device)
    pads = torch.tensor([0, 7, 40], dtype=torch.int32, device=device)
    if paged:
        k_cache, v_cache, table = shuffled_pages(k_dense, v_dense, 16)
        index = dict(block_table=table)
        index_view = dict(block_table=strided(table))
    else:
        k_cache, v_cache = k_dense, v_dense
        idx = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
        index, index_view = dict(cache_batch_idx=idx), dict(cache_batch_idx=strided(idx))
    runs = []
    for rows in ((lens, pads, index), (strided(lens), strided(pads), index_view)):
        caches = k_cache.clone(), v_cache.clone()
        out = flashtile.flash_attn_with_kvcache(q, *caches, k_new, v_new, cache_seqlens=rows[0], cache_leftpad=rows[1],
                                                causal=True, **rows[2])
        runs.append((out, *caches))
    for want, got in zip(*runs):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 0), (1, 1), (3, 2)], ids=["decode-auto", "decode-s1", "chunk-s2"])
def test_cache_batch_idx_and_leftpad(backend, seqlen_q, num_splits):
    """Batch row b uses cache row idx[b] and its keys from cache token leftpad[b] on; appends land in row idx[b]
    at cache_seqlens[b], rotary positions are cache positions, causal/ALiBi measured from the last key."""
    _, device = backend
    q, _, _, k_new, v_new = cache_inputs(device, seqlen_q=seqlen_q, new=3)
    _, k_cache, v_cache, _, _ = cache_inputs(device, batch=5, seed=1)  # 5 cache rows for 3 batch rows
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=device)
    cache_seqlens = torch.tensor([0, 17, 70], dtype=torch.int32, device=device)
    leftpad = torch.tensor([0, 5, 70], dtype=torch.int32, device=device)
    angles = torch.arange(100)[:, None].float() * (0.5 ** torch.arange(8))[None, :]
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    slopes = torch.rand(4, generator=torch.Generator().manual_seed(2)).to(device)
    before_k = k_cache.clone()
    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=cache_seqlens, cache_batch_idx=idx,
                                                 cache_leftpad=leftpad, causal=True, alibi_slopes=slopes,
                                                 num_splits=num_splits, return_softmax_lse=True)
    positions = cache_seqlens[:, None].long() + torch.arange(3, device=device)
    k_rot = rotate_reference(k_new, cos, sin, positions, True)
    q_rot = rotate_reference(q, cos, sin, cache_seqlens[:, None].long() + torch.arange(seqlen_q, device=device), True)
    assert torch.equal(k_cache[[1, 3]], before_k[[1, 3]])  # rows no batch row uses are untouched
    for b, (row, start, pad) in enumerate(zip(idx.tolist(), cache_seqlens.tolist(), leftpad.tolist())):
        torch.testing.assert_close(k_cache[row, start:start + 3], k_rot[b], atol=1e-5, rtol=1e-5)
        assert torch.equal(v_cache[row, start:start + 3], v_new[b])
        keys, values = k_cache[row:row + 1, pad:start + 3], v_cache[row:row + 1, pad:start + 3]
        args = (q_rot[b:b + 1].double(), keys.double(), values.double())
        ref, ref_lse = flashtile.attention_ref(*args, causal=True, alibi_slopes=slopes, return_lse=True)
        low = flashtile.attention_ref(*(a.float() for a in args), causal=True, alibi_slopes=slopes, upcast=False)
        assert_close_rule(f"row {b}", out[b:b + 1], ref, low, torch.float32)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("page_size", [16, 7], ids=["page16", "page7"])
def test_paged_leftpad(backend, page_size):
    """cache_leftpad with a paged cache: the same as the contiguous cache with the same padding."""
    _, device = backend
    q, k_dense, v_dense, _, _ = cache_inputs(device, capacity=8 * page_size, seqlen_q=2)
    batch, capacity = k_dense.shape[:2]
    k_pages, v_pages, block_table = shuffled_pages(k_dense, v_dense, page_size)
    cache_seqlens = torch.tensor([3, page_size + 3, capacity], dtype=torch.int32, device=device)
    leftpad = torch.tensor([3, page_size - 1, 2 * page_size + 1], dtype=torch.int32, device=device)
    kwargs = dict(cache_seqlens=cache_seqlens, cache_leftpad=leftpad, causal=True, return_softmax_lse=True)
    want, want_lse = flashtile.flash_attn_with_kvcache(q, k_dense, v_dense, **kwargs)
    got, got_lse = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=block_table, **kwargs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_lse, want_lse)
    assert torch.all(got[0] == 0) and torch.all(got_lse[0] == float("-inf"))  # leftpad == cache_seqlens: no key
    check_against_reference(got[1:], q[1:], k_dense[1:, page_size - 1:], v_dense[1:, page_size - 1:], [4], causal=True)


def test_decode_step_under_torch_compile(monkeypatch):
    """A decode step (append with rotary, then attend) inside torch.compile(fullgraph=True) goes through the
    custom ops (eager calls skip them): the same output and the same cache writes as eager."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the cpu.py path: the test is about tracing, not kernels
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, heads, 16, generator=gen) for heads in (4, 2, 2))
    cache = torch.randn(2, 32, 2, 16, generator=gen)
    cos, sin = torch.rand(64, 4, generator=gen), torch.rand(64, 4, generator=gen)

    def step(k_cache, v_cache):
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=10, causal=True)

    eager_k, eager_v = cache.clone(), cache.clone()
    want = step(eager_k, eager_v)
    compiled_k, compiled_v = cache.clone(), cache.clone()
    got = torch.compile(step, fullgraph=True)(compiled_k, compiled_v)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(compiled_k, eager_k) and torch.equal(compiled_v, eager_v)


def test_row_tensors_under_torch_compile(monkeypatch):
    """Tensor cache_seqlens, cache_leftpad and cache_batch_idx trace with fullgraph=True: their values are not read
    back while torch.compile traces (as the block table's and cu_seqlens'), and the compiled step gives eager's."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the cpu.py path: the test is about tracing, not kernels
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 16, generator=gen)
    cache = torch.randn(3, 32, 2, 16, generator=gen)
    lens, pads, idx = (torch.tensor(x, dtype=torch.int32) for x in ([10, 20], [0, 3], [2, 0]))

    def step():
        return flashtile.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lens, cache_leftpad=pads,
                                                 cache_batch_idx=idx, causal=True)

    torch.testing.assert_close(torch.compile(step, fullgraph=True)(), step(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("append", [False, True], ids=["attend", "append"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_plain_step_takes_the_short_path(backend, monkeypatch, append, causal, paged):
    """The common decode step (a contiguous or paged cache, int cache_seqlens, an optional append, no other feature)
    skips the argument normalization (kvcache._plain_step; host time) and gives the full path's output, lse and cache
    writes bit for bit (window_size as a list sends the same call down the full path)."""
    _, device = backend
    q, k_cache, v_cache, k_new, v_new = cache_inputs(device, seqlen_q=1, new=2)
    pages = {}
    if paged:
        k_cache, v_cache, table = shuffled_pages(k_cache, v_cache, 16)
        pages = dict(block_table=table)
    new = (k_new, v_new) if append else ()
    full_path = []
    monkeypatch.setattr(flashtile.kvcache.checks, "window",
                        lambda *a, real=flashtile.kvcache.checks.window: full_path.append(1) or real(*a))
    runs = []
    for window in ((-1, -1), [-1, -1]):
        caches = k_cache.clone(), v_cache.clone()
        out, lse = flashtile.flash_attn_with_kvcache(q, *caches, *new, cache_seqlens=40, causal=causal,
                                                     window_size=window, return_softmax_lse=True, **pages)
        runs.append((out, lse, *caches))
    assert full_path == [1]  # the list only
    for want, got in zip(runs[1], runs[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_plain_step_refusals_take_the_full_path():
    """Calls the short path does not take (a length past the cache, mismatched new keys) raise the full path's
    errors, with the cache untouched."""
    q, k_cache, v_cache, k_new, v_new = cache_inputs("cpu", seqlen_q=1, new=2)
    before = k_cache.clone()
    with pytest.raises(ValueError, match=r"cache_seqlens \+ new tokens must lie in \[0, 80\]"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=79)
    with pytest.raises(ValueError, match="k has"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new[..., :16], v_new[..., :16], cache_seqlens=10)
    with pytest.raises(ValueError, match="k and v must be given together"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, None, cache_seqlens=10)
    assert torch.equal(k_cache, before)


def test_plain_step_under_torch_compile(monkeypatch):
    """The short path (kvcache._plain_step) traces with fullgraph=True, contiguous with an append and paged, and the
    compiled step gives eager's output and cache writes."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the cpu.py path: the test is about tracing, not kernels
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 16, generator=gen)
    new = torch.randn(2, 1, 2, 16, generator=gen)
    cache = torch.randn(2, 32, 2, 16, generator=gen)
    pages = torch.randn(4, 16, 2, 16, generator=gen)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)

    def append_step(k_cache, v_cache):
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=10, causal=True)

    def paged_step():
        return flashtile.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=20, block_table=table)

    eager_caches, compiled_caches = (cache.clone(), cache.clone()), (cache.clone(), cache.clone())
    want = append_step(*eager_caches)
    torch.testing.assert_close(torch.compile(append_step, fullgraph=True)(*compiled_caches), want, atol=1e-6,
                               rtol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(compiled_caches, eager_caches))
    torch.testing.assert_close(torch.compile(paged_step, fullgraph=True)(), paged_step(), atol=1e-6, rtol=1e-6)
