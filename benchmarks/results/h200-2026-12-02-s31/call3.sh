#!/usr/bin/env bash
# Session 31, call 3: ALiBi's one-sided key blocks by a wgmma ("default-am", GluonConfig.alibi_mma): its GPU tests (the
# feature benches' compiles in parallel), then the feature times against "default" at D128 / D64, two passes in
# swapped order, with clocks and power after each.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "128 default" "128 default-am" "64 default" "64 default-am"; do
  timeout 250 python3 bisect/s31/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
timeout 250 python3 -m pytest -q -p no:cacheprovider -n 10 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "alibi_by_mma" > $OUT/tests.txt 2>&1
wait
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -h ERROR $OUT/warm-*.log | head
for pass in 1 2 3; do
  echo "== pass $pass $(date +%T)"
  if [ $pass = 2 ]; then a=default-am b=default; else a=default b=default-am; fi
  timeout 120 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 128,64 \
    --feature-variants $a,$b > $OUT/feat$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/feat$pass.log | grep -E "plain|causal  |alibi|ERROR" | sed 's/  *$//'
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.log && ls
