#!/usr/bin/env bash
# Session 43 call 3: fuzz seeds 23, 177, 246 (fp32, the known GPU failures) per tensor, max error / bound, with
# bc08f72's library (ab_old, as in call 2) and with the two-level sums (src), one process each, side by side.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=benchmarks/results/h200-2026-12-04-s43
mkdir -p $OUT
PYTHONPATH=ab_old:tests timeout 200 python3 $R/fuzz_ratios.py old 23 177 246 > $OUT/old.txt 2>&1 &
PYTHONPATH=src:tests timeout 200 python3 $R/fuzz_ratios.py new 23 177 246 > $OUT/new.txt 2>&1 &
wait
cat $OUT/old.txt $OUT/new.txt | grep -v Warning
