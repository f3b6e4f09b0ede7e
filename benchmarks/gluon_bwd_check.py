"""Check and time the Hopper Gluon backward on the GPU, in one self-diagnosing run (target < 150 s).

    PYTHONPATH=src python3 benchmarks/gluon_bwd_check.py [--variants default,atomics,dq-reduce2,...]
        [--check-dims 128,64] [--bench-dims 128,64] [--seqlens 1024,4096,16384] [--skip-bench] [--skip-features]
        [--bench-features] [--skip-portable]

Phases, each in child processes with a time limit (a kernel that deadlocks on an mbarrier hangs forever; killing
the child frees the GPU and the run goes on to report it):
  smoke    one tiny case per head dim of --check-dims (128, 64; 256 on request), default variant: does it
           launch, finish and match?
  correct  one child per head dim (--check-dims) x causal, concurrently: 1K, 4K, odd lengths (1000, 130 x 257
           and 257 x 130 with Sq != Sk), GQA / MQA, batch > 1 with odd lengths, fp16; dq / dk / dv NaN-poisoned
           against the float64 reference with DESIGN.md's rule (<= 2 x the plain low-precision PyTorch error +
           rounding floor), the portable backward's error alongside; then flash_attn_func with
           FLASHTILE_GLUON_BWD=1 (the dispatch).
           Variants after the first get a shorter list; a variant runs only at the head dims it covers
           (gluon_bwd_launch.VARIANTS: e.g. atomics, dQ by red.global.add; dq-reduce2 at D64 / D128).
  features (unless --skip-features; concurrently with correct, five children per head dim) score features in the
           default variant: windows (256, 0), (100, 50), (-1, 64), causal + left window, softcap 30 and 5, ALiBi
           (H,) and (B, H), combos, an additive bias (1, H, Sq, Sk) / (B, 1, ...) / (B, H, ...) / expanded /
           fp32 with bf16 q / -inf and -1e9 key masks / with windows, ALiBi and softcap, with GQA / MQA, odd
           lengths, Sq != Sk both ways, batch tails and fp16; the forward is flashtile's own with the same
           features (so lse is the one P is recomputed against), dq / dk / dv NaN-poisoned against the float64
           reference with the same features. Bias cases the Gluon backward refuses by design (D256, an fp32 bias
           at D128, rows not 16-byte aligned) check that gluon_bwd_supported() says so.
  bench-features (--bench-features) D128 8K B2 H16 bf16: backward time of each feature, Gluon and portable, as
           ratios to the plain Gluon backward (issue 6: <= 1.10x) and Gluon / portable with the same feature;
           windows also per unit of work (the fraction of the score matrix the window keeps).
  bench    16K tokens, hidden 2048 (B = 16384 / S, H = 2048 / D), causal both: backward TFLOP/s (2.5 x 4 B H S^2 D,
           halved when causal; median of do_bench) of each Gluon variant (preprocess + dK/dV + dQ conversion, from
           a saved out / lse), the portable backward and SDPA cuDNN's backward, and the ratios.
Every line starts with PASS / FAIL / SKIP / ERROR / TIME / INFO so the log greps well.
"""
import argparse
import os
import sys
import time

os.environ["FLASHTILE_GLUON_BWD"] = "0"  # the portable backward, except where a check routes to Gluon

import torch  # noqa: E402
import triton  # noqa: E402

from flashtile import bwd_launch, gluon_bwd_launch, launch  # noqa: E402
from flashtile.reference import attention_ref  # noqa: E402
from gpu_check import (ABS_FLOOR, alibi_slopes, bench_shapes, guarded, max_err,  # noqa: E402  (this folder)
                       run_children, say, shape_label, time_providers)

DEVICE = "cuda"
BF16, FP16 = torch.bfloat16, torch.float16

# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype)
CASES = [
    ("1K", 2, 1024, 1024, 4, 4, BF16),
    ("4K", 1, 4096, 4096, 2, 2, BF16),
    ("odd-1000", 1, 1000, 1000, 4, 4, BF16),
    ("tails-q130-k257", 1, 130, 257, 2, 2, BF16),
    ("q257-k130", 1, 257, 130, 2, 2, BF16),  # causal: the first 127 rows see no key (lse -inf, P = 0)
    ("gqa-q777-k999", 1, 777, 999, 8, 2, BF16),
    ("mqa-q200-k1000", 1, 200, 1000, 4, 1, BF16),
    ("batch-tails-3x1000", 3, 1000, 1000, 4, 2, BF16),  # key and query tiles past a sequence's end
    ("batch-q130-k257", 2, 130, 257, 2, 2, BF16),
    ("1x1", 1, 1, 1, 2, 1, BF16),
    ("fp16-gqa-1000", 1, 1000, 1000, 4, 2, FP16),
    ("fp16-2x1024", 2, 1024, 1024, 4, 4, FP16),
]
SHORT_CASES = ("odd-1000", "gqa-q777-k999", "batch-tails-3x1000", "4K")
SMOKE = ("smoke-128", 1, 128, 128, 1, 1, BF16)


def make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shapes = ((batch, seqlen_q, heads_q), (batch, seqlen_k, heads_kv), (batch, seqlen_k, heads_kv),
              (batch, seqlen_q, heads_q))
    return [torch.randn(b, s, h, head_dim, generator=gen, device=DEVICE).to(dtype) for b, s, h in shapes]


def forward(q, k, v, scale, causal):
    """out, lse from flashtile's forward (whichever kernel configs.py picks; both are checked elsewhere)."""
    return launch._flash_attn_forward(q, k, v, scale, -1, 0 if causal else -1, 0.0, None, None)


def portable_backward(dout, q, k, v, out, lse, scale, causal):
    return bwd_launch._flash_attn_backward(dout, q, k, v, out, lse, None, scale, -1, 0 if causal else -1, 0.0, None)[:3]


def references(q, k, v, dout, scale, causal, **features):
    """(dq, dk, dv) in float64 and in plain low-precision PyTorch; features: window_size, softcap, alibi_slopes."""
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = attention_ref(*leaves, causal=causal, softmax_scale=scale, upcast=upcast, **features)
        results.append(torch.autograd.grad(o, leaves, dout.to(o.dtype)))
    return results


def feature_args(spec, batch, heads_q, seqlen_q=None, seqlen_k=None, dtype=BF16):
    """flash_attn_func / gluon_backward / attention_ref keywords of a spec: window (left, right), softcap, alibi
    ('h' for (H,) slopes, 'bh' for (B, H)), bias (attn_bias_of; needs seqlen_q, seqlen_k and q's dtype)."""
    args = dict(window_size=spec.get("window", (-1, -1)), softcap=spec.get("softcap", 0.0))
    if spec.get("alibi"):
        args["alibi_slopes"] = alibi_slopes(heads_q, batch if spec["alibi"] == "bh" else None)
    if spec.get("bias"):
        args["attn_bias"] = attn_bias_of(spec, batch, heads_q, seqlen_q, seqlen_k, dtype)
    return args


def attn_bias_of(spec, batch, heads, seqlen_q, seqlen_k, dtype):
    """spec["bias"]: "1h" (1, H, Sq, Sk), "b1" (B, 1, ...), "bh" (B, H, ...), "11" (1, 1, ...), "eh" (1, H, ...)
    expanded to (B, H, ...) (stride 0); values N(0, 1) in q's dtype, or fp32 with spec["bias_dtype"] == "fp32".
    Rows are padded to 16 bytes (the storage is (.., Sk_pad)[..., :Sk]) unless spec["unaligned"]; spec["keymask"]:
    this value (-inf, -1e9) on the last 100 keys of every row."""
    kind = spec["bias"]
    bias_dtype = torch.float32 if spec.get("bias_dtype") == "fp32" else dtype
    rows_b = batch if kind[0] == "b" else 1
    rows_h = heads if kind[1] == "h" else 1
    align = 1 if spec.get("unaligned") else 16 // torch.empty((), dtype=bias_dtype).element_size()
    padded = -(-seqlen_k // align) * align
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    bias = torch.randn(rows_b, rows_h, seqlen_q, padded, generator=gen, device=DEVICE).to(bias_dtype)[..., :seqlen_k]
    if "keymask" in spec:
        bias[..., max(seqlen_k - 100, 1):] = spec["keymask"]
    if kind[0] == "e":
        bias = bias.expand(batch, rows_h, seqlen_q, seqlen_k)
    return bias


def gluon_takes(spec, head_dim):
    """Whether the Gluon backward should serve a FEATURE_CASES spec at head_dim (gluon_bwd_launch: no bias at D256,
    nor an fp32 bias at D128, nor bias rows that are not 16-byte aligned)."""
    if not spec.get("bias"):
        return True
    if head_dim > 128 or spec.get("unaligned"):
        return False
    return head_dim == 64 or spec.get("bias_dtype") != "fp32"


def launcher_window(causal, window_size):
    """(window_left, window_right) as launch.py takes them: -1 unbounded, causal is right = 0."""
    left, right = window_size
    return left, 0 if causal else right


def feature_forward(q, k, v, scale, causal, feats):
    """out, lse of flashtile's forward with the features (with a bias: the Gluon forward where gluon_launch.bias_ok
    takes it and configs.py wants it, else the portable one; both add it after softcap and ALiBi)."""
    return launch._flash_attn_forward(q, k, v, scale, *launcher_window(causal, feats["window_size"]),
                                      feats["softcap"], feats.get("alibi_slopes"), None,
                                      attn_bias=feats.get("attn_bias"))


def feature_portable_backward(dout, q, k, v, out, lse, scale, causal, feats):
    return bwd_launch._flash_attn_backward(dout, q, k, v, out, lse, None, scale,
                                           *launcher_window(causal, feats["window_size"]), feats["softcap"],
                                           feats.get("alibi_slopes"), attn_bias=feats.get("attn_bias"))[:3]


# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype, causal, spec)
FEATURE_CASES = [
    ("win256,0", 2, 1000, 1000, 4, 2, BF16, False, dict(window=(256, 0))),
    ("win100,50", 1, 1000, 1000, 4, 4, BF16, False, dict(window=(100, 50))),
    ("win100,50-gqa-q777-k999", 1, 777, 999, 8, 2, BF16, False, dict(window=(100, 50))),
    # Sq > Sk: the first 172 rows see no key (lse -inf; the portable forward serves them).
    ("win100,50-q999-k777", 1, 999, 777, 4, 4, BF16, False, dict(window=(100, 50))),
    ("win-1,64", 1, 1000, 1000, 4, 4, BF16, False, dict(window=(-1, 64))),
    ("win16,0-mqa", 1, 1000, 1000, 4, 1, BF16, False, dict(window=(16, 0))),
    ("causal+left256", 1, 1000, 1000, 4, 2, BF16, True, dict(window=(256, -1))),
    ("causal+left256-3x1000", 3, 1000, 1000, 4, 2, BF16, True, dict(window=(256, -1))),
    ("causal+left100-q130-k257", 2, 130, 257, 2, 2, BF16, True, dict(window=(100, -1))),
    ("softcap30", 2, 1024, 1024, 4, 4, BF16, False, dict(softcap=30.0)),
    ("softcap5-gqa-1000", 1, 1000, 1000, 4, 2, BF16, False, dict(softcap=5.0)),
    ("softcap5-causal-q777-k999", 1, 777, 999, 8, 2, BF16, True, dict(softcap=5.0)),
    ("softcap30-fp16-causal", 1, 1000, 1000, 4, 2, FP16, True, dict(softcap=30.0)),
    ("alibi-h-gqa-1000", 1, 1000, 1000, 4, 2, BF16, False, dict(alibi="h")),
    ("alibi-bh-3x1000", 3, 1000, 1000, 4, 2, BF16, False, dict(alibi="bh")),
    ("alibi-bh-causal-q257-k130", 2, 257, 130, 2, 2, BF16, True, dict(alibi="bh")),
    ("alibi-h-causal-q777-k999", 1, 777, 999, 8, 2, BF16, True, dict(alibi="h")),
    ("combo-causal+left300-cap20-alibi-bh", 2, 777, 999, 8, 2, BF16, True,
     dict(window=(300, -1), softcap=20.0, alibi="bh")),
    ("combo-win128,64-cap30-alibi-h-fp16", 1, 1000, 1000, 4, 4, FP16, False,
     dict(window=(128, 64), softcap=30.0, alibi="h")),
    # Additive bias without gradient (D64 / D128; D256 and the other refusals: gluon_takes). Odd Sk: padded rows.
    ("bias-1h-gqa-1000", 2, 1000, 1000, 4, 2, BF16, False, dict(bias="1h")),
    ("bias-b1-causal-q777-k999", 2, 777, 999, 8, 2, BF16, True, dict(bias="b1")),
    ("bias-bh-q999-k777", 2, 999, 777, 4, 4, BF16, False, dict(bias="bh")),  # rows past Sq in the last tile
    ("bias-bh-causal-q257-k130", 2, 257, 130, 2, 2, BF16, True, dict(bias="bh")),  # rows with no key
    ("bias-11-3x1000", 3, 1000, 1000, 4, 2, BF16, False, dict(bias="11")),
    ("bias-eh-expanded-mqa", 2, 1000, 1000, 4, 1, BF16, True, dict(bias="eh")),
    ("bias-fp16-1h-causal", 1, 1000, 1000, 4, 2, FP16, True, dict(bias="1h")),
    ("bias-fp32-bf16q-1h", 2, 1000, 1000, 4, 2, BF16, False, dict(bias="1h", bias_dtype="fp32")),
    ("bias-keymask-inf", 2, 1000, 1000, 4, 2, BF16, False, dict(bias="b1", keymask=float("-inf"))),
    ("bias-keymask-1e9-fp32", 1, 1000, 1000, 4, 2, BF16, False, dict(bias="1h", bias_dtype="fp32", keymask=-1e9)),
    ("bias-win100,50-q777-k999", 1, 777, 999, 8, 2, BF16, False, dict(bias="1h", window=(100, 50))),
    ("bias-causal+left256-alibi-bh", 2, 777, 999, 8, 2, BF16, True, dict(bias="b1", window=(256, -1), alibi="bh")),
    ("bias-softcap30", 1, 1000, 1000, 4, 2, BF16, False, dict(bias="1h", softcap=30.0)),
    ("bias-combo-causal+left300-cap20-alibi-bh", 2, 777, 999, 8, 2, BF16, True,
     dict(bias="bh", window=(300, -1), softcap=20.0, alibi="bh")),
    ("bias-unaligned-q33-k41", 1, 33, 41, 2, 2, BF16, False, dict(bias="1h", unaligned=True)),
]


def check_case(case, head_dim, causal, variant, compare_portable=None):
    name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype = case
    label = (f"d{head_dim} {'causal' if causal else 'full  '} {name:<20} B{batch} Sq{seqlen_q} Sk{seqlen_k} "
             f"H{heads_q}/{heads_kv} {str(dtype)[6:]} [{variant}]")
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
    scale = head_dim ** -0.5
    out, lse = forward(q, k, v, scale, causal)
    if not gluon_bwd_launch.gluon_bwd_supported(q, k, v, out, dout, causal=causal):
        say(f"FAIL {label}: gluon_bwd_supported() is False (UNEXPECTED)")
        return False
    grads = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal, variant=variant)
    torch.cuda.synchronize()
    ref64, reflow = references(q, k, v, dout, scale, causal)
    if compare_portable is None:
        compare_portable = name in SHORT_CASES
    port = portable_backward(dout, q, k, v, out, lse, scale, causal) if compare_portable else (None,) * 3
    ok, line = grade(grads, ref64, reflow, port, (q, k, v), dtype)
    say(f"{'PASS' if ok else 'FAIL'} {label}: {line}")
    return ok


def grade(grads, ref64, reflow, port, likes, dtype):
    """(ok, text) of dq / dk / dv against the float64 reference with DESIGN.md's rule (<= 2 x the plain
    low-precision error + rounding floor), each with the portable backward's error (port: None where not run),
    and on failure which rows are off (tells a tail / mask / ring-phase bug apart)."""
    ok, parts, where = True, [], ""
    for gname, got, r64, rlow, pt, like in zip(("dq", "dk", "dv"), grads, ref64, reflow, port, likes):
        if got.shape != like.shape or got.dtype != like.dtype:
            ok = False
            parts.append(f"{gname} shape {tuple(got.shape)} {got.dtype}")
            continue
        n_nan, n_inf = torch.isnan(got).sum().item(), torch.isinf(got).sum().item()
        err, err_low = max_err(got, r64), max_err(rlow, r64)
        bound = 2 * err_low + max_err(r64.to(dtype), r64) + ABS_FLOOR[dtype]
        good = not n_nan and not n_inf and err <= bound
        ok &= good
        tail = f" NaN {n_nan} Inf {n_inf}" if n_nan or n_inf else ""
        err_pt = max_err(pt, r64) if pt is not None else float("nan")
        parts.append(f"{gname} {err:.2e}/{bound:.2e} (portable {err_pt:.2e}){tail}")
        if not good and not where:
            diff = (got.double() - r64.double()).abs().nan_to_num(nan=1e9).amax(dim=(0, 2, 3))  # [S]
            bad = torch.nonzero(diff > bound).flatten().tolist()
            where = f" | {gname} bad rows {len(bad)} of {diff.numel()}, first {bad[:8]}"
    return ok, f"err/bound {', '.join(parts)}{where}"


def check_feature_case(case, head_dim):
    """One FEATURE_CASES entry in the default variant against the float64 reference with the same features."""
    name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype, causal, spec = case
    label = (f"d{head_dim} {'causal' if causal else 'full  '} {name:<36} B{batch} Sq{seqlen_q} Sk{seqlen_k} "
             f"H{heads_q}/{heads_kv} {str(dtype)[6:]} [features]")
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
    scale = head_dim ** -0.5
    feats = feature_args(spec, batch, heads_q, seqlen_q, seqlen_k, dtype)
    if not gluon_takes(spec, head_dim):  # q stands in for out (same shape and dtype): no forward to compile
        supported = gluon_bwd_launch.gluon_bwd_supported(q, k, v, q, dout, causal=causal, **feats)
        say(f"{'FAIL' if supported else 'PASS'} {label}: gluon_bwd_supported() is {supported}, expected False "
            f"(the portable backward serves it)")
        return not supported
    out, lse = feature_forward(q, k, v, scale, causal, feats)
    if not gluon_bwd_launch.gluon_bwd_supported(q, k, v, out, dout, causal=causal, **feats):
        say(f"FAIL {label}: gluon_bwd_supported() is False (UNEXPECTED)")
        return False
    grads = gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal, **feats)
    torch.cuda.synchronize()
    ref64, reflow = references(q, k, v, dout, scale, causal, **feats)
    port = feature_portable_backward(dout, q, k, v, out, lse, scale, causal, feats)
    ok, line = grade(grads, ref64, reflow, port, (q, k, v), dtype)
    say(f"{'PASS' if ok else 'FAIL'} {label}: {line}")
    return ok


def feature_part(name):
    """Which child checks a FEATURE_CASES entry: "w" windows, "c" softcap, "a" ALiBi and the combos, "b" bias alone
    (layouts, dtypes of q), "x" bias with masks, fp32, other features or a refused layout (two children: each bias
    case compiles its own portable forward and backward as well)."""
    if name.startswith("bias"):
        mixed = ("keymask", "fp32", "win", "left", "softcap", "unaligned")
        return "x" if any(tag in name for tag in mixed) else "b"
    if name.startswith(("alibi", "combo")):
        return "a"
    return "c" if name.startswith("softcap") else "w"


def phase_features(head_dim, part):
    """The FEATURE_CASES of one feature_part at head_dim (part "a" also runs the dispatch check): six children in
    all, so the compiles of the feature kernels (Gluon, portable forward and backward) run in parallel."""
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    for case in FEATURE_CASES:
        if feature_part(case[0]) != part:
            continue
        say(f"INFO d{head_dim} {case[0]} [features] launching")
        ok = guarded(check_feature_case, case, head_dim, what=f"d{head_dim} {case[0]}")
        passed, failed = passed + bool(ok), failed + (not ok)
    if part == "a":
        ok = guarded(check_dispatch, head_dim, True, DISPATCH_FEATURES, what=f"feature dispatch d{head_dim}")
        passed, failed = passed + bool(ok), failed + (not ok)
    if part == "b" and gluon_takes(DISPATCH_BIAS, head_dim):
        ok = guarded(check_dispatch, head_dim, True, DISPATCH_BIAS, what=f"bias dispatch d{head_dim}")
        passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO features d{head_dim} [{part}]: {passed} passed, {failed} failed")
    return failed == 0


def phase_bench_features():
    """D128, 8K, B 2, H 16, bf16: each feature's backward (preprocess + kernels, from a saved out / lse of the
    same features), Gluon and portable, as ratios to the plain Gluon backward (issue 6: <= 1.10x plain) and
    Gluon / portable; windows per unit of work too (time ratio / the fraction of the score matrix kept)."""
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    batch, seqlen, heads, head_dim = 2, 8192, 16, 128
    q, k, v, dout = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, BF16)
    scale = head_dim ** -0.5
    full = seqlen * seqlen

    def window_work(left):  # visible (row, key) pairs of a bottom-right window (left, 0) over a square matrix
        return sum(min(i, left) + 1 for i in range(seqlen)) / full

    rows = [("plain", False, {}, 1.0), ("causal", True, {}, window_work(seqlen)),
            ("softcap30", False, dict(softcap=30.0), 1.0),
            ("causal+softcap30", True, dict(softcap=30.0), window_work(seqlen)),
            ("alibi", False, dict(alibi="h"), 1.0), ("causal+alibi", True, dict(alibi="h"), window_work(seqlen))]
    rows += [(f"win{w},0", False, dict(window=(w, 0)), window_work(w)) for w in (256, 1024, 4096)]
    rows += [("win1024+cap+alibi", False, dict(window=(1024, 0), softcap=30.0, alibi="h"), window_work(1024))]
    # Issue 6: a bf16 bias, (1, H, S, S) (2 GB) and (B, H, S, S) (4 GB), <= 1.10x the plain / causal backward.
    rows += [("bias-1h", False, dict(bias="1h"), 1.0), ("causal+bias-1h", True, dict(bias="1h"), window_work(seqlen)),
             ("bias-bh", False, dict(bias="bh"), 1.0)]
    base = {}
    for name, causal, spec, work in rows:
        feats = feature_args(spec, batch, heads, seqlen, seqlen, BF16)
        out, lse = feature_forward(q, k, v, scale, causal, feats)
        times = {}
        for provider, fn in (
                ("gluon", lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal, **feats)),
                ("triton", lambda: feature_portable_backward(dout, q, k, v, out, lse, scale, causal, feats))):
            try:
                times[provider] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            except Exception as exc:  # noqa: BLE001
                say(f"ERROR time bwd-feat {name} {provider}: {type(exc).__name__}: {exc}")
        g, t = times.get("gluon", float("nan")), times.get("triton", float("nan"))
        if not spec:
            base[causal] = g
        plain = base.get(False, float("nan"))
        same_mask = base.get(causal, float("nan")) if "window" not in spec else plain
        rel = g / plain
        say(f"TIME bwd-feat d128 S{seqlen} B{batch} H{heads} {name:<18} gluon {g:8.3f} ms  triton {t:8.3f} ms  "
            f"gluon/triton {g / t:.2f}  gluon/plain-gluon {rel:.2f}x  triton/plain-gluon {t / plain:.2f}x  "
            f"gluon/same-mask-gluon {g / same_mask:.2f}x  work {work:.3f}  per-work {rel / work:.2f}x"
            f"{'  OVER 1.10' if rel / work > 1.10 else ''}")


def check_dispatch(head_dim, causal, features=None):
    """flash_attn_func with FLASHTILE_GLUON_BWD=1 routes the backward to the Gluon kernel and matches; features:
    a FEATURE_CASES-style spec (window / softcap / alibi / bias) passed to flash_attn_func, or None."""
    import flashtile
    q, k, v, dout = make_inputs(2, 1000, 1000, 4, 2, head_dim, BF16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    feats = feature_args(features, 2, 4, 1000, 1000, BF16) if features else {}
    calls = []
    original = gluon_bwd_launch.gluon_backward
    gluon_bwd_launch.gluon_backward = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    try:
        grads = torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal, **feats), (q, k, v), dout)
    finally:
        os.environ["FLASHTILE_GLUON_BWD"] = "0"
        gluon_bwd_launch.gluon_backward = original
    ref64, reflow = references(q, k, v, dout, head_dim ** -0.5, causal, **feats)
    ok, parts = bool(calls), []
    for gname, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64, reflow):
        err, bound = max_err(got, r64), 2 * max_err(rlow, r64) + max_err(r64.to(BF16), r64) + ABS_FLOOR[BF16]
        ok &= bool(torch.isfinite(got).all().item()) and err <= bound
        parts.append(f"{gname} {err:.2e}/{bound:.2e}")
    mask = ("causal" if causal else "full  ") + (f", {'+'.join(sorted(features))}" if features else "")
    say(f"{'PASS' if ok else 'FAIL'} d{head_dim} {mask} flash_attn_func dispatch "
        f"(FLASHTILE_GLUON_BWD=1, gluon called: {bool(calls)}): {', '.join(parts)}")
    return ok


# The feature dispatch check: causal with a left window, softcap and per-batch ALiBi slopes at once; with a bias
# (no gradient: flash_attn_func's attn_bias does not require grad), a left window and ALiBi.
DISPATCH_FEATURES = dict(window=(256, -1), softcap=30.0, alibi="bh")
DISPATCH_BIAS = dict(window=(256, -1), alibi="bh", bias="1h")


def phase_smoke(variants, head_dims):
    ok = True
    for head_dim in head_dims:
        say(f"INFO smoke d{head_dim} [default] launching (a hang here = deadlock)")
        ok &= bool(guarded(check_case, SMOKE, head_dim, False, "default", False, what=f"smoke d{head_dim}"))
        ok &= bool(guarded(check_case, SMOKE, head_dim, True, "default", False, what=f"smoke d{head_dim} causal"))
    return ok


def phase_correct(variants, head_dim, causal):
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    variants = [v for v in variants if head_dim in gluon_bwd_launch.VARIANTS[v]]
    for variant in variants:
        for case in CASES:
            if variant != variants[0] and case[0] not in SHORT_CASES:
                continue
            say(f"INFO d{head_dim} causal={causal} {case[0]} [{variant}] launching")
            ok = guarded(check_case, case, head_dim, causal, variant, what=f"d{head_dim} causal={causal} {case[0]}")
            passed, failed = passed + bool(ok), failed + (not ok)
    ok = guarded(check_dispatch, head_dim, causal, what=f"dispatch d{head_dim} causal={causal}")
    passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO correctness d{head_dim} {'causal' if causal else 'full'}: {passed} passed, {failed} failed")
    return failed == 0


def phase_bench(variants, seqlens, head_dims, causal_modes="both", portable=True):
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for head_dim, causal, seqlen, batch, heads, tflop in bench_shapes(head_dims, seqlens, causal_modes):
        q, k, v, dout = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, BF16)
        scale = head_dim ** -0.5
        out, lse = forward(q, k, v, scale, causal)
        providers = {}
        for variant in [v for v in variants if head_dim in gluon_bwd_launch.VARIANTS[v]]:
            providers[f"gluon[{variant}]"] = (
                lambda variant=variant: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal,
                                                                        variant=variant))
        if portable:
            providers["flashtile-triton"] = lambda: portable_backward(dout, q, k, v, out, lse, scale, causal)
        qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2).contiguous()
        providers["sdpa-cudnn"] = lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
        # The backward does 2.5 times a forward's work.
        time_providers(providers, 2.5 * tflop, shape_label(head_dim, causal, seqlen, batch, heads), no_grad=False)


def _argv(args):
    return ["--variants", args.variants, "--seqlens", args.seqlens, "--bench-dims", args.bench_dims,
            "--check-dims", args.check_dims, "--bench-causal", args.bench_causal,
            *(["--skip-portable"] if args.skip_portable else [])]


def _children(phase, args, timeout, groups=(None, )):
    return run_children(__file__, phase, _argv(args), timeout, groups)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default,atomics",
                        help=f"comma list of {sorted(gluon_bwd_launch.VARIANTS)} (each runs where it has a config)")
    parser.add_argument("--seqlens", default="1024,4096,16384", help="bench sequence lengths")
    parser.add_argument("--bench-causal", default="both", choices=["both", "0", "1"],
                        help="bench shapes: full and causal, full only (0) or causal only (1)")
    parser.add_argument("--bench-dims", default="128,64", help="bench head dims")
    parser.add_argument("--check-dims", default="128,64",
                        help="head dims of the smoke / correct / features phases (256: the SPLIT_D kernel)")
    parser.add_argument("--phase", default="all",
                        choices=["all", "smoke", "correct", "features", "bench", "bench-features"])
    parser.add_argument("--group", default="", help="correct phase: HEAD_DIM:CAUSAL, e.g. 128:1")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-features", action="store_true", help="no feature correctness phase")
    parser.add_argument("--bench-features", action="store_true", help="time the features at D128 8K (~30 s)")
    parser.add_argument("--skip-portable", action="store_true", help="bench: leave the portable backward out")
    args = parser.parse_args()
    variants = args.variants.split(",")
    check_dims = [int(d) for d in args.check_dims.split(",")]
    if args.phase == "smoke":
        sys.exit(0 if phase_smoke(variants, check_dims) else 1)
    if args.phase == "correct":
        head_dim, causal = args.group.split(":")
        sys.exit(0 if phase_correct(variants, int(head_dim), causal == "1") else 1)
    if args.phase == "features":
        head_dim, part = args.group.lstrip("f").split(":")
        sys.exit(0 if phase_features(int(head_dim), part) else 1)
    if args.phase == "bench-features":
        phase_bench_features()
        return
    if args.phase == "bench":
        phase_bench(variants, [int(s) for s in args.seqlens.split(",")], [int(d) for d in args.bench_dims.split(",")],
                    args.bench_causal, not args.skip_portable)
        return
    say(f"INFO torch {torch.__version__} triton {triton.__version__} "
        f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'} "
        f"gluon import error: {gluon_bwd_launch.GLUON_BWD_IMPORT_ERROR}")
    start = time.time()
    if not _children("smoke", args, 90):
        say("FAIL smoke failed: skipping the remaining phases")
        return
    groups = [f"{d}:{c}" for d in check_dims for c in (0, 1)]
    if not args.skip_features:
        groups += [f"f{d}:{part}" for d in check_dims for part in "wcabx"]
    # Plain groups run the correct phase, feature groups (f<head dim>:<part>) the features phase, concurrently.
    run_children(__file__, "correct", _argv(args), 180, groups,
                 phase_of=lambda group, phase: "features" if group.startswith("f") else phase)
    if not args.skip_bench:
        _children("bench", args, 200)
    if args.bench_features:
        _children("bench-features", args, 150)
    say(f"INFO total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
