set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$PWD/src timeout 240 python3 -m pytest -q -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py -k "dropout" > $OUT/tests.txt 2>&1; echo "tests rc $?"
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head; tail -1 $OUT/tests.txt
B="python3 -m flashtile.bench --head-dims 128 --seqlens 8k --causal both --max-seqlen-probe 0 --providers flashtile --feature none --feature dropout:0.1 --modes bwd --no-plots"
for run in 1 2; do
  for tree in old new; do
    if [ $tree = old ]; then P=$PWD/bisect/old/src; else P=$PWD/src; fi
    PYTHONPATH=$P timeout 150 $B --out $OUT/$tree$run > $OUT/$tree$run.log 2>&1; echo "$tree$run rc $?"
    grep -E "^ *bwd|flashtile .*dropout|flashtile .* none" $OUT/$tree$run.log | tail -6
  done
done
