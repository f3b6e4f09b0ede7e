"""Dropout A/B: the Gluon forward's ms at 8K tokens, B2, hidden 2048, bf16, plain vs dropout 0.1 (then fwd+bwd at
D128 through flash_attn_func), for the flashtile on PYTHONPATH. One line per row."""
import sys
import time

import torch
import triton

import flashtile
from flashtile import gluon_launch

tag, dims = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
torch.manual_seed(0)
rng = torch.tensor([12345], dtype=torch.int64, device="cuda")
for dim in dims:
    heads = 2048 // dim
    q, k, v = (torch.randn(2, 8192, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        for p in (0.0, 0.1):
            t0 = time.time()
            fn = lambda: gluon_launch.gluon_forward(q, k, v, causal=causal, dropout_p=p, rng=rng if p else None)
            fn()
            torch.cuda.synchronize()
            t1 = time.time()
            f = triton.testing.do_bench(fn, warmup=50, rep=300)
            print(f"AB {tag:4s} d{dim} {'causal' if causal else 'full  '} p{p}  fwd {f:.3f} ms  (first call {t1 - t0:.1f} s)",
                  flush=True)
if len(sys.argv) > 3:  # fwd+bwd at D128 through the public API
    q, k, v = (torch.randn(2, 8192, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    for causal in (False, True):
        for p in (0.0, 0.1):
            def fwdbwd():
                out = flashtile.flash_attn_func(q, k, v, dropout_p=p, causal=causal)
                torch.autograd.grad(out, (q, k, v), dout)
            t0 = time.time()
            fwdbwd()
            torch.cuda.synchronize()
            t1 = time.time()
            fb = triton.testing.do_bench(fwdbwd, warmup=20, rep=300)
            print(f"AB {tag:4s} d128 {'causal' if causal else 'full  '} p{p}  fwd+bwd {fb:.3f} ms  (first call {t1 - t0:.1f} s)",
                  flush=True)
