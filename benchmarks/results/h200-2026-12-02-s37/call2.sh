#!/usr/bin/env bash
# Session 37 call 2: decode plans with ALiBi / cache_leftpad (+ cached leftpad read-back): the KV-cache / plans /
# varlen / decode tests, host time (new rows: ALiBi + leftpad), and the paged-layout probe (graph replays).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$PWD/src:$PWD/tests timeout 260 python3 -m pytest -q -n 16 -p no:cacheprovider -rfE --tb=short -W ignore \
  tests/test_plans.py tests/test_kvcache.py tests/test_kvcache_seqlens.py tests/test_rotary.py tests/test_decode.py \
  tests/test_varlen.py > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -2 $OUT/tests.log
for v in old new; do
  src=$PWD/src; [ $v = old ] && src=$PWD/bisect/s37/old/src
  echo "== $v $(date +%T)"
  PYTHONPATH=$src timeout 100 python3 benchmarks/host_time.py --decode $OUT/profile-$v.txt 2>&1 | tee $OUT/host-$v.txt
done
echo "== probe $(date +%T)"
PYTHONPATH=$PWD/src timeout 200 python3 bisect/s37/paged_probe.py 2>&1 | tee $OUT/paged-probe.txt
