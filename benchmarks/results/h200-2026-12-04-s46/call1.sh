#!/usr/bin/env bash
# Session 46 call 1: the GPU tier's part 1 (benchmarks/gpu_session.sh tests 1), first after session 45's host-side
# checks and this session's first_order_only / checks.flag; its test_gluon_bias.py has the default-bb same-bits test.
set -uo pipefail
mkdir -p $OUT
echo 1681232 > $OUT/commit.txt
OUT=$OUT/tier1 bash benchmarks/gpu_session.sh tests 1
