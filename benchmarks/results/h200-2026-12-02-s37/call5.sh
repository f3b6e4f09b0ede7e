#!/usr/bin/env bash
# Session 37 call 5: D64 causal 512-4K keys served by persistent-tma-q2-de-sched4 (was -lpt8; call 4's A/B): its
# tests, then the README sweep's D64 causal rows (forward and backward, cuDNN and FA2 beside).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 120 python3 -m pytest -q -n 16 -p no:cacheprovider -rfE --tb=short -W ignore tests/test_gluon.py \
  tests/test_gluon_grid_order.py tests/test_persistent_schedule.py -k "sched or (d64 and causal and persistent)" \
  > $OUT/tests.log 2>&1; echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -1 $OUT/tests.log
timeout 150 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --head-dims 64 --causal 1 --seqlens 512,1k,2k,4k --no-plots --out $OUT/sweep-d64c > $OUT/sweep.log 2>&1
echo "sweep rc $?"; grep -E "flashtile|cudnn" $OUT/sweep.log | tail -20
