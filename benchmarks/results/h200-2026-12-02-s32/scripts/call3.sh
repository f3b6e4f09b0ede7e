#!/usr/bin/env bash
# Session 32, calls 3-4: the whole GPU tier at the session's served code (d64-3wg with alibi_mma), one part per call
# (bash bisect/s32/call3.sh 1, then 2), each under gpu_session.sh's own 580 s cap.
export PYTHONUNBUFFERED=1
p=$1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
OUT=$OUT/t$p timeout -k 5 590 bash benchmarks/gpu_session.sh tests $p > $OUT/t$p.log 2>&1
tail -4 $OUT/t$p.log; grep -E "^(FAILED|ERROR)" $OUT/t$p/gpu-tier.txt | head -20; tail -2 $OUT/t$p/gpu-tier.txt
grep -cE "^tests/.*(PASSED|FAILED|SKIPPED|ERROR)" $OUT/t$p/gpu-tier.txt
cp $OUT/t$p/gpu-tier.txt $OUT/tier-part$p.txt && gzip $OUT/tier-part$p.txt && rm -rf $OUT/t$p && ls $OUT
