#!/usr/bin/env bash
# Session 31, call 2: Q in registers in the one-tile kernel ("default-qr", GluonConfig.q_in_regs): its GPU tests (the
# feature benches' compiles in parallel), the plain / causal bench and the feature times against "default" at D64 /
# D128, two passes in swapped order; then ncu's memory sections of the plain and bias D128 8K launches of both.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests + compiles $(date +%T)"
for job in "128 default" "128 default-qr" "64 default" "64 default-qr"; do
  timeout 250 python3 bisect/s31/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
timeout 250 python3 -m pytest -q -p no:cacheprovider -n 10 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "q_in_registers" > $OUT/tests.txt 2>&1
wait
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -1 $OUT/tests.txt; grep -h ERROR $OUT/warm-*.log | head
for pass in 1 2; do
  echo "== pass $pass $(date +%T)"
  if [ $pass = 1 ]; then a=default b=default-qr; else a=default-qr b=default; fi
  timeout 100 python3 benchmarks/gluon_check.py --phase bench --bench-dims 64,128 --seqlens 4096,16384 \
    --variants $a,$b > $OUT/bench$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/bench$pass.log | grep -v -i "triton\|cudnn" | sed 's/  *$//'
  timeout 120 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 128,64 \
    --feature-variants $a,$b > $OUT/feat$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/feat$pass.log | sed 's/  *$//'
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== ncu $(date +%T)"
for v in default default-qr; do
  timeout 100 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables -k regex:_attn_fwd --launch-skip 1 --launch-count 1 \
    python3 benchmarks/ncu_cases.py gluon-$v-128-8192-full > $OUT/ncu-$v.txt 2>&1
  grep -E "Throughput|Shared|Bank|L1/TEX|Duration|SM Frequency" $OUT/ncu-$v.txt | head -30
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.log && ls
