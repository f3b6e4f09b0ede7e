"""fp32 at full precision (TF32 off, PyTorch's default): the portable kernels' FMA-dot tiles (configs._IEEE_*)
against the tensor-core tables they replaced (_GENERIC_FP32_FWD / _GENERIC_BWD / _GENERIC_DECODE), on the GPU.

    PYTHONPATH=src python3 benchmarks/fp32_tiles.py [--head-dims 32,64,128,256] [--seqlen 2048] [--out DIR]

Per head dim and causal mode, each table in one process: the first call's seconds (mostly the kernels' compile),
then forward and forward + backward milliseconds (median of do_bench) and TFLOP/s, with the largest error of out
and dq/dk/dv against a float64 SDPA on the same inputs. SDPA's fp32 backends (its default choice) run beside them,
and the TF32 path (allow_tf32=True: tensor-core dots, the old tables) for scale. Decode: one query token over a 16K
cache, 32 query / 4 KV heads, batch 8 (the split-KV kernel). Offline register / spill counts of the same tiles:
`benchmarks/spills.py --dtype fp32 --configured`.
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashtile
from flashtile import configs

NEW = (configs._IEEE_FWD, configs._IEEE_BWD, configs._IEEE_DECODE)
OLD = (configs._GENERIC_FP32_FWD, configs._GENERIC_BWD, configs._GENERIC_DECODE)


def use(tables):
    configs._IEEE_FWD, configs._IEEE_BWD, configs._IEEE_DECODE = tables


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)


def errors(fn, q, k, v, dout, ref):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return max((a.double() - b).abs().max().item() for a, b in zip((out, *grads), ref))


def dense(head_dim, causal, seqlen, record):
    batch, heads = 2, max(1, 1024 // head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out64 = sdpa(q64, k64, v64, causal)
    ref = (out64, *torch.autograd.grad(out64, (q64, k64, v64), dout.double()))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    providers = [("flashtile-ieee-new", NEW, False), ("flashtile-ieee-old", OLD, False),
                 ("flashtile-tf32", NEW, True), ("sdpa", NEW, False)]
    for name, tables, tf32 in providers:
        use(tables)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        fn = ((lambda a, b, c: sdpa(a, b, c, causal)) if name == "sdpa"
              else (lambda a, b, c: flashtile.flash_attn_func(a, b, c, causal=causal)))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        err = errors(fn, q, k, v, dout, ref)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        with torch.no_grad():
            fwd = do_bench(lambda: fn(q, k, v), return_mode="median")
        both = do_bench(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout), return_mode="median")
        row = dict(head_dim=head_dim, causal=causal, seqlen=seqlen, provider=name, first_call_s=round(first, 2),
                   fwd_ms=round(fwd, 3), fwd_bwd_ms=round(both, 3), fwd_tflops=round(flops / fwd * 1e-9, 2),
                   bwd_tflops=round(2.5 * flops / max(both - fwd, 1e-6) * 1e-9, 2), max_err=float(f"{err:.2e}"))
        record(row)
    torch.backends.cuda.matmul.allow_tf32 = False


def decode(head_dim, cache_len, record):
    batch, hq, hk = 8, 32, 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 1, hq, head_dim, device="cuda", generator=gen)
    kc, vc = (torch.randn(batch, cache_len, hk, head_dim, device="cuda", generator=gen) for _ in range(2))
    lens = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
    ref = flashtile.attention_ref(q.double(), kc.double(), vc.double())
    for name, tables in (("flashtile-ieee-new", NEW), ("flashtile-ieee-old", OLD)):
        use(tables)
        fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: E731
        t0 = time.perf_counter()
        err = (fn().double() - ref).abs().max().item()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        ms = do_bench(fn, return_mode="median")
        row = dict(mode="decode", head_dim=head_dim, cache_len=cache_len, provider=name,
                   first_call_s=round(first, 2), ms=round(ms, 4),
                   gb_per_s=round(2 * kc.numel() * 4 / ms * 1e-6, 1), max_err=float(f"{err:.2e}"))
        record(row)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="32,64,128,256")
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--decode-dims", default="128,256")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []

    def record(row):
        """Print the row and rewrite --out's JSON with it: a run stopped by a time limit keeps what it measured."""
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "fp32_tiles.json"), "w") as f:
                json.dump(rows, f, indent=1)

    for d in map(int, args.head_dims.split(",")):
        for c in (bool(int(x)) for x in args.causal.split(",")):
            dense(d, c, args.seqlen, record)
    for d in map(int, filter(None, args.decode_dims.split(","))):
        decode(d, 16384, record)
    use(NEW)
