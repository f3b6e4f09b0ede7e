"""Random shapes and feature combinations against the float64 reference: flash_attn_func / flash_attn_varlen_func
forward, lse and every gradient (tests/fuzz_cases.py), and flash_attn_with_kvcache's cache and output
(tests/fuzz_kvcache.py). The CI tier runs 16 small cases of each through the interpreter and the CPU path; the GPU
tier 24 larger ones; FLASHTILE_FUZZ_CASES sets the count from seed FLASHTILE_FUZZ_FIRST (default 0)."""
import os

import pytest

import fuzz_cases
import fuzz_kvcache
from conftest import HAS_GPU

FIRST = int(os.environ.get("FLASHTILE_FUZZ_FIRST", "0"))
COUNT = int(os.environ.get("FLASHTILE_FUZZ_CASES", "24" if HAS_GPU else "16"))
CASES = [fuzz_cases.draw(seed, HAS_GPU) for seed in range(FIRST, FIRST + COUNT)]
KV_CASES = [fuzz_kvcache.draw(seed, HAS_GPU) for seed in range(FIRST, FIRST + COUNT)]
# GPU draws that failed on the H200 for a reason found and not yet fixed (docs/perf-log.md, session 42; measured
# with the bound of that session's device calls, which was looser for fp32 gradients). Not strict: a fix shows as
# XPASS, and then its seed leaves this list.
KNOWN_GPU = {
    23: "fp32: dV of one key summed over 2048 query rows (x 10: dropout 0.9) in one running fp32 accumulator (the "
        "dots add into dV): past the bound, ~4 ulps against cuBLAS's 1, with tf32x3 and with FMA dots",
    177: "fp32, tf32x3 dots: out at D256 with dropout 0.9 1.12x the bound (not run with FMA dots)",
    246: "fp32, tf32x3 dots: the broadcast bias's gradient at D256 1.13x the bound (not run with FMA dots)",
}


@pytest.mark.parametrize("case", CASES, ids=[case.name() for case in CASES])
def test_fuzz(request, backend, case):
    _, device = backend
    if HAS_GPU and device == "cpu":
        pytest.skip("GPU-sized cases: the CPU path takes the CI tier's")
    if HAS_GPU and case.seed in KNOWN_GPU:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_GPU[case.seed], strict=False))
    fuzz_cases.check(case, device)


@pytest.mark.parametrize("case", KV_CASES, ids=[case.name() for case in KV_CASES])
def test_fuzz_kvcache(backend, case):
    _, device = backend
    if HAS_GPU and device == "cpu":
        pytest.skip("GPU-sized cases: the CPU path takes the CI tier's")
    fuzz_kvcache.check(case, device)
