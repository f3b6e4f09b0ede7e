"""Where a decode step's GPU time goes: per-kernel CUDA time of flashtile's split-KV decode (split kernel, combine
kernel) and of SDPA's, from torch.profiler over eager calls (kernel durations do not depend on the host), plus the
CUDA-graph replay time of the whole call, which adds the gaps between the kernels.

    PYTHONPATH=src python3 benchmarks/decode_profile.py [--cache-lens 4096,16384,131072] [--decode-batch 8,64]
        [--head-major]

Shapes as in the decode bench (Hq 32, Hk 4, D 128, bf16, one query token, contiguous cache). The graph time exceeds
the kernels' sum by ~9 us at batch 8 for one kernel as for two (session 29: the replay's own cost, not the gap before
the combine kernel).
"""
import argparse

import torch
import torch.nn.functional as F

from flashtile import flash_attn_with_kvcache
from flashtile.bench.decode import GQA, HEAD_DIM, HEADS_Q, kv_bytes
from flashtile.bench.timing import bench_ms, kernel_us

CALLS = 20  # profiled calls per shape


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-lens", default="4096,16384,131072")
    parser.add_argument("--decode-batch", default="8,64")
    parser.add_argument("--head-major", action="store_true",
                        help="also time flashtile on the (B, Hk, L, D) caches SDPA reads (flashtile-hm): each head's "
                             "keys contiguous, where flash-attn's (B, L, Hk, D) interleaves the heads per token")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads_kv = HEADS_Q // GQA
    for batch in map(int, args.decode_batch.split(",")):
        for cache_len in map(int, args.cache_lens.split(",")):
            q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(batch, cache_len, heads_kv, HEAD_DIM, generator=gen, device="cuda",
                                dtype=torch.bfloat16) for _ in range(2))
            kt, vt, qt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), q.transpose(1, 2)
            calls = {
                "flashtile": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_len, causal=True),
                "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
            }
            if args.head_major:  # flashtile on SDPA's copies, read through strides: the same bytes in SDPA's order
                calls["flashtile-hm"] = lambda: flash_attn_with_kvcache(q, kt.transpose(1, 2), vt.transpose(1, 2),
                                                                         cache_seqlens=cache_len, causal=True)
            ideal_us = kv_bytes(batch, cache_len, heads_kv, HEAD_DIM, 2) / 4300e9 * 1e6
            print(f"B{batch} L{cache_len}: K/V read at 4.3 TB/s = {ideal_us:.1f} us")
            for name, fn in calls.items():
                kernels = kernel_us(fn, CALLS)  # runs fn once first: compiled before the graph is captured
                graph_us = bench_ms(fn, torch.device("cuda"), 5, 20, cuda_graph=True) * 1e3
                parts = ", ".join(f"{n} {t:.1f}" for n, t in sorted(kernels.items(), key=lambda kv: -kv[1]))
                print(f"  {name:12s} graph {graph_us:7.1f} us; kernels sum {sum(kernels.values()):7.1f} us: {parts}")


if __name__ == "__main__":
    main()
