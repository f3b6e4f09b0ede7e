"""Every kernel launch compiles for sm90 (H100/H200), sm80 (A100) and AMD's gfx942 (MI300), and fits their shared
memory.

Runs the compiler ahead of time, so it needs no GPU; a subprocess because the test session's
kernels are interpreter objects (TRITON_INTERPRET=1 is set before flashtile is imported).
With FLASHTILE_DEVICE_TRITON=DIR (a `pip install --target DIR triton==X` of the GPU machine's
Triton, which .ci/run provides), the check also runs with that Triton, whose front end may differ; then
that Triton compiles for sm90 and the installed one for sm80 (see ARCHS). The AMD targets ("rocm") compile with the
installed Triton, as a ROCm build of torch would launch them (compile_check.ROCM_TARGETS).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flashtile import configs

pytest.importorskip("triton.backends.nvidia")

NVIDIA_TRITONS = ["installed"] + (["device"] if os.environ.get("FLASHTILE_DEVICE_TRITON") else [])
# With both Tritons (CI), each compiles for one target: the GPU machine's Triton for sm90 (the H200 runs it), the
# newest for sm80; front-end errors do not depend on the target, and this halves the test's time (~7 of 12 min).
# AMD: MI300 (gfx942) in the suite, ~120 s of two idle cores (session 47); MI200 (gfx90a) compiles the same launches
# (FLASHTILE_COMPILE_ARCHS=gfx90a python tests/compile_check.py: session 47, all but the known failure), as do
# gfx950 (MI355) and gfx1100 (RDNA3).
ARCHS = {"installed": "80" if len(NVIDIA_TRITONS) == 2 else "80,90", "device": "90", "rocm": "gfx942"}


@pytest.mark.parametrize("which", NVIDIA_TRITONS + ["rocm"])
def test_kernels_compile_for_gpus(which, tmp_path):
    if which == "rocm":
        pytest.importorskip("triton.backends.amd")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FLASHTILE_COMPILE_ARCHS"] = ARCHS[which]
    if which == "device":
        env["PYTHONPATH"] = os.pathsep.join([os.environ["FLASHTILE_DEVICE_TRITON"], env.get("PYTHONPATH", "")])
        env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # keep the two Tritons' caches apart
    script = Path(__file__).with_name("compile_check.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("0 failed")


# The d64-bm128 backward variants (gluon_bwd_launch.VARIANTS) compiled for sm90 with the GPU machine's Triton (the
# Gluon kernels do not build with newer ones): every case compiles, no ptxas "wgmma serialized" warning, and the
# spill loads / stores inside the tile loops stay at most what session 12 compiled (BM128_LOOP_SPILLS: none
# non-causal; causal a few in one warpgroup's masked loop, 1-2 tiles per key block: docs/perf-log.md, "D64
# backward with 128-row query tiles"). Session 25's tiled dQ buffer moved the causal ones: d64-bm128, which causal
# calls run, 7 -> 1; d64-bm128-split, which only plain calls run (configs.GLUON_BWD_PLAIN), 1 -> 5.
BM128_LOOP_SPILLS = {"d64-full-d64-bm128": 0, "d64-causal-d64-bm128": 1, "d64-full-d64-bm128-split": 0,
                     "d64-causal-d64-bm128-split": 5}


def _device_triton_env(tmp_path):
    """The environment of a compile script run with the GPU machine's Triton (FLASHTILE_DEVICE_TRITON) and this
    checkout's src, outside the interpreter, with its own Triton cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([os.environ["FLASHTILE_DEVICE_TRITON"], src, env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.mark.skipif(not os.environ.get("FLASHTILE_DEVICE_TRITON"), reason="needs FLASHTILE_DEVICE_TRITON (triton 3.6)")
def test_gluon_bwd_bm128_variants_compile_for_sm90(tmp_path):
    env = _device_triton_env(tmp_path)
    script = Path(__file__).with_name("gluon_bwd_compile_check.py")
    proc = subprocess.run([sys.executable, str(script), "--variants", "d64-bm128,d64-bm128-split", "--head-dims", "64",
                           "--features", "none"], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("d64-")]
    assert len(lines) == 4, proc.stdout[-4000:] + proc.stderr[-4000:]
    for line in lines:
        assert "FAILED" not in line and "smem" in line, line
        name = line.split(":")[0]
        spills = int(re.search(r"LDL\+STL (\d+)\)", line).group(1))
        assert spills <= BM128_LOOP_SPILLS[name], line
    assert "C7515" not in proc.stdout and "serializ" not in proc.stdout, proc.stdout[-4000:]


# Every variant configs.GLUON_FWD_PERSISTENT serves, compiled for sm90 with the GPU machine's Triton at the head dims
# it serves, plain and causal: they build without ptxas warnings and fit sm90's 227 KB of shared memory per CTA (D128
# with two Q tiles and O by TMA takes 229768 B, D256 229808 B: a few more KB of buffers would not launch), and the
# launches they serve spill at most what they were measured with: nothing, but 4 B in D128 causal q2-de-sched4 (one
# store, three reloads outside the key loops; three consumers serve plain rows only: their causal kernel spilled 16 B).
SM90_SMEM_BYTES = 232448
SERVED_SPILL_BYTES = {("persistent-tma-q2-de-sched4", 128, "causal"): 4}


def _served_persistent():
    """variant -> head dim -> the modes ("full", "causal") configs.GLUON_FWD_PERSISTENT serves it for."""
    served = {}
    for (head_dim, causal), ranges in configs.GLUON_FWD_PERSISTENT.items():
        for variant, _, _ in ranges:
            served.setdefault(variant, {}).setdefault(head_dim, set()).add("causal" if causal else "full")
    return served


SERVED_PERSISTENT = _served_persistent()


@pytest.mark.skipif(not os.environ.get("FLASHTILE_DEVICE_TRITON"), reason="needs FLASHTILE_DEVICE_TRITON (triton 3.6)")
@pytest.mark.parametrize("variant", sorted(SERVED_PERSISTENT))
def test_gluon_fwd_persistent_variants_compile_for_sm90(variant, tmp_path):
    env = _device_triton_env(tmp_path)
    served = SERVED_PERSISTENT[variant]
    script = Path(__file__).with_name("gluon_compile_check.py")
    proc = subprocess.run([sys.executable, str(script), "--variant", variant, "--head-dims",
                           ",".join(map(str, sorted(served))), "--features", "plain", "--layouts", "dense"], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if re.match(rf"d\d+-(full|causal)-{variant}:", line)]
    assert proc.returncode == 0 and len(lines) == 2 * len(served), proc.stdout[-4000:] + proc.stderr[-4000:]
    for line in lines:
        assert int(re.search(r"smem (\d+) B", line).group(1)) <= SM90_SMEM_BYTES, line
        head_dim, mode = int(re.match(r"d(\d+)-(full|causal)", line).group(1)), line.split("-")[1]
        if mode in served[head_dim]:
            spills = max(map(int, re.search(r"spill stores ([\d,]+) B", line).group(1).split(",")))
            assert spills <= SERVED_SPILL_BYTES.get((variant, head_dim, mode), 0), line
    assert "    ptxas:" not in proc.stdout, proc.stdout[-4000:]


@pytest.mark.skipif(not os.environ.get("FLASHTILE_DEVICE_TRITON"), reason="needs FLASHTILE_DEVICE_TRITON (triton 3.6)")
@pytest.mark.parametrize("kernels,head_dims", [("fwd", "64,128,256"), ("dkdv,dq", "128")], ids=["fwd", "bwd-d128"])
def test_fp32_fma_tiles_do_not_spill(kernels, head_dims, tmp_path):
    """fp32 without TF32 (FMA dots): the configured tiles (configs._IEEE_FWD, and _IEEE_BWD where it has its own:
    D128) keep everything in registers for sm90, plain and causal. The tensor-core tiles they replaced spilled 31-67 KB
    per thread in the forward (6-9.5x slower) and 6-94 KB in the D128 backward (session 21)."""
    env = _device_triton_env(tmp_path)
    script = Path(__file__).parents[1] / "benchmarks" / "spills.py"
    proc = subprocess.run([sys.executable, str(script), "--dtype", "fp32", "--configured", "--kernel", kernels,
                           "--causal", "both", "--head-dims", head_dims], env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in kernels.split(",")]
    assert len(lines) == 2 * len(kernels.split(",")) * len(head_dims.split(",")), proc.stdout[-4000:] + proc.stderr[
        -4000:]
    for line in lines:
        assert re.search(r"spill\s+0 B", line), line
