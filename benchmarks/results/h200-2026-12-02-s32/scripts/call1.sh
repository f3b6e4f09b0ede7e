#!/usr/bin/env bash
# Session 32, call 1: session 31's GPU cases added after its device time (ALiBi by wgmma incl. the 11 d64-3wg-am cases,
# lazy rescale), the 12 part-2 tier tests the 330 s cap cut, then the A/B of d64-3wg-am against d64-3wg (D64 features,
# both orders), then the feature-cost bench (issue 6's table) again.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for v in d64-3wg d64-3wg-am; do
  timeout 250 python3 bisect/s32/warm.py 64 $v > $OUT/warm-$v.log 2>&1 &
done
timeout -k 5 240 python3 -m pytest -v -p no:cacheprovider -n 12 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "alibi_by_mma or lazy_rescale_one_tile" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
wait
grep -h ERROR $OUT/warm-*.log | head
echo "== A/B $(date +%T)"
for pass in 1 2; do
  if [ $pass = 1 ]; then a=d64-3wg b=d64-3wg-am; else a=d64-3wg-am b=d64-3wg; fi
  timeout 80 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 64 \
    --feature-variants $a,$b > $OUT/feat$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/feat$pass.log | grep -E "plain|causal  |alibi|ERROR" | sed 's/  *$//'
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== part-2 ids $(date +%T)"
OUT=$OUT/ids timeout -k 5 200 bash benchmarks/gpu_session.sh tests ids bisect/s32/ids-part2.txt > $OUT/ids.log 2>&1
grep -E "^(FAILED|ERROR)" $OUT/ids/gpu-tier.txt | head; tail -1 $OUT/ids/gpu-tier.txt
echo "== features $(date +%T)"
timeout 150 bash benchmarks/gpu_session.sh features | grep -v -i warn | tail -40
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt ids && rm -rf *.log ids && ls -R | head
