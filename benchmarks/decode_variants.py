"""Paged decode with each way of computing the page lookups, timed in one process on the same caches.

The variants set the kernels' paging constexprs (launch.Geometry.page_constexprs; the library picks "shift+prefetch"
for power-of-two pages): "div" a division per key and the lookup in the tile's own iteration (main before the
decode-page16 branch, up to its int32 tokens and one lookup shared by K and V), "shift" a shift and a mask,
"prefetch" page numbers read a tile ahead, and both. Shapes as in the decode bench (Hq 32, Hk 4, D 128, bf16, one
query token, causal, random page tables); times are CUDA-graph replays (flashtile.bench.timing.bench_ms), the
variants interleaved per shape. Every variant's output must equal the first one's bit for bit.
    python3 benchmarks/decode_variants.py --page-sizes 16,256 --cache-lens 16384,131072 --decode-batch 8,64
Without a GPU it runs the interpreter on tiny shapes (a smoke test: TRITON_INTERPRET=1, --cache-lens 256).
"""
import argparse

import torch

from flashtile import flash_attn_with_kvcache, launch
from flashtile.bench.decode import COPY_CEILING_GBPS, GQA, HEAD_DIM, HEADS_Q, capacity_for, kv_bytes, paged
from flashtile.bench.timing import bench_ms

VARIANTS = {"div": (-1, False), "shift": (None, False), "prefetch": (-1, True), "shift+prefetch": (None, True)}
CHOSEN = launch.Geometry.page_constexprs


def use_variant(shift, prefetch):
    """Make every launch take these paging constexprs (shift None: log2 of a power-of-two page, as chosen)."""
    def page_constexprs(self, k, block_n):
        c = CHOSEN(self, k, block_n)
        if c["PAGED"]:
            c = dict(c, PAGE_SHIFT=c["PAGE_SHIFT"] if shift is None else shift, PAGE_PREFETCH=prefetch)
        return c
    launch.Geometry.page_constexprs = page_constexprs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-sizes", default="16,256")
    parser.add_argument("--cache-lens", default="16384,131072")
    parser.add_argument("--decode-batch", default="8,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rep", type=int, default=30, help="do_bench repetition budget in ms")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(0)
    names = args.variants.split(",")
    heads_kv = HEADS_Q // GQA
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"{'B':>3} {'L':>7} {'page':>5} " + " ".join(f"{n:>22}" for n in names) + "   (ms, % of 4.3 TB/s)")
    for batch in map(int, args.decode_batch.split(",")):
        for cache_len in map(int, args.cache_lens.split(",")):
            pages = [int(p) for p in args.page_sizes.split(",")]
            capacity = capacity_for(cache_len, pages)
            q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, generator=gen, device=device, dtype=dtype)
            k, v = (torch.randn(batch, capacity, heads_kv, HEAD_DIM, generator=gen, device=device, dtype=dtype)
                    for _ in range(2))
            nbytes = kv_bytes(batch, cache_len, heads_kv, HEAD_DIM, dtype.itemsize)
            for page in pages:
                k_pages, v_pages, table = paged(k, v, cache_len, page, gen)
                fn = lambda: flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=cache_len,  # noqa: E731
                                                     block_table=table, causal=True)
                cells, first = [], None
                for name in names:
                    use_variant(*VARIANTS[name])
                    with torch.no_grad():
                        out = fn()  # compiles this variant
                        if first is None:
                            first = out
                        elif not torch.equal(out, first):
                            raise SystemExit(f"variant {name} differs from {names[0]} at B {batch} L {cache_len} "
                                             f"page {page}")
                        ms = bench_ms(fn, device, 5, args.rep, cuda_graph=device.type == "cuda")
                    frac = nbytes / (ms * 1e-3) / 1e9 / COPY_CEILING_GBPS
                    cells.append(f"{ms:9.4f} ms {frac:7.0%}")
                print(f"{batch:>3} {cache_len:>7} {page:>5} " + " ".join(f"{c:>22}" for c in cells), flush=True)
                k_pages = v_pages = table = first = out = None
            q = k = v = None
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
