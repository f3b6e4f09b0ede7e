"""Session 37 probe: why 16-token pages decode slower than contiguous caches (issue 5; B64 4K 79 % against 93 % of
the copy ceiling). Same memory, CUDA graph replays (bench_ms), D128 bf16, 32 / 4 heads, 1 query token:
contiguous; pages of 16 / 32 / 64 / 256 tokens, each with the pages in order (table = arange: the contiguous
cache's own order) and shuffled (the bench's random table). In order at 16 as fast as contiguous -> the loss is the
pages' scattering in memory; shuffled no slower than in order -> it is the kernel's per-key page lookups."""
import torch

import flashtile
from flashtile.bench.decode import kv_bytes
from flashtile.bench.timing import bench_ms

dev = torch.device("cuda")
print(f"{'B':>3} {'cache':>6} {'layout':>14} {'us':>8} {'TB/s':>6}")
for batch, cache in ((8, 4096), (64, 4096), (8, 16384), (64, 16384)):
    q = torch.randn(batch, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, cache, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    nbytes = kv_bytes(batch, cache, 4, 128, 2)
    layouts = [("contiguous", k, v, None)]
    for page in (16, 32, 64, 256):
        per_row = cache // page
        kp, vp = k.view(-1, page, 4, 128), v.view(-1, page, 4, 128)
        order = torch.arange(batch * per_row, device=dev, dtype=torch.int32).view(batch, per_row)
        shuffled = torch.randperm(batch * per_row, device=dev).to(torch.int32).view(batch, per_row)
        layouts += [(f"p{page} order", kp, vp, order), (f"p{page} shuffled", kp, vp, shuffled)]
    for name, kc, vc, table in layouts:
        fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cache - 1, block_table=table,  # noqa
                                                       causal=True)
        fn()
        ms = bench_ms(fn, dev, 50, 300, cuda_graph=True)
        print(f"{batch:3} {cache:6} {name:>14} {ms * 1e3:8.1f} {nbytes / ms / 1e9:6.2f}", flush=True)
