#!/usr/bin/env bash
# Session 29, call 6: the GPU tier's part 1 (the Gluon forward's files first) under the session's last device time.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout -k 5 380 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  -k "not flex_mods_match and not kernels_compile" tests/test_gluon.py tests/test_gluon_3wg.py \
  tests/test_persistent_schedule.py tests/test_gluon_grid_order.py tests/test_fast_launch.py tests/test_plans.py \
  tests/test_gluon_persistent_protocol.py tests/test_gluon_sparse.py tests/test_varlen.py tests/test_dropout.py \
  tests/test_features.py tests/test_programmable.py tests/test_bench.py tests/test_gluon_alibi_split.py \
  > $OUT/tier1.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tier1.txt | head -20; tail -1 $OUT/tier1.txt
cd $OUT && gzip tier1.txt && ls
