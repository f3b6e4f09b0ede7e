#!/usr/bin/env bash
# Session 19, call 3: PDL A/B (decode profile, backward short rows), then the touched test files.
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for p in 1 0; do
  echo "== decode_profile PDL=$p"; FLASHTILE_PDL=$p timeout 90 python3 benchmarks/decode_profile.py 2>&1 | grep -v Warn | grep -v _warn_once | tee $OUT/decode-pdl$p.txt
done
for r in 1 2; do for p in 1 0; do
  echo "== bwd PDL=$p round $r"
  FLASHTILE_PDL=$p timeout 120 python3 -m flashtile.bench --modes bwd --providers flashtile,sdpa-cudnn --head-dims 64,128,256 \
     --seqlens 512,1k,2k --causal both --max-seqlen-probe 0 --out $OUT/bwd-pdl$p-r$r > $OUT/bwd-pdl$p-r$r.log 2>&1
  grep -E "^ *flashtile" $OUT/bwd-pdl$p-r$r.log | awk '{print $3"/"$7"/"$8":"$10"("$12")"}' | tr '\n' ';'; echo
done; done
echo "== tests"
timeout 250 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_decode.py tests/test_kvcache.py \
   tests/test_kvcache_seqlens.py tests/test_gluon_bwd.py > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
cd $OUT && tar czf bwd.tgz bwd-* && rm -rf bwd-pdl*-r*/
