#!/usr/bin/env bash
# Session 33, call 8 (a3397e5): the remaining files' D64 / three-consumer GPU cases after P by pairs (call 7 ran
# test_gluon_3wg, test_gluon, test_gpu, test_varlen and test_gluon_alibi_split's).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests $(date +%T)"
timeout -k 5 280 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_attention.py tests/test_gluon_bwd.py tests/test_plans.py tests/test_fast_launch.py \
  tests/test_programmable.py tests/test_bench.py tests/test_gluon_grid_order.py -k "3wg or d64 or 64" \
  > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
echo "== end $(date +%T)"
gzip $OUT/tests.txt
