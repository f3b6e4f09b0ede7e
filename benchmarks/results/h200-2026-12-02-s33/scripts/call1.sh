#!/usr/bin/env bash
# Session 33, call 1: the row sums by a wgmma (session 32, built offline): its GPU tests with the bench kernels
# compiling beside them, then the interleaved variant timing (first GPU run of it) at D64 (d64-3wg vs d64-3wg-rs)
# and D128 / D256 (default vs default-rs).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "64 d64-3wg" "64 d64-3wg-rs" "128 default" "128 default-rs" "256 default" "256 default-rs"; do
  timeout 280 python3 bisect/s33/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
timeout -k 5 280 python3 -m pytest -v -p no:cacheprovider -n 10 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k rowsum > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
wait
grep -h ERROR $OUT/warm-*.log | head
echo "== bench $(date +%T)"
timeout 120 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 64 \
  --feature-variants d64-3wg,d64-3wg-rs > $OUT/feat64.log 2>&1
grep -E "^(TIME|ERROR)" $OUT/feat64.log | sed 's/  *$//'
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 128,256 \
  --feature-variants default,default-rs > $OUT/feat128.log 2>&1
grep -E "^(TIME|ERROR)" $OUT/feat128.log | sed 's/  *$//'
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log && gzip tests.txt && ls
