"""Backward dropout A/B: the Gluon backward's ms (gluon_bwd_launch.gluon_backward alone, after the Gluon forward with
the same seed) at 8K tokens, B 2, hidden 2048, bf16, dropout 0.1 against none, for the flashtile on PYTHONPATH.
    PYTHONPATH=<src> python3 bwd_drop_ab.py TAG 128,64
One line per row."""
import sys

import torch
import triton

from flashtile import gluon_bwd_launch, gluon_launch

tag, dims = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
torch.manual_seed(0)
rng = torch.tensor([12345], dtype=torch.int64, device="cuda")
for dim in dims:
    heads = 2048 // dim
    q, k, v, dout = (torch.randn(2, 8192, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for causal in (False, True):
        for p in (0.0, 0.1):
            r = rng if p else None
            out, lse = gluon_launch.gluon_forward(q, k, v, causal=causal, dropout_p=p, rng=r)
            fn = lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, causal=causal, dropout_p=p, rng=r)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=50, rep=400)
            print(f"AB {tag:4s} d{dim} {'causal' if causal else 'full  '} p{p}  bwd {ms:.3f} ms", flush=True)
