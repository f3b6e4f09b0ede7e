"""Every kernel launch compiles for sm90 (H100/H200) and sm80 (A100) and fits their shared memory.

Runs the compiler ahead of time, so it needs no GPU; a subprocess because the test session's
kernels are interpreter objects (TRITON_INTERPRET=1 is set before flashtile is imported).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")


def test_kernels_compile_for_gpus():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_check.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("0 failed")
