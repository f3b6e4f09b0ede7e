#!/usr/bin/env bash
# Session 31, call 5: GPU tier part 2 at 0784447, then the feature-cost bench (issue 6's table) at D128 8K.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
OUT=$OUT/t2 timeout -k 5 330 bash benchmarks/gpu_session.sh tests 2 > $OUT/t2.log 2>&1
tail -4 $OUT/t2.log; grep -E "^(FAILED|ERROR)" $OUT/t2/gpu-tier.txt | head -20; tail -2 $OUT/t2/gpu-tier.txt
cp $OUT/t2/gpu-tier.txt $OUT/tier-part2.txt && gzip $OUT/tier-part2.txt && rm -rf $OUT/t2
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 170 bash benchmarks/gpu_session.sh features
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
ls -R $OUT | head
