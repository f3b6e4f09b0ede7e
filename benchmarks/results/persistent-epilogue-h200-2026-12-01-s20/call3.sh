#!/usr/bin/env bash
# Session 20, call 3 (x2): GPU 0: the README sweep, a second in-process sample of D256 causal 512-2K (routing), then
# test_gpu / plans / fast_launch; GPU 1: the Gluon forward's test files.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
(CUDA_VISIBLE_DEVICES=1 timeout 470 python3 -m pytest -q -p no:cacheprovider -n 14 -rfE --tb=short -W ignore \
  tests/test_gluon.py tests/test_gluon_grid_order.py tests/test_gluon_3wg.py tests/test_persistent_schedule.py \
  tests/test_gluon_persistent_protocol.py tests/test_configs.py --durations=10 > $OUT/tests1.txt 2>&1) &
export CUDA_VISIBLE_DEVICES=0
echo "== sweep"
timeout 120 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
    --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep.log 2>&1
tail -45 $OUT/sweep.log
echo "== variants"
timeout 80 python3 benchmarks/gluon_check.py --phase bench --variants default,persistent-sched4 \
  --bench-dims 256 --seqlens 512,1024,2048 --bench-causal 1 > $OUT/variants.log 2>&1
grep TIME $OUT/variants.log
echo "== tests GPU 0"
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 14 -rfE --tb=short -W ignore tests/test_gpu.py \
  tests/test_plans.py tests/test_fast_launch.py --durations=10 > $OUT/tests0.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests0.txt | head -20; tail -3 $OUT/tests0.txt
echo "== tests GPU 1"
wait
grep -E "^(FAILED|ERROR)" $OUT/tests1.txt | head -20; tail -3 $OUT/tests1.txt
cd $OUT && ls h200 && tar czf misc.tgz *.log tests*.txt && tar czf h200.tgz h200 && rm -rf h200 *.log tests*.txt
