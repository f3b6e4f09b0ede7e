#!/usr/bin/env bash
# Session 34, call 1: softcap's fixed row max (GluonConfig.fixed_max, served in "default" / "d64-3wg"; their "-rmax"
# twins keep the running max): the softcap GPU tests with the bench kernels compiling beside them, then the
# interleaved feature A/B (the rows without softcap compile the same kernels in both: the control) at D128, D64, D256.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "128 default-rmax,default" "64 d64-3wg-rmax,d64-3wg" "256 default-rmax,default"; do
  timeout 240 python3 bisect/s34/warm.py $job > $OUT/warm-${job%% *}.log 2>&1 &
done
timeout -k 5 240 python3 -m pytest -v -p no:cacheprovider -n 12 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_gluon.py tests/test_gluon_3wg.py tests/test_features.py tests/test_varlen.py -k "fixed_max or softcap" \
  > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
wait
grep -h ERROR $OUT/warm-*.log | head
for pair in "128 default-rmax,default" "64 d64-3wg-rmax,d64-3wg" "256 default-rmax,default"; do
  set -- $pair
  echo "== bench-features D$1 $(date +%T)"
  timeout 80 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims $1 --feature-variants $2 \
    > $OUT/feat-d$1.log 2>&1
  grep -E "^(TIME|FAIL|ERROR)" $OUT/feat-d$1.log | sed 's/  *$//'
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log && gzip tests.txt
