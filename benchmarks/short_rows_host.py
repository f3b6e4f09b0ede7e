"""Are the README bench's 512-key causal forward rows host-bound? Per head dim (the bench's shapes, 16K tokens,
hidden 2048, bf16), in one process: triton's do_bench of flash_attn_func four times in a row, the host time per
call issued back to back with and without grad (and the wall time until the GPU drains), and the replay of a
captured CUDA graph of the same call (the kernel alone: no host work).

    PYTHONPATH=src python3 benchmarks/short_rows_host.py

Session 15 (benchmarks/results/host-h200-2026-11-30-s15/diag512.txt): the portable D64 causal forward cost 233 us
of host time per call with grad against a 160 us kernel, so do_bench moved between 0.159 and 0.300 ms."""
import time
import torch
import triton
from flashtile import flash_attn_func

torch.manual_seed(0)
for head_dim, heads in ((64, 32), (256, 8), (128, 16)):
    q, k, v = (torch.randn(32, 512, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fn = lambda: flash_attn_func(q, k, v, causal=True)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    flops = 4 * 32 * heads * 512 * 512 * head_dim / 2
    runs = [triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(4)]
    print(f"D{head_dim} do_bench x4 ms", " ".join(f"{r:.3f}" for r in runs),
          "TFLOP/s", " ".join(f"{flops / r / 1e9:.0f}" for r in runs), flush=True)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - t) / 200 * 1e3
            torch.cuda.synchronize()
            dev = (time.perf_counter() - t) / 200 * 1e3
            r = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(f"D{head_dim} grad={grad} host {host:.3f} ms/call, wall {dev:.3f} ms/call, do_bench {r:.3f}", flush=True)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
    r = triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median")
    print(f"D{head_dim} graph replay do_bench {r:.3f} ms ({flops / r / 1e9:.0f} TFLOP/s)", flush=True)
