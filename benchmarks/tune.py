"""Sweep tile configurations for the forward and backward on the GPU, next to cuDNN in the same run.

Usage (on a CUDA machine, from the repo root):
    PYTHONPATH=src python benchmarks/tune.py --seqlen 4096 --out results.json
Shapes follow the papers: batch = 16384 / seqlen, heads = 2048 / head_dim, bf16.
Each candidate is checked against SDPA's output (backward: its gradients, relative error) when timed;
the fastest valid one per (head dim, causal, direction) is printed last. The chosen ones go into configs.py by hand,
with
the numbers in docs/perf-log.md.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashtile
from flashtile import configs
from flashtile.configs import BwdConfig, TileConfig

T = TileConfig
# Candidates are installed by replacing the module's lookup functions (launch.py calls them through the module).
FWD_CONFIG, BWD_CONFIG = configs.fwd_config, configs.bwd_config
FWD_CANDIDATES = {
    64: [T(128, 64, 4, 3), T(128, 128, 4, 3), T(128, 64, 4, 4), T(64, 64, 4, 3), T(128, 32, 4, 3)],
    128: [T(128, 64, 8, 3), T(128, 128, 8, 3), T(128, 64, 8, 4), T(64, 64, 4, 3), T(64, 128, 4, 3)],
    256: [T(128, 64, 8, 2), T(64, 64, 4, 2), T(128, 32, 8, 2), T(64, 32, 4, 3), T(64, 64, 8, 2)],
}
# The dK/dV kernel keeps k, v, dk, dv tiles of [BLOCK_N, D] resident; the dQ kernel q, do, dq of [BLOCK_M, D].
# Each is swept with the other held at its configs.py value, then the best pair is timed together.
DKDV_CANDIDATES = {
    # Spill-free by benchmarks/spills.py (2026-11-29): 64x128/8w/1st, 32x128/8w/2st and 32x64/4w/2st at D64;
    # 32x128/8w/2st (72 B in causal) and 32x32 at D128. The configs.py entries spill 64-1144 B.
    64: [T(64, 64, 4, 3), T(32, 128, 4, 3), T(64, 128, 8, 3), T(32, 64, 4, 4), T(64, 128, 8, 2), T(64, 128, 8, 1),
         T(32, 128, 8, 2), T(32, 64, 4, 2)],
    128: [T(64, 128, 8, 2), T(32, 128, 4, 3), T(64, 64, 4, 2), T(32, 64, 4, 3), T(64, 128, 8, 3), T(32, 128, 8, 2),
          T(64, 128, 8, 1), T(32, 32, 4, 2)],
    256: [T(32, 32, 4, 2), T(32, 64, 8, 2), T(64, 64, 8, 1), T(32, 64, 4, 2), T(16, 64, 4, 2), T(64, 32, 8, 2),
          T(32, 32, 8, 2)],  # 32x32/8w: the only spill-free one at D256
}
DQ_CANDIDATES = {
    64: [T(64, 64, 4, 3), T(128, 32, 4, 3), T(128, 64, 8, 3), T(64, 32, 4, 4)],
    128: [T(128, 64, 8, 2), T(128, 32, 4, 3), T(64, 64, 4, 2), T(64, 32, 4, 3)],
    256: [T(32, 32, 4, 2), T(64, 32, 8, 2), T(64, 64, 8, 1), T(64, 32, 4, 2), T(128, 32, 8, 2)],
}


def tflops(batch, heads, seqlen, head_dim, causal, ms, factor=1.0):
    flops = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0) * factor
    return flops / ms * 1e-9


def sdpa(backend, q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def time_fwd_bwd(fn, q, k, v, dout):
    fwd_ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    out = fn()
    bwd_ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                      warmup=25, rep=100, return_mode="median")
    return fwd_ms, bwd_ms


def time_bwd(cfg, out, q, k, v, dout, shape, part, ref_grads):
    """Time the whole backward with cfg installed for this head dim; a record for the summary."""
    configs.bwd_config = lambda *args, **kwargs: cfg
    batch, heads, seqlen, head_dim, causal = (shape[x] for x in ("batch", "heads", "seqlen", "head_dim", "causal"))
    rec = dict(shape, provider="flashtile", direction="bwd", part=part, config=repr(cfg))
    try:
        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                      warmup=25, rep=100, return_mode="median")
        rec.update(finite=all(bool(torch.isfinite(g).all()) for g in grads), bwd_ms=ms,
                   # relative to the gradient's scale: bf16 rounding differs between kernels
                   err=max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref_grads)),
                   bwd_tflops=tflops(batch, heads, seqlen, head_dim, causal, ms, 2.5))
    except Exception as exc:  # a config that does not fit is a result, not a crash
        rec.update(error=str(exc)[:200])
    return rec


def save(path, records):
    if path:
        with open(path, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, records=records), f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--directions", default="fwd,bwd", help="fwd, bwd or both (the other keeps configs.py's)")
    parser.add_argument("--fwd-candidates", default=None,
                        help="forward tiles to try at every head dim instead of FWD_CANDIDATES, as "
                             "BLOCK_MxBLOCK_NxWARPSxSTAGES,... e.g. 128x32x8x2,64x64x4x3")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.fwd_candidates:
        tiles = [T(*map(int, item.split("x"))) for item in args.fwd_candidates.split(",")]
        FWD_CANDIDATES.update({d: tiles for d in FWD_CANDIDATES})
    directions = args.directions.split(",")
    records = []
    for head_dim in [int(d) for d in args.head_dims.split(",")]:
        for causal in [bool(int(c)) for c in args.causal.split(",")]:
            seqlen = args.seqlen
            batch, heads = max(1, 16384 // seqlen), 2048 // head_dim
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                                   generator=gen).requires_grad_() for _ in range(3))
            dout = torch.randn_like(q)
            ref_out = sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal)
            ref, ref_grads = ref_out.detach(), torch.autograd.grad(ref_out, (q, k, v), dout)
            shape = dict(head_dim=head_dim, causal=causal, seqlen=seqlen, batch=batch, heads=heads)
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    f, b = time_fwd_bwd(lambda: sdpa(backend, q, k, v, causal), q, k, v, dout)
                    records.append(dict(shape, provider=name, config=None, fwd_ms=f, bwd_ms=b,
                                        fwd_tflops=tflops(batch, heads, seqlen, head_dim, causal, f),
                                        bwd_tflops=tflops(batch, heads, seqlen, head_dim, causal, b, 2.5)))
                except Exception as exc:  # an anchor missing on this machine is reported, not fatal
                    print(f"{name}: {exc}", file=sys.stderr)
            pad = max(16, head_dim)
            run = lambda: flashtile.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
            arch = torch.cuda.get_device_capability()
            for cfg in FWD_CANDIDATES.get(head_dim, []) if "fwd" in directions else []:
                configs.fwd_config = lambda *args, _cfg=cfg, **kwargs: _cfg
                try:
                    err = (run() - ref).abs().max().item()
                    ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                    records.append(dict(shape, provider="flashtile", direction="fwd", config=repr(cfg), err=err,
                                        fwd_ms=ms, fwd_tflops=tflops(batch, heads, seqlen, head_dim, causal, ms)))
                except Exception as exc:
                    records.append(dict(shape, provider="flashtile", direction="fwd", config=repr(cfg),
                                        error=str(exc)[:200]))
                print(records[-1], flush=True)
                save(args.out, records)
            configs.fwd_config = FWD_CONFIG
            out = run()
            bwd_default = BWD_CONFIG(arch, pad, causal, torch.bfloat16)
            best = {}
            for part, candidates in (("dkdv", DKDV_CANDIDATES), ("dq", DQ_CANDIDATES)) if "bwd" in directions else ():
                for tiles in candidates.get(head_dim, []):
                    others = dict(dkdv=best.get("dkdv", bwd_default.dkdv), dq=bwd_default.dq)
                    cfg = BwdConfig(**dict(others, **{part: tiles}))
                    rec = time_bwd(cfg, out, q, k, v, dout, shape, part, ref_grads)
                    records.append(rec)
                    print(rec, flush=True)
                    save(args.out, records)  # after every record: a sweep cut off by a time limit keeps what ran
                    if rec.get("finite") and rec["err"] < 0.05 and rec["bwd_tflops"] > best.get(part + "_tflops", 0):
                        best[part], best[part + "_tflops"] = tiles, rec["bwd_tflops"]
            configs.bwd_config = BWD_CONFIG
    print("\nhead_dim causal  cudnn fwd/bwd   flash fwd/bwd   best flashtile fwd (config)   best bwd (config)")
    keys = sorted({(r["head_dim"], r["causal"]) for r in records})
    for hd, c in keys:
        rs = [r for r in records if r["head_dim"] == hd and r["causal"] == c]
        anchor = {r["provider"]: r for r in rs if r["provider"] != "flashtile"}
        fwd = max((r for r in rs if r.get("direction") == "fwd" and "fwd_tflops" in r and r["err"] < 0.05),
                  key=lambda r: r["fwd_tflops"], default=None)
        bwd = max((r for r in rs if r.get("direction") == "bwd" and "bwd_tflops" in r and r["finite"]
                   and r["err"] < 0.05),
                  key=lambda r: r["bwd_tflops"], default=None)
        cud, fl = anchor.get("cudnn", {}), anchor.get("sdpa-flash", {})
        print(f"{hd:8d} {c!s:6} {cud.get('fwd_tflops', 0):6.0f}/{cud.get('bwd_tflops', 0):<6.0f} "
              f"{fl.get('fwd_tflops', 0):6.0f}/{fl.get('bwd_tflops', 0):<6.0f} "
              f"{fwd and fwd['fwd_tflops'] or 0:6.0f} {fwd and fwd['config']}  "
              f"{bwd and bwd['bwd_tflops'] or 0:6.0f} {bwd and bwd['config']}")


if __name__ == "__main__":
    main()
