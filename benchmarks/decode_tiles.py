"""Split-KV decode tiles and split counts at D128, timed in one process against SDPA on the same caches.

A variant is BLOCK_N x warps x stages x resident programs per SM (configs._SM90_DECODE[128] and
configs.SPLIT_PROGRAMS_PER_SM, the number of splits follows from the last); "cur" is the shipped setting.
Shapes as the decode bench (Hq 32, Hk 4, one query token, causal, bf16, random page tables), CUDA-graph replays,
variants interleaved per shape; each variant's output must match the first one's to 1e-2. Prints ms and % of
the 4.3 TB/s copy ceiling; the sdpa column is the contiguous cache (SDPA reads no pages).
    python3 benchmarks/decode_tiles.py [--variants cur,128x4x3x2,...] [--page-sizes 0,16,256]
"""
import argparse

import torch
import torch.nn.functional as F

from flashtile import configs, flash_attn_with_kvcache
from flashtile.bench.decode import COPY_CEILING_GBPS, GQA, HEAD_DIM, HEADS_Q, capacity_for, kv_bytes, paged
from flashtile.bench.timing import bench_ms

SHIPPED = (*configs._SM90_DECODE[128], configs.SPLIT_PROGRAMS_PER_SM)
DEFAULT_VARIANTS = "cur,64x4x4x2,128x4x3x2,128x8x3x2,64x4x3x1,64x4x3x3,64x4x3x4,128x4x2x2"


def use(variant):
    block_n, warps, stages, per_sm = SHIPPED if variant == "cur" else map(int, variant.split("x"))
    configs._SM90_DECODE[128] = (block_n, warps, stages)
    configs.SPLIT_PROGRAMS_PER_SM = per_sm
    configs.num_splits_heuristic.cache_clear()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--page-sizes", default="0,16,256")
    p.add_argument("--cache-lens", default="4096,16384,131072")
    p.add_argument("--decode-batch", default="8,64")
    p.add_argument("--rep", type=int, default=30)
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    names = args.variants.split(",")
    pages = [int(x) for x in args.page_sizes.split(",")]
    heads_kv = HEADS_Q // GQA
    print(f"{'B':>3} {'L':>7} {'page':>6} {'sdpa':>16} " + " ".join(f"{n:>16}" for n in names), flush=True)
    for batch in map(int, args.decode_batch.split(",")):
        for cache_len in map(int, args.cache_lens.split(",")):
            capacity = capacity_for(cache_len, pages)
            q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, generator=gen, device=device, dtype=torch.bfloat16)
            k, v = (torch.randn(batch, capacity, heads_kv, HEAD_DIM, generator=gen, device=device,
                                dtype=torch.bfloat16) for _ in range(2))
            nbytes = kv_bytes(batch, cache_len, heads_kv, HEAD_DIM, 2)

            def cell(ms):
                return f"{ms:.4f} {nbytes / (ms * 1e-3) / 1e9 / COPY_CEILING_GBPS:5.0%}"

            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k[:, :cache_len], v[:, :cache_len]))
            sdpa_ms = bench_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), device, 5,
                               args.rep, cuda_graph=True)
            qt = kt = vt = None
            for page in pages:
                if page:
                    kp, vp, table = paged(k, v, cache_len, page, gen)
                else:
                    kp, vp, table = k, v, None
                fn = lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=cache_len,  # noqa: E731
                                                     block_table=table, causal=True)
                cells, first = [], None
                for name in names:
                    use(name)
                    with torch.no_grad():
                        out = fn()
                        if first is None:
                            first = out
                        elif (out.float() - first.float()).abs().max().item() > 1e-2:
                            raise SystemExit(f"{name} differs from {names[0]} at B {batch} L {cache_len} page {page}")
                        cells.append(cell(bench_ms(fn, device, 5, args.rep, cuda_graph=True)))
                print(f"{batch:>3} {cache_len:>7} {page or 'contig':>6} {cell(sdpa_ms):>16} "
                      + " ".join(f"{c:>16}" for c in cells), flush=True)
            use("cur")
            q = k = v = kp = vp = table = first = out = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
