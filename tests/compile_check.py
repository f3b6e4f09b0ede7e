"""Compile every kernel launch flashtile makes, ahead of time for GPUs that are not here.

Catches, on a machine without a GPU, what the interpreter cannot: code the Triton compiler rejects
and tile configurations whose shared memory exceeds the target's limit (which would otherwise fail
only at launch on the GPU). Run: python tests/compile_check.py  (TRITON_INTERPRET must be unset).
Prints one line per compiled kernel and exits 1 if any failed. FLASHTILE_COMPILE_ARCHS picks the targets (default
80,90); on the smaller-memory ones (86, 75: FALLBACK_TARGETS) a launch passes when fit.py's fallback makes it fit.
AMD targets (gfx942: MI300, gfx90a: MI200, gfx950: MI355, gfx1100: RDNA3; ROCM_TARGETS) compile the launches a ROCm
build of torch makes: no NVIDIA
capability (launch._arch is None there: the generic tables), precision._dot_precision's ROCm rule, no tanh.approx,
and tensors specialized as spanning at most 2 GB (ROCm triton's buffer loads), as most real launches are.
"""
import dataclasses
import inspect
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.tensor_descriptor import TensorDescriptor

from flashtile import bwd_launch, fit, kvcache_launch, launch

# Per-block shared memory limits (bytes) of the targets checked: H100/H200 and A100, then smaller NVIDIA parts, then
# AMD's GPUs (LDS per workgroup: 64 KB, 160 KB on gfx950).
TARGETS = {(9, 0): 232448, (8, 0): 166912, (8, 6): 101376, (7, 5): 65536, "gfx942": 65536, "gfx90a": 65536,
           "gfx950": 163840, "gfx1100": 65536}
ROCM_TARGETS = {"gfx942": 64, "gfx90a": 64, "gfx950": 64, "gfx1100": 32}  # target -> wave size
# GPUs with less shared memory than configs.py's tables are sized for (sm86 / sm89 / sm120, sm75, and AMD's): a launch
# may load there through fit.py's smaller variants (one pipeline stage, halved loop tiles). Not in the default targets
# (FLASHTILE_COMPILE_ARCHS=86,75 adds them; CI's time): benchmarks/results/small-smem-compile-2026-12-01-s22.
FALLBACK_TARGETS = {(8, 6), (7, 5), *ROCM_TARGETS}
# (target, kernel, head dim, dtype) that fit no fallback variant: at 16 x 16 tiles the sm75 fp32 D256 dK/dV kernel
# needs 66560 bytes (its K, V, Q and dO tiles alone are 64 KB); reported, not counted as failures.
KNOWN_UNFIT = {((7, 5), "_attn_bwd_dkdv", 256, torch.float32)}
TRITON_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
                torch.int64: "*i64"}


def _signature(kl, arch=None):
    """Signature, constexprs and the attributes a real launch of kl (a launch.KernelLaunch) specializes on."""
    return kernel_signature(kl.kernel, kl.args, kl.constexprs, rocm=arch in ROCM_TARGETS)


def target_name(arch):
    """A target as FLASHTILE_COMPILE_ARCHS spells it: "90" for (9, 0), AMD's gfx names as they are."""
    return arch if isinstance(arch, str) else f"{arch[0]}{arch[1]}"


def kernel_signature(kernel, args, constexprs, rocm=False):
    """Signature, constexprs and the attributes a launch of kernel(*args, **constexprs) specializes on: like
    Triton's JIT, pointers (torch allocations are 16-byte aligned) and ints divisible by 16 get
    tt.divisibility = 16, and an int equal to 1 becomes a constant (e.g. group_size for MHA: its loop
    disappears) unless the kernel lists it in do_not_specialize. Without them loads cannot be vectorized, the
    pipeliner skips them, and shared memory and registers would be misreported. rocm: tensors also get ROCm triton's
    tt.pointer_range = 32 (a tensor of at most 2 GB). Also serves the Gluon kernel (tests/gluon_compile_check.py)."""
    names = kernel.arg_names
    sig, consts, attrs = {}, {}, {}
    values = {p.name: p.default for p in inspect.signature(kernel.fn).parameters.values()
              if p.default is not p.empty}  # parameters a launch leaves at their defaults, as the JIT binds them
    values.update(zip(names, args), **constexprs)
    for i, name in enumerate(names):
        value = values[name]
        # The JIT makes a None argument a constexpr None; a constexpr left at its default is one too.
        if name in constexprs or value is None or kernel.params[i].is_constexpr:
            sig[name] = "constexpr"
            consts[(i,)] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = TRITON_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if rocm else [])
        elif isinstance(value, TensorDescriptor):  # as the JIT specializes a host-side descriptor
            block = ", ".join(map(str, value.block_shape))
            sig[name] = f"tensordesc<{TRITON_TYPES[value.base.dtype][1:]}[{block}]>"
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif isinstance(value, bool) or not isinstance(value, int):  # e.g. a Gluon host descriptor
            from triton.runtime.jit import mangle_type
            sig[name] = mangle_type(value)
        elif name in kernel.do_not_specialize:
            sig[name] = "i32"
        elif value == 1:
            sig[name] = "constexpr"
            consts[(i,)] = 1
        else:
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def compile_launch(kl, arch):
    sig, constexprs, attrs = _signature(kl, arch)
    src = ASTSource(fn=kl.kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    if arch in ROCM_TARGETS:
        target = GPUTarget("hip", arch, ROCM_TARGETS[arch])
    else:
        target = GPUTarget("cuda", arch[0] * 10 + arch[1], 32)
    return triton.compile(src, target=target, options=dict(num_warps=kl.num_warps, num_stages=kl.num_stages))


# (head_dim, causal, dtype, heads_q, heads_kv, score features): the head-dim buckets users hit most, both
# causal modes, GQA, a padded head dim, fp32 (tf32x3 dots, TF32 off on sm80+: their tiles and the group-sum path;
# ieee=True: FMA dots on their tiles, as GPUs without TF32 run fp32; tf32=True: TF32 dots on the largest tiles in
# bytes),
# every score feature switched on at once, and dropout (with the attention-probabilities kernel) alone, with
# everything, with varlen, and at the largest head dim. Most cases are 64 tokens long, where rows see few keys
# and the forward takes its short-row tiles (configs.SHORT_KEYS); the seqlen=2048 cases compile the others.
ALL_FEATURES = dict(window_left=32, window_right=8, softcap=30.0, alibi=True, sink=True, bias=True)
CASES = [
    (64, True, torch.bfloat16, 2, 1, {}),
    (128, True, torch.bfloat16, 2, 1, {}),
    (256, True, torch.bfloat16, 2, 1, {}),
    (128, False, torch.float16, 2, 2, {}),
    (72, True, torch.bfloat16, 2, 2, {}),
    (256, True, torch.float32, 2, 1, {}),
    (128, False, torch.bfloat16, 2, 1, ALL_FEATURES),
    (128, True, torch.bfloat16, 2, 1, dict(softcap=30.0, approx_tanh=True)),  # softcap's tanh.approx.f32
    (128, True, torch.bfloat16, 2, 1, dict(seqlen=2048)),
    (128, False, torch.bfloat16, 2, 1, dict(softcap=30.0, alibi=True, sink=True, bias=True, dropout=True, seqlen=2048)),
    (128, False, torch.float32, 2, 1, ALL_FEATURES),  # fp32 tf32x3 tiles (configs._TF32X3_*) with every feature
    (128, False, torch.float32, 2, 1, dict(ALL_FEATURES, ieee=True)),  # fp32 FMA tiles (configs._IEEE_*)
    (128, False, torch.float32, 2, 1, dict(ALL_FEATURES, tf32=True)),  # TF32 fp32 tiles + a bias tile: tightest on sm80
    (256, True, torch.float32, 2, 1, dict(tf32=True)),
    (64, True, torch.bfloat16, 2, 1, dict(dropout=True)),
    (256, True, torch.bfloat16, 2, 1, dict(dropout=True)),
    (128, False, torch.bfloat16, 2, 1, dict(ALL_FEATURES, dropout=True)),
    (64, True, torch.float32, 2, 1, dict(dropout=True)),
    (128, True, torch.bfloat16, 2, 1, dict(varlen=True)),
    (128, True, torch.bfloat16, 2, 1, dict(varlen=True, bias=True, dropout=True, dlse=True)),
    (128, True, torch.bfloat16, 2, 1, dict(kvcache=True)),
    (128, True, torch.bfloat16, 2, 1, dict(kvcache=True, paged=True, leftpad=True)),
    (128, True, torch.bfloat16, 2, 1, dict(varlen=True, paged=True)),  # paged keys in flash_attn_varlen_func
    (128, True, torch.bfloat16, 2, 1, dict(varlen=True, paged=True, page_size=64)),  # one page lookup per tile
    # Split-KV decoding (packed GQA rows, then the combine kernel): the decode bench's shape, paged, every
    # score feature, the smallest and largest head dims, fp32, and a prefill-sized chunk of 4 x 8 rows.
    (128, True, torch.bfloat16, 8, 1, dict(decode=True)),
    (128, True, torch.bfloat16, 8, 1, dict(decode=True, paged=True, leftpad=True)),
    (128, True, torch.bfloat16, 8, 1, dict(decode=True, leftpad=True)),
    (128, False, torch.float16, 8, 2, dict(decode=True, paged=True, window_left=32, window_right=8, softcap=30.0,
                                           alibi=True)),
    (64, True, torch.bfloat16, 1, 1, dict(decode=True)),
    (256, True, torch.bfloat16, 8, 1, dict(decode=True, paged=True)),
    (256, True, torch.float32, 8, 1, dict(decode=True)),
    (256, True, torch.float32, 8, 1, dict(decode=True, tf32=True)),
    (256, True, torch.float32, 8, 1, dict(decode=True, ieee=True)),
    (128, True, torch.bfloat16, 8, 1, dict(decode=True, seqlen_q=4)),
    # An int cache_seqlens: the key count as a kernel scalar, no tensor (HAS_SEQUSED_TENSOR / HAS_CACHE_SEQLENS off).
    (128, True, torch.bfloat16, 8, 1, dict(decode=True, scalar_seqlens=True)),
    (128, True, torch.bfloat16, 8, 1, dict(decode=True, paged=True, leftpad=True, scalar_seqlens=True)),
    (128, True, torch.bfloat16, 2, 1, dict(kvcache=True, paged=True, scalar_seqlens=True)),
    (128, True, torch.bfloat16, 8, 1, dict(append=True, rotary_half=64, interleaved=True, scalar_seqlens=True)),
    (128, False, torch.bfloat16, 2, 1, dict(flex=True)),
    (64, False, torch.float16, 2, 2, dict(flex=True, softcap=30.0, alibi=True)),
    (256, False, torch.bfloat16, 2, 1, dict(flex=True)),
    (128, True, torch.bfloat16, 2, 1, dict(score_mod=True)),
    # The random cross-checks' score mods (tests/fuzz_programmable.py), which only the GPU otherwise compiles.
    (128, False, torch.bfloat16, 2, 1, dict(fuzz_mod="relbias")),
    (64, True, torch.float16, 2, 2, dict(fuzz_mod="softcap")),
    (256, False, torch.float32, 2, 1, dict(fuzz_mod="alibi")),
    # Dropout through the block-sparse loops with the mods (not reachable from flashtile.attention, which
    # takes no dropout, but the kernels carry it there).
    (128, False, torch.bfloat16, 2, 1, dict(flex=True, dropout=True)),
    # The KV-cache append with fused rotary (flash_attn_with_kvcache's first launch): both pairings, paged and
    # contiguous, a partial rotary dim on a padded head dim, fp32 tables with fp16 data, and the plain append.
    (128, True, torch.bfloat16, 8, 1, dict(append=True, rotary_half=64, interleaved=True)),
    (72, False, torch.float16, 4, 2, dict(append=True, rotary_half=8, paged=True)),
    (256, True, torch.float32, 2, 1, dict(append=True, rotary_half=64, paged=True, interleaved=True)),
    (128, False, torch.bfloat16, 8, 1, dict(append=True, paged=True)),
]


def _rel_bias(score, b, h, q_idx, kv_idx, table):
    return score + tl.load(table + (q_idx - kv_idx + 64))


def _unit(score, b, h, q_idx, kv_idx, table):
    return score * 0.0 + 1.0


def _mod_args(features, q):
    """Programmable attention: a score_mod reading an aux table (and its derivative), and with flex=True a
    block-sparse document mask (the block-sparse loops, the mask_mod, a second aux tensor)."""
    from flashtile.flex import and_masks, causal_mask, create_block_mask, document_mask, mods

    table = torch.zeros(128)
    score = mods.Mod(_rel_bias, (table,), mods.SCORE_ARGS, "score_mod")
    grad = mods.Mod(_unit, (table,), mods.SCORE_ARGS, "score_mod_grad")
    if features.get("fuzz_mod"):
        import fuzz_programmable

        fn, fn_grad = fuzz_programmable.SCORES[features["fuzz_mod"]]
        aux = (torch.zeros(q.shape[2] * 64),) if features["fuzz_mod"] != "softcap" else ()
        score = mods.Mod(fn, aux, mods.SCORE_ARGS, "score_mod")
        grad = mods.Mod(fn_grad, aux, mods.SCORE_ARGS, "score_mod_grad")
    mask = block_mask = None
    if features.get("flex"):
        mask = and_masks(causal_mask, document_mask(torch.zeros(q.shape[1], dtype=torch.int64)))
        block_mask = create_block_mask(mask, None, None, q.shape[1], q.shape[1], device="cpu")
    pool = mods.aux_pool(score, grad, mask)
    return launch.ModArgs.make(pool, mods.adapter(score, pool), mods.adapter(grad, pool),
                               mods.adapter(mask, pool) if mask is not None else None, block_mask)


def _append_launches(features, q, k_cache):
    """The rotary-append kernel for one new token of a decode step, cos/sin in fp32 as models keep them."""
    half = features.get("rotary_half")
    cos = torch.zeros(4096, half) if half else None
    seqlens = None if features.get("scalar_seqlens") else torch.tensor([50], dtype=torch.int32)
    table = torch.zeros(1, 4, dtype=torch.int32) if features.get("paged") else None
    if table is not None:
        k_cache = k_cache.reshape(4, 16, *k_cache.shape[2:])
    new = k_cache[:1, :1]
    return kvcache_launch.rotary_append_launches(q, q, k_cache, k_cache, new, new, cos, cos, seqlens, table,
                                                 features.get("interleaved", False), q_local=True,
                                                 cache_add=50 if seqlens is None else 0)


def case_launches(arch, case):
    """The launches flashtile builds for one case on arch (see CASES), with the case's TF32 switch and dot precision,
    and on a ROCm target as a ROCm build of torch builds them; None where that build never makes the case."""
    features = case[5]
    rocm = arch in ROCM_TARGETS
    if rocm and features.get("approx_tanh"):
        return None  # tanh.approx.f32 is NVIDIA's PTX: launch._approx_tanh never asks for it on ROCm
    # fp32's dots (and so its tiles) follow PyTorch's TF32 switch and the GPU: tf32=True builds the launches with it
    # on, as a user who allows TF32 gets them; ieee=True with the FMA dots a GPU without TF32 runs.
    matmul, dot_precision, hip = torch.backends.cuda.matmul, launch._dot_precision, torch.version.hip
    tf32_before, matmul.allow_tf32 = matmul.allow_tf32, bool(features.get("tf32"))
    if features.get("ieee") and not rocm:
        launch._dot_precision = lambda dtype, arch: "ieee" if dtype == torch.float32 else "tf32"
    if rocm:
        torch.version.hip = "rocm"  # precision._dot_precision's ROCm rule
    try:
        return _case_launches(None if rocm else arch, case)  # launch._arch is None on ROCm
    finally:
        matmul.allow_tf32, launch._dot_precision, torch.version.hip = tf32_before, dot_precision, hip


def launch_key(kl, arch):
    """What triton compiles for kl on arch: launches with equal keys compile to the same kernel."""
    sig, consts, attrs = _signature(kl, arch)
    # a constexpr function (a score_mod's generated adapter) by its source's hash, as triton keys it, not its name
    consts = sorted((k, getattr(v, "cache_key", v)) for k, v in consts.items())
    return (arch, kl.kernel.fn.__name__, repr(sig), repr(consts), repr(sorted(attrs.items())), kl.num_warps,
            kl.num_stages)


def check_case(arch, case, todo):
    """Compile the launches of one case whose indices are in todo (the others compiled for an earlier case) for
    arch; returns (failures, report lines)."""
    head_dim, causal, dtype, features = case[0], case[1], case[2], case[5]
    smem_limit = TARGETS[arch]
    name = arch if arch in ROCM_TARGETS else f"sm{target_name(arch)}"
    launches = case_launches(arch, case)
    if launches is None:
        return 0, [f"skip  {name} D{head_dim} causal={causal} {features}: not a launch of this target"]
    failures, lines = 0, []
    for index, kl in enumerate(launches):
        what = (f"{name} {kl.kernel.fn.__name__} D{head_dim} causal={causal} "
                f"{str(dtype).removeprefix('torch.')} {features or ''} warps={kl.num_warps} stages={kl.num_stages}")
        if index not in todo:
            lines.append(f"same  {what}: compiled for an earlier case")
            continue
        try:
            shared = compile_launch(kl, arch).metadata.shared
        except Exception as exc:  # report every failure, not only the first
            failures += 1
            lines.append(f"FAIL  {what}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        note = ""
        if shared > smem_limit and arch in FALLBACK_TARGETS:
            shared, note = _fallback_fit(kl, arch, smem_limit, shared)
        ok = shared <= smem_limit
        known = not ok and (arch, kl.kernel.fn.__name__, head_dim, dtype) in KNOWN_UNFIT
        failures += not ok and not known
        status = "ok" if ok else "KNOWN" if known else "FAIL"
        lines.append(f"{status:5} {what}: shared memory {shared} of {smem_limit} bytes{note}")
    return failures, lines


def _fallback_fit(kl, arch, smem_limit, shared):
    """(shared memory, note) of the first of fit.smaller_variants that fits, as fit.launch would run it on a GPU
    that refused kl's tiles (which need `shared` bytes); the smallest variant's where none fits."""
    kwargs = {**kl.constexprs, "num_warps": kl.num_warps, "num_stages": kl.num_stages}
    note = " (no smaller variant)"
    for smaller in fit.smaller_variants(kwargs, fit.tiles(kl)):
        stages = smaller.pop("num_stages")
        warps = smaller.pop("num_warps")
        variant = dataclasses.replace(kl, constexprs=smaller, num_warps=warps, num_stages=stages)
        shared = compile_launch(variant, arch).metadata.shared
        tiles = ", ".join(f"{name}={smaller[name]}" for name in fit.tiles(kl))
        note = f" after fit.py's fallback (stages={stages}{', ' + tiles if tiles else ''})"
        if shared <= smem_limit:
            break
    return shared, note


def _case_launches(arch, case):
    """The launches flashtile makes for one case (see CASES)."""
    head_dim, causal, dtype, heads_q, heads_kv, features = case
    seqlen = features.get("seqlen", 64)
    q = torch.zeros(1, features.get("seqlen_q", 1) if features.get("decode") else seqlen, heads_q, head_dim,
                    dtype=dtype)
    k = torch.zeros(1, seqlen, heads_kv, head_dim, dtype=dtype)
    lse = torch.zeros(1, heads_q, seqlen)
    slopes = torch.ones(heads_q) if features.get("alibi") else None
    geo = launch.Geometry.of(q, k)
    if features.get("varlen"):
        q, k = q[0], k[0]
        cu = torch.tensor([0, 30, 64], dtype=torch.int32)
        geo = launch.Geometry.of(q, k, cu, cu, 34, 34)
        lse = torch.zeros(heads_q, 64)
        if features.get("paged"):  # forward only: the keys are (num_pages, page_size, Hk, D)
            page = features.get("page_size", 16)
            k = k.reshape(64 // page, page, heads_kv, head_dim)
            geo = dataclasses.replace(geo, block_table=torch.zeros(2, 64 // page, dtype=torch.int32))
    bias = dbias = None
    if features.get("bias"):
        bias, dbias = torch.zeros(1, heads_q, seqlen, seqlen, dtype=dtype), torch.zeros(1, heads_q, seqlen, seqlen)
    dropout_p, rng = (0.1, torch.zeros(1, dtype=torch.int64)) if features.get("dropout") else (0.0, None)
    sa = launch.ScoreArgs.make(geo, 0.1, features.get("window_left", -1), 0 if causal else features.get(
        "window_right", -1), features.get("softcap", 0.0), slopes, lse, bias, dropout_p, rng,
        approx_tanh=features.get("approx_tanh", False))
    sink = torch.zeros(heads_q) if features.get("sink") else None
    if features.get("kvcache") or features.get("decode"):
        if features.get("scalar_seqlens"):
            geo = dataclasses.replace(geo, seqused_add=50)
        else:
            geo = dataclasses.replace(geo, seqused_k=torch.tensor([50], dtype=torch.int32))
        if features.get("paged"):
            geo = dataclasses.replace(geo, block_table=torch.zeros(1, 4, dtype=torch.int32))
        if features.get("leftpad"):
            geo = dataclasses.replace(geo, key_start=torch.tensor([3], dtype=torch.int32))
    mods = _mod_args(features, q) if any(features.get(k) for k in ("flex", "score_mod", "fuzz_mod")) else None
    if features.get("append"):
        launches = _append_launches(features, q[:, :1], k)
    elif features.get("decode"):
        lse = torch.zeros(1, heads_q, q.shape[1])
        cfg, splits, precision = kvcache_launch.splitkv_plan(geo, 4096, 0, arch, dtype, torch.device("cpu"),
                                                             interpreter=False)
        assert splits > 1, "the compile check needs the combine kernel"
        launches = kvcache_launch.splitkv_launches(geo, q, k, k, q, lse, sa, cfg, splits, precision)
    else:
        launches = launch.forward_launches(geo, q, k, k, q, lse, sink, sa, arch, interpreter=False, mods=mods)
    if not any(features.get(name) for name in ("kvcache", "decode", "paged", "append")):  # paged KV is inference only
        rows = torch.zeros(geo.row_buffer_shape(q))  # the backward's Delta / Lse2 layout
        launches += bwd_launch.backward_launches(geo, q, q, k, k, q, lse, rows, rows, q, k, k, dbias, 0.1, sa, arch,
                                                 interpreter=False, mods=mods,
                                                 dlse=lse if features.get("dlse") else None)
    if features.get("dropout"):  # return_attn_probs
        launches += launch.probs_launches(geo, q, k, lse, torch.zeros(1, heads_q, seqlen, seqlen, dtype=dtype), sa,
                                          arch, interpreter=False)
    return launches


def main():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: the interpreter does not compile")
    # FLASHTILE_COMPILE_ARCHS=80,90 (default: both) picks the targets; gfx942,gfx90a,gfx950,gfx1100 the AMD ones.
    names = os.environ.get("FLASHTILE_COMPILE_ARCHS", "80,90").split(",")
    archs = [a for a in TARGETS if target_name(a) in names]
    # Each distinct kernel compiles once per target: the cases' launches are built here (milliseconds each), and a
    # launch equal to an earlier case's is reported, not compiled again (~1 in 6 on the NVIDIA targets).
    jobs, seen = [], set()
    for arch in archs:
        for case in CASES:
            todo = []
            for index, kl in enumerate(case_launches(arch, case) or ()):
                key = launch_key(kl, arch)
                if key not in seen:
                    seen.add(key)
                    todo.append(index)
            jobs.append((arch, case, tuple(todo)))
    # spawned workers: forked ones could inherit a lock of torch's threads, taken while the launches were built
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(check_case, *zip(*jobs)))
    failures = 0
    for count, lines in results:
        failures += count
        print("\n".join(lines))
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
