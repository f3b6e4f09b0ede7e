#!/bin/bash
# Session 22, call 5: after fit.py (every portable launch goes through fit.launch): its tests on the GPU (real
# kernels on refused-then-fitted tiles) and the files that exercise the launch path.
# run: bash benchmarks/results/gpu-tier-2026-12-01-s22/call5.sh   (repo root, $OUT set)
PYTHONPATH=src timeout 300 python3 -m pytest -q -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
    tests/test_fit.py tests/test_plans.py tests/test_fast_launch.py tests/test_gpu.py tests/test_decode.py \
    -k "not long_sequences" > "$OUT/call5.txt" 2>&1
echo "rc $?"; grep -E "^(FAILED|ERROR)" "$OUT/call5.txt" | head -20; tail -2 "$OUT/call5.txt"
