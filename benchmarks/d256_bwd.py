"""D256 backward: configs.py's default against the dK/dV variants (configs.D256_BWD_VARIANTS), SDPA flash and cuDNN.

Usage (on the H200, from the repo root; under 2 minutes, most of it compiling):
    PYTHONPATH=src python3 benchmarks/d256_bwd.py [--out results.json] [--seqlens 4096,16384] [--causal 0,1] [--all]
bf16, D 256, H 8, 16K tokens per shape (B = 16384 / S). Times torch.autograd.grad on a saved forward (do_bench
median, L2 flushed), so the number is the whole backward (preprocess, dK/dV (one or two launches), dQ) plus
autograd. Each case is checked against a float64 reference of the same inputs (err: max over dq, dk, dv of
max |g - ref| / max |ref|; SDPA flash's own err is printed as the bf16 yardstick); a case whose err exceeds
2x FA2's plus 1e-3 is marked "FAIL". --all adds the "pointers" variant and session 5's one-kernel tile
candidates (left out of the default run so that it stays under 2 minutes: each D256 dK/dV compile takes seconds).
TFLOP/s: backward FLOPs = 2.5 * 4 * B * H * S * S * D, halved when causal. One line per (shape, variant, config).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashtile
from flashtile import configs
from flashtile.configs import BwdConfig, TileConfig as T

BWD_CONFIG = configs.bwd_config
HEAD_DIM, HEADS, TOKENS = 256, 8, 16384
DEVICE, DTYPE = "cuda", torch.bfloat16  # module constants, so a CPU smoke run can swap them
DQ = T(128, 32, 8, 2)  # configs.py's dQ tiles at D256, held fixed: only the dK/dV kernels change here


def dvdk(dv, dk):
    return BwdConfig(dv, DQ, "desc", "dv-dk", dk)


# (name, BwdConfig, causal values it runs at). configs.py's choice always runs first (the "dv-dk" variant since
# session 7); then the other variants but "pointers" (configs.D256_BWD_VARIANTS) and one dv-dk tile alternative:
# dK with 16 query rows (0 B spill, 1 stage causal: benchmarks/results/spills-d256-dvdk).
CASES = [(f"variant {name}", cfg, (causal,)) for name, pair in configs.D256_BWD_VARIANTS.items() if name != "pointers"
         for causal, cfg in zip((False, True), pair)] + [
    ("dv-dk", dvdk(T(64, 128, 8, 2), T(16, 128, 8, 2)), (False,)),
    ("dv-dk", dvdk(T(64, 128, 8, 1), T(16, 128, 8, 1)), (True,)),
]
# --all: the "pointers" variant (measured in session 5: 208 / 188 TFLOP/s at S 4096) and session 5's one-kernel
# candidates. Causal 32x32/8w/2st: the one causal candidate that is spill-free and whose wgmmas ptxas does not
# serialize (benchmarks/results/spills-d256-desc).
OLD_CASES = [(f"variant {name}", cfg, (causal,)) for name, pair in configs.D256_BWD_VARIANTS.items()
             if name == "pointers" for causal, cfg in zip((False, True), pair)] + [
    ("default", BwdConfig(T(64, 64, 8, 2), DQ, "default"), (False, True)),
    ("desc", BwdConfig(T(32, 64, 8, 2), DQ, "desc"), (False, True)),
    ("desc", BwdConfig(T(16, 64, 8, 2), DQ, "desc"), (False, True)),
    ("desc", BwdConfig(T(32, 32, 8, 2), DQ, "desc"), (True,)),
]


def label(cfg):
    def one(t):
        return f"{t.BLOCK_M}x{t.BLOCK_N}/{t.num_warps}w/{t.num_stages}st"
    return one(cfg.dkdv) + (f"+{one(cfg.dk or cfg.dkdv)}" if cfg.dkdv_split else "")


def tflops(batch, seqlen, causal, ms):
    return 2.5 * 4 * batch * HEADS * seqlen * seqlen * HEAD_DIM * (0.5 if causal else 1.0) / ms * 1e-9


def sdpa(backend, q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def bench_grad(out, q, k, v, dout):
    return do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                    warmup=10, rep=50, return_mode="median")


def reference_grads(q, k, v, dout, causal):
    """float64 gradients, one batch element at a time (S 16384: the score matrix of one head group is 2 GiB)."""
    grads = [torch.empty_like(t, dtype=torch.float64) for t in (q, k, v)]
    for b in range(q.shape[0]):
        for h in range(HEADS):
            qh, kh, vh = (t[b:b + 1, :, h:h + 1].detach().double().requires_grad_() for t in (q, k, v))
            out = sdpa(SDPBackend.MATH, qh, kh, vh, causal)
            for g, r in zip(grads, torch.autograd.grad(out, (qh, kh, vh), dout[b:b + 1, :, h:h + 1].double())):
                g[b:b + 1, :, h:h + 1] = r
            del out
    return grads


def rel_err(grads, ref):
    return max(((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--all", action="store_true", help="also the session-5 one-kernel tile candidates")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = str(DTYPE).removeprefix("torch.")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  D{HEAD_DIM} {dtype} H{HEADS}", flush=True)
    print(f"{'S':>5} {'B':>3} {'causal':6} {'provider / variant':22} {'dK/dV config':36} {'ms':>7} {'TFLOP/s':>7} "
          f"{'err':>8}", flush=True)
    records, t0 = [], time.time()
    for seqlen in map(int, args.seqlens.split(",")):
        batch = max(1, TOKENS // seqlen)
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            q, k, v = (torch.randn(batch, seqlen, HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE,
                                   generator=gen).requires_grad_() for _ in range(3))
            dout = torch.randn_like(q)
            ref = reference_grads(q, k, v, dout, causal)
            head = f"{seqlen:5d} {batch:3d} {str(causal):6}"
            bound = [None]  # 2x FA2's error + 1e-3 (DESIGN.md's tolerance rule, FA2 as the low-precision yardstick)

            def report(name, config, ms=None, err=None, error=None):
                rec = dict(seqlen=seqlen, batch=batch, heads=HEADS, head_dim=HEAD_DIM, causal=causal, provider=name,
                           config=config, ms=ms, tflops=ms and tflops(batch, seqlen, causal, ms), err=err, error=error,
                           ok=None if err is None or bound[0] is None else err <= bound[0])
                records.append(rec)
                if error:
                    print(f"{head} {name:22} {config:36} failed: {error}", flush=True)
                else:
                    flag = " FAIL" if rec["ok"] is False else ""
                    print(f"{head} {name:22} {config:36} {ms:7.3f} {rec['tflops']:7.1f} "
                          f"{'' if err is None else f'{err:8.2e}'}{flag}", flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, records=records),
                                  f, indent=1)

            for name, backend in (("sdpa-flash (FA2)", SDPBackend.FLASH_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    out = sdpa(backend, q, k, v, causal)
                    err = rel_err(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), ref)
                    if bound[0] is None:
                        bound[0] = 2 * err + 1e-3
                    report(name, "-", bench_grad(out, q, k, v, dout), err)
                    del out
                except Exception as exc:  # an anchor missing on this machine is reported, not fatal
                    report(name, "-", error=f"{type(exc).__name__}: {str(exc)[:150]}")

            arch = torch.cuda.get_device_capability()
            cases = [("configs.py/" + (BWD_CONFIG(arch, HEAD_DIM, causal, DTYPE).dkdv_split or "one-kernel"),
                      BWD_CONFIG(arch, HEAD_DIM, causal, DTYPE))]
            cases += [(name, cfg) for name, cfg, when in CASES + (OLD_CASES if args.all else [])
                      if causal in when and cfg != cases[0][1]]  # configs.py's own variant is timed once
            try:
                out = flashtile.flash_attn_func(q, k, v, causal=causal)  # forward with configs.py's tiles
            except Exception as exc:
                report("flashtile fwd", "-", error=f"{type(exc).__name__}: {str(exc)[:150]}")
                continue
            for name, cfg in cases:
                configs.bwd_config = lambda *a, _cfg=cfg, **kw: _cfg
                try:
                    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    if not all(bool(torch.isfinite(g).all()) for g in grads):
                        raise RuntimeError("non-finite gradient")
                    err = rel_err(grads, ref)
                    del grads
                    report(name, label(cfg), bench_grad(out, q, k, v, dout), err)
                except Exception as exc:  # a config that does not fit or compile is a result, not a crash
                    report(name, label(cfg), error=f"{type(exc).__name__}: {str(exc)[:150]}")
                finally:
                    configs.bwd_config = BWD_CONFIG
            del out, q, k, v, dout, ref
            torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
