"""Session 21 exploration: tf32x3 vs ieee dots for fp32, and D64 backward tiles, on the GPU."""
import json, sys, time
sys.path.insert(0, "benchmarks")
import torch
from triton.testing import do_bench
import flashtile
from flashtile import configs, launch
from fp32_tiles import sdpa, errors

T, B = configs.TileConfig, configs.BwdConfig
orig_prec = launch._dot_precision

def run(head_dim, causal, name, prec=None, bwd=None, seqlen=2048):
    batch, heads = 2, max(1, 1024 // head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out64 = sdpa(q64, k64, v64, causal)
    ref = (out64, *torch.autograd.grad(out64, (q64, k64, v64), dout.double()))
    launch._dot_precision = (lambda dt: prec if dt == torch.float32 else orig_prec(dt)) if prec else orig_prec
    saved = dict(configs._IEEE_BWD)
    if bwd:
        configs._IEEE_BWD[head_dim] = bwd
    fn = lambda a, b, c: flashtile.flash_attn_func(a, b, c, causal=causal)
    t0 = time.perf_counter(); err = errors(fn, q, k, v, dout, ref); torch.cuda.synchronize(); first = time.perf_counter() - t0
    with torch.no_grad():
        fwd = do_bench(lambda: fn(q, k, v))
    both = do_bench(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout))
    configs._IEEE_BWD.clear(); configs._IEEE_BWD.update(saved)
    launch._dot_precision = orig_prec
    print(json.dumps(dict(d=head_dim, causal=causal, name=name, first=round(first, 1), fwd_ms=round(fwd, 3),
                          bwd_ms=round(both - fwd, 3), err=float(f"{err:.2e}"))), flush=True)

torch.backends.cuda.matmul.allow_tf32 = False
for d in (64, 128):
    for c in (False, True):
        run(d, c, "ieee")
        run(d, c, "tf32x3", prec="tf32x3")
for c in (False, True):
    run(64, c, "bwd-16x32w4-32x32w4", bwd=B(T(16, 32, 4, 2), T(32, 32, 4, 2)))
    run(64, c, "bwd-32x16w4-64x32w8", bwd=B(T(32, 16, 4, 2), T(64, 32, 8, 2)))
    run(64, c, "bwd-32x64w4-32x32w4", bwd=B(T(32, 64, 4, 2), T(32, 32, 4, 2)))
# decode D128 again: old (64) vs new (32) block_n
q = torch.randn(8, 1, 32, 128, device="cuda"); kc, vc = (torch.randn(8, 16384, 4, 128, device="cuda") for _ in range(2))
lens = torch.full((8,), 16384, dtype=torch.int32, device="cuda")
for bn in (64, 32, 64, 32):
    configs._IEEE_DECODE[128] = (bn, 4, 2)
    fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    fn(); print(json.dumps(dict(decode=128, block_n=bn, ms=round(do_bench(fn), 4))), flush=True)
