"""What the split-KV decode kernel compiles to, ahead of time (no GPU): registers, spills, shared memory, and
what the key loop's loads become, for the decode bench's shape (Hq 32 / Hk 4, D 128, bf16, 1 query token,
causal) with a contiguous or paged cache laid out as flashtile.bench.decode lays it out.
    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python benchmarks/decode_asm.py --page-sizes 0,16,256
    (--dump DIR writes each kernel's TTGIR, PTX and SASS there.)
Counts: in the TTGIR, async copies (cp.async, with the shared-memory buffer shapes: a leading dimension =
the pipeline's stages) and synchronous tt.load ops; in the PTX, cp.async by byte width and ld.global by width.
"""
import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from compile_check import _signature  # noqa: E402  (the launch-faithful signature with divisibility hints)

from flashtile import kvcache_launch, launch  # noqa: E402
from flashtile.bench.decode import GQA, HEAD_DIM, HEADS_Q  # noqa: E402


def decode_launch(batch, cache_len, page_size, leftpad=False):
    """The split-KV launch flash_attn_with_kvcache makes on an H200 for the bench's shape (meta tensors)."""
    heads_kv = HEADS_Q // GQA
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(batch, 1, HEADS_Q, HEAD_DIM, **meta)
    capacity = -(-cache_len // max(page_size, 1)) * max(page_size, 1)
    k = torch.empty(batch, capacity, heads_kv, HEAD_DIM, **meta)
    table = None
    if page_size:
        k = k.view(batch * capacity // page_size, page_size, heads_kv, HEAD_DIM)
        table = torch.empty(batch, capacity // page_size, device="meta", dtype=torch.int32)
    geo = launch.Geometry.of(q, k)
    geo = dataclasses.replace(geo, batch=batch, seqlen_k=capacity,
                              seqused_k=torch.empty(batch, device="meta", dtype=torch.int32), block_table=table,
                              key_start=torch.empty(batch, device="meta", dtype=torch.int32) if leftpad else None)
    lse = torch.empty(batch, HEADS_Q, 1, device="meta")
    sa = launch.ScoreArgs.make(geo, HEAD_DIM ** -0.5, -1, 0, 0.0, None, lse)
    cfg, splits, precision = kvcache_launch.splitkv_plan(geo, cache_len, 0, (9, 0), torch.bfloat16, torch.device("cpu"),
                                                         False)
    return kvcache_launch.splitkv_launches(geo, q, k, k, q, lse, sa, cfg, splits, precision)[0], splits


def ptxas(ptx):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    cubin = f.name + ".cubin"
    run = subprocess.run([str(bin_dir / "ptxas"), "-v", "--gpu-name=sm_90a", f.name, "-o", cubin],
                         capture_output=True, text=True)
    err = run.stderr
    os.unlink(f.name)
    if run.returncode:
        raise RuntimeError(f"ptxas failed: {err[-500:]}")
    sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    os.unlink(cubin)
    regs = re.search(r"Used (\d+) registers", err)
    spills = re.search(r"(\d+) bytes spill stores", err)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else -1, sass


def sass_loops(sass):
    """[(instructions, LDGSTS, LDG, DEPBAR waits)] of each loop in the SASS (a backward branch's range)."""
    code = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for addr, text in code:
        jump = re.search(r"BRA (?:`\()?0x([0-9a-f]+)", text)
        if jump and int(jump.group(1), 16) < addr:
            body = [t for a, t in code if int(jump.group(1), 16) <= a <= addr]
            loops.append((len(body), sum("LDGSTS" in t for t in body),
                          sum(bool(re.search(r"\bLDG\b|\bLDG\.", t)) and "LDGSTS" not in t for t in body),
                          sum("DEPBAR.LE" in t for t in body)))
    return loops


def facts(batch, cache_len, page_size, leftpad, dump):
    kl, splits = decode_launch(batch, cache_len, page_size, leftpad)
    sig, constexprs, attrs = _signature(kl)
    compiled = triton.compile(ASTSource(fn=kl.kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=kl.num_warps, num_stages=kl.num_stages))
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    regs, spills, sass = ptxas(ptx)
    name = f"B{batch}-L{cache_len}-page{page_size}" + ("-leftpad" if leftpad else "")
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext, text in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
            Path(dump, f"{name}.{ext}").write_text(text)
    async_bufs = Counter(re.findall(r"!ttg\.memdesc<(\d+x\d+x\d+)x(?:bf16|f16|f32)", ttgir))
    cp_async = Counter(int(n, 16) for n in re.findall(r"cp\.async\.c[ag]\.shared\.global(?:\.L2::\w+)? \[[^\]]+\], "
                                                      r"\[[^\]]+\], 0x([0-9a-f]+)", ptx))
    ld_global = Counter(re.findall(r"ld\.global(?:\.\w+)*?\.(v\d\.b\d+|b\d+|u\d+|s\d+)", ptx))
    ldgsts, ldg = len(re.findall(r"LDGSTS", sass)), len(re.findall(r" LDG(?:\.|\s)", sass))
    int_div = len(re.findall(r"IMAD\.HI", sass))
    c = kl.constexprs
    lines = [f"{name}: BLOCK_M {c['BLOCK_M']} BLOCK_N {c['BLOCK_N']} warps {kl.num_warps} stages {kl.num_stages} "
             f"splits {splits} PAGED {c['PAGED']}" + "".join(f" {k} {v}" for k, v in c.items() if k.startswith("PAGE_"))
             + f"\n  regs {regs}  spill {spills} B  smem {compiled.metadata.shared} B",
             f"  TTGIR: {ttgir.count('ttg.async_copy_global_to_local')} async copies, "
             f"{len(re.findall(r'= tt.load ', ttgir))} tt.load, {ttgir.count('ttg.async_wait')} async_wait, "
             f"multi-buffered smem {dict(async_bufs) or '-'}",
             f"  PTX: cp.async by bytes {dict(cp_async) or '-'}, ld.global {dict(ld_global) or '-'}, "
             f"{len(ptx.splitlines())} lines; SASS: {ldgsts} LDGSTS, {ldg} LDG, {int_div} IMAD.HI (integer division)",
             "  SASS loops (instructions, LDGSTS, LDG, DEPBAR waits): " + ", ".join(map(str, sass_loops(sass)))]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-sizes", default="0,16,256")
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--cache-len", type=int, default=16384)
    parser.add_argument("--leftpad", action="store_true")
    parser.add_argument("--dump", default=None)
    args = parser.parse_args()
    jobs = [(int(b), args.cache_len, int(p), args.leftpad, args.dump) for b in args.batches.split(",")
            for p in args.page_sizes.split(",")]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for text in pool.map(facts, *zip(*jobs)):
            print(text, flush=True)


if __name__ == "__main__":
    main()
