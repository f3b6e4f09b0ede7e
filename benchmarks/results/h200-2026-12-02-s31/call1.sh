#!/usr/bin/env bash
# Session 31, call 1: the GPU cases added after session 30's device time (-inf bias rows with the lazy rescale, the
# fp16 lazy case), then the README table's D64 causal 8K / 16K rows (now the lazy d64-3wg kernel), twice.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
echo "== tests $(date +%T)"
timeout -k 5 300 python3 -m pytest -v -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "bias_rows_without_keys or lazy_rescale_one_tile" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -2 $OUT/tests.txt
for pass in 1 2; do
  echo "== bench D64 causal pass $pass $(date +%T)"
  timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
    --head-dims 64 --seqlens 8k,16k --causal 1 --no-plots --out $OUT/d64c-$pass 2>&1 | grep -v -i warn | tail -12
done
echo "== end $(date +%T)"
cd $OUT && gzip tests.txt && ls -R | head
