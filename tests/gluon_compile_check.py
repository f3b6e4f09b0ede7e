"""Compile the Hopper Gluon forward ahead of time for sm90 (no GPU needed) and report what it became.

Run with the device's triton first on the path (TRITON_INTERPRET unset):
    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python tests/gluon_compile_check.py [--variant default]
        [--head-dims 64,128,256] [--features plain,softcap,alibi,sink,window,combo,bias,bias-alibi,bias-combo,
        sparse-window,sparse-causal,sparse-document,sparse-dilated,... | all]
        [--layouts dense,tail,varlen | all] [--dump DIR] [--sass]
Per case: registers / spills from ptxas -v, shared memory, and counts of the PTX instructions the schedule
relies on (wgmma, TMA loads, mbarrier waits/arrives, setmaxnreg) and of the softmax's special-function (ex2,
tanh) and FMA-pipe ones. --sass: the key loops' SASS (nvdisasm), per loop: instructions, MUFU and FMA-pipe ops,
and those per score of a consumer thread, and the longest dependent FMNMX chain (the row max's latency).
Exits 1 if a case fails to compile.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from compile_check import kernel_signature  # this folder: the JIT-faithful signature
from flashtile import gluon_launch, gluon_variants

PTX_PATTERNS = {
    "wgmma": r"wgmma\.mma_async",
    "wgmma.wait": r"wgmma\.wait_group",
    "tma.load": r"cp\.async\.bulk\.tensor",
    "mbar.wait": r"mbarrier\.try_wait",
    "mbar.arrive": r"mbarrier\.arrive",
    "setmaxnreg": r"setmaxnreg",
    "st.shared": r"st\.shared",
    "ld.shared": r"ld\.shared",
    "bar.sync": r"bar\.sync|barrier\.sync",
    "ex2": r"ex2\.approx",
    "tanh": r"tanh\.approx",
    "rcp": r"rcp\.approx",
    "fma.f32": r"\bfma\.rn(\.ftz)?\.f32",
}
# SASS opcodes by the pipe that runs them on sm90 (MUFU 16 results / clock / SM; the FMA pipe 128; every
# instruction takes an issue slot: one warp instruction / clock / SM sub-partition).
SASS_FMA = ("FFMA", "FADD", "FMUL", "IMAD")
SASS_SHOW = ("MUFU.EX2", "MUFU.TANH", "MUFU.RCP", "FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "IMAD", "LEA", "SHF",
             "LOP3", "F2FP", "PRMT", "SHFL", "ISETP", "LDG", "LDL", "STL")


def sass_instructions(cubin):
    """The cubin's SASS from nvdisasm: ({label: index of the next instruction}, [(opcode, instruction text)]),
    predicates stripped, opcodes with their modifiers (HGMMA.64x128x16..., MUFU.EX2)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    text = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    labels, ops = {}, []
    for line in text.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ops)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m:
            txt = re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip())
            ops.append((txt.split()[0], txt))
    return labels, ops


def backward_branches(labels, ops):
    """(first, last) instruction index of every loop: a BRA to a label at or before it."""
    loops = []
    for i, (op, txt) in enumerate(ops):
        target = re.search(r"(\.L_x_\d+)", txt) if op.split(".")[0] == "BRA" else None
        if target and labels.get(target.group(1), i + 1) <= i:
            loops.append((labels[target.group(1)], i))
    return loops


def sass_loops(cubin, scores_per_thread):
    """Per key loop of the cubin (a backward branch whose body has wgmmas, ex2 and 4-48 instructions per score,
    without the epilogue's rcp): its opcode counts, as 'loop N: instr X (Y / score) MUFU a FMA b ...' (LDL / STL:
    spill reloads / stores inside the loop), then one 'kernel: LDL a STL b' line for the whole cubin."""
    labels, ops = sass_instructions(cubin)
    local = {k: sum(op.split(".")[0] == k for op, _ in ops) for k in ("LDL", "STL")}
    # Opcodes without modifiers, but MUFU keeps its function (MUFU.EX2, MUFU.TANH, ...).
    ops = [(".".join(op.split(".")[:2]) if op.startswith("MUFU") else op.split(".")[0], txt) for op, txt in ops]
    loops = backward_branches(labels, ops)
    out = []
    for a, b in loops:
        body = [op for op, _ in ops[a:b + 1]]
        counts = {k: body.count(k) for k in set(body)}
        if not counts.get("HGMMA") or not 4 * scores_per_thread <= len(body) <= 48 * scores_per_thread:
            continue
        if counts.get("MUFU.RCP") or not counts.get("MUFU.EX2"):
            continue  # a branch back over the epilogue (its 1 / l) or one without the softmax: not a key loop
        # The longest dependent FMNMX chain (the row max: each link waits for the previous one's result).
        depth, chain = {}, 0
        for op, txt in ops[a:b + 1]:
            regs = re.findall(r"\bR\d+\b", txt)
            if op == "FMNMX" and len(regs) >= 3:
                depth[regs[0]] = 1 + max(depth.get(r, 0) for r in regs[1:3])
                chain = max(chain, depth[regs[0]])
            elif regs:
                depth[regs[0]] = 0
        mufu = sum(v for k, v in counts.items() if k.startswith("MUFU"))
        fma = sum(counts.get(k, 0) for k in SASS_FMA)
        per = scores_per_thread
        out.append(f"loop {len(out)}: instr {len(body)} ({len(body) / per:.2f} / score)  MUFU {mufu} "
                   f"({mufu / per:.2f})  FMA-pipe {fma} ({fma / per:.2f})  | "
                   + " ".join(f"{k} {counts[k]}" for k in SASS_SHOW if counts.get(k)) + f"  | FMNMX chain {chain}")
    out.append(f"kernel: LDL {local['LDL']} STL {local['STL']} (spill reloads / stores, anywhere)")
    return out


def ptxas_report(ptx):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    res = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True,
                         text=True)
    os.unlink(f.name)
    return res.stderr


def dump(folder, name, compiled, report):
    """A case's ttgir / llir / ptx and ptxas report, as NAME.EXT files in folder."""
    os.makedirs(folder, exist_ok=True)
    for ext in ("ttgir", "llir", "ptx"):
        Path(folder, f"{name}.{ext}").write_text(compiled.asm[ext])
    Path(folder, f"{name}.ptxas.txt").write_text(report)


# Score features to compile (gluon_launch_args keywords); window cases replace the causal mask.
FEATURES = {
    "plain": {},
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi_slopes=True),
    "sink": dict(sink=True),
    "window": dict(window_size=(256, 0)),
    "combo": dict(window_size=(256, 64), softcap=30.0, alibi_slopes=True, sink=True),
    # Softcap with a window / dropout and no ALiBi, sink or bias: FIXED_MAX's launches (gluon_launch.fixed_max_ok).
    "softcap-window": dict(window_size=(256, 64), softcap=30.0),
    "softcap-dropout": dict(softcap=30.0, dropout_p=0.1, rng=True),
    "alibi-window-sink": dict(window_size=(256, 64), alibi_slopes=True, sink=True),  # ALiBi without softcap / bias
    "alibi-dropout": dict(alibi_slopes=True, dropout_p=0.1, rng=True),
    # A bf16 (1, Hq, Sq, Sk) bias (rows padded to a 16-byte multiple where Sk is not), alone and with the rest.
    "bias": dict(attn_bias=True),
    "bias-alibi": dict(alibi_slopes=True, attn_bias=True),
    "bias-combo": dict(window_size=(256, 64), softcap=30.0, alibi_slopes=True, sink=True, attn_bias=True),
    "dropout": dict(dropout_p=0.1, rng=True),
    "dropout-combo": dict(window_size=(256, 64), softcap=30.0, alibi_slopes=True, sink=True, dropout_p=0.1, rng=True),
    # Block-sparse flashtile.attention (128 x 128 block masks; no causal flag: the mask is the mask_mod).
    "sparse-window": dict(sparse="window"),
    "sparse-causal": dict(sparse="causal"),
    "sparse-document": dict(sparse="document"),
    "sparse-dilated": dict(sparse="dilated"),
    "sparse-prefix": dict(sparse="prefix"),
    "sparse-blockdiag": dict(sparse="blockdiag"),
    "sparse-strided": dict(sparse="strided"),
    "sparse-aux": dict(sparse="aux"),  # a custom mask_mod reading a per-batch aux table (b * S + q_idx)
    "sparse-256": dict(sparse="window", sparse_block=(256, 256)),  # two key tiles per listed block
}


@triton.jit
def _bounded_mask(b, h, q_idx, kv_idx, limits):
    """A custom mask_mod reading an aux table: causal, at most limits[b * 4 + h % 4] keys back."""
    return (kv_idx <= q_idx) & (q_idx - kv_idx < tl.load(limits + b * 4 + h % 4))


def sparse_mods(kind, batch, seqlen_q, seqlen_k, block=(128, 128)):
    """launch.ModArgs of a block-sparse flashtile.attention call with one of the ready-made masks (or a custom
    mask_mod with an aux tensor), its block lists as create_block_mask builds them (on the CPU)."""
    import flashtile
    from flashtile.flex.api import _Spec
    ids = torch.arange(seqlen_k) * 5 // seqlen_k
    if kind == "aux":
        mask = flashtile.flex.mods.Mod(_bounded_mask, (torch.full((batch * 4,), 300, dtype=torch.int32),))
    else:
        mask = {"window": flashtile.sliding_window_mask(256), "causal": flashtile.causal_mask,
                "document": flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids)),
                "dilated": flashtile.dilated_mask(4), "prefix": flashtile.prefix_lm_mask(200),
                "blockdiag": flashtile.block_diagonal_mask(300), "strided": flashtile.strided_mask(7)}[kind]
    bm = flashtile.create_block_mask(mask, batch if kind == "aux" else None, None, seqlen_q, seqlen_k,
                                     block_size=block, device="cpu")
    return _Spec(None, None, mask, bm).mod_args()


# Batch layouts (--layouts): "dense" B 2 with Sk = 1024 (a multiple of every key block: the 2-D descriptors, the
# kernel as it was), "tail" B 2 with Sk = 1000 (ragged descriptors), "varlen" packed sequences at cu_seqlens.
LAYOUTS = ("dense", "tail", "varlen")


def compile_case(head_dim, causal, config, batch=2, seqlen_q=1000, seqlen_k=1024, heads_q=4, heads_kv=2,
                 features=None, layout="dense"):
    from triton.experimental.gluon._runtime import GluonASTSource
    if layout == "tail":
        seqlen_k = 1000
    elif layout == "dense" and config.tma_store:
        seqlen_q = 1024  # Sq % 64 == 0: O by TMA (the tail layout compiles the register stores)
    q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=torch.bfloat16)
    k = torch.empty(batch, seqlen_k, heads_kv, head_dim, dtype=torch.bfloat16)
    lse = torch.empty(batch, heads_q, seqlen_q)
    varlen = {}
    if layout == "varlen":
        q, k = q.flatten(0, 1), k.flatten(0, 1)
        lse = torch.empty(heads_q, q.shape[0])
        cu_q = torch.tensor([0, 600, batch * seqlen_q], dtype=torch.int32)
        cu_k = torch.tensor([0, 700, batch * seqlen_k], dtype=torch.int32)
        varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1400, max_seqlen_k=1348)
    out = torch.empty_like(q)
    kernel = gluon_launch._attn_fwd_hopper
    features = dict(features or {})
    if features.get("sparse"):
        block = features.pop("sparse_block", (128, 128))
        features["mods"] = sparse_mods(features.pop("sparse"), batch, seqlen_q, seqlen_k, block)
    if features.get("alibi_slopes"):
        features["alibi_slopes"] = torch.empty(heads_q)
    if features.get("sink"):
        features["sink"] = torch.empty(heads_q)
    if features.get("rng"):
        features["rng"] = torch.empty(1, dtype=torch.int64)
    if features.get("attn_bias"):
        bias_q, bias_k = (1400, 1348) if layout == "varlen" else (seqlen_q, seqlen_k)
        features["attn_bias"] = torch.empty(1, heads_q, bias_q, -(-bias_k // 8) * 8, dtype=torch.bfloat16)[..., :bias_k]
    persistent_ok = "mods" not in features and "dropout_p" not in features  # gluon_forward's rule
    if persistent_ok and gluon_launch.takes_persistent(config, q, k, causal, **features,
                                                       cu_seqlens_q=varlen.get("cu_seqlens_q")):
        # The persistent kernel (132 SMs: an H200's), as gluon_forward launches it.
        kernel = gluon_launch._attn_fwd_hopper_persistent
        _, args, constexprs, options = gluon_launch.persistent_launch_args(q, k, k, out, lse, 0.1, causal, config,
                                                                           sm_count=132)
        assert constexprs["RAGGED"] == (layout != "dense") and constexprs["O_TMA"] == (config.tma_store
                                                                                   and seqlen_q % 64 == 0)
    else:
        _, args, constexprs, options = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.1, causal, config,
                                                                      **features, **varlen)
        assert constexprs["RAGGED"] == (layout != "dense") and constexprs["VARLEN"] == (layout == "varlen")
    sig, consts, attrs = kernel_signature(kernel, args, constexprs)
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="default", choices=sorted(gluon_variants.VARIANTS))
    parser.add_argument("--head-dims", default="64,128,256", help="head dims the variant covers are compiled")
    parser.add_argument("--features", default="plain", help=f"comma list of {list(FEATURES)} or 'all'")
    parser.add_argument("--layouts", default="dense", help=f"comma list of {list(LAYOUTS)} or 'all'")
    parser.add_argument("--dump", default="", help="write each case's ttgir / ptx / ptxas report here")
    parser.add_argument("--sass", action="store_true", help="count the key loops' SASS opcodes (nvdisasm)")
    args = parser.parse_args()
    print(f"triton {triton.__version__} from {Path(triton.__file__).parent}")
    failed = 0
    features = list(FEATURES) if args.features == "all" else args.features.split(",")
    layouts = list(LAYOUTS) if args.layouts == "all" else args.layouts.split(",")
    for head_dim in map(int, args.head_dims.split(",")):
        if head_dim not in gluon_variants.VARIANTS[args.variant]:
            continue
        for layout, feature, causal in [(lay, f, c) for lay in layouts for f in features for c in (False, True)
                                        if not (c and ("window_size" in FEATURES[f] or "sparse" in FEATURES[f]))
                                        and not (lay == "varlen" and "sparse" in FEATURES[f])]:
            # The config the launch would run (gluon_variants.takes_config: a three-consumer variant gives a bias or
            # ALiBi the default's, ALiBi without softcap not where its alibi_mma takes it).
            config = gluon_variants.takes_config(args.variant, head_dim, FEATURES[feature].get("attn_bias"),
                                                 FEATURES[feature].get("alibi_slopes"),
                                                 FEATURES[feature].get("dropout_p", 0.0),
                                                 FEATURES[feature].get("softcap", 0.0))
            variant = args.variant if config is gluon_variants.VARIANTS[args.variant][head_dim] else "default"
            name = f"d{head_dim}-{'causal' if causal else 'full'}-{variant}"
            if feature != "plain":
                name = f"d{head_dim}-{feature}{'-causal' if causal else ''}-{variant}"
            if layout != "dense":
                name = f"{layout}-{name}"
            try:
                compiled = compile_case(head_dim, causal, config, features=FEATURES[feature], layout=layout)
            except Exception as exc:  # noqa: BLE001
                failed += 1
                print(f"{name}: FAILED to compile: {type(exc).__name__}: {exc}")
                continue
            ptx = compiled.asm["ptx"]
            report = ptxas_report(ptx)
            regs = re.findall(r"Used (\d+) registers", report)
            spills = re.findall(r"(\d+) bytes spill stores", report)
            warnings = [line for line in report.splitlines()
                        if "warning" in line.lower() or "performance loss" in line.lower()]
            counts = "  ".join(f"{key} {len(re.findall(pat, ptx))}" for key, pat in PTX_PATTERNS.items())
            print(f"{name}: smem {compiled.metadata.shared} B  regs {','.join(regs)}  spill stores "
                  f"{','.join(spills)} B  | {counts}")
            for line in warnings:
                print(f"    ptxas: {line.strip()}")
            if args.sass:
                # One consumer thread holds 64 x BLOCK_N / 128 scores of a key block.
                for line in sass_loops(compiled.asm["cubin"], 64 * config.block_n // 128):
                    print(f"    sass {line}")
            if args.dump:
                dump(args.dump, name, compiled, report)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
