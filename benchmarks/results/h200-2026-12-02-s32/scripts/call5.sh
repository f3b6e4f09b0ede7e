#!/usr/bin/env bash
# Session 32, call 5: the review's new GPU cases: the lazy-rescale ALiBi cases on d64-3wg (skipped until then) and
# ALiBi by wgmma with varlen + window + sink (8 B spill on three consumers).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout -k 5 170 python3 -m pytest -v -p no:cacheprovider -n 8 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "lazy_rescale_one_tile and d64-3wg and alibi or alibi_by_mma and varlen-window" > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|SKIPPED|ERROR" $OUT/tests.txt | sed 's/.*::/  /' | head -20; tail -1 $OUT/tests.txt
