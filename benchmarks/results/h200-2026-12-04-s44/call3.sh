#!/usr/bin/env bash
# Session 44 call 3: the GPU tier's part 2 (benchmarks/gpu_session.sh tests 2; tests/test_fuzz.py's 24 GPU cases of
# each family among its files).
set -uo pipefail
mkdir -p $OUT
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
