#!/usr/bin/env bash
# Session 19, call 7: the one-tile Gluon forward's O through shared memory (O_VIA_SMEM), old tree / new tree
# alternated (forward only, D128 / D256, 512-16K, causal both, cuDNN in the same runs), then the forward's tests.
export PYTHONUNBUFFERED=1
for r in 1 2; do for t in old new; do
  pp="$PWD/src"; [ $t = old ] && pp="$PWD/bisect/old/src"
  echo "== $t round $r"
  PYTHONPATH=$pp timeout 100 python3 -m flashtile.bench --modes fwd --providers flashtile,sdpa-cudnn --head-dims 128,256 \
     --seqlens 512,1k,2k,4k,8k,16k --causal both --max-seqlen-probe 0 --no-plots --out $OUT/fwd-$t-r$r > $OUT/fwd-$t-r$r.log 2>&1
  grep -E "^ *flashtile" $OUT/fwd-$t-r$r.log | awk '{print $3"/"$7"/"$8":"$10"("$12")"}' | tr '\n' ';'; echo
done; done
echo "== tests"
export PYTHONPATH="$PWD/src"
timeout 230 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "matches_reference or o_via_smem or takes_it_by_default or spanning or launch_args or refuses" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -2 $OUT/tests.txt
cd $OUT && for d in fwd-*-r?; do [ -d $d ] && mv $d/results.csv $d.csv && rm -rf $d; done; ls
