"""Compile the Hopper Gluon backward (kernels/gluon_bwd.py) ahead of time for sm90 and report what it became.

    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python tests/gluon_bwd_compile_check.py [--variants all]
        [--head-dims 64,128] [--features all] [--dump DIR] [--loop-ops] [--seqlen 1000]
Per case (head dim x mask / feature x variant): registers / spills from ptxas -v, shared memory, PTX instruction
counts (wgmma, TMA, mbarriers, atomics, TMA reduce-adds and their bulk-group waits), ptxas warnings (C7515
"wgmma serialized" must not appear) and the spill loads / stores (LDL / STL) inside the per-tile loops' SASS
(loops with HGMMA and MUFU.EX2). Feature cases
(--features; window, softcap, ALiBi, combos) compile the default variant only. Exits 1 if a case fails to
compile, spills inside a per-tile loop or serializes its wgmmas (spills in the per-head prologue / epilogue
are reported, as the plain kernel has them). --seqlen (query and key rows; 2 query heads per KV head): the default
1000 compiles the short-program kernel (STORE_VIA_SMEM, configs.GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS), 4096 the other
at D64 / D128 (D256 takes STORE_VIA_SMEM at every length: GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256).
"""
import argparse
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

from compile_check import kernel_signature  # this folder: the JIT-faithful signature
from gluon_compile_check import PTX_PATTERNS, backward_branches, dump, ptxas_report, sass_instructions, sparse_mods
from flashtile import gluon_bwd_launch

PATTERNS = {**PTX_PATTERNS, "atom.add": r"(?:atom|red)\.global[\w.]*\.add",
            "tma.reduce": r"cp\.reduce\.async\.bulk", "bulk.wait": r"cp\.async\.bulk\.wait_group"}

# Score features (dkdv_launch_args keywords) with the causal flag they compile with; "alibi" is a placeholder
# for a (B, Hq) slopes tensor. Window cases replace the causal mask (causal + left window is IS_LOCAL).
FEATURES = {
    "window": (False, dict(window_size=(256, 0))),
    "window2": (False, dict(window_size=(100, 50))),
    "causal-left": (True, dict(window_size=(256, -1))),
    "softcap": (False, dict(softcap=30.0)),
    "softcap-causal": (True, dict(softcap=30.0)),
    "alibi": (False, dict(alibi_slopes="alibi")),
    "alibi-causal": (True, dict(alibi_slopes="alibi")),
    "window-softcap": (True, dict(window_size=(256, -1), softcap=30.0)),
    "window-alibi": (True, dict(window_size=(256, -1), alibi_slopes="alibi")),
    "softcap-alibi": (False, dict(softcap=30.0, alibi_slopes="alibi")),
    "combo": (True, dict(window_size=(256, -1), softcap=30.0, alibi_slopes="alibi")),
    # "bias": a placeholder for a (1, Hq, Sq, Sk) bf16 bias ("bias32": fp32); cases bias_shared_ok refuses (D256,
    # fp32 at D128) are skipped: the support check keeps them on the portable backward
    "bias": (False, dict(attn_bias="bias")),
    "bias-causal": (True, dict(attn_bias="bias")),
    "bias32": (False, dict(attn_bias="bias32")),
    "bias-softcap": (False, dict(softcap=30.0, attn_bias="bias")),
    "bias-alibi-window": (True, dict(window_size=(256, -1), alibi_slopes="alibi", attn_bias="bias")),
    "bias-window": (False, dict(window_size=(100, 50), attn_bias="bias")),
    "bias-combo": (True, dict(window_size=(256, -1), softcap=30.0, alibi_slopes="alibi", attn_bias="bias")),
    # Dropout (D64 / D128: DROPOUT_HEAD_DIMS), alone and with the score features
    "dropout": (False, dict(dropout_p=0.1, rng="rng")),
    "dropout-causal": (True, dict(dropout_p=0.1, rng="rng")),
    "dropout-combo": (True, dict(window_size=(256, -1), softcap=30.0, alibi_slopes="alibi", dropout_p=0.1, rng="rng")),
    # Block-sparse flashtile.attention (gluon_compile_check.sparse_mods: 128 x 128 block masks, their transposed
    # lists; no causal flag, the mask is the mask_mod); dense only (sparse_ok).
    "sparse-window": (False, dict(sparse="window")),
    "sparse-causal": (False, dict(sparse="causal")),
    "sparse-document": (False, dict(sparse="document")),
    "sparse-aux": (False, dict(sparse="aux")),  # a custom mask_mod reading a per-batch aux table
    "sparse-256": (False, dict(sparse="window", sparse_block=(256, 256))),  # two key programs per listed block
    "sparse-64": (False, dict(sparse="causal", sparse_block=(64, 128))),  # one query tile per listed block
}


def sass_loop_spills(ops, inner):
    """[(instructions, LDL + STL)] of each per-tile loop of sass_tile_loops' (ops, inner)."""
    return [(b - a + 1, sum(o.startswith(("LDL", "STL")) for o, _ in ops[a:b + 1])) for a, b in inner]


# --loop-ops: the SASS opcodes (by prefix) counted in each per-tile loop: the dQ path (atomics vs shared stores and
# TMA reduce-adds), its waits and barriers, and the GEMMs for scale.
LOOP_OPS = ("REDG", "ATOMG", "STS", "UTMAREDG", "UTMACMDFLUSH", "DEPBAR", "FENCE", "BAR.SYNC", "SYNCS", "HGMMA",
            "LDL", "STL")


def sass_loop_ops(ops, inner):
    """[(instructions, {opcode: count})] of each per-tile loop of sass_tile_loops' (ops, inner), opcodes starting
    with one of LOOP_OPS."""
    loops = []
    for a, b in inner:
        counts = {}
        for o, _ in ops[a:b + 1]:
            if o.startswith(LOOP_OPS):
                counts[o] = counts.get(o, 0) + 1
        loops.append((b - a + 1, dict(sorted(counts.items()))))
    return loops


def sass_tile_loops(cubin):
    """(ops, [(first, last)]): cubin's SASS as (opcode, text) pairs and the index ranges of its per-tile loops (a
    backward branch over HGMMA and MUFU.EX2, innermost)."""
    labels, ops = sass_instructions(cubin)
    loops = []
    for a, b in backward_branches(labels, ops):
        body = [o for o, _ in ops[a:b + 1]]
        # Out-of-line mbarrier retry stubs after the EXIT branch back into a loop: their span has the EXIT.
        if "EXIT" in body:
            continue
        if any(o.startswith("HGMMA") for o in body) and any(o.startswith("MUFU.EX2") for o in body):
            loops.append((a, b))
    # The per-tile loops: the innermost of those (the per-head loops around them contain one).
    return ops, [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]


def compile_case(head_dim, causal, config, batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2,
                 varlen=False, **features):
    """The kernel dkdv_launch_args builds for this case, compiled for sm90; varlen: packed (total, H, D) tensors
    of batch sequences of the given lengths (the launcher's varlen arguments)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    if varlen:
        q = torch.empty(batch * seqlen_q, heads_q, head_dim, dtype=torch.bfloat16)
        k = torch.empty(batch * seqlen_k, heads_kv, head_dim, dtype=torch.bfloat16)
        cu_q = torch.arange(batch + 1, dtype=torch.int32) * seqlen_q
        cu_k = torch.arange(batch + 1, dtype=torch.int32) * seqlen_k
        rows = torch.empty(heads_q, 16 * batch + -(-batch * seqlen_q // 16) * 16 + 128)  # Geometry.row_buffer_shape
        dq_accum = torch.empty(batch * seqlen_q + config.block_m, heads_q, head_dim)
        features = dict(features, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=seqlen_q,
                        max_seqlen_k=seqlen_k)
    else:
        q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=torch.bfloat16)
        k = torch.empty(batch, seqlen_k, heads_kv, head_dim, dtype=torch.bfloat16)
        seqlen_q_pad = -(-seqlen_q // config.block_m) * config.block_m
        rows = torch.empty(batch, heads_q, seqlen_q_pad)
        dq_accum = torch.empty(batch, seqlen_q_pad, heads_q, head_dim)
    if features.get("alibi_slopes") is not None:
        features = dict(features, alibi_slopes=torch.empty(batch, heads_q))
    if features.get("attn_bias") is not None:
        dtype = torch.float32 if features["attn_bias"] == "bias32" else torch.bfloat16
        features = dict(features, attn_bias=torch.empty(1, heads_q, seqlen_q, seqlen_k, dtype=dtype))
    if features.get("rng") is not None:
        features = dict(features, rng=torch.empty(1, dtype=torch.int64))
    if features.get("sparse"):
        features = dict(features)
        block = features.pop("sparse_block", (128, 128))
        features["mods"] = sparse_mods(features.pop("sparse"), batch, seqlen_q, seqlen_k, block)
    kernel = gluon_bwd_launch._attn_bwd_dkdv_hopper
    _, args, constexprs, options = gluon_bwd_launch.dkdv_launch_args(q, k, k, q, rows, rows, k, k, dq_accum, 0.1,
                                                                     causal, config, **features)
    sig, consts, attrs = kernel_signature(kernel, args, constexprs)
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def report_case(name, compiled, dump_dir, loop_ops=False):
    """Print one case's line (and with loop_ops, each tile loop's opcode counts); True when it is bad (spills
    inside a per-tile loop, or serialized wgmmas)."""
    ptx = compiled.asm["ptx"]
    report = ptxas_report(ptx)
    regs = re.findall(r"Used (\d+) registers", report)
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", report)]
    warns = [line.strip() for line in report.splitlines()
             if "warning" in line.lower() or "performance loss" in line.lower()]
    counts = "  ".join(f"{key} {len(re.findall(pat, ptx))}" for key, pat in PATTERNS.items())
    sass = sass_tile_loops(compiled.asm["cubin"])  # one disassembly for both reports
    loops = sass_loop_spills(*sass)
    loop_spills = sum(n for _, n in loops)
    print(f"{name}: smem {compiled.metadata.shared} B  regs {','.join(regs)}  spill stores "
          f"{','.join(map(str, spills))} B  tile loops {len(loops)} (SASS {'/'.join(str(n) for n, _ in loops)}, "
          f"LDL+STL {loop_spills})  | {counts}")
    for line in warns:
        print(f"    ptxas: {line}")
    if loop_ops:
        for n, counts in sass_loop_ops(*sass):
            print(f"    loop {n}: " + "  ".join(f"{op} {c}" for op, c in counts.items()))
    if dump_dir:
        dump(dump_dir, name, compiled, report)
    return loop_spills > 0 or any("C7515" in w or "serializ" in w for w in warns)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="all", help=f"comma list of {sorted(gluon_bwd_launch.VARIANTS)} or all")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--features", default="all", help=f"comma list of {sorted(FEATURES)}, all or none")
    parser.add_argument("--dump", default="", help="write each case's ttgir / ptx / ptxas report here")
    parser.add_argument("--loop-ops", action="store_true", help="SASS opcode counts of each per-tile loop")
    parser.add_argument("--varlen", action="store_true", help="packed varlen launches instead of dense ones")
    parser.add_argument("--seqlen", type=int, default=1000, help="query and key rows of each case")
    args = parser.parse_args()
    print(f"triton {triton.__version__} from {Path(triton.__file__).parent}")
    variants = list(gluon_bwd_launch.VARIANTS) if args.variants == "all" else args.variants.split(",")
    features = (list(FEATURES) if args.features == "all" else [] if args.features == "none"
                else args.features.split(","))
    cases = []
    for variant in variants:
        for head_dim in map(int, args.head_dims.split(",")):
            config = gluon_bwd_launch.VARIANTS[variant].get(head_dim)
            if config is not None:
                cases += [(f"d{head_dim}-{'causal' if c else 'full'}-{variant}", head_dim, c, config, {})
                          for c in (False, True)]
    for feature in features:
        causal, kwargs = FEATURES[feature]
        for head_dim in map(int, args.head_dims.split(",")):
            config = gluon_bwd_launch.VARIANTS["default"][head_dim]
            if "attn_bias" in kwargs and (args.varlen or not gluon_bwd_launch.bias_shared_ok(
                    head_dim, config, torch.float32 if kwargs["attn_bias"] == "bias32" else torch.bfloat16)):
                print(f"d{head_dim}-{feature}-default: skipped (bias: dense only, where bias_shared_ok takes it)")
                continue
            if "dropout_p" in kwargs and head_dim not in gluon_bwd_launch.DROPOUT_HEAD_DIMS:
                print(f"d{head_dim}-{feature}-default: skipped (dropout: D64 / D128)")
                continue
            if "sparse" in kwargs and (args.varlen or head_dim not in gluon_bwd_launch.SPARSE_HEAD_DIMS):
                print(f"d{head_dim}-{feature}-default: skipped (block-sparse: dense only)")
                continue
            cases.append((f"d{head_dim}-{feature}-default", head_dim, causal, config, kwargs))
    bad = 0
    for name, head_dim, causal, config, kwargs in cases:
        if args.varlen:
            name, kwargs = name + "-varlen", dict(kwargs, varlen=True)
        try:
            compiled = compile_case(head_dim, causal, config, seqlen_q=args.seqlen, seqlen_k=args.seqlen, **kwargs)
        except Exception as exc:  # noqa: BLE001
            bad += 1
            print(f"{name}: FAILED to compile: {type(exc).__name__}: {str(exc)[:2000]}")
            continue
        bad += report_case(name, compiled, args.dump, args.loop_ops)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
