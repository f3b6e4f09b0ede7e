#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
part1="tests/test_gluon.py tests/test_gluon_3wg.py tests/test_gluon_persistent_protocol.py
    tests/test_gluon_sparse.py tests/test_varlen.py tests/test_fast_launch.py tests/test_plans.py
    tests/test_dropout.py tests/test_persistent_schedule.py tests/test_gluon_grid_order.py
    tests/test_features.py tests/test_programmable.py"
timeout -k 5 300 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  --durations=30 $part1 tests/test_configs.py tests/test_kvcache.py -k "not flex_mods_match and not kernels_compile" > "$OUT/part1-gpu-tier.txt" 2>&1
{ grep -E "^(FAILED|ERROR)" "$OUT/part1-gpu-tier.txt" || true; } | head -40; tail -3 "$OUT/part1-gpu-tier.txt"
