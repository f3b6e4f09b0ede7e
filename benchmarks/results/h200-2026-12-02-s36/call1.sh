#!/usr/bin/env bash
# Session 36 call 1: branch decode-plan (decode launch plans) on the GPU: its tests, the host-time A/B against main's
# src (76d661a), the eager decode bench; plus the three p = 0.01 exact-mask dropout cases.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
OLD=$PWD/bisect/s36/old_src NEW=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$NEW:$PWD/tests timeout 240 python3 -m pytest -v -n 16 -p no:cacheprovider -rfE --tb=short -W ignore \
  tests/test_plans.py tests/test_kvcache.py tests/test_kvcache_seqlens.py tests/test_decode.py \
  "tests/test_gluon.py::test_dropout_mask_is_exact" > $OUT/tests.log 2>&1; echo "tests rc $?"
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -20; tail -3 $OUT/tests.log; grep -c "p0.01.*PASSED" $OUT/tests.log
PYTHONPATH=$OLD timeout 120 python3 benchmarks/host_time.py --decode $OUT/old-profile.txt 2>&1 | tee $OUT/host-old.txt
PYTHONPATH=$NEW timeout 120 python3 benchmarks/host_time.py --decode $OUT/new-profile.txt 2>&1 | tee $OUT/host-new.txt
PYTHONPATH=$NEW timeout 150 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --decode-batch 8,64 \
  --cache-lens 4k,16k --page-size 0,16 --out $OUT/decode 2>&1 | tail -30 | tee $OUT/decode.txt
