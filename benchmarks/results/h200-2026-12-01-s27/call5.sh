#!/usr/bin/env bash
# Session 27, call 5: D128 causal at 512 keys, persistent-tma-sched4 against its -q2 twin (three passes, alternated),
# then the README sweep's D128 causal rows with D128 causal back on persistent-tma-sched4.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
for p in 1 2 3; do
  timeout 40 python3 benchmarks/gluon_check.py --phase bench --bench-causal 1 --bench-dims 128 --seqlens 512,1024 \
    --variants persistent-tma-sched4,persistent-tma-q2-sched4,persistent-tma-q2-lpt8 2>&1 | grep -E "TIME|ERROR"
done
timeout 60 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 --head-dims 128 \
  --causal 1 --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep-d128-causal.log 2>&1
grep -E "^ *flashtile" $OUT/sweep-d128-causal.log
