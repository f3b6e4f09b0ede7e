#!/usr/bin/env bash
# Session 33, call 5: the wide-block D128 forward (kernels/gluon_fwd_wide.py, variants wide160 / wide192: FA3 / FA4's
# 128 x 160-192 tile as [64, 128] + [64, 32 | 64] accumulators): its GPU tests, then default vs wide160 vs wide192 at
# D128 plain 4K / 8K / 16K (hidden 2048, 16K tokens) beside cuDNN, two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests $(date +%T)"
timeout -k 5 240 python3 -m pytest -v -p no:cacheprovider -n 8 -rfE --tb=short -W ignore tests/test_gluon_wide.py \
  > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
for pass in 1 2; do
  if [ $pass = 1 ]; then vs=default,wide160,wide192; else vs=wide192,wide160,default; fi
  echo "== pass $pass $(date +%T)"
  timeout 200 python3 benchmarks/gluon_check.py --phase bench --bench-dims 128 --seqlens 4096,8192,16384 \
    --bench-causal 0 --variants $vs > $OUT/bench$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/bench$pass.log | grep -v triton | sed 's/  *$//'
  tail -3 $OUT/bench$pass.log | grep -i -E "error|timeout|killed" | head -3
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log && gzip tests.txt
