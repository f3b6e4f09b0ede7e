#!/usr/bin/env bash
# Session 44 call 2: the GPU tier's part 1 (benchmarks/gpu_session.sh tests 1).
set -uo pipefail
mkdir -p $OUT
git log -1 --format=%h 2>/dev/null | tee $OUT/commit.txt
OUT=$OUT/tier1 bash benchmarks/gpu_session.sh tests 1
