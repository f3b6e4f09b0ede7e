"""Check and time the Hopper Gluon forward on the GPU, in one self-diagnosing run (target < 90 s).

    PYTHONPATH=src python3 benchmarks/gluon_check.py [--variants default,no-pingpong,bn64,stages3]

Phases, each in a child process with a time limit (a kernel that deadlocks on an mbarrier hangs forever;
killing the child frees the GPU and the run goes on to report it):
  smoke    one tiny case per head dim: does it launch, finish and match?
  correct  four children at once, one per head dim (64, 128) x causal: seqlens 1K, 4K, odd (1000,
           130 x 257), GQA/MQA with q < k (causal aligned bottom-right), 1 x 1, strided q/k/v (a packed qkv
           tensor), fp16; NaN-poisoned outputs; O against the float64 reference with DESIGN.md's rule (<= 2 x
           the plain bf16 PyTorch error + rounding floor), with the portable Triton forward's error on a few
           cases for comparison; lse (natural log, (B, Hq, Sq)) against the float64 one. Then the existing
           backward run on the Gluon forward's out / lse (FLASHTILE_GLUON=1 through flash_attn_func), checked
           the same way. Variants after the first get a shorter list.
  bench    16K tokens, hidden 2048 (B = 16384 / S, H = 2048 / D), S 4096 / 16384, D 64 / 128, causal both:
           TFLOP/s (4 B H S^2 D, halved when causal; median of do_bench) of each Gluon variant, the flashtile
           Triton forward and SDPA cuDNN, and the ratios.
Every line starts with PASS / FAIL / SKIP / ERROR / TIME / INFO so the log greps well.
"""
import argparse
import os
import subprocess
import sys
import time
import traceback

os.environ["FLASHTILE_GLUON"] = "0"  # the portable path, except where a check routes to Gluon

import torch  # noqa: E402
import triton  # noqa: E402

from flashtile import gluon_launch, launch  # noqa: E402
from flashtile.reference import attention_ref  # noqa: E402

ABS_FLOOR = {torch.float16: 1e-5, torch.bfloat16: 1e-4}
LSE_ATOL, LSE_RTOL = 2e-3, 1e-4


def say(*parts):
    print(*parts, flush=True)


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item()


def make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, packed=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if packed:  # q, k, v as views of one (B, S, 3, H, D) tensor: row stride 3 * H * D
        qkv = torch.randn(batch, seqlen_q, 3, heads_q, head_dim, generator=gen, device="cuda").to(dtype)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return [torch.randn(b, s, h, head_dim, generator=gen, device="cuda").to(dtype)
            for b, s, h in ((batch, seqlen_q, heads_q), (batch, seqlen_k, heads_kv), (batch, seqlen_k, heads_kv))]


def triton_forward(q, k, v, scale, causal):
    return launch._flash_attn_forward(q, k, v, scale, -1, 0 if causal else -1, 0.0, None, None)


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
    ("batch-tail-2x1000", 2, 1000, 1000, 4, 4, torch.bfloat16, False),  # unsupported: a key block spans two sequences
    ("fp16-gqa-1000", 1, 1000, 1000, 4, 2, torch.float16, False),
]
SHORT_CASES = ("odd-1000", "gqa-q777-k999", "4K")
SMOKE = ("smoke-128", 1, 128, 128, 1, 1, torch.bfloat16, False)


def check_case(case, head_dim, causal, variant):
    """One forward case: PASS / FAIL / SKIP line; returns True unless it failed."""
    name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype, packed = case
    label = (f"d{head_dim} {'causal' if causal else 'full  '} {name:<16} B{batch} Sq{seqlen_q} Sk{seqlen_k} "
             f"H{heads_q}/{heads_kv} {str(dtype)[6:]} [{variant}]")
    q, k, v = make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, packed)
    expect_supported = not (causal and seqlen_q > seqlen_k) and (batch == 1 or seqlen_k % 128 == 0)
    supported = gluon_launch.gluon_supported(q, k, v, causal=causal)
    if not supported:
        tag = "SKIP" if not expect_supported else "FAIL"
        say(f"{tag} {label}: gluon_supported() is False ({'expected' if not expect_supported else 'UNEXPECTED'})")
        return expect_supported is False
    if not expect_supported:
        say(f"FAIL {label}: gluon_supported() is True for a case it must refuse")
        return False
    scale = head_dim ** -0.5
    out, lse = gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant)
    torch.cuda.synchronize()
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    low_out = attention_ref(q, k, v, causal=causal, softmax_scale=scale, upcast=False)
    # The portable kernel's error for comparison, on a few cases only (each seqlen class is another compile).
    tri_out, tri_lse = triton_forward(q, k, v, scale, causal) if name in SHORT_CASES else (None, None)
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


def check_backward(head_dim, causal):
    """flash_attn_func with FLASHTILE_GLUON=1: the Gluon forward's out / lse feed the existing backward."""
    import flashtile
    batch, seqlen, heads_q, heads_kv, dtype = 1, 1000, 4, 2, torch.bfloat16
    label = (f"d{head_dim} {'causal' if causal else 'full  '} backward-on-gluon-fwd B{batch} S{seqlen} "
             f"H{heads_q}/{heads_kv}")
    q, k, v = [t.requires_grad_() for t in make_inputs(batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype)]
    dout = torch.randn_like(q)
    calls = []
    original = gluon_launch.gluon_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    gluon_launch.gluon_forward = counting
    os.environ["FLASHTILE_GLUON"] = "1"
    try:
        out = flashtile.flash_attn_func(q, k, v, causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        os.environ["FLASHTILE_GLUON"] = "0"
        gluon_launch.gluon_forward = original
    if not calls:
        say(f"FAIL {label}: FLASHTILE_GLUON=1 did not route the forward to the Gluon kernel")
        return False
    refs = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = attention_ref(*leaves, causal=causal, upcast=upcast)
        refs.append((o.detach(), *torch.autograd.grad(o, leaves, dout.to(o.dtype))))
    ok, parts = True, []
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, *grads), *refs):
        err, err_low = max_err(got, r64), max_err(rlow, r64)
        bound = 2 * err_low + max_err(r64.to(dtype), r64) + ABS_FLOOR[dtype]
        finite = torch.isfinite(got).all().item()
        ok &= finite and err <= bound
        parts.append(f"{name} {err:.2e}/{bound:.2e}{'' if finite else ' NON-FINITE'}")
    say(f"{'PASS' if ok else 'FAIL'} {label}: err/bound {', '.join(parts)}")
    return ok


def guarded(fn, *args, what=""):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001  (report and go on with the other cases)
        say(f"ERROR {what}: {type(exc).__name__}: {exc}")
        traceback.print_exc(limit=6, file=sys.stdout)
        sys.stdout.flush()
        return False


def phase_smoke(variants):
    ok = True
    for variant in variants[:1]:
        for head_dim in (64, 128):
            say(f"INFO smoke d{head_dim} [{variant}] launching (a hang here = deadlock)")
            ok &= bool(guarded(check_case, SMOKE, head_dim, False, variant, what=f"smoke d{head_dim} [{variant}]"))
    return ok


def phase_correct(variants, head_dim, causal):
    """One (head_dim, causal) group: every case for the first variant, the short list for the others."""
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    for variant in variants:
        for case in CASES:
            if variant != variants[0] and case[0] not in SHORT_CASES:
                continue
            what = f"d{head_dim} causal={causal} {case[0]} [{variant}]"
            ok = guarded(check_case, case, head_dim, causal, variant, what=what)
            passed, failed = passed + bool(ok), failed + (not ok)
    ok = guarded(check_backward, head_dim, causal, what=f"backward d{head_dim} causal={causal}")
    passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO correctness d{head_dim} {'causal' if causal else 'full'}: {passed} passed, {failed} failed")
    return failed == 0


def _tflops(ms, batch, heads, seqlen, head_dim, causal):
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def phase_bench(variants, seqlens):
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import flashtile
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in seqlens:
                batch, heads = 16384 // seqlen, 2048 // head_dim
                q, k, v = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
                scale = head_dim ** -0.5
                providers = {}
                for variant in variants:
                    providers[f"gluon[{variant}]"] = (
                        lambda variant=variant: gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant))
                providers["flashtile-triton"] = lambda: flashtile.flash_attn_func(q, k, v, causal=causal)
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # as flashtile.bench does

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                providers["sdpa-cudnn"] = cudnn
                results = {}
                for name, fn in providers.items():
                    try:
                        with torch.no_grad():
                            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                        results[name] = _tflops(ms, batch, heads, seqlen, head_dim, causal)
                        say(f"TIME d{head_dim} {'causal' if causal else 'full  '} S{seqlen:<5} B{batch} H{heads} "
                            f"{name:<22} {ms:8.3f} ms {results[name]:6.1f} TFLOP/s")
                    except Exception as exc:  # noqa: BLE001
                        say(f"ERROR time d{head_dim} causal={causal} S{seqlen} {name}: {type(exc).__name__}: {exc}")
                ref = results.get("sdpa-cudnn")
                tri = results.get("flashtile-triton")
                for name, tf in results.items():
                    if name.startswith("gluon"):
                        say(f"INFO ratio d{head_dim} {'causal' if causal else 'full  '} S{seqlen:<5} {name:<22} "
                            f"vs cuDNN {tf / ref if ref else float('nan'):.2f}x  "
                            f"vs triton {tf / tri if tri else float('nan'):.2f}x")


def run_children(phase, args, timeout, groups=(None, )):
    """Runs the phase in one child per group, concurrently (compiles dominate and run in parallel), killing
    whatever is still running after timeout seconds. True if every child exited 0."""
    say(f"INFO phase {phase} (limit {timeout} s)")
    start = time.time()
    children = []
    for group in groups:
        cmd = [sys.executable, __file__, "--phase", phase, "--variants", args.variants, "--seqlens", args.seqlens]
        if group is not None:
            cmd += ["--group", group]
        children.append((group, subprocess.Popen(cmd)))
    ok = True
    for group, child in children:
        try:
            rc = child.wait(timeout=max(1.0, start + timeout - time.time()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            say(f"FAIL phase {phase} {group or ''}: TIMEOUT after {timeout} s (likely a hang / deadlock in the "
                "last case this group announced; the child was killed)")
            ok = False
            continue
        ok &= rc == 0
        if rc != 0:
            say(f"INFO phase {phase} {group or ''}: exit {rc}")
    say(f"INFO phase {phase} done in {time.time() - start:.1f} s")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default,no-pingpong,bn64,stages3",
                        help=f"comma list of {sorted(gluon_launch.VARIANTS)}")
    parser.add_argument("--seqlens", default="4096,16384", help="bench sequence lengths")
    parser.add_argument("--phase", default="all", choices=["all", "smoke", "correct", "bench"])
    parser.add_argument("--group", default="", help="correct phase: HEAD_DIM:CAUSAL, e.g. 128:1")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    variants = args.variants.split(",")
    seqlens = [int(s) for s in args.seqlens.split(",")]
    if args.phase == "smoke":
        sys.exit(0 if phase_smoke(variants) else 1)
    if args.phase == "correct":
        head_dim, causal = args.group.split(":")
        sys.exit(0 if phase_correct(variants, int(head_dim), causal == "1") else 1)
    if args.phase == "bench":
        phase_bench(variants, seqlens)
        return
    say(f"INFO torch {torch.__version__} triton {triton.__version__} "
        f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'} "
        f"gluon import error: {gluon_launch.GLUON_IMPORT_ERROR}")
    start = time.time()
    if not run_children("smoke", args, 120):
        say("FAIL smoke failed: skipping the remaining Gluon phases")
        return
    run_children("correct", args, 240, groups=("64:0", "64:1", "128:0", "128:1"))
    if not args.skip_bench:
        run_children("bench", args, 240)
    say(f"INFO total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
