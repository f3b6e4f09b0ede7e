#!/usr/bin/env bash
# Session 47 call 1: the GPU tier's part 1 (benchmarks/gpu_session.sh tests 1) at d76bed4, the first whole run with
# the batch-fast bias order served (507f54c) and gluon_grid._batch_and_head (ba9c9e8).
set -uo pipefail
mkdir -p $OUT
git rev-parse --short HEAD 2>/dev/null > $OUT/commit.txt || echo d76bed4 > $OUT/commit.txt
OUT=$OUT/tier1 bash benchmarks/gpu_session.sh tests 1
