#!/usr/bin/env bash
# Session 27, call 1: block-relative masks in the Gluon forward (021770f) against c7b385c (bisect/old/src),
# alternated, forward only, D64/D128/D256 512-4K causal both, cuDNN in the same runs; then D64 causal 512/1K by
# variant (Gluon vs the portable kernel); then the forward's reference tests.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for r in 1 2; do for t in old new; do
  pp="$PWD/src"; [ $t = old ] && pp="$PWD/bisect/old/src"
  echo "== $t round $r $(date +%T)"
  PYTHONPATH=$pp timeout 150 python3 -m flashtile.bench --modes fwd --providers flashtile,sdpa-cudnn --head-dims 64,128,256 \
     --seqlens 512,1k,2k,4k --causal both --max-seqlen-probe 0 --no-plots --out $OUT/fwd-$t-r$r > $OUT/fwd-$t-r$r.log 2>&1
  grep -E "^ *flashtile" $OUT/fwd-$t-r$r.log | awk '{print $3"/"$7"/"$8":"$10"("$12")"}' | tr '\n' ';'; echo
done; done
for t in old new; do
  pp="$PWD/src"; [ $t = old ] && pp="$PWD/bisect/old/src"
  echo "== variants $t $(date +%T)"
  PYTHONPATH=$pp timeout 60 python3 benchmarks/gluon_check.py --phase bench --variants persistent-tma-lpt8,persistent-tma,default \
     --bench-dims 64 --seqlens 512,1024 --bench-causal 1 2>&1 | grep -E "TIME|ERROR" | tee $OUT/variants-$t.log
done
echo "== tests $(date +%T)"
PYTHONPATH=$PWD/src timeout 170 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py \
  tests/test_gluon_3wg.py -k "matches_reference" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -2 $OUT/tests.txt
cd $OUT && for d in fwd-*-r?; do [ -d $d ] && mv $d/results.csv $d.csv && rm -rf $d; done; tar czf logs.tgz *.log *.txt; rm -f *.log *.txt; ls
