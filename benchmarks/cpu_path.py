"""The CPU path (flashtile/cpu.py) against SDPA's CPU kernel: ms forward and forward + backward, median of a few
runs, fp32 / bf16, on this machine's cores. A benchmark, not a test.
    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/cpu_path.py [--reps 5]"""
import argparse
import os
import statistics
import time

os.environ["TRITON_INTERPRET"] = "0"  # CPU tensors take cpu.py, not the interpreter
import torch  # noqa: E402

import flashtile  # noqa: E402

# (B, S, H, D, causal, dtype)
SHAPES = [(1, 1024, 8, 64, False, torch.float32), (1, 1024, 8, 64, True, torch.float32),
          (1, 2048, 8, 128, True, torch.float32), (2, 512, 8, 64, False, torch.bfloat16)]


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for batch, seqlen, heads, head_dim, causal, dtype in SHAPES:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(dtype).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(q.shape, generator=gen).to(dtype)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dout_t = dout.transpose(1, 2)

        def ours():
            return flashtile.flash_attn_func(q, k, v, causal=causal)

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        row = []
        for name, fn, grad_of, g in (("flashtile", ours, (q, k, v), dout), ("sdpa", sdpa, (qt, kt, vt), dout_t)):
            with torch.no_grad():
                fwd = median_ms(fn, args.reps)
            both = median_ms(lambda fn=fn, grad_of=grad_of, g=g: torch.autograd.grad(fn(), grad_of, g), args.reps)
            row.append(f"{name} {fwd:7.1f} / {both:7.1f} ms")
        print(f"B{batch} S{seqlen} H{heads} D{head_dim} {'causal' if causal else 'full  '} {str(dtype)[6:]:8s} "
              f"fwd / fwd+bwd: " + "   ".join(row), flush=True)


if __name__ == "__main__":
    main()
