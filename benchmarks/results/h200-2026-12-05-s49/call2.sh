#!/usr/bin/env bash
# Session 49 call 2: the GPU tier's part 2 (benchmarks/gpu_session.sh tests 2) at 3fd99c5, the first whole run since
# 1681232 (session 46): session 48's ROCm dropout factor, cpu.py/checks changes and conftest's interpreter startup.
set -uo pipefail
mkdir -p $OUT
git rev-parse --short HEAD 2>/dev/null > $OUT/commit.txt || echo 3fd99c5 > $OUT/commit.txt
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
