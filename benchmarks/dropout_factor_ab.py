"""The portable dK/dV kernel's two forms of dropout's keep mask, timed in one process on the GPU: the select NVIDIA
runs and the factor ROCm runs (kernels/bwd._attn_bwd_dkdv_inner's DROPOUT_FACTOR, bwd_launch._dropout_as_factor).
Session 48 counted the factor form's sm90 loops ~24 % shorter (docs/perf-log.md); this measures it. The backward
runs with deterministic=True, which takes the portable kernels on every GPU; the two forms alternate, each first in
turn, and their gradients are compared (dV bit for bit; dQ and dK may differ in the last bits where the factor's
product fuses into an FMA: tests/test_dropout.py::test_dropout_factor_matches_the_select).
    PYTHONPATH=src python3 benchmarks/dropout_factor_ab.py [--head-dims 64,128,256] [--seqlen 8192] [--p 0.1]
Shapes as the README's feature table: bf16, 16K tokens (B = 16384 / S), hidden 2048 (H = 2048 / D).
"""
import argparse

import torch
import triton

from feature_ab import table_inputs  # the feature table's shapes (this folder)
from flashtile import bwd_launch, flash_attn_func


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    seqlen = args.seqlen
    for head_dim, causal, q, k, v in table_inputs(args.head_dims, seqlen):
        torch.manual_seed(0)
        out = flash_attn_func(q, k, v, dropout_p=args.p, causal=causal, deterministic=True)
        grad = torch.randn_like(out)
        times, grads = {}, {}
        for repeat in range(args.repeats):
            forms = (False, True)
            for factor in forms[::-1] if repeat % 2 else forms:
                bwd_launch._dropout_as_factor = lambda factor=factor: factor
                grads[factor] = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
                times.setdefault(factor, []).append(triton.testing.do_bench(
                    lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), warmup=25, rep=100))
        same = " ".join(f"{name} {'bitwise' if torch.equal(a, b) else f'max diff {(a - b).abs().max().item():.2e}'}"
                        for name, a, b in zip(("dq", "dk", "dv"), grads[False], grads[True]))
        select, factor = min(times[False]), min(times[True])
        print(f"d{head_dim} causal={int(causal)} S={seqlen} p={args.p}: backward select {select:.3f} ms, factor "
              f"{factor:.3f} ms ({factor / select:.3f}x); gradients: {same}", flush=True)


if __name__ == "__main__":
    main()
