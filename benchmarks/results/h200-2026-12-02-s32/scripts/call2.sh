#!/usr/bin/env bash
# Session 32, call 2: softcap's exp2 partly on the FMA pipe (GluonConfig.exp2_emu, "-eN" variants): the tests
# (exp2_mixed on the GPU, the forward cases, and d64-3wg's feature cases now that it takes ALiBi) with the bench
# kernels compiling beside them, then the feature times, two passes in reversed order, clocks after each.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "128 default" "128 default-e2" "128 default-e3" "128 default-e4" "64 d64-3wg" "64 d64-3wg-e3" \
           "64 d64-3wg-e4" "64 d64-3wg-e6" "256 default" "256 default-e3"; do
  timeout 300 python3 bisect/s32/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider -n 8 -rfE --tb=short -W ignore tests/test_gluon_exp2.py \
  tests/test_gluon.py tests/test_gluon_3wg.py -k "exp2 or (features_match_reference and 3wg)" \
  > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
wait
grep -h ERROR $OUT/warm-*.log | head
for pass in 1 2; do
  echo "== pass $pass $(date +%T)"
  if [ $pass = 1 ]; then a128=default,default-e2,default-e3,default-e4; a64=d64-3wg,d64-3wg-e3,d64-3wg-e4,d64-3wg-e6
     a256=default,default-e3
  else a128=default-e4,default-e3,default-e2,default; a64=d64-3wg-e6,d64-3wg-e4,d64-3wg-e3,d64-3wg
     a256=default-e3,default; fi
  for d in 128 64 256; do
    eval vs=\$a$d
    timeout 100 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims $d \
      --feature-variants $vs > $OUT/feat$pass-$d.log 2>&1
    grep -E "^(TIME|ERROR)" $OUT/feat$pass-$d.log | grep -E "plain |causal  |softcap|ERROR" | sed 's/  *$//'
  done
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log && gzip tests.txt && ls
