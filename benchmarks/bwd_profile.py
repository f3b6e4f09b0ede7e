"""Where the backward's GPU time goes: per-kernel CUDA time of flashtile's backward (preprocess, dK/dV kernel, dQ
conversion) and of SDPA cuDNN's, from torch.profiler, at the bench's shapes (16K tokens, hidden 2048, bf16).
Then the two memory-bound kernels around flashtile's main one, timed alone in a few tile configurations, with
their bandwidth against the 4.3 TB/s copy ceiling.

    PYTHONPATH=src python3 benchmarks/bwd_profile.py [--head-dims 64,128,256] [--seqlens 1024,4096] [--causal both]
"""
import argparse
import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtile import bwd_launch, flash_attn_func, gluon_bwd_launch, launch
from flashtile.bench.timing import bench_ms, kernel_us

CALLS = 10  # profiled calls per shape
TOKENS, HIDDEN = 16384, 2048


def backward_calls(head_dim, seqlen, causal):
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dout_t = dout.transpose(1, 2)

    def flashtile():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.autograd.grad(out_t, (qt, kt, vt), dout_t, retain_graph=True)

    return {"flashtile": flashtile, "sdpa-cudnn": cudnn}


def profile_shapes(head_dims, seqlens, causals):
    for head_dim in head_dims:
        for seqlen in seqlens:
            for causal in causals:
                print(f"D{head_dim} S{seqlen} {'causal' if causal else 'plain'} (B{TOKENS // seqlen} "
                      f"H{HIDDEN // head_dim}):")
                for name, fn in backward_calls(head_dim, seqlen, causal).items():
                    kernels = kernel_us(fn, CALLS, 48)
                    ms = bench_ms(fn, torch.device("cuda"), 25, 100)
                    parts = ", ".join(f"{n} {t:.1f}" for n, t in sorted(kernels.items(), key=lambda kv: -kv[1]))
                    print(f"  {name:10s} do_bench {ms * 1e3:8.1f} us; kernels {sum(kernels.values()):8.1f} us: "
                          f"{parts}", flush=True)


def memory_kernels(head_dim):
    """The preprocess (reads O and dO, zeroes the fp32 dQ buffer) and the dQ conversion, alone, per config."""
    batch, heads, seqlen = TOKENS // 4096, HIDDEN // head_dim, 4096
    out, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(batch, heads, seqlen, device="cuda")
    geo = launch.Geometry.of(out, out)
    delta, lse2 = (torch.empty(batch, heads, seqlen, device="cuda") for _ in range(2))
    dq_accum = torch.empty(batch, seqlen, heads, head_dim, device="cuda")
    dq = torch.empty_like(out)
    elems = out.numel()
    device = torch.device("cuda")
    default_pre = bwd_launch.PRE_BLOCK
    print(f"D{head_dim}: preprocess (reads 2 x {elems * 2 / 1e6:.0f} MB, writes {elems * 4 / 1e6:.0f} MB), "
          f"dQ conversion (reads {elems * 4 / 1e6:.0f} MB, writes {elems * 2 / 1e6:.0f} MB)")
    try:
        for block in (32, 64, 128):
            for warps in (2, 4, 8):
                bwd_launch.PRE_BLOCK = block
                pre = dataclasses.replace(bwd_launch.preprocess_launch(geo, out, dout, lse, None, delta, lse2,
                                                                       dq_accum=dq_accum), num_warps=warps)
                pre.run()
                us = bench_ms(pre.run, device, 25, 100) * 1e3
                default = "  (default)" if (block, warps) == (default_pre, 4) else ""
                print(f"  preprocess BLOCK_M {block:3d} warps {warps}: {us:7.1f} us, "
                      f"{elems * 8 / us / 1e6:5.2f} TB/s{default}")
    finally:
        bwd_launch.PRE_BLOCK = default_pre
    for block in (32, 64, 128):
        for warps in (2, 4, 8):
            conv = dataclasses.replace(bwd_launch.dq_convert_launch(dq_accum, dq, 0.5, block), num_warps=warps)
            conv.run()
            us = bench_ms(conv.run, device, 25, 100) * 1e3
            print(f"  dq convert BLOCK_M {block:3d} warps {warps}: {us:7.1f} us, "
                  f"{elems * 6 / us / 1e6:5.2f} TB/s{'  (default)' if (block, warps) == (64, 4) else ''}", flush=True)
    # The tiled dQ buffer (gluon_bwd_launch.dq_tile) the defaults use: 64-row pieces, 4 warps.
    tile = gluon_bwd_launch.dq_tile(gluon_bwd_launch.VARIANTS["default"][head_dim], head_dim, False)
    if tile is not None:
        pre = bwd_launch.preprocess_launch(geo, out, dout, lse, None, delta, lse2, dq_accum=dq_accum, dq_tile=tile)
        conv = bwd_launch.dq_convert_launch(dq_accum, dq, 0.5, tile=tile)
        for name, kernel, nbytes in (("preprocess", pre, elems * 8), ("dq convert", conv, elems * 6)):
            kernel.run()
            us = bench_ms(kernel.run, device, 25, 100) * 1e3
            print(f"  {name} tiled {tile}: {us:7.1f} us, {nbytes / us / 1e6:5.2f} TB/s", flush=True)
    copy_src = torch.empty(elems * 3, dtype=torch.bfloat16, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    us = bench_ms(lambda: copy_dst.copy_(copy_src), device, 25, 100) * 1e3
    print(f"  torch copy of {elems * 6 / 1e6:.0f} MB: {us:7.1f} us, {elems * 12 / us / 1e6:5.2f} TB/s (read + write)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--seqlens", default="1024,4096")
    parser.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    head_dims = [int(d) for d in args.head_dims.split(",")]
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    if not args.skip_profile:
        profile_shapes(head_dims, [int(s) for s in args.seqlens.split(",")], causals)
    if not args.skip_memory:
        for head_dim in head_dims:
            memory_kernels(head_dim)


if __name__ == "__main__":
    main()
