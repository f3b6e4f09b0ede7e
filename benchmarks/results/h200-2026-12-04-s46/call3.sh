#!/usr/bin/env bash
# Session 46 call 3 (the working tree after 1681232: the batch-fast bias order served in both Gluon defaults, forward
# and backward; uncommitted until this call's results): the backward's A/B (bwd_bias_order.py), the bias tests of
# both directions (the new same-bits / same-dk-dv tests among them), then the feature-cost bench (README table).
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout -k 5 150 python3 benchmarks/results/h200-2026-12-04-s46/bwd_bias_order.py 2>&1 | tee $OUT/bwd_bias_order.txt
timeout -k 5 170 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon_bias.py \
    tests/test_gluon_bwd_features.py -k "bias" > $OUT/bias-tests.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/bias-tests.txt || true; } | head -20; tail -2 $OUT/bias-tests.txt
OUT=$OUT/features timeout -k 5 230 bash benchmarks/gpu_session.sh features
