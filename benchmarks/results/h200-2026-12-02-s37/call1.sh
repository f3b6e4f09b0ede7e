#!/usr/bin/env bash
# Session 37 call 1 (main = e05b5fe + append-plan 6a03e64): the KV-cache / plans / rotary / decode tests, then eager
# decode host time of e05b5fe's src (old) and this tree's (new), alternated twice, with cProfiles of the new steps.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$PWD/src:$PWD/tests timeout 240 python3 -m pytest -q -n 16 -p no:cacheprovider -rfE --tb=short -W ignore \
  tests/test_plans.py tests/test_kvcache.py tests/test_kvcache_seqlens.py tests/test_rotary.py tests/test_decode.py \
  > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -2 $OUT/tests.log
for round in 1 2; do
  for v in old new; do
    src=$PWD/src; [ $v = old ] && src=$PWD/bisect/s37/old/src
    echo "== $v round $round $(date +%T)"
    PYTHONPATH=$src timeout 100 python3 benchmarks/host_time.py --decode $OUT/profile-$v-$round.txt 2>&1 | tee $OUT/host-$v-$round.txt
  done
done
