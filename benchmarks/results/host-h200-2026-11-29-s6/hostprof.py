# Host time of the causal 1K D128 call (B16 H16 bf16) that the session-6 bench timed at 0.59 ms fwd / 1.04 ms bwd.
import cProfile, os, pstats, sys, time
import torch, triton, flashtile
q, k, v = (torch.randn(16, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)
for causal in (True, False):
    f = lambda: flashtile.flash_attn_func(q, k, v, causal=causal)
    out = f(); torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50): f()
    host = (time.perf_counter() - t) / 50; torch.cuda.synchronize()
    print(f"causal={causal} fwd host {host*1e3:.3f} ms  do_bench {triton.testing.do_bench(f, return_mode='median'):.3f}", flush=True)
    out = f()
    g = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(50): g()
    host = (time.perf_counter() - t) / 50; torch.cuda.synchronize()
    print(f"causal={causal} bwd host {host*1e3:.3f} ms  do_bench {triton.testing.do_bench(g, return_mode='median'):.3f}", flush=True)
out = flashtile.flash_attn_func(q, k, v, causal=True)
pr = cProfile.Profile(); pr.enable()
for _ in range(30):
    o = flashtile.flash_attn_func(q, k, v, causal=True); torch.autograd.grad(o, (q, k, v), dout)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
