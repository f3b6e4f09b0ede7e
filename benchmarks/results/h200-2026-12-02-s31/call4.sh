#!/usr/bin/env bash
# Session 31, call 4: GPU tier part 1 at 0784447 (ALiBi by a wgmma at D64 / D128), under a cap.
export PYTHONUNBUFFERED=1
OUT=$OUT/t1 timeout -k 5 570 bash benchmarks/gpu_session.sh tests 1 > $OUT/t1.log 2>&1
tail -4 $OUT/t1.log; grep -E "^(FAILED|ERROR)" $OUT/t1/gpu-tier.txt | head -20; tail -2 $OUT/t1/gpu-tier.txt
cp $OUT/t1/gpu-tier.txt $OUT/tier-part1.txt && gzip $OUT/tier-part1.txt && rm -rf $OUT/t1 && ls $OUT
