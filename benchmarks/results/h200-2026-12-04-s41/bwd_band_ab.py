"""Masked-tile A/B: the Gluon backward's ms (gluon_bwd_launch.gluon_backward alone, after the Gluon forward) at 8K
tokens, B 2, hidden 2048, bf16: full (control), causal, windows (1024, 0) and (4096, 0), for the flashtile on
PYTHONPATH.
    PYTHONPATH=<src> python3 bwd_band_ab.py TAG 128,64,256
One line per row."""
import sys

import torch
import triton

from flashtile import gluon_bwd_launch, gluon_launch

tag, dims = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
torch.manual_seed(0)
for dim in dims:
    heads = 2048 // dim
    q, k, v, dout = (torch.randn(2, 8192, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for name, causal, window in (("full", False, (-1, -1)), ("causal", True, (-1, -1)),
                                 ("win1024", False, (1024, 0)), ("win4096", False, (4096, 0))):
        out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, window_size=window)
        fn = lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, causal=causal, window_size=window)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=50, rep=400)
        print(f"AB {tag:4s} d{dim} {name:8s} bwd {ms:.3f} ms", flush=True)
