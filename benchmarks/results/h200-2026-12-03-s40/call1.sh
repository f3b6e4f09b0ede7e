#!/usr/bin/env bash
# Session 40 call 1 (main at 3ddb84b, whose whole GPU tier passed in session 39): the README sweep's D64 causal rows
# (persistent-tma-q2-de-sched4 since ced7149, forward and backward, cuDNN and FA2 beside), then the eager decode
# steps' host time with the decode short path (src) and without it (14bcb72's src, in bisect/s39/old), alternated.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$PWD/src timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash \
  --max-seqlen-probe 0 --head-dims 64 --causal 1 --seqlens 512,1k,2k,4k --no-plots --out $OUT/sweep-d64c \
  > $OUT/sweep.log 2>&1
echo "sweep rc $?"; grep -E "flashtile|cudnn|flash" $OUT/sweep.log | tail -24
for round in 1 2; do
  for tree in new old; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/bisect/s39/old/src
    PYTHONPATH=$src timeout 120 python3 benchmarks/host_time.py --decode $OUT/profile-$tree$round.txt \
      > $OUT/decode-$tree$round.txt 2>&1
    echo "decode $tree round $round rc $?"; cat $OUT/decode-$tree$round.txt | tail -20
  done
done
