#!/usr/bin/env bash
# Session 45 call 1: the GPU tier's part 1 (benchmarks/gpu_session.sh tests 1) at 323dd13, the first whole-tier run
# after the portable kernels' score_mod fma (7634ec4) and gluon_bwd_bias.py (moved code).
set -uo pipefail
mkdir -p $OUT
echo 323dd13 > $OUT/commit.txt
OUT=$OUT/tier1 bash benchmarks/gpu_session.sh tests 1
