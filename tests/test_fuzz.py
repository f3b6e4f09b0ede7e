"""Random shapes and feature combinations against the float64 reference (tests/fuzz_cases.py): forward, lse and
every gradient, dense and varlen. The CI tier runs 16 small cases through the interpreter and the CPU path; the
GPU tier 24 larger ones; FLASHTILE_FUZZ_CASES sets the count from seed FLASHTILE_FUZZ_FIRST (default 0)."""
import os

import pytest

import fuzz_cases
from conftest import HAS_GPU

FIRST = int(os.environ.get("FLASHTILE_FUZZ_FIRST", "0"))
COUNT = int(os.environ.get("FLASHTILE_FUZZ_CASES", "24" if HAS_GPU else "16"))
CASES = [fuzz_cases.draw(seed, HAS_GPU) for seed in range(FIRST, FIRST + COUNT)]


@pytest.mark.parametrize("case", CASES, ids=[case.name() for case in CASES])
def test_fuzz(backend, case):
    _, device = backend
    if HAS_GPU and device == "cpu":
        pytest.skip("GPU-sized cases: the CPU path takes the CI tier's")
    fuzz_cases.check(case, device)
