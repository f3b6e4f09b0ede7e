"""The fused rotary + KV-cache append (flashtile::kvcache_append): the kernel against a float64 rotation and the
PyTorch path (cpu.kvcache_append), every cache layout, and the cache outside the written slots untouched."""
import pytest
import torch

import flashtile
from conftest import DEVICE
from flashtile import cpu, ops
from utils import assert_close_rule

LAYOUTS = ["contiguous", "page1", "page16", "page33", "batch_idx"]


def rotate64(x, cos, sin, positions, interleaved):
    """x (B, S, H, D) rotated in float64 as complex multiplication by e^(i angle) at positions (B, S)."""
    half = cos.shape[1]
    xr = x[..., :2 * half].double()
    first, second = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    turned = torch.complex(first, second) * torch.complex(cos.double(), sin.double())[positions][:, :, None]
    if interleaved:
        rotated = torch.stack([turned.real, turned.imag], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([turned.real, turned.imag], dim=-1)
    return torch.cat([rotated, x[..., 2 * half:].double()], dim=-1)


def tables(rotary_dim, device, positions=128):
    """cos, sin (positions, rotary_dim / 2) fp32, as models keep them."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    angles = torch.arange(positions).double()[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def make_cache(layout, batch, capacity, heads_kv, head_dim, dtype, device, seed=0):
    """(k_cache, v_cache, block_table, slot): NaN-filled caches in the layout and slot(b, pos) -> (cache row,
    cache position) index tensors, so that cache[slot(...)] reads batch row b's logical position pos.
    batch_idx: 2 * batch cache rows, batch row b in row idx[b]; pageN: shuffled pages of N tokens."""
    gen = torch.Generator().manual_seed(seed)
    if layout.startswith("page"):
        page_size = int(layout[4:])
        per_row = -(-capacity // page_size)
        table = torch.randperm(batch * per_row, generator=gen).reshape(batch, per_row).to(torch.int32).to(device)
        shape = (batch * per_row, page_size, heads_kv, head_dim)

        def slot(b, pos):
            return table.long()[b, pos // page_size], pos % page_size
    elif layout == "batch_idx":
        idx = torch.randperm(2 * batch, generator=gen)[:batch].to(torch.int32).to(device)
        table, shape = idx[:, None], (2 * batch, capacity, heads_kv, head_dim)

        def slot(b, pos):
            return idx.long()[b], pos
    else:
        table, shape = None, (batch, capacity, heads_kv, head_dim)

        def slot(b, pos):
            return b, pos
    nan = torch.full(shape, float("nan"), dtype=dtype, device=device)
    return nan, nan.clone(), table, slot


def run_case(layout, interleaved, rotary_dim, head_dim, seqlen_new, dtype, q_local=True, seqlen_q=2,
             heads_q=4, heads_kv=2, batch=3, capacity=40, device=DEVICE):
    gen = torch.Generator().manual_seed(1)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    q = make(batch, seqlen_q, heads_q, head_dim)
    k, v = make(batch, seqlen_new, heads_kv, head_dim), make(batch, seqlen_new, heads_kv, head_dim)
    seqlens = torch.tensor([0, 17, capacity - seqlen_new][:batch] + [5] * (batch - 3), dtype=torch.int32,
                           device=device)
    cos, sin = tables(rotary_dim, device, capacity + seqlen_q) if rotary_dim else (None, None)
    k_cache, v_cache, table, slot = make_cache(layout, batch, capacity, heads_kv, head_dim, dtype, device)
    args = (cos, sin, seqlens, table, interleaved, q_local)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = cpu.kvcache_append(q, k_ref, v_ref, k, v, *args)  # the PyTorch path
    q_rot = ops.kvcache_append(q, k_cache, v_cache, k, v, *args)

    positions = seqlens[:, None].long() + torch.arange(seqlen_new, device=device)  # [B, Sk_new]
    rows, where = slot(torch.arange(batch, device=device)[:, None], positions)
    untouched = torch.ones(k_cache.shape[:2], dtype=torch.bool, device=device)
    untouched[rows, where] = False
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        assert torch.isnan(cache[untouched]).all(), f"{name} written outside the new tokens' slots"
    assert torch.equal(v_cache[rows, where], v)
    if rotary_dim:
        q_steps = torch.arange(seqlen_q, device=device) if q_local else torch.zeros(seqlen_q, dtype=torch.long,
                                                                                     device=device)
        checks = (("q", q_rot, q_ref, rotate64(q, cos, sin, seqlens[:, None].long() + q_steps, interleaved)),
                  ("k", k_cache[rows, where], k_ref[rows, where], rotate64(k, cos, sin, positions, interleaved)))
        for name, got, low, ref64 in checks:
            assert_close_rule(name, got, ref64, low, dtype)
            if q.device.type == "cpu":  # the interpreter rounds as PyTorch does (a GPU may fuse multiply-adds)
                assert torch.equal(got, low), f"{name}: not bit-identical to the PyTorch path"
            passthrough = got[..., rotary_dim:]
            assert torch.equal(passthrough, low[..., rotary_dim:]), f"{name}: channels past rotary_dim changed"
    else:
        assert q_rot.numel() == 0
        assert torch.equal(k_cache[rows, where], k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("head_dim", [40, 64, 72], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("rotary", ["full", "half", "16"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
def test_rotation(interleaved, rotary, head_dim, dtype):
    """Both pairings, rotary_dim D, D / 2 and 16 (odd head dims: 40 and 72 pad to 64 and 128 in the kernel)."""
    rotary_dim = {"full": head_dim, "half": head_dim // 2, "16": 16}[rotary]
    run_case("contiguous", interleaved, rotary_dim, head_dim, 3, dtype)


@pytest.mark.parametrize("rotary", [0, 16], ids=["plain", "rotary"])
@pytest.mark.parametrize("seqlen_new", [1, 3], ids=["new1", "new3"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(layout, seqlen_new, rotary):
    """Every cache layout, one or three new tokens, with and without rotary (the plain append is the same
    launch); queries at one position (not causal) when rotary."""
    run_case(layout, False, rotary, 32, seqlen_new, torch.float16, q_local=False)


def test_gqa_and_query_only():
    """MQA (8 query heads, 1 KV head), more queries than new tokens, and rotary of q alone (k=None)."""
    run_case("page16", True, 32, 32, 1, torch.float32, seqlen_q=4, heads_q=8, heads_kv=1)
    q = torch.randn(2, 3, 4, 32)
    cos, sin = tables(16, "cpu")
    cache = torch.full((2, 8, 2, 32), float("nan"))
    seqlens = torch.tensor([2, 5], dtype=torch.int32)
    got = ops.kvcache_append(q, cache, cache, None, None, cos, sin, seqlens, None, False, True)
    assert torch.equal(got, cpu.kvcache_append(q, cache, cache, None, None, cos, sin, seqlens, None, False, True))
    assert torch.isnan(cache).all()


def test_op_registration():
    """Schema (mutated caches declared), fake implementation and dispatch pass torch.library's checks."""
    q, k = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16)
    cos, sin = tables(16, "cpu")
    args = (q, torch.zeros(2, 8, 2, 16), torch.zeros(2, 8, 2, 16), k, k.clone(), cos, sin,
            torch.tensor([0, 3], dtype=torch.int32), None, True, True)
    torch.library.opcheck(ops.kvcache_append, args, test_utils=("test_schema", "test_faketensor"))


def test_with_kvcache_end_to_end(backend):
    """flash_attn_with_kvcache with rotary, a paged cache of 33-token pages and cache_leftpad: the kernel
    path (the backend fixture's triton) writes the cache as the PyTorch path and attends to the same keys."""
    _, device = backend
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 4, 40, generator=gen) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    cos, sin = tables(20, "cpu")
    k_pages, v_pages = torch.randn(6, 33, 2, 40, generator=gen), torch.randn(6, 33, 2, 40, generator=gen)
    table = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    kwargs = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=torch.tensor([31, 60], dtype=torch.int32),
                  cache_leftpad=torch.tensor([3, 40], dtype=torch.int32), block_table=table, causal=True,
                  rotary_interleaved=False)
    want_k, want_v = k_pages.clone(), v_pages.clone()
    q_rot = cpu.kvcache_append(q, want_k, want_v, k, v, cos, sin, kwargs["cache_seqlens"], table, False, True)
    to = lambda t: t.to(device)  # noqa: E731
    got_k, got_v = to(k_pages), to(v_pages)
    out = flashtile.flash_attn_with_kvcache(to(q), got_k, got_v, to(k), to(v), **{
        name: to(value) if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()})
    torch.testing.assert_close(got_k.cpu(), want_k)  # bit-identical under the interpreter (run_case checks that)
    assert torch.equal(got_v.cpu(), want_v)
    for b, (pad, end) in enumerate(((3, 33), (40, 62))):
        pages = table[b].long()
        keys = want_k[pages].reshape(1, 99, 2, 40)[:, pad:end].double()
        values = want_v[pages].reshape(1, 99, 2, 40)[:, pad:end].double()
        ref = flashtile.attention_ref(q_rot[b:b + 1].double(), keys, values, causal=True)
        low = flashtile.attention_ref(q_rot[b:b + 1], keys.float(), values.float(), causal=True, upcast=False)
        assert_close_rule(f"row {b}", out[b:b + 1].cpu(), ref, low, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("layout", ["contiguous", "page256", "batch_idx"])
def test_decode_size_gpu(layout, interleaved):
    """A decode step at serving size, bf16: 64 rows, 32 query / 8 KV heads, D 128, one new token, 4096-token
    cache; against float64 and the PyTorch path on the GPU (within the tolerance rule: FMA contraction)."""
    run_case(layout, interleaved, 128, 128, 1, torch.bfloat16, seqlen_q=1, heads_q=32, heads_kv=8, batch=64,
             capacity=4096, device="cuda")
