"""Session 37: the paged (16-token) B64 4K decode is ~10 % slower in the bench after SDPA's 128K-key copies (17 GB).
Is it the memory mapped beside the cache? p16 / contiguous / p256 graph-replay times before, with 20 GB of other
tensors allocated (and written), and after freeing them (empty_cache)."""
import torch

import flashtile
from flashtile.bench.decode import paged
from flashtile.bench.timing import bench_ms

dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
batch, cache = 64, 4096
q = torch.randn(batch, 1, 32, 128, device=dev, dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(batch, cache, 4, 128, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
layouts = [("contiguous", k, v, None), ("p16", *paged(k, v, cache, 16, gen)), ("p256", *paged(k, v, cache, 256, gen))]


def time(label):
    for name, kc, vc, bt in layouts:
        fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cache, block_table=bt,  # noqa
                                                       causal=True)
        fn()
        print(f"{label:24} {name:10} {bench_ms(fn, dev, 50, 300, cuda_graph=True) * 1e3:7.1f} us", flush=True)


time("start")
other = [torch.ones(2**30, device=dev, dtype=torch.bfloat16) for _ in range(10)]  # 20 GB, touched
time("20 GB more allocated")
other = None
time("freed, still reserved")
torch.cuda.empty_cache()
time("after empty_cache")
