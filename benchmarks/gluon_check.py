"""Check and time the Hopper Gluon forward on the GPU, in one self-diagnosing run (target < 120 s).

    PYTHONPATH=src python3 benchmarks/gluon_check.py [--variants ...] [--bench-dims 64,128,256]
        [--seqlens 4096,16384] [--skip-bench] [--skip-features] [--skip-varlen] [--bench-features
        [--feature-variants ...]] [--bench-varlen]

Phases, each in a child process with a time limit (a kernel that deadlocks on an mbarrier hangs forever;
killing the child frees the GPU and the run goes on to report it):
  smoke    one tiny case per head dim (64, 128, 256): does it launch, finish and match?
  correct  one child per head dim (64, 128, 256) x causal, and one per feature group, all at once: seqlens 1K,
           4K, odd (1000, 130 x 257), GQA/MQA with q < k (causal aligned bottom-right), 1 x 1, strided q/k/v (a
           packed qkv tensor), fp16; NaN-poisoned outputs; O against the float64 reference with DESIGN.md's rule
           (<= 2 x the plain bf16 PyTorch error + rounding floor), with the portable Triton forward's error on a
           few cases for comparison; lse (natural log, (B, Hq, Sq)) against the float64 one. Then the existing
           backward run on the Gluon forward's out / lse (FLASHTILE_GLUON=1 through flash_attn_func), checked
           the same way. Variants after the first get a shorter list; a variant runs only at the head dims it
           has a config for. Persistent variants (GluonConfig.persistent) also run PERSISTENT_CASES (many tiles
           per CTA); a variant with max_ctas is checked, not timed. A variant with another tile height
           (GluonConfig.consumers 3: BLOCK_M 192) runs every case, TILE_FEATURE_CASES and VARLEN_CASES.
           Feature groups (FEATURE_CASES, default variant): feat:single (softcap, ALiBi (H,) / (B, H), sinks),
           feat:window (sliding windows incl. a refused one), feat:combo (window + softcap + ALiBi + GQA at
           D64/128/256, D256 features, and the backward on a window + softcap + ALiBi + sink forward, dsink too),
           feat:alibi (ALiBi's key-block split: q == k / q < k / q > k, causal both, (H,) / (B, H) slopes, 16
           heads, D64/128/256, with windows, softcap, sinks), feat:bias (additive biases (1, H) / (B, 1) / (B, H) /
           expanded, fp16 / bf16, causal, GQA, odd lengths, D64/128/256, with softcap / ALiBi / windows / sinks, and
           refused layouts (fp32, Sq broadcast) checked through the dispatcher's portable answer), feat:bias-mix
           (D64 / D256 and bias with softcap / ALiBi / windows / sinks).
           --correct-groups G1,G2 runs only those groups.
  bench    16K tokens, hidden 2048 (B = 16384 / S, H = 2048 / D), S in --seqlens, D in --bench-dims, causal
           both: TFLOP/s (4 B H S^2 D, halved when causal; median of do_bench) of each Gluon variant, the
           flashtile Triton forward and SDPA cuDNN, and the ratios.
  varlen   (a child of the correct batch; --skip-varlen drops it) flash_attn_varlen_func's layout through the
           Gluon forward (ragged descriptors): mixed lengths incl. 0 and 1 and lengths off the key block, Sq > Sk
           (causal rows without keys), GQA / MQA, D64/128/256, causal both, NaN-poisoned outputs, each sequence
           against the float64 reference run alone (DESIGN.md's rule), lse in (Hq, total_q); inf values in the
           next sequence and in rows past the last one must not reach a sequence's output; the varlen backward on
           the Gluon forward (flash_attn_varlen_func, FLASHTILE_GLUON=1); dense batch > 1 with Sk % 128 != 0 is
           in the correct groups' CASES (batch-tail-2x1000).
  bench-varlen (--bench-varlen)  16K tokens, hidden 2048: varlen Gluon against dense Gluon on the same tokens
           (equal lengths 2K and 8K), D64/D128, causal both, plus a mixed-length batch, and the portable varlen
           kernel: TFLOP/s and ratios (issue 5: varlen >= 0.90x dense).
  bench-features (--bench-features)  D128 8K B2 H16: plain / causal / softcap / ALiBi / sink / windows
           (256, 1024, 4096 left, 0 right) / a combination / bias (1, 16, 8K, 8K) bf16 (causal too; fp32: the
           portable kernel), Gluon against the portable kernel, as ratios to the plain Gluon time (causal+softcap /
           causal+alibi / causal+bias: to the causal one), per unit of work for windows; cuDNN plain and causal for
           scale. With
           --feature-variants V1,V2 instead: plain, causal, softcap, causal softcap, bias, causal bias, ALiBi, causal
           ALiBi, sink and a 4096-key window with softcap with each of them, row by row, the variants in turn and
           in reversed order the second round (the mean of two rounds), as ratios to the first one's plain / causal
           time, at --feature-dims (default 128,64,256; 8K tokens, hidden 2048) (the correct phase checks them too).
Every line starts with PASS / FAIL / SKIP / ERROR / TIME / INFO so the log greps well.
"""
import argparse
import functools
import os
import statistics
import sys
import time

os.environ["FLASHTILE_GLUON"] = "0"  # the portable path, except where a check routes to Gluon

import torch  # noqa: E402
import triton  # noqa: E402

from flashtile import gluon_launch, gluon_variants, persistent_schedule  # noqa: E402
from flashtile.reference import attention_ref  # noqa: E402
from gluon_check_inputs import (LSE_ATOL, LSE_RTOL, _ms, bias_refused, describe,  # noqa: E402  (this folder)
                                dispatched_forward, feature_args, make_inputs, triton_forward)
from gluon_check_varlen import VARLEN_CASES, check_varlen_case, phase_bench_varlen, phase_varlen  # noqa: E402
from gpu_check import (ABS_FLOOR, bench_shapes, guarded, max_err, run_children, say, shape_label,  # noqa: E402
                       time_providers)

# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype, packed)
CASES = [
    ("1K", 2, 1024, 1024, 4, 4, torch.bfloat16, False),
    ("4K", 1, 4096, 4096, 2, 2, torch.bfloat16, False),
    ("odd-1000", 1, 1000, 1000, 4, 4, torch.bfloat16, False),
    ("gqa-q777-k999", 1, 777, 999, 8, 2, torch.bfloat16, False),
    ("mqa-q200-k1000", 1, 200, 1000, 4, 1, torch.bfloat16, False),
    ("1x1", 1, 1, 1, 2, 1, torch.bfloat16, False),
    ("tails-q130-k257", 1, 130, 257, 2, 2, torch.bfloat16, False),
    ("q257-k130", 1, 257, 130, 2, 2, torch.bfloat16, False),  # causal: unsupported (rows without keys)
    ("packed-qkv-1000", 1, 1000, 1000, 4, 4, torch.bfloat16, True),
    ("packed-qkv-2x1024", 2, 1024, 1024, 4, 4, torch.bfloat16, True),
    ("batch-tail-2x1000", 2, 1000, 1000, 4, 4, torch.bfloat16, False),  # ragged descriptors: blocks span sequences
    ("batch-tail-3x130-257", 3, 130, 257, 4, 2, torch.bfloat16, False),
    ("fp16-gqa-1000", 1, 1000, 1000, 4, 2, torch.float16, False),
]
SHORT_CASES = ("odd-1000", "gqa-q777-k999", "4K")
# Persistent variants (GluonConfig.persistent) also run these: hundreds of tiles, so a CTA runs several (and a
# max_ctas variant dozens), with batches, GQA, causal q < k, and ragged descriptors (Sk % 128 != 0), so the ring,
# Q and turn barriers' phases run on across tiles of different lengths and heads.
PERSISTENT_CASES = [
    ("p-b4-512-h16", 4, 512, 512, 16, 16, torch.bfloat16, False),
    ("p-b16-640-h8", 16, 640, 640, 8, 8, torch.bfloat16, False),
    ("p-b3-q300-k700-gqa", 3, 300, 700, 8, 2, torch.bfloat16, False),
    ("p-b2-1000-h8-gqa", 2, 1000, 1000, 8, 4, torch.bfloat16, False),
    ("p-b5-q130-k257", 5, 130, 257, 6, 3, torch.float16, False),
]
SMOKE = ("smoke-128", 1, 128, 128, 1, 1, torch.bfloat16, False)
BF16 = torch.bfloat16
C1000 = ("1000", 1, 1000, 1000, 4, 2, BF16, False)
C2K = ("2K", 1, 2048, 2048, 4, 4, BF16, False)
GQA2K = ("gqa-2K", 1, 2048, 2048, 8, 2, BF16, False)
# Score features, three groups (one child each): (case, head_dim, causal, spec, compare with the portable kernel).
COMBO = dict(window=(256, 0), softcap=30.0, alibi="h")
FEATURE_CASES = {
    "feat:single": [
        (C1000, 128, False, dict(softcap=30.0), True),
        (C1000, 128, True, dict(softcap=30.0), False),
        (("gqa-q777-k999", 1, 777, 999, 8, 2, BF16, False), 128, False, dict(alibi="h"), True),
        (("2x1024", 2, 1024, 1024, 4, 4, BF16, False), 128, True, dict(alibi="bh"), False),
        (C1000, 128, False, dict(sink=True), True),
        (C1000, 128, True, dict(sink=True), False),
        (("fp16-1000", 1, 1000, 1000, 4, 2, torch.float16, False), 128, False,
         dict(softcap=30.0, alibi="h", sink=True), False),
        (("odd-1000", 1, 1000, 1000, 4, 4, BF16, False), 64, False, dict(softcap=30.0), False),
        (("q130-k257", 1, 130, 257, 2, 2, BF16, False), 64, True, dict(alibi="h", sink=True), False),
    ],
    "feat:window": [
        (C2K, 128, False, dict(window=(256, 0)), True),
        (C1000, 128, False, dict(window=(100, 50)), True),
        (C1000, 128, False, dict(window=(300, -1)), False),
        (("q130-k257", 1, 130, 257, 2, 2, BF16, False), 128, False, dict(window=(64, 0)), False),
        (("q300-k200", 1, 300, 200, 2, 2, BF16, False), 128, False, dict(window=(50, 150)), False),
        (("q300-k200", 1, 300, 200, 2, 2, BF16, False), 128, False, dict(window=(50, 50)), False),  # refused
        (("2x1024", 2, 1024, 1024, 4, 2, BF16, False), 128, False, dict(window=(0, 0)), False),
        (("4K", 1, 4096, 4096, 2, 2, BF16, False), 128, True, dict(window=(1024, -1)), False),  # causal: (1024, 0)
        (C2K, 128, False, dict(window=(256, 0), sink=True), False),
        (C2K, 64, False, dict(window=(256, 0)), False),
    ],
    "feat:combo": [
        (GQA2K, 128, False, COMBO, True),
        (("gqa-q1000-k1200", 1, 1000, 1200, 8, 2, BF16, False), 128, False,
         dict(window=(200, 100), softcap=30.0, alibi="bh", sink=True), False),
        (GQA2K, 64, False, COMBO, False),
        (GQA2K, 256, False, COMBO, True),
        (C1000, 256, False, dict(softcap=30.0), False),
        (C2K, 256, False, dict(window=(256, 0)), False),
        (C1000, 256, True, dict(sink=True, alibi="h"), False),
        (("b2-tail-q300-k1000", 2, 300, 1000, 8, 2, BF16, False), 128, False,
         dict(window=(200, 100), softcap=30.0, alibi="bh", sink=True), False),  # ragged descriptors + features
    ],
    # ALiBi's key-block split (kernels/gluon_fwd.py: unmasked blocks left of every row's diagonal, crossed by one,
    # right of all): q == k / q < k / q > k (every block right of the first rows' diagonals), causal both,
    # (H,) and (B, H) slopes (16 heads: slopes 2^-0.5 .. 2^-8, so far keys still count), D64 / D128 / D256
    # (BLOCK_N 64), windows whose full blocks lie on either side, softcap and sinks on the split path.
    "feat:alibi": [
        (("4K-h16", 1, 4096, 4096, 16, 16, BF16, False), 128, False, dict(alibi="h"), True),
        (("4K-h16", 1, 4096, 4096, 16, 16, BF16, False), 128, True, dict(alibi="h"), False),
        (("b2-q1000-k300", 2, 1000, 300, 8, 2, BF16, False), 128, False, dict(alibi="bh"), True),
        (("b2-q300-k2000", 2, 300, 2000, 8, 8, BF16, False), 128, False, dict(alibi="bh"), False),
        (("q1000-k3000", 1, 1000, 3000, 16, 4, BF16, False), 128, True, dict(alibi="h"), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 64, False, dict(alibi="bh"), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 256, False, dict(alibi="h"), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 256, True, dict(alibi="bh"), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 128, False, dict(alibi="bh", softcap=30.0), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 128, False, dict(alibi="h", sink=True), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 128, False, dict(window=(300, -1), alibi="h"), False),
        (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), 128, False, dict(window=(512, 700), alibi="bh"), False),
        (("q1000-k1300-h16", 1, 1000, 1300, 16, 8, BF16, False), 128, False, dict(window=(256, 0), alibi="h"),
         False),
        (("fp16-q777-k999-h16", 1, 777, 999, 16, 16, torch.float16, False), 128, False, dict(alibi="h"), False),
    ],
    # Additive bias (HAS_BIAS: a TMA-loaded ring beside K / V): (1, H) / (B, 1) / (B, H) / expanded layouts, fp16
    # bias with bf16 q, causal, GQA, odd lengths and q != k (tile rows past Sq read the next head's bias rows),
    # ragged batches, D64 / D128 / D256, with softcap / ALiBi / windows / sinks; fp32 and Sq-broadcast biases are
    # refused and checked through the dispatcher (the portable kernel). Two groups (each child has 240 s of compiles).
    "feat:bias": [
        (C1000, 128, False, dict(bias=("h", "bf16")), True),
        (C1000, 128, True, dict(bias=("h", "bf16")), False),
        (("b2-1024", 2, 1024, 1024, 4, 4, BF16, False), 128, False, dict(bias=("b", "bf16")), False),
        (("b2-q300-k1000", 2, 300, 1000, 8, 2, BF16, False), 128, True, dict(bias=("bh", "bf16")), False),
        (("gqa-q777-k999", 1, 777, 999, 8, 2, BF16, False), 128, False, dict(bias=("bh", "fp16")), True),
        (("b3-q130-k257", 3, 130, 257, 4, 2, BF16, False), 128, False, dict(bias=("expanded", "bf16")), False),
        (("q1000-k300", 1, 1000, 300, 4, 4, BF16, False), 128, False, dict(bias=("h", "bf16")), False),
        (C1000, 128, False, dict(bias=("h", "fp32")), True),  # refused: fp32 (the dispatcher's portable answer)
        (C1000, 128, True, dict(bias=("q1", "bf16")), False),  # refused: Sq broadcast
    ],
    "feat:bias-mix": [
        (C1000, 64, True, dict(bias=("bh", "bf16")), False),
        (GQA2K, 64, False, dict(bias=("h", "bf16"), softcap=30.0), False),
        (C1000, 256, False, dict(bias=("h", "bf16")), False),
        (C1000, 256, True, dict(bias=("h", "bf16"), alibi="h", sink=True), False),
        (C1000, 128, False, dict(bias=("h", "bf16"), softcap=30.0), False),
        (C1000, 128, True, dict(bias=("bh", "bf16"), alibi="bh"), False),
        (("4K-h16", 1, 4096, 4096, 16, 16, BF16, False), 128, False, dict(bias=("h", "bf16"), alibi="h"), False),
        (C2K, 128, False, dict(bias=("h", "bf16"), window=(256, 0)), False),
        (("gqa-q1000-k1200", 1, 1000, 1200, 8, 2, BF16, False), 128, False,
         dict(bias=("bh", "bf16"), window=(200, 100), softcap=30.0, alibi="bh", sink=True), False),
        (C1000, 128, False, dict(bias=("h", "bf16"), sink=True), False),
        (("fp16-1000", 1, 1000, 1000, 4, 2, torch.float16, False), 128, True, dict(bias=("h", "fp16")), False),
    ],
}
BACKWARD_FEATURES = dict(window=(256, 0), softcap=30.0, alibi="h", sink=True)
# A variant with another tile height (GluonConfig.consumers != 2: BLOCK_M 192) changes the grid, the causal block
# ranges, the tails and the varlen early exit, so it runs every CASE (not the short list), these score features
# (its consumers share the default's score code) and VARLEN_CASES at its head dims; the bias cases and ALiBi with
# softcap are served by the default config (gluon_variants.takes_config).
TILE_FEATURE_CASES = [
    (C1000, False, dict(softcap=30.0)),
    (C1000, True, dict(softcap=30.0)),
    (("q130-k257", 1, 130, 257, 2, 2, BF16, False), True, dict(alibi="h", sink=True)),
    (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), False, dict(alibi="bh")),
    (("2K-h16", 1, 2048, 2048, 16, 16, BF16, False), True, dict(alibi="h")),
    (C2K, False, dict(window=(256, 0))),
    (C1000, False, dict(window=(100, 50))),
    (("q300-k200", 1, 300, 200, 2, 2, BF16, False), False, dict(window=(50, 150))),
    (GQA2K, False, COMBO),
    (("b2-tail-q300-k1000", 2, 300, 1000, 8, 2, BF16, False), False,
     dict(window=(200, 100), softcap=30.0, alibi="bh", sink=True)),
    (C1000, True, dict(sink=True)),
    (C1000, True, dict(bias=("h", "bf16"))),  # the default config serves it
]


def check_case(case, head_dim, causal, variant, spec=None, compare_triton=None):
    """One forward case (spec: score features, see feature_args): PASS / FAIL / SKIP line; returns True unless
    it failed. compare_triton: also run the portable forward (default: on SHORT_CASES)."""
    name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype, packed = case
    spec = spec or {}
    label = (f"d{head_dim} {'causal' if causal else 'full  '} {name:<16} B{batch} Sq{seqlen_q} Sk{seqlen_k} "
             f"H{heads_q}/{heads_kv} {str(dtype)[6:]} {describe(spec)} [{variant}]")
    q, k, v = make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, packed)
    feats = feature_args(spec, batch, heads_q, seqlen_q, seqlen_k)
    # Every row must see a key: causal needs Sq <= Sk, a window's right side Sq - Sk <= right.
    right = 0 if causal else feats["window_size"][1]
    expect_supported = not (right >= 0 and seqlen_q - seqlen_k > right) and not bias_refused(spec)
    supported = gluon_launch.gluon_supported(q, k, v, causal=causal, **feats)
    scale = head_dim ** -0.5
    if not supported:
        tag = "SKIP" if not expect_supported else "FAIL"
        say(f"{tag} {label}: gluon_supported() is False ({'expected' if not expect_supported else 'UNEXPECTED'})")
        if not (expect_supported is False and bias_refused(spec)):
            return expect_supported is False
        # A refused bias layout: the dispatcher must still answer correctly (the portable kernel); graded below.
        label += " [refused: dispatcher]"
        out, lse = dispatched_forward(q, k, v, scale, causal, **feats)
    elif not expect_supported:
        say(f"FAIL {label}: gluon_supported() is True for a case it must refuse")
        return False
    else:
        out, lse = gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant, **feats)
    torch.cuda.synchronize()
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, **feats)
    low_out = attention_ref(q, k, v, causal=causal, softmax_scale=scale, upcast=False, **feats)
    # The portable kernel's error for comparison, on a few cases only (each seqlen class is another compile).
    if compare_triton is None:
        compare_triton = name in SHORT_CASES
    tri_out, tri_lse = triton_forward(q, k, v, scale, causal, **feats) if compare_triton else (None, None)
    problems = []
    if out.shape != q.shape or out.dtype != q.dtype or lse.shape != (batch, heads_q, seqlen_q):
        problems.append(f"shapes out {tuple(out.shape)} {out.dtype} lse {tuple(lse.shape)}")
    n_nan, n_inf = torch.isnan(out).sum().item(), torch.isinf(out).sum().item()
    l_nan, l_inf = torch.isnan(lse).sum().item(), torch.isinf(lse).sum().item()
    if n_nan or n_inf or l_nan or l_inf:
        problems.append(f"non-finite: out NaN {n_nan} Inf {n_inf}, lse NaN {l_nan} Inf {l_inf} "
                        "(NaN = unwritten, outputs are poisoned)")
    err = max_err(out, ref_out)
    err_low = max_err(low_out, ref_out)
    err_tri = max_err(tri_out, ref_out) if tri_out is not None else float("nan")
    floor = max_err(ref_out.to(dtype), ref_out) + ABS_FLOOR[dtype]
    bound = 2 * err_low + floor
    if not err <= bound:
        problems.append(f"out error {err:.3g} > bound {bound:.3g}")
    lse_err = max_err(lse, ref_lse)
    lse_bound = LSE_ATOL + LSE_RTOL * ref_lse.abs().max().item()
    if not lse_err <= lse_bound:
        problems.append(f"lse error {lse_err:.3g} > {lse_bound:.3g}")
    if problems:
        # Where the error is: helps tell a tail / mask / pipeline-phase bug apart.
        diff = (out.double() - ref_out.double()).abs().nan_to_num(nan=1e9).amax(dim=(0, 2, 3))  # [Sq]
        bad_rows = torch.nonzero(diff > bound).flatten().tolist()
        where = f" bad query rows: {len(bad_rows)} first {bad_rows[:8]}" if bad_rows else ""
        say(f"FAIL {label}: {'; '.join(problems)}{where} | torch-lowp err {err_low:.3g}, triton err {err_tri:.3g}")
        return False
    say(f"PASS {label}: out err {err:.2e} (bound {bound:.2e}; torch-lowp {err_low:.2e}, triton {err_tri:.2e}) "
        f"lse err {lse_err:.2e} (triton {max_err(tri_lse, ref_lse) if tri_lse is not None else float('nan'):.2e})")
    return True


def check_backward(head_dim, causal, spec=None):
    """flash_attn_func with FLASHTILE_GLUON=1: the Gluon forward's out / lse feed the existing backward (with a
    sink in spec, its gradient too: it is computed from lse, which includes the sink)."""
    import flashtile
    spec = spec or {}
    batch, seqlen, heads_q, heads_kv, dtype = 1, 1000, 4, 2, torch.bfloat16
    label = (f"d{head_dim} {'causal' if causal else 'full  '} backward-on-gluon-fwd B{batch} S{seqlen} "
             f"H{heads_q}/{heads_kv} {describe(spec)}")
    q, k, v = [t.requires_grad_() for t in make_inputs(batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype)]
    feats = feature_args(spec, batch, heads_q)
    leaves = [q, k, v]
    if feats.get("sink") is not None:
        feats["sink"].requires_grad_()
        leaves.append(feats["sink"])
    dout = torch.randn_like(q)
    calls = []
    original = gluon_launch.gluon_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    gluon_launch.gluon_forward = counting
    os.environ["FLASHTILE_GLUON"] = "1"
    try:
        out = flashtile.flash_attn_func(q, k, v, causal=causal, **feats)
        grads = torch.autograd.grad(out, leaves, dout)
    finally:
        os.environ["FLASHTILE_GLUON"] = "0"
        gluon_launch.gluon_forward = original
    if not calls:
        say(f"FAIL {label}: FLASHTILE_GLUON=1 did not route the forward to the Gluon kernel")
        return False
    refs = []
    for upcast in (True, False):
        ref_leaves = [x.detach().clone().requires_grad_() for x in leaves]
        ref_feats = dict(feats)
        if len(ref_leaves) == 4:
            ref_feats["sink"] = ref_leaves[3]
        o = attention_ref(*ref_leaves[:3], causal=causal, upcast=upcast, **ref_feats)
        refs.append((o.detach(), *torch.autograd.grad(o, ref_leaves, dout.to(o.dtype))))
    ok, parts = True, []
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv", "dsink"), (out, *grads), *refs):
        err, err_low = max_err(got, r64), max_err(rlow, r64)
        bound = 2 * err_low + max_err(r64.to(dtype), r64) + ABS_FLOOR[dtype]
        finite = torch.isfinite(got).all().item()
        ok &= finite and err <= bound
        parts.append(f"{name} {err:.2e}/{bound:.2e}{'' if finite else ' NON-FINITE'}")
    say(f"{'PASS' if ok else 'FAIL'} {label}: err/bound {', '.join(parts)}")
    return ok


def phase_smoke(variants):
    ok = True
    for variant in variants[:1]:
        for head_dim in (64, 128, 256):
            say(f"INFO smoke d{head_dim} [{variant}] launching (a hang here = deadlock)")
            ok &= bool(guarded(check_case, SMOKE, head_dim, False, variant, what=f"smoke d{head_dim} [{variant}]"))
    return ok


def phase_correct(variants, head_dim, causal):
    """One (head_dim, causal) group: every case for the first variant, the short list for the others (the
    variants that cover this head dim)."""
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    variants = [v for v in variants if head_dim in gluon_variants.VARIANTS[v]]
    for variant in variants:
        persistent = gluon_variants.VARIANTS[variant][head_dim].persistent
        tile = gluon_variants.VARIANTS[variant][head_dim].consumers != 2  # another BLOCK_M: every case
        for case in CASES + (PERSISTENT_CASES if persistent else []):
            if (variant != variants[0] and not tile and case[0] not in SHORT_CASES
                    and not case[0].startswith("p-")):
                continue
            what = f"d{head_dim} causal={causal} {case[0]} [{variant}]"
            ok = guarded(check_case, case, head_dim, causal, variant, what=what)
            passed, failed = passed + bool(ok), failed + (not ok)
        if tile and variant != "default":
            jobs = [(check_case, (case, head_dim, causal, variant, spec, False))
                    for case, c, spec in TILE_FEATURE_CASES if c == causal]
            jobs += [(check_varlen_case, (case, head_dim, causal, None, None, variant)) for case in VARLEN_CASES]
            if not causal:
                jobs += [(check_varlen_case, (VARLEN_CASES[0], head_dim, False, p, None, variant))
                         for p in ("next", "tail")]
                jobs += [(check_varlen_case, (VARLEN_CASES[0], head_dim, False, None,
                                              dict(window=(64, 0), softcap=30.0, alibi="bh", sink=True), variant))]
            for fn, job in jobs:
                ok = guarded(fn, *job, what=f"d{head_dim} causal={causal} {fn.__name__} {job[0][0]} [{variant}]")
                passed, failed = passed + bool(ok), failed + (not ok)
    ok = guarded(check_backward, head_dim, causal, what=f"backward d{head_dim} causal={causal}")
    passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO correctness d{head_dim} {'causal' if causal else 'full'}: {passed} passed, {failed} failed")
    return failed == 0


def phase_features(group):
    """One group of FEATURE_CASES with the default variant; feat:combo adds the backward on a feature forward."""
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    for case, head_dim, causal, spec, compare in FEATURE_CASES[group]:
        what = f"d{head_dim} causal={causal} {case[0]} {describe(spec)}"
        say(f"INFO {group}: {what} launching")
        ok = guarded(check_case, case, head_dim, causal, "default", spec, compare, what=what)
        passed, failed = passed + bool(ok), failed + (not ok)
    if group == "feat:combo":
        ok = guarded(check_backward, 128, False, BACKWARD_FEATURES, what=f"backward d128 {describe(BACKWARD_FEATURES)}")
        passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO correctness {group}: {passed} passed, {failed} failed")
    return failed == 0


def phase_bench(variants, seqlens, head_dims, causal_modes="both"):
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import flashtile
    for head_dim, causal, seqlen, batch, heads, tflop in bench_shapes(head_dims, seqlens, causal_modes):
        q, k, v = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
        scale = head_dim ** -0.5
        providers = {}
        # A variant with max_ctas (a grid capped to check the persistent kernel's phases) is not timed.
        for variant in [v for v in variants if head_dim in gluon_variants.VARIANTS[v]
                        and not gluon_variants.VARIANTS[v][head_dim].max_ctas]:
            providers[f"gluon[{variant}]"] = (
                lambda variant=variant: gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant))
        providers["flashtile-triton"] = lambda: flashtile.flash_attn_func(q, k, v, causal=causal)
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # as flashtile.bench does

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        providers["sdpa-cudnn"] = cudnn
        time_providers(providers, tflop, shape_label(head_dim, causal, seqlen, batch, heads))



def phase_bench_features(feature_variants=(), head_dims=(128, 64, 256)):
    """D128, 8K, B 2, H 16, bf16: each score feature's forward time, Gluon (default variant) against the portable
    kernel, as a ratio to the plain Gluon time (issue 6: each feature <= 1.10x plain) and, for windows, per unit of
    work (time ratio / the fraction of the score matrix the window keeps); cuDNN plain / causal for scale.
    feature_variants: instead, variant_feature_times of these variants at head_dims (8K tokens, hidden 2048)."""
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    batch, seqlen, heads, head_dim = 2, 8192, 16, 128
    q, k, v = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    scale = head_dim ** -0.5
    if feature_variants:
        # At D64 half the matmul work per score, so MUFU weighs twice as much; D256's one-tile kernel serves all its
        # feature calls.
        for dim in head_dims:
            variant_feature_times(*make_inputs(batch, seqlen, seqlen, heads * 128 // dim, heads * 128 // dim, dim,
                                               torch.bfloat16)[:3], dim ** -0.5, feature_variants)
        return
    full = seqlen * seqlen

    def window_work(left):  # visible (row, key) pairs of a bottom-right window (left, 0) over a square matrix
        return sum(min(i, left) + 1 for i in range(seqlen))

    rows = [("plain", False, {}, 1.0), ("causal", True, {}, window_work(seqlen) / full),
            ("softcap30", False, dict(softcap=30.0), 1.0), ("alibi", False, dict(alibi="h"), 1.0),
            ("sink", False, dict(sink=True), 1.0)]
    rows += [(f"win{w},0", False, dict(window=(w, 0)), window_work(w) / full) for w in (256, 1024, 4096)]
    rows += [("win1024+cap+alibi", False, dict(window=(1024, 0), softcap=30.0, alibi="h"), window_work(1024) / full)]
    # Causal features against the causal plain time (the "causal" row), work 1.
    rows += [("causal+softcap30", True, dict(softcap=30.0), 1.0), ("causal+alibi", True, dict(alibi="h"), 1.0),
             ("alibi-bh", False, dict(alibi="bh"), 1.0)]
    # Issue 6's bias: (1, 16, 8K, 8K) bf16 (the Gluon ring), and the same bias as fp32 (the portable kernel).
    rows += [("bias", False, dict(bias=("h", "bf16")), 1.0), ("causal+bias", True, dict(bias=("h", "bf16")), 1.0),
             ("bias-fp32", False, dict(bias=("h", "fp32")), 1.0)]
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for causal in (False, True):
        def cudnn(causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        try:
            say(f"TIME feat d128 S{seqlen} B{batch} H{heads} sdpa-cudnn {'causal' if causal else 'plain'}"
                f" {_ms(cudnn):8.3f} ms")
        except Exception as exc:  # noqa: BLE001
            say(f"ERROR time feat cudnn causal={causal}: {type(exc).__name__}: {exc}")
    plain_ms = causal_ms = None
    for name, causal, spec, work in rows:
        feats = feature_args(spec, batch, heads, seqlen, seqlen)
        times = {}
        # A refused bias (fp32): the dispatcher's answer (the portable kernel) in the gluon column.
        gluon_fn = dispatched_forward if bias_refused(spec) else gluon_launch.gluon_forward
        for provider, fn in (
                ("gluon", lambda: gluon_fn(q, k, v, scale, causal, **feats)),
                ("triton", lambda: triton_forward(q, k, v, scale, causal, **feats))):
            try:
                times[provider] = _ms(fn)
            except Exception as exc:  # noqa: BLE001
                say(f"ERROR time feat {name} {provider}: {type(exc).__name__}: {exc}")
        if name == "plain":
            plain_ms = times.get("gluon")
        if name == "causal":
            causal_ms = times.get("gluon")
        g, t = times.get("gluon", float("nan")), times.get("triton", float("nan"))
        base_ms, base_name = (causal_ms, "causal") if name.startswith("causal+") else (plain_ms, "plain")
        rel = g / base_ms if base_ms else float("nan")
        say(f"TIME feat d128 S{seqlen} B{batch} H{heads} {name:<18} gluon {g:8.3f} ms  triton {t:8.3f} ms  "
            f"gluon/triton {g / t:.2f}  gluon/{base_name}-gluon {rel:.2f}x  work {work:.3f}  per-work {rel / work:.2f}x"
            f"{'  OVER 1.10' if rel / work > 1.10 else ''}")


VARIANT_FEATURE_ROWS = (("plain", False, {}), ("causal", True, {}), ("softcap30", False, dict(softcap=30.0)),
                        ("causal+softcap30", True, dict(softcap=30.0)), ("bias", False, dict(bias=("h", "bf16"))),
                        ("causal+bias", True, dict(bias=("h", "bf16"))), ("alibi", False, dict(alibi="h")),
                        ("causal+alibi", True, dict(alibi="h")), ("sink", False, dict(sink=True)),
                        ("win4096+softcap30", False, dict(window=(4096, 0), softcap=30.0)))


def variant_feature_times(q, k, v, scale, feature_variants, rounds=2):
    """Plain / causal / softcap 30 / causal softcap 30 / bias (1, H, S, S) bf16 / causal bias / ALiBi / causal ALiBi /
    sink / a 4096-key window with softcap 30 (Gemma 2's local layers) with each variant that has a config at q's head
    dim, as ratios to the first one's plain or causal time: what a variant does to the feature costs.
    Each row is timed with every variant in turn, `rounds` times, the order reversed every other round (A B, B A, ...),
    and the rounds' mean reported: the clocks drift over a run (the 700 W cap), and when each variant ran all its rows
    after the other, the second-timed one ran 5-18 % slower or faster than like against like (sessions 31 and 32)."""
    batch, _, heads, head_dim = q.shape
    names = [v_ for v_ in feature_variants if head_dim in gluon_variants.VARIANTS[v_]]
    times = {}  # (variant, row name) -> [ms per round]
    for name, causal, spec in VARIANT_FEATURE_ROWS:
        feats = feature_args(spec, batch, heads, q.shape[1], k.shape[1])
        failed = set()
        for round_ in range(rounds):
            for variant in names if round_ % 2 == 0 else names[::-1]:
                if variant in failed:
                    continue
                try:
                    ms = _ms(functools.partial(gluon_launch.gluon_forward, q, k, v, scale, causal, variant=variant,
                                               **feats))
                except Exception as exc:  # noqa: BLE001
                    say(f"ERROR time feat {name} [{variant}]: {type(exc).__name__}: {exc}")
                    failed.add(variant)
                    continue
                times.setdefault((variant, name), []).append(ms)
    base = {causal: statistics.mean(times[(names[0], name)]) for name, causal, spec in VARIANT_FEATURE_ROWS[:2]
            if (names[0], name) in times}
    for variant in names:
        for name, causal, _ in VARIANT_FEATURE_ROWS:
            if (variant, name) not in times:
                continue
            ms = statistics.mean(times[(variant, name)])
            ref = base.get(causal)
            each = " / ".join(f"{t:.3f}" for t in times[(variant, name)])
            say(f"TIME feat-variant d{head_dim} S{q.shape[1]} B{batch} H{heads} {name:<17} [{variant:<20}] "
                f"{ms:8.3f} ms  / {names[0]} {'causal' if causal else 'plain '} "
                f"{ms / ref if ref else float('nan'):.3f}x  (rounds {each})")


def _phase_of(group, phase):
    """Correct-phase groups that are features ("feat:...") or varlen run their own phase."""
    if group is not None and group.startswith("feat:"):
        return "features"
    return "varlen" if group == "varlen" else phase


def _children(phase, args, timeout, groups=(None, )):
    argv = ["--variants", args.variants, "--seqlens", args.seqlens, "--bench-dims", args.bench_dims,
            "--feature-variants", args.feature_variants, "--feature-dims", args.feature_dims,
            "--bench-causal", args.bench_causal]
    return run_children(__file__, phase, argv, timeout, groups, _phase_of)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default,no-pingpong,bn64,stages3,d256-bn64s1,d256-bn32s4",
                        help=f"comma list of {sorted(gluon_variants.VARIANTS)} (each runs where it has a config)")
    parser.add_argument("--seqlens", default="4096,16384", help="bench sequence lengths")
    parser.add_argument("--bench-causal", default="both", choices=["both", "0", "1"],
                        help="bench shapes: full and causal, full only (0) or causal only (1)")
    parser.add_argument("--bench-dims", default="64,128,256", help="bench head dims")
    parser.add_argument("--phase", default="all",
                        choices=["all", "smoke", "correct", "features", "varlen", "bench", "bench-features",
                                 "bench-varlen"])
    parser.add_argument("--group", default="", help="correct phase: HEAD_DIM:CAUSAL, e.g. 128:1; features: a "
                        f"FEATURE_CASES key {list(FEATURE_CASES)}")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-features", action="store_true", help="no feature correctness cases")
    parser.add_argument("--bench-features", action="store_true", help="also time each score feature (D128 8K)")
    parser.add_argument("--skip-varlen", action="store_true", help="no varlen correctness child")
    parser.add_argument("--bench-varlen", action="store_true", help="also time varlen against dense (16K tokens)")
    parser.add_argument("--correct-groups", default="", help="only these correct-phase groups (comma list of "
                        "HEAD_DIM:CAUSAL, FEATURE_CASES keys, varlen)")
    parser.add_argument("--tile-overhead", type=float, default=None, help="with --phase bench only: the listed "
                        "persistent orders' cost model, a tile's fixed cost in key blocks "
                        "(persistent_schedule.TILE_OVERHEAD)")
    parser.add_argument("--feature-dims", default="128,64,256", help="with --feature-variants: the head dims")
    parser.add_argument("--feature-variants", default="", help="with --bench-features: time ten feature rows with "
                        "these variants in the listed order, as ratios to the first one's plain / causal time, "
                        "instead of every feature against the portable kernel (the correct phase checks them)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    feature_variants = [v for v in args.feature_variants.split(",") if v]
    seqlens = [int(s) for s in args.seqlens.split(",")]
    if args.phase == "smoke":
        sys.exit(0 if phase_smoke(variants) else 1)
    if args.phase == "correct":
        head_dim, causal = args.group.split(":")
        checked = variants + [v for v in feature_variants if v not in variants]
        sys.exit(0 if phase_correct(checked, int(head_dim), causal == "1") else 1)
    if args.phase == "features":
        sys.exit(0 if phase_features(args.group) else 1)
    if args.phase == "bench":
        if args.tile_overhead is not None:  # before any launch: lists are built once per shape and kept
            persistent_schedule.TILE_OVERHEAD = args.tile_overhead
            say(f"INFO TILE_OVERHEAD {args.tile_overhead}")
        phase_bench(variants, seqlens, [int(d) for d in args.bench_dims.split(",")], args.bench_causal)
        return
    if args.phase == "bench-features":
        phase_bench_features(feature_variants, [int(d) for d in args.feature_dims.split(",")])
        return
    if args.phase == "varlen":
        sys.exit(0 if phase_varlen() else 1)
    if args.phase == "bench-varlen":
        phase_bench_varlen()
        return
    say(f"INFO torch {torch.__version__} triton {triton.__version__} "
        f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'} "
        f"gluon import error: {gluon_launch.GLUON_IMPORT_ERROR}")
    start = time.time()
    if not _children("smoke", args, 120):
        say("FAIL smoke failed: skipping the remaining Gluon phases")
        return
    groups = ["64:0", "64:1", "128:0", "128:1", "256:0", "256:1"]
    if not args.skip_features:
        groups += list(FEATURE_CASES)
    if not args.skip_varlen:
        groups.append("varlen")
    if args.correct_groups:
        groups = [g for g in groups if g in args.correct_groups.split(",")]
    # Plain groups run the correct phase, feature groups the features phase: both in one concurrent batch.
    _children("correct", args, 240, groups=groups)
    if not args.skip_bench:
        _children("bench", args, 240)
    if args.bench_features:
        _children("bench-features", args, 420 if args.feature_variants else 180)  # 9 rows x head dims x variants
    if args.bench_varlen:
        _children("bench-varlen", args, 150)
    say(f"INFO total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
