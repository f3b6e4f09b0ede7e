"""Session 37: the graph bench's B64 4K 16-token-page row reads 79 % of the ceiling with the sdpa provider in the
run and 87 % without. Which SDPA step slows the paged kernel after it? p16 time (graph replays) before SDPA, after
making the transposed copies, after one SDPA call (flash, then cuDNN), after freeing the copies."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtile
from flashtile.bench.decode import paged
from flashtile.bench.timing import bench_ms

dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
batch, cache = 64, 4096
q = torch.randn(batch, 1, 32, 128, device=dev, dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(batch, cache, 4, 128, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
kp, vp, table = paged(k, v, cache, 16, gen)


def time(label):
    for name, kc, vc, bt in (("contiguous", k, v, None), ("p16", kp, vp, table)):
        fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=cache, block_table=bt,  # noqa
                                                       causal=True)
        fn()
        print(f"{label:28} {name:10} {bench_ms(fn, dev, 50, 300, cuda_graph=True) * 1e3:7.1f} us", flush=True)


time("start")
time("again")
qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
time("copies made")
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
torch.cuda.synchronize()
time("after sdpa flash")
bench_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), dev, 50, 300, cuda_graph=True)
time("after sdpa default (graph)")
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
torch.cuda.synchronize()
time("after sdpa cudnn")
del qt, kt, vt
torch.cuda.empty_cache()
time("copies freed")
