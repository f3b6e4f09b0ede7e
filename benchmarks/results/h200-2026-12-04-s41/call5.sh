#!/usr/bin/env bash
# Session 41 call 5: the GPU tier's part 2 (every backward file among them) on main + the masked tiles' band test
# (kernels/gluon_bwd_step._band_t, uncommitted then), then the backward A/B of causal and window tiles against main's
# src before it (bisect/s41/band_old/src), two rounds at D128 and D64.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
HERE=benchmarks/results/h200-2026-12-04-s41
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
for round in 1 2; do
  PYTHONPATH=$PWD/bisect/s41/band_old/src timeout 100 python3 $HERE/bwd_band_ab.py old 128,64 2>&1 | tee -a $OUT/ab.txt
  PYTHONPATH=$PWD/src timeout 60 python3 $HERE/bwd_band_ab.py new 128,64 2>&1 | tee -a $OUT/ab.txt
done
