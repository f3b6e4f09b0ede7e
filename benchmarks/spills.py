"""Registers, spills and shared memory of kernel tile configurations, compiled ahead of time (no GPU needed).

The counting step of the method before a GPU measurement: a configuration whose kernel spills registers
to local memory is a poor candidate however its tiles look. Compiles for sm90 with the installed triton
(put the device's triton first on PYTHONPATH to match the GPU) and runs that triton's ptxas -v.
    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python benchmarks/spills.py --head-dims 128 --kernel dkdv
--kernel dv,dk compiles the two launches of the D256 "dv-dk" split (configs.BwdConfig.dkdv_split) apart.
--variant desc compiles the dK/dV kernel's descriptor variant (configs.BwdConfig.dkdv_variant). "wgmma serialized":
ptxas's C7515 warning, every wgmma of the kernel waits for the previous one (a performance cliff, not a spill).
Shapes: bf16 (--dtype), B=4, S=4096, H=16 (strides as in the benchmark; divisibility hints as at launch).
--configured: only the tiles configs.py picks for the shape. --dtype fp32: fp32 inputs, with --precision ieee (the
default: FMA loops, configs._IEEE_FWD / _IEEE_BWD with --configured), tf32x3 (three TF32 products per product, sm80+
with TF32 off) or tf32. --dropout P: compile with dropout on (P > 0).
--sass: also the instruction count of each loop body over 64 instructions, in kernel order (nvdisasm of the
cubin; per iteration and thread: the issue cost of one tile; the unmasked loop is the hot one, the masked ones
run on boundary tiles), with how many are integer ALU (IMAD/IADD3/LOP3/SHF/ISETP/SEL/PRMT/LEA) and
shared-memory (LDS/STS/BAR) instructions.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from compile_check import _signature  # noqa: E402  (the launch-faithful signature with divisibility hints)

from flashtile import bwd_launch, configs, launch  # noqa: E402

CANDIDATES = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel
    "dkdv": [(64, 128, 8, 2), (64, 128, 8, 1), (32, 128, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 2),
             (128, 64, 8, 2), (32, 64, 4, 2), (32, 32, 4, 2), (32, 32, 8, 2), (32, 64, 8, 2), (16, 64, 8, 2),
             (16, 32, 4, 2)],
    # The D256 "dv-dk" split (configs.BwdConfig.dkdv_split): the dV launch and the dK launch apart.
    "dv": [(64, 128, 8, 2), (64, 128, 8, 1), (32, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 2), (64, 64, 4, 2)],
    "dk": [(64, 128, 8, 2), (64, 128, 8, 1), (32, 128, 8, 2), (32, 128, 8, 1), (16, 128, 8, 2), (64, 64, 8, 2)],
    "dq": [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (64, 32, 4, 2),
           (32, 32, 4, 2)],
    "fwd": [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 2)],
}


def ptxas_usage(ptx):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    err = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", err)
    spills = re.search(r"(\d+) bytes spill stores", err)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else -1, "C7515" in err


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_OPS = ("IMAD", "IADD3", "LOP3", "SHF", "ISETP", "SEL", "PRMT", "LEA")
SMEM_OPS = ("LDS", "STS", "BAR")


def loop_bodies(cubin):
    """(instructions, integer ALU, shared memory) of each loop body (a backward branch) of over 64 instructions."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    text = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    labels, ops, bodies = {}, [], []
    for line in text.splitlines():
        label = re.match(r"^\.(L_x_\d+):", line.strip())
        if label:
            labels[label.group(1)] = len(ops)
            continue
        ins = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[A-Z0-9_.]*(.*)", line)
        if not ins:
            continue
        ops.append(ins.group(1))
        target = re.search(r"`\(\.(L_x_\d+)\)", ins.group(2))
        if ins.group(1) == "BRA" and target and labels.get(target.group(1), len(ops)) < len(ops) - 1:
            count = collections.Counter(ops[labels[target.group(1)]:])
            if len(ops) - labels[target.group(1)] > 64:
                bodies.append((len(ops) - labels[target.group(1)], sum(count[o] for o in INT_OPS),
                               sum(count[o] for o in SMEM_OPS)))
    return bodies


def measure(kernel, head_dim, causal, tiles, dropout_p=0.0, sass=False, variant="default", dtype=torch.bfloat16,
            precision="ieee"):
    launch._dot_precision = lambda dtype, arch: precision if dtype == torch.float32 else "tf32"  # fp32's dots
    split = "dv-dk" if kernel in ("dv", "dk") else ""
    if tiles is not None:
        m, n, warps, stages = tiles
        tile = configs.TileConfig(m, n, warps, stages)
        configs.fwd_config = lambda *a, **k: tile
        configs.bwd_config = lambda *a, **k: configs.BwdConfig(tile, tile, variant, split)
    q = torch.empty(4, 4096, 2048 // head_dim, head_dim, dtype=dtype)
    lse = torch.empty(4, 2048 // head_dim, 4096)
    geo = launch.Geometry.of(q, q)
    rng = torch.zeros(1, dtype=torch.int64) if dropout_p > 0 else None
    sa = launch.ScoreArgs.make(geo, 0.1, -1, 0 if causal else -1, 0.0, None, lse, None, dropout_p, rng)
    if kernel == "fwd":
        kl = launch.forward_launches(geo, q, q, q, q, lse, None, sa, (9, 0), interpreter=False)[0]
    else:
        launches = bwd_launch.backward_launches(geo, q, q, q, q, q, lse, lse, lse, q, q, q, None, 0.1, sa, (9, 0),
                                                interpreter=False)
        kl = launches[-1] if kernel == "dq" else launches[1]  # the dV launch where split: dkdv_split
        if kernel == "dk":
            kl = launches[2]
    tiles = (kl.constexprs["BLOCK_M"], kl.constexprs["BLOCK_N"], kl.num_warps, kl.num_stages)
    sig, constexprs, attrs = _signature(kl)
    try:
        compiled = triton.compile(ASTSource(fn=kl.kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=kl.num_warps, num_stages=kl.num_stages))
    except Exception as exc:
        return kernel, head_dim, causal, tiles, f"does not compile: {type(exc).__name__}"
    regs, spills, serialized = ptxas_usage(compiled.asm["ptx"])
    text = f"regs {regs:3d}  spill {spills:5d} B  smem {compiled.metadata.shared:6d} B"
    if serialized:
        text += "  wgmma serialized"
    if sass:
        text += "  loops " + " | ".join("{} ({} int, {} smem)".format(*b) for b in loop_bodies(compiled.asm["cubin"]))
    return kernel, head_dim, causal, tiles, text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--kernel", default="dkdv,dq,fwd")
    parser.add_argument("--causal", default="both", choices=["yes", "no", "both"])
    parser.add_argument("--configured", action="store_true", help="only the tiles configs.py picks")
    parser.add_argument("--tiles", help="candidates for every kernel in place of CANDIDATES: M,N,WARPS,STAGES;...")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P", help="compile with dropout_p = P")
    parser.add_argument("--sass", action="store_true", help="instruction count of the longest loop body")
    parser.add_argument("--variant", default="default", help="the dK/dV kernel's variant (configs.BwdConfig)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--precision", default="ieee", choices=["ieee", "tf32x3", "tf32"],
                        help="fp32's dots: ieee (FMA dots and configs._IEEE_* tiles, as GPUs without TF32 run them), "
                             "tf32x3 (sm80+ with TF32 off, PyTorch's default) or tf32 (TF32 on)")
    args = parser.parse_args()
    tiles = [tuple(map(int, t.split(","))) for t in args.tiles.split(";")] if args.tiles else None
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    jobs = [(kern, d, c, t, args.dropout, args.sass) for kern in args.kernel.split(",")
            for d in map(int, args.head_dims.split(",")) for c in causals
            for t in ([None] if args.configured else tiles or CANDIDATES[kern])]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for kernel, d, causal, tiles, text in pool.map(measure, *zip(*jobs), [args.variant] * len(jobs),
                                                       [DTYPES[args.dtype]] * len(jobs), [args.precision] * len(jobs)):
            print(f"{kernel:5} D{d:<4} {'causal' if causal else 'full  '} {str(tiles):18} {text}", flush=True)


if __name__ == "__main__":
    main()
