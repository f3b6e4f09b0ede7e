"""Forward and backward time of flashtile at the commit whose src/ is first on PYTHONPATH (bisecting speed).

Export each commit's sources on the dev machine, carry them to the GPU and time each one in turn:
    for c in A B; do mkdir -p bisect/$c && git archive $c src | tar -x -C bisect/$c; done
    # on the device (run with carry=["bisect"]):
    for c in A B; do PYTHONPATH=bisect/$c/src python3 benchmarks/time_commits.py $c; done
Shapes: bf16, 16K tokens (B = 16384 / S), hidden 2048 (H = 2048 / D), S = 4096; API-level timing with
triton.testing.do_bench, backward through torch.autograd.grad. Extra NAME=VALUE arguments go to
flash_attn_func, e.g. `time_commits.py A softcap=30` or `time_commits.py A dropout_p=0.1`.
"""
import ast
import sys

import torch
import triton

from flashtile import flash_attn_func

tag = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
extra = {name: ast.literal_eval(value) for name, value in (arg.split("=", 1) for arg in sys.argv[2:])}
seqlen = 4096
for head_dim in (64, 128, 256):
    for causal in (False, True):
        batch, heads = 16384 // seqlen, 2048 // head_dim
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        fwd = triton.testing.do_bench(lambda: flash_attn_func(q, k, v, causal=causal, **extra), warmup=50,
                                      rep=200)
        out = flash_attn_func(q, k, v, causal=causal, **extra)
        grad = torch.randn_like(out)
        bwd = triton.testing.do_bench(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                                      warmup=50, rep=200)
        setting = " ".join([tag, *sys.argv[2:]])
        print(f"{setting} d{head_dim} causal={int(causal)} fwd {fwd:.3f} ms bwd {bwd:.3f} ms", flush=True)
