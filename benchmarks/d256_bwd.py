"""D256 backward: configs.py's default against the dK/dV variants (configs.D256_BWD_VARIANTS), SDPA flash and cuDNN.

Usage (on the H200, from the repo root; about a minute, most of it compiling):
    PYTHONPATH=src python3 benchmarks/d256_bwd.py [--out results.json] [--seqlens 4096,1024] [--causal 0,1]
bf16, D 256, H 8; S 4096 with B 4 and S 1024 with B 16 (16K tokens). Times torch.autograd.grad on a saved
forward (do_bench median, L2 flushed), so the number is the whole backward (preprocess, dK/dV, dQ) plus autograd.
Each flashtile case is checked against SDPA flash's gradients (max |g - ref| / max |ref|, as tune.py).
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
HEAD_DIM, HEADS = 256, 8
DQ = T(128, 32, 8, 2)  # configs.py's dQ tiles at D256, held fixed: only the dK/dV kernel changes here
# (variant, dK/dV tiles). The default variant at 64x64/8w/2st is the pointer-load kernel at the descriptor
# variant's tiles: the difference between the two is the loads alone.
# Causal only: 32x32/8w/2st, the one causal candidate that is spill-free and whose wgmmas ptxas does not
# serialize (benchmarks/results/spills-d256-desc).
CASES = [
    ("default", T(64, 64, 8, 2), (False, True)),
    ("desc", T(64, 64, 8, 2), (False, True)),
    ("desc", T(32, 64, 8, 2), (False, True)),
    ("desc", T(16, 64, 8, 2), (False, True)),
    ("desc", T(32, 32, 8, 2), (True,)),
]


def tflops(batch, seqlen, causal, ms):
    return 2.5 * 4 * batch * HEADS * seqlen * seqlen * HEAD_DIM * (0.5 if causal else 1.0) / ms * 1e-9


def sdpa(backend, q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def bench_grad(out, q, k, v, dout):
    return do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                    warmup=10, rep=50, return_mode="median")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="4096,1024")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  D{HEAD_DIM} bf16 H{HEADS}", flush=True)
    print(f"{'S':>5} {'B':>3} {'causal':6} {'provider / variant':18} {'dK/dV config':24} {'ms':>7} {'TFLOP/s':>7} "
          f"{'err':>8}", flush=True)
    records, t0 = [], time.time()
    for seqlen in map(int, args.seqlens.split(",")):
        batch = 16384 // seqlen
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, seqlen, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                                   generator=gen).requires_grad_() for _ in range(3))
            dout = torch.randn_like(q)
            head = f"{seqlen:5d} {batch:3d} {str(causal):6}"

            def report(name, config, ms=None, err=None, error=None):
                rec = dict(seqlen=seqlen, batch=batch, heads=HEADS, head_dim=HEAD_DIM, causal=causal, provider=name,
                           config=config, ms=ms, tflops=ms and tflops(batch, seqlen, causal, ms), err=err, error=error)
                records.append(rec)
                if error:
                    print(f"{head} {name:18} {config:24} failed: {error}", flush=True)
                else:
                    print(f"{head} {name:18} {config:24} {ms:7.3f} {rec['tflops']:7.1f} "
                          f"{'' if err is None else f'{err:8.2e}'}", flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, records=records),
                                  f, indent=1)

            ref_grads = None
            for name, backend in (("sdpa-flash (FA2)", SDPBackend.FLASH_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    out = sdpa(backend, q, k, v, causal)
                    if ref_grads is None:
                        ref_grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    report(name, "-", bench_grad(out, q, k, v, dout))
                    del out
                except Exception as exc:  # an anchor missing on this machine is reported, not fatal
                    report(name, "-", error=f"{type(exc).__name__}: {str(exc)[:150]}")

            arch = torch.cuda.get_device_capability()
            default = BWD_CONFIG(arch, HEAD_DIM, causal, torch.bfloat16)
            cases = [("configs.py", default)] + [(variant, BwdConfig(t, DQ, variant)) for variant, t, when in CASES
                                                   if causal in when]
            try:
                out = flashtile.flash_attn_func(q, k, v, causal=causal)  # forward with configs.py's tiles
            except Exception as exc:
                report("flashtile fwd", "-", error=f"{type(exc).__name__}: {str(exc)[:150]}")
                continue
            for name, cfg in cases:
                d = cfg.dkdv
                label = f"{d.BLOCK_M}x{d.BLOCK_N}/{d.num_warps}w/{d.num_stages}st"
                configs.bwd_config = lambda *a, _cfg=cfg, **kw: _cfg
                try:
                    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    if not all(bool(torch.isfinite(g).all()) for g in grads):
                        raise RuntimeError("non-finite gradient")
                    err = (max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref_grads))
                           if ref_grads is not None else None)
                    report(f"configs.py/{cfg.dkdv_variant}" if name == "configs.py" else name, label,
                           bench_grad(out, q, k, v, dout), err)
                except Exception as exc:  # a config that does not fit or compile is a result, not a crash
                    report(name, label, error=f"{type(exc).__name__}: {str(exc)[:150]}")
                finally:
                    configs.bwd_config = BWD_CONFIG
            del out, q, k, v, dout
            torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
