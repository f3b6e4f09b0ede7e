#!/usr/bin/env bash
# Session 50 call 1 (7b4a282): the tests session 49's changes touched and that never ran on a GPU (the dropout factor
# test's compiled branch, cpu.py under autocast on CUDA, a constant score_mod compiled, forward-AD refusal, 0-d bias),
# then the bias tests of both directions.
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
mkdir -p $OUT
git rev-parse --short HEAD 2>/dev/null > $OUT/commit.txt || echo 7b4a282 > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
start=$SECONDS
timeout -k 5 330 python3 -m pytest -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore -q \
    tests/test_dropout.py tests/test_varlen.py tests/test_attention.py tests/test_validation.py \
    tests/test_programmable.py tests/test_features.py > $OUT/touched.txt 2>&1
echo "touched rc=$? $((SECONDS - start)) s"; tail -3 $OUT/touched.txt; grep -E "^(FAILED|ERROR)" $OUT/touched.txt | head -30
start=$SECONDS
timeout -k 5 200 python3 -m pytest -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore -q \
    tests/test_gluon_bias.py tests/test_gluon_bwd_features.py -k bias > $OUT/bias.txt 2>&1
echo "bias rc=$? $((SECONDS - start)) s"; tail -3 $OUT/bias.txt; grep -E "^(FAILED|ERROR)" $OUT/bias.txt | head -30
