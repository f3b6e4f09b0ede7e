#!/usr/bin/env bash
# Session 29, call 3: the lazy rescale's GPU tests, then its A/B pass 1 (each served persistent variant before its
# "-lr" twin), and the decode layout probe (flashtile on SDPA's head-major caches).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== lr tests $(date +%T)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "lazy_rescale" > $OUT/lr-tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/lr-tests.txt | head -30; tail -2 $OUT/lr-tests.txt
bash bisect/s29/lr_ab.sh p1 base-first
echo "== decode head-major probe $(date +%T)"
timeout 60 python3 benchmarks/decode_profile.py --cache-lens 4096,131072 --decode-batch 8,64 --head-major 2>&1 \
  | grep -v -i "warn" | tee $OUT/decode-hm.log
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt
