"""Check and time the Hopper Gluon backward on the GPU, in one self-diagnosing run (target < 150 s).

    PYTHONPATH=src python3 benchmarks/gluon_bwd_check.py [--variants default,stages3,dq-keys,dq-split]
        [--bench-dims 128,64] [--seqlens 1024,4096,16384] [--skip-bench]

Phases, each in child processes with a time limit (a kernel that deadlocks on an mbarrier hangs forever; killing
the child frees the GPU and the run goes on to report it):
  smoke    one tiny case per head dim (128, 64), default variant: does it launch, finish and match?
  correct  one child per head dim x causal, concurrently: 1K, 4K, odd lengths (1000, 130 x 257 and 257 x 130 with
           Sq != Sk), GQA / MQA, batch > 1 with odd lengths, fp16; dq / dk / dv NaN-poisoned against the float64
           reference with DESIGN.md's rule (<= 2 x the plain low-precision PyTorch error + rounding floor), the
           portable backward's error alongside; then flash_attn_func with FLASHTILE_GLUON_BWD=1 (the dispatch).
           Variants after the first get a shorter list; a variant runs only at the head dims it covers.
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

from flashtile import gluon_bwd_launch, launch  # noqa: E402
from flashtile.reference import attention_ref  # noqa: E402
from gpu_check import (ABS_FLOOR, bench_shapes, guarded, max_err, run_children, say, shape_label,  # noqa: E402  (this folder)
                       time_providers)

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
    return launch._flash_attn_backward(dout, q, k, v, out, lse, None, scale, -1, 0 if causal else -1, 0.0, None)[:3]


def references(q, k, v, dout, scale, causal):
    """(dq, dk, dv) in float64 and in plain low-precision PyTorch."""
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = attention_ref(*leaves, causal=causal, softmax_scale=scale, upcast=upcast)
        results.append(torch.autograd.grad(o, leaves, dout.to(o.dtype)))
    return results


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
    ok, parts, where = True, [], ""
    for gname, got, r64, rlow, pt, like in zip(("dq", "dk", "dv"), grads, ref64, reflow, port, (q, k, v)):
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
            # Which rows: tells a tail / mask / ring-phase bug apart.
            diff = (got.double() - r64.double()).abs().nan_to_num(nan=1e9).amax(dim=(0, 2, 3))  # [S]
            bad = torch.nonzero(diff > bound).flatten().tolist()
            where = f" | {gname} bad rows {len(bad)} of {diff.numel()}, first {bad[:8]}"
    say(f"{'PASS' if ok else 'FAIL'} {label}: err/bound {', '.join(parts)}{where}")
    return ok


def check_dispatch(head_dim, causal):
    """flash_attn_func with FLASHTILE_GLUON_BWD=1 routes the backward to the Gluon kernel and matches."""
    import flashtile
    q, k, v, dout = make_inputs(2, 1000, 1000, 4, 2, head_dim, BF16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    calls = []
    original = gluon_bwd_launch.gluon_backward
    gluon_bwd_launch.gluon_backward = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    try:
        grads = torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    finally:
        os.environ["FLASHTILE_GLUON_BWD"] = "0"
        gluon_bwd_launch.gluon_backward = original
    ref64, reflow = references(q, k, v, dout, head_dim ** -0.5, causal)
    ok = bool(calls)
    parts = []
    for gname, got, r64, rlow in zip(("dq", "dk", "dv"), grads, ref64, reflow):
        err, bound = max_err(got, r64), 2 * max_err(rlow, r64) + max_err(r64.to(BF16), r64) + ABS_FLOOR[BF16]
        ok &= bool(torch.isfinite(got).all().item()) and err <= bound
        parts.append(f"{gname} {err:.2e}/{bound:.2e}")
    say(f"{'PASS' if ok else 'FAIL'} d{head_dim} {'causal' if causal else 'full  '} flash_attn_func dispatch "
        f"(FLASHTILE_GLUON_BWD=1, gluon called: {bool(calls)}): {', '.join(parts)}")
    return ok


def phase_smoke(variants):
    ok = True
    for head_dim in (128, 64):
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


def phase_bench(variants, seqlens, head_dims):
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for head_dim, causal, seqlen, batch, heads, tflop in bench_shapes(head_dims, seqlens):
        q, k, v, dout = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, BF16)
        scale = head_dim ** -0.5
        out, lse = forward(q, k, v, scale, causal)
        providers = {}
        for variant in [v for v in variants if head_dim in gluon_bwd_launch.VARIANTS[v]]:
            providers[f"gluon[{variant}]"] = (
                lambda variant=variant: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal,
                                                                        variant=variant))
        providers["flashtile-triton"] = lambda: portable_backward(dout, q, k, v, out, lse, scale, causal)
        qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2).contiguous()
        providers["sdpa-cudnn"] = lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
        # The backward does 2.5 times a forward's work.
        time_providers(providers, 2.5 * tflop, shape_label(head_dim, causal, seqlen, batch, heads), no_grad=False)


def _children(phase, args, timeout, groups=(None, )):
    argv = ["--variants", args.variants, "--seqlens", args.seqlens, "--bench-dims", args.bench_dims]
    return run_children(__file__, phase, argv, timeout, groups)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default,stages3,dq-keys,dq-split",
                        help=f"comma list of {sorted(gluon_bwd_launch.VARIANTS)} (each runs where it has a config)")
    parser.add_argument("--seqlens", default="1024,4096,16384", help="bench sequence lengths")
    parser.add_argument("--bench-dims", default="128,64", help="bench head dims")
    parser.add_argument("--phase", default="all", choices=["all", "smoke", "correct", "bench"])
    parser.add_argument("--group", default="", help="correct phase: HEAD_DIM:CAUSAL, e.g. 128:1")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if args.phase == "smoke":
        sys.exit(0 if phase_smoke(variants) else 1)
    if args.phase == "correct":
        head_dim, causal = args.group.split(":")
        sys.exit(0 if phase_correct(variants, int(head_dim), causal == "1") else 1)
    if args.phase == "bench":
        phase_bench(variants, [int(s) for s in args.seqlens.split(",")], [int(d) for d in args.bench_dims.split(",")])
        return
    say(f"INFO torch {torch.__version__} triton {triton.__version__} "
        f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'} "
        f"gluon import error: {gluon_bwd_launch.GLUON_BWD_IMPORT_ERROR}")
    start = time.time()
    if not _children("smoke", args, 90):
        say("FAIL smoke failed: skipping the remaining phases")
        return
    _children("correct", args, 150, groups=["128:0", "128:1", "64:0", "64:1"])
    if not args.skip_bench:
        _children("bench", args, 200)
    say(f"INFO total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
