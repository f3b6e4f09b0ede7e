#!/usr/bin/env bash
# Session 20, call 5 (one H200): the D256 backward's dK / dV through V's shared buffer (STORE_VIA_SMEM at SPLIT_D):
# the bitwise test first, then the backward A/B (old tree bisect/old = 5698648, alternated), then D256 test files.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "== bitwise"
PYTHONPATH=$PWD/src timeout 100 python3 -m pytest -q -p no:cacheprovider -n 4 -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py -k "both_dkdv_epilogues and d256" 2>&1 | tail -3
for r in 1 2; do for t in old new; do
  pp="$PWD/src"; [ $t = old ] && pp="$PWD/bisect/old/src"
  echo "== $t round $r"
  PYTHONPATH=$pp timeout 75 python3 -m flashtile.bench --modes bwd --providers flashtile,sdpa-cudnn --head-dims 256 \
     --seqlens 512,1k,2k,4k,8k,16k --causal both --max-seqlen-probe 0 --no-plots --out $OUT/bwd-$t-r$r > $OUT/bwd-$t-r$r.log 2>&1
  grep -E "^ *flashtile" $OUT/bwd-$t-r$r.log | awk '{print $3"/"$7"/"$8":"$10"("$12")"}' | tr '\n' ';'; echo
done; done
echo "== tests"
PYTHONPATH=$PWD/src timeout 150 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py tests/test_gluon_sparse.py tests/test_gluon_grid_order.py -k "256 and not forward" \
  --durations=5 > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -8 $OUT/tests.txt
cd $OUT && for d in bwd-*-r?; do [ -d $d ] && mv $d/results.csv $d.csv && rm -rf $d; done
tar czf logs.tgz *.log tests.txt && rm -f *.log tests.txt; ls
