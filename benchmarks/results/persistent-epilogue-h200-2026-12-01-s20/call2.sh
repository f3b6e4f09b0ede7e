#!/usr/bin/env bash
# Session 20, call 2: the persistent forward's O through one shared tile (O_VIA_SMEM): its GPU tests, an A/B of the
# D256 forward (old tree bisect/old = f5f461d, new = HEAD, alternated, cuDNN in the same runs), the D256 variants in
# one process (routing), then ncu on the D64 causal forward at 512 keys.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
# The tests on GPU 1 beside the timings on GPU 0 (x2 machine).
(CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PWD/src timeout 420 python3 -m pytest -q -p no:cacheprovider -n 12 -rfE --tb=short \
  -W ignore tests/test_gluon.py tests/test_gluon_grid_order.py tests/test_gluon_3wg.py tests/test_gluon_persistent_protocol.py \
  tests/test_gpu.py -k "persistent or o_via_smem or launch_args or heads_dtypes or takes_it_by_default" --durations=15 \
  > $OUT/tests.txt 2>&1) &
export CUDA_VISIBLE_DEVICES=0
for r in 1 2; do for t in old new; do
  pp="$PWD/src"; [ $t = old ] && pp="$PWD/bisect/old/src"
  echo "== $t round $r"
  PYTHONPATH=$pp timeout 70 python3 -m flashtile.bench --modes fwd --providers flashtile,sdpa-cudnn --head-dims 256 \
     --seqlens 512,1k,2k,4k,8k,16k --causal both --max-seqlen-probe 0 --no-plots --out $OUT/fwd-$t-r$r > $OUT/fwd-$t-r$r.log 2>&1
  grep -E "^ *flashtile" $OUT/fwd-$t-r$r.log | awk '{print $3"/"$7"/"$8":"$10"("$12")"}' | tr '\n' ';'; echo
done; done
echo "== variants"
PYTHONPATH=$PWD/src timeout 120 python3 benchmarks/gluon_check.py --phase bench --variants default,persistent,persistent-sched4 \
  --bench-dims 256 --seqlens 512,1024,2048,4096,8192 --bench-causal both > $OUT/variants.log 2>&1
grep -E "TIME|SPEED" $OUT/variants.log | grep -v "^INFO" | tail -70
echo "== ncu"
OUT=$OUT/ncu timeout 100 bash benchmarks/gpu_session.sh ncu "_attn_fwd|cudnn|fmha|sm90" fwd-64-512-causal \
  sdpa-fwd-64-512-causal gluon-persistent-tma-lpt8-64-512-causal
echo "== tests (GPU 1)"
wait
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -20; tail -18 $OUT/tests.txt
cd $OUT && for d in fwd-*-r?; do [ -d $d ] && mv $d/results.csv $d.csv && rm -rf $d; done
tar czf logs.tgz *.log ncu 2>/dev/null; ls
