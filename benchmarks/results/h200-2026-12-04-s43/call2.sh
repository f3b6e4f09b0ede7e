#!/usr/bin/env bash
# Session 43 call 2: the fuzz's gradient slack (fuzz_cases.design_slack) and fp32's two-level sums
# (kernels/common._dot_add), against bc08f72's library (ab_old/flashtile, untracked: `git archive bc08f72
# src/flashtile | tar -x -C ab_old --strip-components=1`).
# 1. tests/test_fuzz.py -k "test_fuzz[" seeds 0-299 (dense / varlen; the KV-cache family passed in call 1), 14 workers,
#    beside two processes compiling fp32_ab.py's kernels (old / new); 2. fp32_ab.py timed, old then new; 3. the tier's
#    tests whose ids name fp32, and tests/test_features.py (fp32 softcap tests), stopped at 140 s.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=benchmarks/results/h200-2026-12-04-s43
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
(PYTHONPATH=ab_old:tests timeout 280 python3 $R/fp32_ab.py old warm > $OUT/warm-old.txt 2>&1 &)
(PYTHONPATH=src:tests timeout 280 python3 $R/fp32_ab.py new warm > $OUT/warm-new.txt 2>&1 &)
PYTHONPATH=src FLASHTILE_FUZZ_CASES=300 timeout -k 5 290 python3 -m pytest -v -p no:cacheprovider -n 14 \
    --dist worksteal -rfE --tb=short -W ignore tests/test_fuzz.py -k "test_fuzz[" > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR|XPASS)|XPASS" $OUT/fuzz.txt || true; } | head -40; tail -2 $OUT/fuzz.txt
wait; sleep 2
for v in old:ab_old new:src; do
    PYTHONPATH=${v#*:}:tests timeout 90 python3 $R/fp32_ab.py ${v%%:*} > $OUT/ab-${v%%:*}.txt 2>&1
    cat $OUT/ab-${v%%:*}.txt
done
PYTHONPATH=src timeout -k 5 140 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short \
    -W ignore tests/ -k "(float32 or fp32) and not flex_mods_match and not kernels_compile" tests/test_features.py \
    > $OUT/fp32-tests.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/fp32-tests.txt || true; } | head -40; tail -2 $OUT/fp32-tests.txt
