"""Host time vs GPU time of one attention call, to tell launch-bound shapes from kernel-bound ones.

    PYTHONPATH=src python3 benchmarks/host_time.py [--profile OUT.txt | --parts OUT.txt | --decode OUT.txt]

Per case (provider x grad x shape) it prints:
  host_us  Python time per call, calls issued back to back without a sync (the GPU queue absorbs them);
  gpu_us   time per call of 50 back-to-back calls between two CUDA events: the kernel time when the host
           keeps ahead, else the host time;
  bench_us triton's do_bench median (the bench command's number: L2 flushed before each call, so host time
           beyond the flush's own ~80 us shows up in it).
--passes N runs the sweep N times in one process: a row that moves between passes (no code changes between them)
measures the machine's state, not the call (the no-grad / grad inversion at D128 S512 in session 11's log).
Run in a fresh process without torch.profiler (a CPU-activity profile slows every later call in the process).
--profile writes cProfile's top functions of 200 flashtile calls with grad (B32 S512 H16 D128).
--decode OUT.txt: host and GPU time of eager decode steps (flash_attn_with_kvcache, 1 query token, 32 / 4 heads, D128,
int cache_seqlens, contiguous and 16-token pages, without and with a one-token append) against SDPA on the same
cache, B 8 / 64, 4K / 16K cached tokens, then B8 4K with ALiBi and cache_leftpad; writes cProfiles of 300 B8 4K
steps to OUT.txt (contiguous, with an append, 16-token pages).
--parts prints the host time of each stage of the forward's call path at B32 S512 H16 D128 (the Gluon persistent
launch and the portable one), from flash_attn_func down to the bare kernel launch with prebuilt arguments (through
triton's kernel[grid] and through fast_launch.launch), and writes a cProfile (by own time) of 300 forward calls to
the given file. FLASHTILE_FAST_LAUNCH=0 / 1 compares the library's launches without / with the fast path.
"""
import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashtile

SHAPES = [(32, 512, 16, 128, False), (32, 512, 16, 128, True), (16, 1024, 16, 128, True), (32, 512, 32, 64, False),
          (32, 512, 32, 64, True), (16, 1024, 32, 64, True)]  # D64 causal: the portable forward below 4K keys


def _cudnn(q, k, v, causal):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal)


def _host(fn, calls=200):
    """Python time per call (us), back to back; synchronizes before and after."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return host * 1e6


def _host_and_gpu(fn, calls=100):
    host = _host(fn, calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        fn()
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / 50 * 1e3


def _write_profile(fn, calls, path, orders, rows, mode="w", title=None):
    """cProfile of calls x fn(), its top rows functions by each of orders, written (or appended: mode "a") to path
    under an optional title line."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    for order in orders:
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(rows)
    with open(path, mode) as f:
        f.write(f"=== {title}\n" if title else "")
        f.write(text.getvalue())


def parts(profile_path):
    """Host time of the forward's stages (B32 S512 H16 D128 bf16, no grad): where the ~130-300 us go."""
    import os

    from flashtile import configs, fast_launch, gluon_launch, gluon_variants, launch, ops

    q, k, v = (torch.randn(32, 512, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 128 ** -0.5
    variant = configs.gluon_fwd_variant(128, False, 512, plain=True)
    config = gluon_variants.VARIANTS[variant][128]
    out, lse = torch.empty_like(q), torch.empty(32, 16, 512, device="cuda")
    grid, pargs, constexprs, options = gluon_launch.persistent_launch_args(q, k, v, out, lse, scale, False, config)
    kernel = gluon_launch._attn_fwd_hopper_persistent
    fwd_args = (q, k, v, scale, -1, -1, 0.0, None, None, None, None, 0, 0, None)
    stages = [
        ("flash_attn_func", lambda: flashtile.flash_attn_func(q, k, v)),
        ("ops.fwd implementation", lambda: ops._IMPLS[ops.fwd](*fwd_args)),
        ("launch._flash_attn_forward", lambda: launch._flash_attn_forward(*fwd_args[:9])),
        ("launch._gluon_forward", lambda: launch._gluon_forward(q, k, v, scale, -1, -1, 0.0, None, None)),
        ("gluon_launch.gluon_supported", lambda: gluon_launch.gluon_supported(q, k, v)),
        (f"gluon_launch.gluon_forward [{variant}]", lambda: gluon_launch.gluon_forward(q, k, v, scale,
                                                                                      variant=variant)),
        ("persistent_launch_args", lambda: gluon_launch.persistent_launch_args(q, k, v, out, lse, scale, False,
                                                                               config)),
        ("bare persistent kernel launch", lambda: kernel[grid](*pargs, **constexprs, **options)),
        ("fast_launch.launch persistent", lambda: fast_launch.launch(kernel, grid, pargs, {**constexprs, **options})),
        ("torch.empty x2", lambda: (torch.empty_like(q), torch.empty(32, 16, 512, device="cuda"))),
        ("cudnn sdpa", lambda: _cudnn(q, k, v, False)),
    ]
    for name, fn in stages:
        print(f"{name:40} {_host(fn):8.1f} us", flush=True)
    os.environ["FLASHTILE_GLUON"] = "0"
    geo = launch.Geometry.of(q, k)
    sa = launch.ScoreArgs.make(geo, scale, -1, -1, 0.0, None, lse, approx_tanh=False)
    arch = launch._arch(q.device)
    launches = launch.forward_launches(geo, q, k, v, out, lse, None, sa, arch, False)
    portable = [("portable: launch._flash_attn_forward", lambda: launch._flash_attn_forward(*fwd_args[:9])),
                ("portable: forward_launches",
                 lambda: launch.forward_launches(geo, q, k, v, out, lse, None, sa, arch, False)),
                ("portable: launches[0].run()", launches[0].run)]
    for name, fn in portable:
        print(f"{name:40} {_host(fn):8.1f} us", flush=True)
    kl = launches[0]
    bare = lambda: kl.kernel[kl.grid](*kl.args, **kl.constexprs, num_warps=kl.num_warps,  # noqa: E731
                                      num_stages=kl.num_stages)
    print(f"{'portable: bare kernel[grid]':40} {_host(bare):8.1f} us")
    print(f"fast_launch: enabled {fast_launch.enabled()}, [fast, recorded] launches so far {fast_launch.counts}",
          flush=True)
    del os.environ["FLASHTILE_GLUON"]
    _write_profile(lambda: flashtile.flash_attn_func(q, k, v), 300, profile_path, ("tottime", "cumulative"), 45)


def decode(profile_path):
    """Eager decode steps (no CUDA graph): host / GPU time per call, flashtile and SDPA (B8 host-bound: session 35)."""
    print(f"{'provider':10} {'B':>3} {'cache':>6} {'page':>4} {'append':6} {'host_us':>8} {'gpu_us':>8}")
    bf = dict(device="cuda", dtype=torch.bfloat16)
    for batch in (8, 64):
        for cache in (4096, 16384):
            q = torch.randn(batch, 1, 32, 128, **bf)
            k_cache, v_cache = (torch.randn(batch, cache + 16, 4, 128, **bf) for _ in range(2))
            k_new, v_new = (torch.randn(batch, 1, 4, 128, **bf) for _ in range(2))
            # 16-token pages: the same tokens in a shuffled pool addressed by a block table
            pages = (cache + 16) // 16
            order = torch.randperm(batch * pages, device="cuda")
            table = order.reshape(batch, pages).to(torch.int32)
            k_pool, v_pool = (torch.empty(batch * pages, 16, 4, 128, **bf) for _ in range(2))
            k_pool[order] = k_cache.reshape(batch * pages, 16, 4, 128)
            v_pool[order] = v_cache.reshape(batch * pages, 16, 4, 128)
            for page, kc, vc, bt in ((0, k_cache, v_cache, None), (16, k_pool, v_pool, table)):
                for append in (False, True):
                    new = (k_new, v_new) if append else (None, None)
                    call = lambda: flashtile.flash_attn_with_kvcache(  # noqa: E731
                        q, kc, vc, *new, cache_seqlens=cache, block_table=bt, causal=True)
                    host, gpu = _host_and_gpu(call)
                    print(f"{'flashtile':10} {batch:3} {cache:6} {page:4} {str(append):6} {host:8.1f} {gpu:8.1f}",
                          flush=True)
            qt = q.transpose(1, 2)
            kt, vt = (t[:, :cache].transpose(1, 2).contiguous() for t in (k_cache, v_cache))
            host, gpu = _host_and_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
            print(f"{'sdpa':10} {batch:3} {cache:6} {0:4} {'False':6} {host:8.1f} {gpu:8.1f}", flush=True)
    q = torch.randn(8, 1, 32, 128, **bf)
    k_cache, v_cache = (torch.randn(8, 4096, 4, 128, **bf) for _ in range(2))
    slopes, pads = torch.rand(8, 32, device="cuda"), torch.randint(0, 64, (8,), device="cuda", dtype=torch.int32)
    host, gpu = _host_and_gpu(lambda: flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=4095, causal=True, alibi_slopes=slopes, cache_leftpad=pads))
    print(f"B8 4K contiguous with ALiBi (8, 32) and cache_leftpad: host_us {host:.1f} gpu_us {gpu:.1f}", flush=True)
    k_new, v_new = (torch.randn(8, 1, 4, 128, **bf) for _ in range(2))
    table = torch.randperm(8 * 256, device="cuda").reshape(8, 256).to(torch.int32)
    k_pool, v_pool = (torch.randn(8 * 256, 16, 4, 128, **bf) for _ in range(2))
    steps = [("contiguous", lambda: flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4095,
                                                                      causal=True)),
             ("contiguous + append", lambda: flashtile.flash_attn_with_kvcache(
                 q, k_cache, v_cache, k_new, v_new, cache_seqlens=4095, causal=True)),
             ("16-token pages", lambda: flashtile.flash_attn_with_kvcache(
                 q, k_pool, v_pool, cache_seqlens=4095, block_table=table, causal=True))]
    for i, (title, step) in enumerate(steps):
        step()
        _write_profile(step, 300, profile_path, ("tottime", "cumulative"), 30, "w" if i == 0 else "a",
                       f"300 B8 4K steps, {title}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", help="write a cProfile of 200 flashtile calls with grad here")
    ap.add_argument("--parts", help="time the forward's stages; write a cProfile of 300 forward calls here")
    ap.add_argument("--passes", type=int, default=1, help="run the sweep this many times")
    ap.add_argument("--decode", help="time eager decode steps instead; write cProfiles of 300 B8 steps here")
    args = ap.parse_args()
    if args.decode:
        decode(args.decode)
        return
    if args.parts:
        parts(args.parts)
        return
    print(f"{'provider':10} {'grad':5} {'B':>3} {'S':>5} {'H':>3} {'D':>4} {'causal':6} "
          f"{'host_us':>8} {'gpu_us':>8} {'bench_us':>8}")
    for b, s, h, d, causal in SHAPES * args.passes:
        for grad in (False, True):
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
                       for _ in range(3))
            for name, call in (("flashtile", lambda: flashtile.flash_attn_func(q, k, v, causal=causal)),
                               ("cudnn", lambda: _cudnn(q, k, v, causal))):
                host, gpu = _host_and_gpu(call)
                bench = do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3
                print(f"{name:10} {str(grad):5} {b:3} {s:5} {h:3} {d:4} {str(causal):6} "
                      f"{host:8.1f} {gpu:8.1f} {bench:8.1f}", flush=True)
    if args.profile:
        q, k, v = (torch.randn(32, 512, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        _host_and_gpu(lambda: flashtile.flash_attn_func(q, k, v))
        _write_profile(lambda: flashtile.flash_attn_func(q, k, v), 200, args.profile, ("tottime", ), 30)


if __name__ == "__main__":
    main()
