#!/usr/bin/env bash
# Session 30, call 3: the one-tile kernel's lazy rescale ("default-lr", "d64-3wg-lr"): its GPU tests (with the feature
# kernels' compiles for the bench in parallel), then the feature times of both at D128 / D256 (default) and D64
# (d64-3wg, which serves D64 feature calls at 8K), two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "128 default" "128 default-lr" "256 default" "256 default-lr" "64 d64-3wg" "64 d64-3wg-lr"; do
  timeout 250 python3 bisect/s30/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
timeout 250 python3 -m pytest -q -p no:cacheprovider -n 10 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "lazy_rescale_one_tile or launch_args" > $OUT/tests.txt 2>&1
wait
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -h ERROR $OUT/warm-*.log | head
for pass in 1 2; do
  echo "== pass $pass $(date +%T)"
  if [ $pass = 1 ]; then a=default b=default-lr c=d64-3wg d=d64-3wg-lr; else a=default-lr b=default c=d64-3wg-lr d=d64-3wg; fi
  timeout 120 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 128,256 \
    --feature-variants $a,$b > $OUT/pass$pass.log 2>&1
  timeout 60 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 64 \
    --feature-variants $c,$d >> $OUT/pass$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/pass$pass.log | sed 's/  *$//'
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt warm-*.log && ls
