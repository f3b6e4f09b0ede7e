"""Shared by the self-diagnosing GPU check scripts (gluon_check.py, gluon_bwd_check.py): PASS / FAIL / ERROR /
INFO lines, errors measured in float64, and phases run in child processes with a time limit (a kernel that
deadlocks on an mbarrier hangs forever; killing the child frees the GPU and the run goes on to report it)."""
import subprocess
import sys
import time
import traceback

import torch
import triton

ABS_FLOOR = {torch.float16: 1e-5, torch.bfloat16: 1e-4}  # DESIGN.md's rounding floor per dtype


def say(*parts):
    print(*parts, flush=True)


def alibi_slopes(heads, batch=None, device="cuda"):
    """The ALiBi paper's geometric slopes 2^(-8 h / H), (H,) or per batch (B, H) (rows slightly perturbed)."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)
    if batch is None:
        return slopes
    return torch.stack([slopes * (1.0 + 0.1 * b) for b in range(batch)])


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item()


def guarded(fn, *args, what=""):
    """fn(*args), or False after reporting the exception (the other cases go on)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001  (report and go on with the other cases)
        say(f"ERROR {what}: {type(exc).__name__}: {exc}")
        traceback.print_exc(limit=6, file=sys.stdout)
        sys.stdout.flush()
        return False


def run_children(script, phase, argv, timeout, groups=(None, ), phase_of=lambda group, phase: phase):
    """Runs `script --phase P [argv] --group G` for each group concurrently (compiles dominate and run in
    parallel), P = phase_of(group, phase), killing whatever still runs after timeout seconds. True if every
    child exited 0."""
    say(f"INFO phase {phase} (limit {timeout} s)")
    start = time.time()
    children = []
    for group in groups:
        cmd = [sys.executable, script, "--phase", phase_of(group, phase), *argv]
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


def time_providers(providers, tflop, label, no_grad=True):
    """Times each provider (name -> zero-argument function; do_bench median, grad disabled unless no_grad is
    False) and prints a TIME line each, then, for every "gluon[...]" provider, its speed against "sdpa-cudnn"
    and "flashtile-triton". tflop: the work of one call in TFLOP; label: the shape, e.g. "d128 causal S4096"."""
    results = {}
    # Compile every provider first, then warm the GPU: a compile between two timings idles the GPU, and the next
    # timing ran at a lower clock (session 14: a variant's first shape measured up to 40 % slow).
    with torch.set_grad_enabled(not no_grad):
        working = []
        for fn in providers.values():
            try:
                fn()
                working.append(fn)
            except Exception:  # noqa: BLE001  (its timing below reports it)
                pass
        if working:
            triton.testing.do_bench(working[0], warmup=200, rep=100)
    for name, fn in providers.items():
        try:
            with torch.set_grad_enabled(not no_grad):
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            results[name] = tflop / (ms * 1e-3)
            say(f"TIME {label} {name:<22} {ms:8.3f} ms {results[name]:6.1f} TFLOP/s")
        except Exception as exc:  # noqa: BLE001
            say(f"ERROR time {label} {name}: {type(exc).__name__}: {exc}")
    ref, tri = results.get("sdpa-cudnn"), results.get("flashtile-triton")
    for name, tf in results.items():
        if name.startswith("gluon"):
            say(f"INFO ratio {label} {name:<22} vs cuDNN {tf / ref if ref else float('nan'):.2f}x  "
                f"vs triton {tf / tri if tri else float('nan'):.2f}x")
    return results


def bench_shapes(head_dims, seqlens, causal_modes="both"):
    """(head_dim, causal, seqlen, batch, heads, tflop) of the papers' setup: 16K tokens (batch = 16384 / seqlen),
    hidden 2048 (heads = 2048 / head_dim); tflop = one forward's work, 4 B H S^2 D, halved when causal.
    causal_modes: "both", "0" (full only) or "1" (causal only)."""
    for head_dim in head_dims:
        for causal in {"both": (False, True), "0": (False, ), "1": (True, )}[causal_modes]:
            for seqlen in seqlens:
                batch, heads = 16384 // seqlen, 2048 // head_dim
                tflop = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1) / 1e12
                yield head_dim, causal, seqlen, batch, heads, tflop


def shape_label(head_dim, causal, seqlen, batch, heads):
    return f"d{head_dim} {'causal' if causal else 'full  '} S{seqlen:<5} B{batch} H{heads}"
