"""Session 37: the B64 4K 16-token-page row reads 87 % of the ceiling alone and 79 % when SDPA's 128K-key rows ran
before it in the bench. p16 / contiguous 4K graph-replay times around each step of that: the 128K caches and SDPA's
transposed copies allocated, one eager cuDNN SDPA call at 128K, SDPA's graph bench at 128K."""
import torch
import torch.nn.functional as F

import flashtile
from flashtile.bench.decode import paged
from flashtile.bench.timing import bench_ms

dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
batch, cache = 64, 4096
q = torch.randn(batch, 1, 32, 128, device=dev, dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(batch, cache, 4, 128, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
layouts = [("contiguous", k, v, None), ("p16", *paged(k, v, cache, 16, gen))]


def time(label):
    for name, kc, vc, bt in layouts:
        fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cache, block_table=bt,  # noqa
                                                       causal=True)
        fn()
        print(f"{label:30} {name:10} {bench_ms(fn, dev, 50, 300, cuda_graph=True) * 1e3:7.1f} us", flush=True)


time("start")
big = 131072
kl, vl = (torch.randn(batch, big, 4, 128, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
fl = lambda: flashtile.flash_attn_with_kvcache(q, kl, vl, cache_seqlens=big, causal=True)  # noqa: E731
fl()
print("flashtile 128K", bench_ms(fl, dev, 50, 300, cuda_graph=True))
time("after flashtile 128K")
qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, kl, vl))
time("128K copies made")
sd = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
sd()
torch.cuda.synchronize()
time("one sdpa 128K call")
print("sdpa 128K", bench_ms(sd, dev, 50, 300, cuda_graph=True))
time("after sdpa 128K graph bench")
print("sdpa 128K eager", bench_ms(sd, dev, 50, 300))
time("after sdpa 128K eager bench")
