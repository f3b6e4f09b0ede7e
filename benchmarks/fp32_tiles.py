"""fp32 with TF32 off (PyTorch's default) on the GPU: the dots' precision and the tiles that suit it.

    PYTHONPATH=src python3 benchmarks/fp32_tiles.py [--head-dims 32,64,128,256] [--seqlen 2048] [--causal 0,1]
        [--decode-dims 128,256] [--candidates] [--jobs 8] [--out DIR]

Providers, per head dim and causal mode, all in one process:
  configured   what flashtile runs: tf32x3 dots (three TF32 tensor-core products per fp32 product) on
               configs._TF32X3_* tiles, NVIDIA sm80+;
  ieee         FMA dots on configs._IEEE_* tiles (what GPUs without TF32 and ROCm run);
  tf32         allow_tf32=True: TF32 dots on the generic fp32 tables, for scale;
  sdpa         SDPA's fp32 default (on the H200 its efficient kernel, CUTLASS's 3xTF32), for scale;
  --candidates also tf32x3 on each tile set of CANDIDATES (the generic fp32 tables among them).
Per row: the first call's seconds (mostly compiles), forward and forward + backward ms (median of do_bench), TFLOP/s,
and the largest error of out, dq, dk, dv against a float64 SDPA on the same inputs (B2, H 1024 / D). Decode: one
query token over a 16K cache, 32 query / 4 KV heads, batch 8 (the split-KV kernel), as configured, ieee and the
candidates' block_n. --jobs N first compiles every provider's kernels in N child processes (the Triton cache is
shared), so the timed process finds them compiled. Offline register / spill counts: `benchmarks/spills.py --dtype
fp32 --precision tf32x3 --configured`.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flashtile
from flashtile import configs, launch

T, B = configs.TileConfig, configs.BwdConfig
# tf32x3 tile sets timed with --candidates: (label, forward tiles, backward tiles); None keeps the configured one.
# The spill-free or nearly spill-free tiles of the offline sweep (session 22) and the generic fp32 tables.
CANDIDATES = {
    32: [("generic", configs._GENERIC_FP32_FWD[32], configs._GENERIC_BWD[32]),
         ("f64x64w4", T(64, 64, 4, 2), None)],
    64: [("generic", configs._GENERIC_FP32_FWD[64], configs._GENERIC_BWD[64]),
         ("f64x64w4-b32x32w8", T(64, 64, 4, 2), B(T(32, 32, 8, 2), T(32, 64, 8, 2))),
         ("f128x32w8", T(128, 32, 8, 2), None)],
    128: [("generic", configs._GENERIC_FP32_FWD[128], configs._GENERIC_BWD[128]),
          ("f128x32w8-b32x32w8", T(128, 32, 8, 2), B(T(32, 32, 8, 2), T(32, 32, 8, 2))),
          ("f64x32w8-b16x16w4", T(64, 32, 8, 2), B(T(16, 16, 4, 2), T(16, 32, 4, 2)))],
    256: [("generic", configs._GENERIC_FP32_FWD[256], configs._GENERIC_BWD[256]),
          ("f16x32w8-b32x16w8", T(16, 32, 8, 1), B(T(32, 16, 8, 1), T(16, 32, 8, 1)))],
}
DECODE_CANDIDATES = {128: [32, 16], 256: [16]}  # block_n beside the configured one (4 warps, 2 stages)


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)


def errors(fn, q, k, v, dout, ref):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return max((a.double() - b).abs().max().item() for a, b in zip((out, *grads), ref))


class Setting:
    """A provider's precision and tf32x3 tiles for one head dim, applied while in a `with` block."""

    def __init__(self, head_dim, precision=None, fwd=None, bwd=None, decode_block_n=None, tf32=False):
        self.head_dim, self.precision, self.tf32 = head_dim, precision, tf32
        self.fwd, self.bwd, self.decode_block_n = fwd, bwd, decode_block_n

    def __enter__(self):
        d = self.head_dim
        self.saved = (launch._dot_precision, configs._TF32X3_FWD[d], configs._TF32X3_BWD[d],
                      configs._TF32X3_DECODE[d])
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        if self.precision:
            launch._dot_precision = lambda dtype, arch: self.precision if dtype == torch.float32 else "tf32"
        configs._TF32X3_FWD[d] = self.fwd or configs._TF32X3_FWD[d]
        configs._TF32X3_BWD[d] = self.bwd or configs._TF32X3_BWD[d]
        if self.decode_block_n:
            configs._TF32X3_DECODE[d] = (self.decode_block_n, 4, 2)

    def __exit__(self, *exc):
        d = self.head_dim
        launch._dot_precision, configs._TF32X3_FWD[d], configs._TF32X3_BWD[d], configs._TF32X3_DECODE[d] = self.saved
        torch.backends.cuda.matmul.allow_tf32 = False


def providers(head_dim, with_candidates):
    rows = [("configured", Setting(head_dim)), ("ieee", Setting(head_dim, "ieee")),
            ("tf32", Setting(head_dim, tf32=True)), ("sdpa", None)]
    if with_candidates:
        rows += [(f"tf32x3-{label}", Setting(head_dim, "tf32x3", fwd, bwd))
                 for label, fwd, bwd in CANDIDATES.get(head_dim, [])]
    return rows


def dense(head_dim, causal, seqlen, record, with_candidates, compile_only=False):
    batch, heads = 2, max(1, 1024 // head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out64 = sdpa(q64, k64, v64, causal)
    ref = (out64, *torch.autograd.grad(out64, (q64, k64, v64), dout.double()))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    for name, setting in providers(head_dim, with_candidates):
        if setting is None:
            fn = lambda a, b, c: sdpa(a, b, c, causal)  # noqa: E731
        else:
            fn = lambda a, b, c: flashtile.flash_attn_func(a, b, c, causal=causal)  # noqa: E731
        with setting or Setting(head_dim):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                err = errors(fn, q, k, v, dout, ref)
            except Exception as exc:  # a candidate that does not fit this GPU: report it, go on
                error = f"{type(exc).__name__}: {exc}"[:300]
                record(dict(head_dim=head_dim, causal=causal, provider=name, error=error))
                continue
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            if compile_only:
                continue
            with torch.no_grad():
                fwd = do_bench(lambda: fn(q, k, v), return_mode="median")
            both = do_bench(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout), return_mode="median")
        record(dict(head_dim=head_dim, causal=causal, seqlen=seqlen, provider=name, first_call_s=round(first, 2),
                    fwd_ms=round(fwd, 3), fwd_bwd_ms=round(both, 3), fwd_tflops=round(flops / fwd * 1e-9, 2),
                    bwd_tflops=round(2.5 * flops / max(both - fwd, 1e-6) * 1e-9, 2), max_err=float(f"{err:.2e}")))


def decode(head_dim, cache_len, record, with_candidates, compile_only=False):
    batch, hq, hk = 8, 32, 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 1, hq, head_dim, device="cuda", generator=gen)
    kc, vc = (torch.randn(batch, cache_len, hk, head_dim, device="cuda", generator=gen) for _ in range(2))
    lens = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
    ref = flashtile.attention_ref(q.double(), kc.double(), vc.double())
    settings = [("configured", Setting(head_dim)), ("ieee", Setting(head_dim, "ieee"))]
    if with_candidates:
        settings += [(f"tf32x3-n{n}", Setting(head_dim, "tf32x3", decode_block_n=n))
                     for n in DECODE_CANDIDATES.get(head_dim, [])]
    for name, setting in settings:
        with setting:
            fn = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: E731
            t0 = time.perf_counter()
            err = (fn().double() - ref).abs().max().item()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            if compile_only:
                continue
            ms = do_bench(fn, return_mode="median")
        record(dict(mode="decode", head_dim=head_dim, cache_len=cache_len, provider=name,
                    first_call_s=round(first, 2), ms=round(ms, 4),
                    gb_per_s=round(2 * kc.numel() * 4 / ms * 1e-6, 1), max_err=float(f"{err:.2e}")))


def precompile(args):
    """Each (head dim, causal) and decode head dim's first calls in a child process, args.jobs at a time."""
    base = [sys.executable, __file__, "--compile-only", "--seqlen", str(args.seqlen)] + (
        ["--candidates"] if args.candidates else [])
    jobs = [base + ["--head-dims", d, "--causal", c, "--decode-dims", ""]
            for d in args.head_dims.split(",") for c in args.causal.split(",")]
    jobs += [base + ["--head-dims", "", "--decode-dims", d] for d in filter(None, args.decode_dims.split(","))]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        codes = list(pool.map(lambda cmd: subprocess.run(cmd).returncode, jobs))
    print(json.dumps(dict(precompile_s=round(time.perf_counter() - t0, 1), failed=sum(c != 0 for c in codes))),
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="32,64,128,256")
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--decode-dims", default="128,256")
    parser.add_argument("--candidates", action="store_true", help="also the tf32x3 tile sets of CANDIDATES")
    parser.add_argument("--jobs", type=int, default=0, help="compile first in this many child processes")
    parser.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.jobs:
        precompile(args)
    rows = []

    def record(row):
        """Print the row and rewrite --out's JSON with it: a run stopped by a time limit keeps what it measured."""
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "fp32_tiles.json"), "w") as f:
                json.dump(rows, f, indent=1)

    for d in map(int, filter(None, args.head_dims.split(","))):
        for c in (bool(int(x)) for x in args.causal.split(",")):
            dense(d, c, args.seqlen, record, args.candidates, args.compile_only)
    for d in map(int, filter(None, args.decode_dims.split(","))):
        decode(d, 16384, record, args.candidates, args.compile_only)


if __name__ == "__main__":
    main()
