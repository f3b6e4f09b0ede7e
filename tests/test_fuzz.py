"""Random shapes and feature combinations against the float64 reference: flash_attn_func / flash_attn_varlen_func
forward, lse and every gradient (tests/fuzz_cases.py), flash_attn_with_kvcache's cache and output
(tests/fuzz_kvcache.py), and flashtile.attention's masks and score mods (tests/fuzz_programmable.py). The CI tier
runs 16 small cases of each through the interpreter and the CPU path; the GPU tier 24 larger ones;
FLASHTILE_FUZZ_CASES sets the count from seed FLASHTILE_FUZZ_FIRST (default 0)."""
import os

import pytest

import fuzz_cases
import fuzz_kvcache
import fuzz_programmable
from conftest import HAS_GPU

FIRST = int(os.environ.get("FLASHTILE_FUZZ_FIRST", "0"))
COUNT = int(os.environ.get("FLASHTILE_FUZZ_CASES", "24" if HAS_GPU else "16"))
CASES = [fuzz_cases.draw(seed, HAS_GPU) for seed in range(FIRST, FIRST + COUNT)]
KV_CASES = [fuzz_kvcache.draw(seed, HAS_GPU) for seed in range(FIRST, FIRST + COUNT)]
MOD_CASES = [fuzz_cases.Case(**fuzz_programmable.draw(seed, HAS_GPU)) for seed in range(FIRST, FIRST + COUNT)]


def _device(backend):
    """The backend's device; on a GPU machine the CPU backend's ids are skipped (the CI tier runs CPU-sized cases)."""
    _, device = backend
    if HAS_GPU and device == "cpu":
        pytest.skip("GPU-sized cases: the CPU path takes the CI tier's")
    return device


@pytest.mark.parametrize("case", CASES, ids=[case.name() for case in CASES])
def test_fuzz(backend, case):
    fuzz_cases.check(case, _device(backend))


@pytest.mark.parametrize("case", KV_CASES, ids=[case.name() for case in KV_CASES])
def test_fuzz_kvcache(backend, case):
    fuzz_kvcache.check(case, _device(backend))


@pytest.mark.parametrize("case", MOD_CASES, ids=[case.name() for case in MOD_CASES])
def test_fuzz_programmable(backend, case):
    fuzz_cases.check(case, _device(backend))
