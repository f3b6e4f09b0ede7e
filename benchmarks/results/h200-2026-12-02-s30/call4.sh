#!/usr/bin/env bash
# Session 30, call 4: GPU tier part 1 at 0453d87 (D256's default and d64-3wg now rescale lazily), under a cap.
export PYTHONUNBUFFERED=1
OUT=$OUT/t1 timeout -k 5 570 bash benchmarks/gpu_session.sh tests 1 > $OUT/t1.log 2>&1
tail -4 $OUT/t1.log; grep -E "^(FAILED|ERROR)" $OUT/t1/gpu-tier.txt | head -20; tail -2 $OUT/t1/gpu-tier.txt
cp $OUT/t1/gpu-tier.txt $OUT/tier-part1.txt && gzip $OUT/tier-part1.txt && rm -rf $OUT/t1 && ls $OUT
