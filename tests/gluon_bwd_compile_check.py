"""Compile the Hopper Gluon backward (kernels/gluon_bwd.py) ahead of time for sm90 and report what it became.

    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python tests/gluon_bwd_compile_check.py [--variants all]
        [--head-dims 64,128] [--dump DIR]
Per case (head dim x causal x variant): registers / spills from ptxas -v, shared memory, PTX instruction counts
(wgmma, TMA, mbarriers, atomics) and ptxas warnings (C7515 "wgmma serialized" must not appear). Exits 1 if a
case fails to compile, spills or serializes its wgmmas.
"""
import argparse
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

from compile_check import kernel_signature  # this folder: the JIT-faithful signature
from gluon_compile_check import PTX_PATTERNS, dump, ptxas_report
from flashtile import gluon_bwd_launch

PATTERNS = {**PTX_PATTERNS, "atom.add": r"(?:atom|red)\.global[\w.]*\.add"}


def compile_case(head_dim, causal, config, batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2):
    from triton.experimental.gluon._runtime import GluonASTSource
    q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=torch.bfloat16)
    k = torch.empty(batch, seqlen_k, heads_kv, head_dim, dtype=torch.bfloat16)
    seqlen_q_pad = -(-seqlen_q // config.block_m) * config.block_m
    rows = torch.empty(batch, heads_q, seqlen_q_pad)
    dq_accum = torch.empty(batch, seqlen_q_pad, heads_q, head_dim)
    kernel = gluon_bwd_launch._attn_bwd_dkdv_hopper
    _, args, constexprs, options = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, dq_accum, 0.1,
                                                                     causal, config)
    sig, consts, attrs = kernel_signature(kernel, args, constexprs)
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="all", help=f"comma list of {sorted(gluon_bwd_launch.VARIANTS)} or all")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--dump", default="", help="write each case's ttgir / ptx / ptxas report here")
    args = parser.parse_args()
    print(f"triton {triton.__version__} from {Path(triton.__file__).parent}")
    variants = list(gluon_bwd_launch.VARIANTS) if args.variants == "all" else args.variants.split(",")
    bad = 0
    for variant in variants:
        for head_dim in map(int, args.head_dims.split(",")):
            config = gluon_bwd_launch.VARIANTS[variant].get(head_dim)
            if config is None:
                continue
            for causal in (False, True):
                name = f"d{head_dim}-{'causal' if causal else 'full'}-{variant}"
                try:
                    compiled = compile_case(head_dim, causal, config)
                except Exception as exc:  # noqa: BLE001
                    bad += 1
                    print(f"{name}: FAILED to compile: {type(exc).__name__}: {str(exc)[:2000]}")
                    continue
                ptx = compiled.asm["ptx"]
                report = ptxas_report(ptx)
                regs = re.findall(r"Used (\d+) registers", report)
                spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", report)]
                warns = [line.strip() for line in report.splitlines()
                         if "warning" in line.lower() or "performance loss" in line.lower()]
                counts = "  ".join(f"{key} {len(re.findall(pat, ptx))}" for key, pat in PATTERNS.items())
                print(f"{name}: smem {compiled.metadata.shared} B  regs {','.join(regs)}  spill stores "
                      f"{','.join(map(str, spills))} B  | {counts}")
                for line in warns:
                    print(f"    ptxas: {line}")
                bad += any(spills) or any("C7515" in w or "serializ" in w for w in warns)
                if args.dump:
                    dump(args.dump, name, compiled, report)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
