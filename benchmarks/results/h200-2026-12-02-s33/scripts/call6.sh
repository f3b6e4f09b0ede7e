#!/usr/bin/env bash
# Session 33, call 6: P rounded by pairs (p_cvt_asm) in the three-consumer D64 kernels, which spilled with it when
# built (session 26) and compile without spills in their full-block loops now (-32 SASS per warp and block): the
# persistent grid (plain 1K-16K) in two passes swapped, then d64-3wg's rows (8K, plain / causal / features)
# interleaved.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
for job in "64 d64-3wg" "64 d64-3wg-cvt"; do
  timeout 200 python3 bisect/s33/warm.py $job > $OUT/warm-${job// /-}.log 2>&1 &
done
for pass in 1 2; do
  if [ $pass = 1 ]; then vs=persistent-3wg-tma-q2-lr,persistent-3wg-tma-q2-lr-cvt
  else vs=persistent-3wg-tma-q2-lr-cvt,persistent-3wg-tma-q2-lr; fi
  echo "== pass $pass $(date +%T)"
  timeout 200 python3 benchmarks/gluon_check.py --phase bench --bench-dims 64 --seqlens 1024,2048,4096,8192,16384 \
    --bench-causal 0 --variants $vs > $OUT/bench$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/bench$pass.log | grep -v triton | sed 's/  *$//'
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
wait
grep -h ERROR $OUT/warm-*.log | head
echo "== features $(date +%T)"
timeout 150 python3 benchmarks/gluon_check.py --phase bench-features --feature-dims 64 \
  --feature-variants d64-3wg,d64-3wg-cvt > $OUT/feat64.log 2>&1
grep -E "^(TIME|ERROR)" $OUT/feat64.log | sed 's/  *$//'
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
